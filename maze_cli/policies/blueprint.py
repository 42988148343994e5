"""Policy blueprints: how to rebuild a policy from plain data, and the allow-list that guards it.

A blueprint is what a checkpoint stores about its policy: the policy class (`_target_`), its
spaces as plain data and its arguments (the network's config, with its own `_target_`). Files
travel between people, so rebuilding one builds only classes on an allow-list: maze_cli's own
policy classes and networks, plus the classes the user named in this run's config or command line.
Anything else is refused, unless the user passes `trust_checkpoint=true` (which runs code from the
file: only for files from people you trust).
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Iterator

import gymnasium as gym
from torch import nn

from maze_cli.envs.spaces import space_from_dict, space_to_dict
from maze_cli.errors import CheckpointError, ConfigError

OWN_PACKAGE = "maze_cli"


def policy_blueprint(cls: type, observation_space: gym.Space, action_space: gym.Space, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The blueprint of `cls(observation_space, action_space, **kwargs)`."""
    return {
        "_target_": f"{cls.__module__}.{cls.__qualname__}",
        "observation_space": space_to_dict(observation_space),
        "action_space": space_to_dict(action_space),
        "kwargs": kwargs,
    }


def targets_in(value: Any) -> Iterator[str]:
    """Every `_target_` string anywhere in a nested structure of dicts and lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "_target_" and isinstance(item, str):
                yield item
            else:
                yield from targets_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from targets_in(item)


def _is_own_module_class(obj: Any) -> bool:
    """A torch module class defined in maze_cli itself (not merely reachable through it: a path such
    as `maze_cli.checkpoint.os.system` resolves to a function of another package)."""
    return (
        inspect.isclass(obj) and issubclass(obj, nn.Module)
        and (obj.__module__ == OWN_PACKAGE or obj.__module__.startswith(OWN_PACKAGE + "."))
    )


def is_own_env_maker(target: str) -> bool:
    """An env callable of maze_cli itself (e.g. maze_cli.envs.atari.make_atari): safe to call from a checkpoint."""
    from hydra.utils import get_object

    try:
        obj = get_object(target)
    except Exception:  # noqa: BLE001
        return False
    module = getattr(obj, "__module__", "") or ""
    return target.startswith(OWN_PACKAGE + ".envs.") and (module == OWN_PACKAGE or module.startswith(OWN_PACKAGE + "."))


# Packages whose env wrappers a checkpoint may name without allow=: gymnasium's, maze_cli's own, and those of
# the env packages maze_cli's extras install.
WRAPPER_PACKAGES = ("gymnasium.wrappers", OWN_PACKAGE + ".envs", "minigrid.wrappers", "ale_py", "minatar")


# Packages whose env makers (PettingZoo's convention: functions named env, parallel_env or raw_env) a
# checkpoint may name as its env `_target_` without allow=: those of the multiagent extra.
ENV_MAKER_PACKAGES = ("pettingzoo", "mpe2")
ENV_MAKER_NAMES = ("env", "parallel_env", "raw_env")


def _is_known_env_maker(target: str) -> bool:
    """A PettingZoo-style env maker of ENV_MAKER_PACKAGES (e.g. pettingzoo.classic.connect_four_v3.env), by
    name and by where it is defined, as for wrappers."""
    return target.rsplit(".", 1)[-1] in ENV_MAKER_NAMES and _defined_within(target, ENV_MAKER_PACKAGES)


def _is_known_wrapper(target: str) -> bool:
    """A wrapper class or function of WRAPPER_PACKAGES, both by name and by where it is defined (so
    that a path through a module's imports, such as gymnasium.wrappers.os.system, is not one)."""
    return _defined_within(target, WRAPPER_PACKAGES)


def _defined_within(target: str, packages: tuple[str, ...]) -> bool:
    """A class or function named inside `packages` and defined there too."""
    from hydra.utils import get_object

    def within(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in packages)

    if not within(target):  # judged by name before anything is imported
        return False
    try:
        obj = get_object(target)
    except Exception:  # noqa: BLE001
        return False
    return (inspect.isclass(obj) or inspect.isfunction(obj)) and within(getattr(obj, "__module__", "") or "")


def refused_env_callables(env_config: dict[str, Any], allow: Iterable[str], trust: bool) -> list[str]:
    """The callables a checkpoint's env config names that loading it may not call: its env `_target_`
    unless maze_cli's own env maker or a known PettingZoo-style one, its `wrappers` unless gymnasium's,
    maze_cli's or a known env package's; anything listed in `allow` (or everything, with `trust`) passes."""
    from maze_cli.envs.wrappers import wrapper_targets

    if trust:
        return []
    allowed = set(allow)
    refused = []
    target = env_config.get("_target_")
    if target is not None and target not in allowed and not is_own_env_maker(target) and not _is_known_env_maker(target):
        refused.append(target)
    refused += [w for w in wrapper_targets(env_config.get("wrappers")) if w not in allowed and not _is_known_wrapper(w)]
    return refused


def check_allowed(blueprint: dict[str, Any], trusted: Iterable[str], where: str) -> None:
    """Refuse a blueprint naming anything but maze_cli's own module classes and `trusted` paths."""
    from hydra.utils import get_object

    trusted = set(trusted)
    for target in targets_in(blueprint):
        if target in trusted:
            continue
        try:
            allowed = target.startswith(OWN_PACKAGE + ".") and _is_own_module_class(get_object(target))
        except Exception:  # noqa: BLE001 - an unimportable path is not allowed either
            allowed = False
        if not allowed:
            raise CheckpointError(
                f"{where}: the checkpoint asks to build '{target}', which is neither a maze_cli class nor one this run's "
                f"config names; refused. Allow it by name (rollout: allow=[{target}]; train: name it in the config, e.g. "
                f"policy._target_={target}), or trust the file's author with trust_checkpoint=true (runs code from the file)"
            )


def build_policy(blueprint: dict[str, Any], trusted: Iterable[str] = (), trust: bool = False, where: str = "checkpoint") -> nn.Module:
    """The policy a blueprint describes (weights not loaded), after the allow-list check."""
    from hydra.utils import get_object

    if not trust:
        check_allowed(blueprint, trusted, where)
    try:
        cls = get_object(blueprint["_target_"])
        observation_space = space_from_dict(blueprint["observation_space"])
        action_space = space_from_dict(blueprint["action_space"])
        return cls(observation_space, action_space, **blueprint.get("kwargs", {}))
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise CheckpointError(f"{where}: its policy blueprint cannot be built ({type(err).__name__}: {err})") from None


def check_spaces(policy: nn.Module, observation_space: gym.Space, action_space: gym.Space, where: str) -> None:
    """A loaded policy acts in this env only if it was trained on the same spaces (as SB3's
    check_for_correct_spaces): refuse a mismatch in one line that names both."""
    for what, theirs, ours in (("observation", policy.observation_space, observation_space), ("action", policy.action_space, action_space)):
        if theirs != ours:
            raise ConfigError(f"{where}: the checkpoint's policy was trained with {what} space {theirs}, but this env's is {ours}")


def initial_sampling_policy(spec: Any, observation_space: gym.Space, action_space: gym.Space, load_policy=None) -> nn.Module | None:
    """`algorithm.initial_sampling_policy`: None or 'random' (uniform random: None lets the caller
    default to it); a checkpoint path (read through `load_policy(path, where)`); or a mapping with
    `_target_`, called with the spaces and its other keys."""
    where = f"algorithm.initial_sampling_policy={spec}"
    if spec is None or spec == "random":
        return None
    if isinstance(spec, str):
        if load_policy is None:
            raise ConfigError(f"{where}: checkpoints cannot be loaded here")
        return load_policy(spec, where)
    if isinstance(spec, dict) and "_target_" in spec:
        from hydra.utils import instantiate

        return instantiate(spec, observation_space=observation_space, action_space=action_space, _convert_="all")
    raise ConfigError(f"{where}: use null (uniform random), a checkpoint path, or a mapping with _target_")
