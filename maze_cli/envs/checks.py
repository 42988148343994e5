"""The checks an env passes before any actor starts (`env.check`): an observation a network can read,
spaces kept on reset and a few steps, numeric env statistics, and gymnasium's env checker (whose
findings are warnings). Each failure is one line that names the env and the fix."""

from __future__ import annotations

import logging
import re
import warnings
from typing import Iterable

import gymnasium as gym

from maze_cli.envs.info_stats import as_number
from maze_cli.envs.spaces import observation_specs
from maze_cli.errors import EnvConfigError, UnsupportedSpaceError

# Observation keys no network reads, and the wrapper that turns such an observation into one it does.
FIXING_WRAPPERS = {"mission": "minigrid.wrappers.ImgObsWrapper"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _plain_warnings() -> None:
    """gymnasium colours its warnings with ANSI codes, which land raw in train.log and in consoles
    that do not read them: every process that builds envs shows warnings without them."""
    if getattr(warnings.formatwarning, "maze_cli_plain", False):
        return
    original = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None) -> str:
        return _ANSI.sub("", original(message, category, filename, lineno, line))

    formatwarning.maze_cli_plain = True
    warnings.formatwarning = formatwarning


_plain_warnings()


def readable_keys(space: gym.Space) -> list[str] | None:
    """The top-level keys of a Dict observation that a network reads (not text, graphs, ...); None for
    any other space."""
    if not isinstance(space, gym.spaces.Dict):
        return None
    readable = []
    for key, sub in space.spaces.items():
        try:
            observation_specs(gym.spaces.Dict({key: sub}))
            readable.append(key)
        except UnsupportedSpaceError:
            pass
    return readable


def keys_to_read(space: gym.Space) -> list[str] | None:
    """The keys a network reads, where a Dict observation has others beside them (MiniGrid's text `mission`):
    what `env.obs_keys` is set to where the config leaves it null, said in the log. None where every key
    is read, or none is (`supported_observation` then names the fixes)."""
    readable = readable_keys(space)
    if not readable or len(readable) == len(space.spaces):
        return None
    unread = ", ".join(f"'{key}' ({type(sub).__name__})" for key, sub in space.spaces.items() if key not in readable)
    logging.getLogger("maze_cli").info(f"env.obs_keys=[{','.join(readable)}], chosen for this env: no network reads {unread}; "
                                       f"env.obs_keys=[...] names the keys yourself")
    return readable


def supported_observation(space: gym.Space) -> None:
    """A Dict observation with keys no network reads (text, graphs) names the `env.obs_keys` that
    leave them out, and the wrapper made for it where there is one."""
    try:
        observation_specs(space)
    except UnsupportedSpaceError as err:
        readable = readable_keys(space)
        if readable is None:
            raise
        fixes = [f"env.wrappers=[{FIXING_WRAPPERS[key]}]" for key in space.spaces if key in FIXING_WRAPPERS]
        wrap = f"; wrap the env with the wrapper made for it: {fixes[0]}" if fixes else ""
        if not readable and not wrap:
            raise
        leave_out = f"; or leave it out: env.obs_keys=[{','.join(readable)}]" if readable else ""
        raise UnsupportedSpaceError(f"{err}{wrap}{leave_out}") from None


def check_spaces(env: gym.Env, name: str, info_stats: Iterable[str]) -> None:
    """The env as built (wrappers included) keeps its declared spaces on reset and a few random
    steps: a violation would only surface later as a reshape error inside an actor."""
    space = env.observation_space
    observation, _ = env.reset(seed=0)
    _require(space.contains(observation), name, f"its reset() observation is outside its observation space {space}")
    for _ in range(5):
        observation, _, terminated, truncated, info = env.step(env.action_space.sample())
        _require(space.contains(observation), name, f"a step() observation is outside its observation space {space}")
        for key in info_stats:  # a non-numeric statistic fails here, before any actor starts
            if key in info:
                as_number(key, info[key])
        if terminated or truncated:
            env.reset()


def _require(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise EnvConfigError(f"env {name} fails the env checker: {problem} (a wrapper or the env breaks "
                             f"its declared space; fix it, or env.check=false to skip the checks)")


def run_env_checker(env: gym.Env, name: str) -> None:
    """gymnasium's env checker on the env as built: its findings (determinism under a seed,
    signatures, advice) are warnings in the log, not errors: simulators and real-world envs often
    are not deterministic, and the spaces are checked above."""
    from gymnasium.utils.env_checker import check_env

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env, skip_render_check=True)
    except Exception as err:  # noqa: BLE001 - any finding of the checker
        message = " ".join(str(err).split())
        logging.getLogger("maze_cli").warning(f"env {name}: gymnasium's env checker says: {message} "
                                              f"(training goes on; env.check=false skips the checks)")
