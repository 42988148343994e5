"""gymnasium's MuJoCo envs (extra `mujoco`): a clear message when MuJoCo is missing, and its
warnings shown once.

MuJoCo's C library prints its warnings straight to the terminal (e.g. a deprecated attribute in
one of gymnasium's model files, printed each time a model is compiled, so once per env built:
hundreds of lines in a run that builds evaluation envs). Here they go through Python's `warnings`
as `EnvLibraryWarning`, each distinct message once per process; actor processes, which build the
same envs the learner's process has already built and checked, keep them to themselves
(`quiet_env_library_warnings`), so a console shows each once.
"""

from __future__ import annotations

import re
import warnings

import gymnasium as gym

from maze_cli.errors import ConfigError

MUJOCO_ENTRY_POINT = "gymnasium.envs.mujoco"
_NUMBERS = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")
_seen: set[str] = set()


class EnvLibraryWarning(UserWarning):
    """A warning an env's library emits while it builds or steps an env (e.g. MuJoCo's compiler)."""


def quiet_env_library_warnings() -> None:
    """Called by actor processes: their envs are the learner's, whose process shows the warnings."""
    warnings.filterwarnings("ignore", category=EnvLibraryWarning)


def is_mujoco_id(env_id: str) -> bool:
    """Whether a registered gymnasium id is one of gymnasium's MuJoCo envs (Hopper-v5, ...)."""
    spec = gym.registry.get(env_id)
    entry_point = getattr(spec, "entry_point", None)
    return isinstance(entry_point, str) and entry_point.startswith(MUJOCO_ENTRY_POINT)


def prepare_mujoco(env_id: str) -> None:
    """Before a MuJoCo env is made: MuJoCo importable (else one line naming the extra), and its
    warnings routed through `_warn_once`."""
    try:
        import mujoco
    except ImportError:
        raise ConfigError(f"env.id={env_id}: a MuJoCo env, and MuJoCo is not installed; pip install 'maze_cli[mujoco]' "
                          f"(or pip install mujoco)") from None
    if mujoco.get_mju_user_warning() is not _warn_once:
        mujoco.set_mju_user_warning(_warn_once)


def _warn_once(message: str) -> None:
    """MuJoCo's warning handler: each message (its numbers aside: a time or a DOF index) once per process."""
    key = _NUMBERS.sub("#", message)
    if key in _seen:
        return
    _seen.add(key)
    warnings.warn(f"MuJoCo: {message.strip()} (shown once)", EnvLibraryWarning, stacklevel=2)
