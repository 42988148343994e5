"""Build envs from their config: a registered gymnasium id, or any callable named by `_target_`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import gymnasium as gym

from maze_cli.envs.spaces import UnsupportedSpaceError, action_spec, observation_specs
from maze_cli.errors import ConfigError

__all__ = ["EnvFactory", "EnvConfigError", "UnsupportedSpaceError"]

# Keys of an env config that configure maze_cli rather than the env itself.
ID_KEYS = ("id", "kwargs", "max_episode_steps", "vectorize")


class EnvConfigError(ConfigError):
    """An env config that cannot produce an env."""


@dataclass(frozen=True)
class EnvFactory:
    """A picklable factory: `EnvFactory(config)()` returns a fresh gymnasium.Env.

    `config` is a plain mapping: either `{id, kwargs, max_episode_steps, vectorize}` for
    `gymnasium.make`, or `{_target_: "pkg.module.Callable", **arguments}` for a user's own env.
    `vectorize` (default true): actors step their envs with the env's own vectorized implementation
    where gymnasium registers one (`vector_entry_point`).
    """

    config: Mapping[str, Any]

    def __post_init__(self) -> None:
        has_id = self.config.get("id") is not None
        has_target = self.config.get("_target_") is not None
        if has_id == has_target:
            raise EnvConfigError("env: give exactly one of env.id (a registered gymnasium id) or env._target_")
        if has_id:
            unknown = sorted(set(self.config) - set(ID_KEYS))
            if unknown:
                raise EnvConfigError(
                    f"env.{unknown[0]}: not a key of an env config with 'id' "
                    f"(allowed: {', '.join(ID_KEYS)}; put env arguments under env.kwargs)"
                )

    def __call__(self) -> gym.Env:
        if self.config.get("_target_") is not None:
            from hydra.utils import instantiate

            env = instantiate(dict(self.config), _convert_="all")
        else:
            kwargs = dict(self.config.get("kwargs") or {})
            max_steps = self.config.get("max_episode_steps")
            if max_steps is not None:
                kwargs["max_episode_steps"] = max_steps
            env = gym.make(self.config["id"], **kwargs)
        if not isinstance(env, gym.Env):
            raise EnvConfigError(f"env: {self.config.get('_target_')} returned {type(env).__name__}, not a gymnasium.Env")
        return env

    def vector_env(self, n_envs: int) -> gym.vector.VectorEnv | None:
        """`n_envs` copies as the env's own vectorized implementation, or None where there is none
        (or `vectorize` is off)."""
        if self.config.get("id") is None or not self.config.get("vectorize", True):
            return None
        if gym.spec(self.config["id"]).vector_entry_point is None:
            return None
        kwargs = dict(self.config.get("kwargs") or {})
        if self.config.get("max_episode_steps") is not None:
            kwargs["max_episode_steps"] = self.config["max_episode_steps"]
        return gym.make_vec(self.config["id"], num_envs=n_envs, vectorization_mode="vector_entry_point", **kwargs)

    def without_vectorization(self) -> "EnvFactory":
        """The same env, always built one by one."""
        return EnvFactory({**self.config, "vectorize": False}) if self.config.get("id") is not None else self

    def describe(self) -> str:
        return str(self.config.get("id") or self.config.get("_target_"))

    def check(self) -> tuple[gym.Space, gym.Space]:
        """Build one env in this process, check its spaces are supported, and return them.

        Run before any actor starts, so a wrong env fails here with one clear message.
        """
        try:
            env = self()
        except EnvConfigError:
            raise
        except Exception as err:  # anything the env's own constructor raises is a config problem here
            cause = err.__cause__ if err.__cause__ is not None and "Error in call to target" in str(err) else err
            what = f"env.id={self.config['id']}" if self.config.get("id") else f"env._target_={self.config['_target_']}"
            raise EnvConfigError(f"{what}: {type(cause).__name__}: {str(cause).strip().splitlines()[0]}") from err
        try:
            observation_specs(env.observation_space)
            action_spec(env.action_space)
            self._run_env_checker(env)
            return env.observation_space, env.action_space
        finally:
            env.close()

    def _run_env_checker(self, env: gym.Env) -> None:
        """gymnasium's env checker (observations inside their space, dtypes, shapes, reset/step
        signatures); its advice-only warnings are silenced, its errors become one line."""
        import warnings

        from gymnasium.utils.env_checker import check_env

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_env(env.unwrapped, skip_render_check=True)
        except Exception as err:
            message = " ".join(str(err).split())
            raise EnvConfigError(f"env {self.describe()} fails gymnasium's env checker: {message}") from err
