"""Env wrappers from config: `env.wrappers`, applied in order to every env a run builds.

MiniGrid, BabyAI and most third-party envs are used through wrappers of gymnasium or of their own
package (RL Zoo's `env_wrapper`). Each entry is a dotted name of a class or function called as
`wrapper(env)`, or a mapping `{_target_: <dotted name>, <argument>: <value>, ...}` called as
`wrapper(env, **arguments)`. They are plain data in the run's config, so a checkpoint records them
as data and `rollout` rebuilds them (under the allow-list rule of `maze_cli.policies.blueprint`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium as gym

from maze_cli.errors import ConfigError, EnvConfigError, first_line


def wrapper_specs(wrappers: Any) -> list[tuple[str, dict[str, Any]]]:
    """`env.wrappers` as [(dotted name, arguments)]; a malformed entry is one line naming it."""
    if wrappers is None:
        return []
    if isinstance(wrappers, (str, Mapping)) or not isinstance(wrappers, Sequence):
        raise ConfigError(f"env.wrappers: expected a list, e.g. env.wrappers=[minigrid.wrappers.ImgObsWrapper], got {wrappers!r}")
    specs = []
    for i, entry in enumerate(wrappers):
        if isinstance(entry, str) and entry:
            specs.append((entry, {}))
        elif isinstance(entry, Mapping) and isinstance(entry.get("_target_"), str):
            specs.append((entry["_target_"], {str(k): v for k, v in entry.items() if k != "_target_"}))
        else:
            raise ConfigError(f"env.wrappers[{i}]: expected a dotted name or {{_target_: <dotted name>, <argument>: ...}}, got {entry!r}")
    return specs


def wrapper_targets(wrappers: Any) -> list[str]:
    """The dotted names `env.wrappers` calls (what an allow-list judges)."""
    return [target for target, _ in wrapper_specs(wrappers)]


def apply_wrappers(env: gym.Env, wrappers: Any) -> gym.Env:
    """`env` wrapped by each entry of `wrappers` in order (the first is innermost)."""
    from hydra.utils import get_object

    for i, (target, arguments) in enumerate(wrapper_specs(wrappers)):
        try:
            wrapper = get_object(target)
        except Exception as err:  # noqa: BLE001 - a missing module or attribute: the user's to fix
            env.close()
            raise EnvConfigError(f"env.wrappers[{i}]={target}: cannot import it ({first_line(err)}); check the name, "
                                 f"or install its package") from None
        try:
            wrapped = wrapper(env, **arguments)
        except Exception as err:  # noqa: BLE001 - the wrapper refused this env or these arguments
            env.close()
            raise EnvConfigError(f"env.wrappers[{i}]={target}: {type(err).__name__}: {first_line(err)}") from None
        if not isinstance(wrapped, gym.Env):
            env.close()
            raise EnvConfigError(f"env.wrappers[{i}]={target}: returned {type(wrapped).__name__}, not a gymnasium.Env")
        env = wrapped
    return env
