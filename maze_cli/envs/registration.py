"""What makes an env id exist in a process: the module of `env.register`, or the package of a known id
prefix (ALE/, MinAtar/, MiniGrid-), imported in every process that makes the env; and the optional
packages an id needs (MuJoCo, Box2D), named with the extra that installs them."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

import gymnasium as gym

from maze_cli.envs.mujoco import is_mujoco_id, prepare_mujoco
from maze_cli.errors import EnvConfigError

# Optional extras that bring env packages, by the module an env config registers its ids from.
EXTRAS = {"minatar": "minatar", "ale_py": "atari", "minigrid": "minigrid"}
# Env id prefixes whose ids exist only once their package is imported (gymnasium 1.x loads no plugins).
ID_PACKAGES = {"ALE/": "ale_py", "MinAtar/": "minatar.gym", "MiniGrid-": "minigrid", "BabyAI-": "minigrid"}


def register(config: Mapping[str, Any]) -> None:
    """Import `register`'s module (or, for a known id prefix such as ALE/, its package) so that the
    env's id exists; for a MuJoCo id, check MuJoCo and route its warnings (`maze_cli.envs.mujoco`); for
    a Box2D id, check Box2D."""
    _import_register_module(config)
    if is_mujoco_id(config["id"]):
        prepare_mujoco(config["id"])
    _check_box2d(config["id"])


def _check_box2d(env_id: str) -> None:
    """gymnasium's Box2D envs need the Box2D package, which gymnasium names by its own extra: name ours."""
    entry_point = gym.spec(env_id).entry_point if env_id in gym.registry else None
    if not (isinstance(entry_point, str) and entry_point.startswith("gymnasium.envs.box2d")):
        return
    try:
        import Box2D  # noqa: F401
    except ImportError:
        raise EnvConfigError(f"env.id={env_id}: a Box2D env, and Box2D is not installed; "
                             "pip install 'maze_cli[box2d]' (or pip install box2d)") from None


def _import_register_module(config: Mapping[str, Any]) -> None:
    env_id = config["id"]
    module_name = config.get("register") or next((m for prefix, m in ID_PACKAGES.items() if env_id.startswith(prefix)), None)
    if not module_name or env_id in gym.registry:
        return
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        top = module_name.split(".")[0]
        extra = f"pip install 'maze_cli[{EXTRAS[top]}]' (or pip install {top})" if top in EXTRAS else f"install the package that provides {module_name}"
        if config.get("register"):
            message = f"env.register={module_name}: cannot import it ({err}); {extra}"
        else:
            message = f"env.id={env_id}: its package {top} is not installed; {extra}"
        raise EnvConfigError(message) from None
    if callable(getattr(module, "register_envs", None)):
        module.register_envs()
