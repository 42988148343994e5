"""What actors, evaluation and the trainer ask of an env factory: the `EnvSource` contract.

`EnvFactory` (an env from config) answers every question; a plain callable that returns a
gymnasium.Env (what tests and users hand `DistributedActors`) answers the defaults: one
single-agent env at a time, no env statistics, rewards as the env gives them. Such a callable is
wrapped once, where it enters (`as_env_source`), so no caller below asks which kind it holds.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import gymnasium as gym

from maze_cli.envs.action_mask import find_mask_key


@runtime_checkable
class VectorizedEnvTarget(Protocol):
    """A `_target_` callable that also builds `n_envs` copies of its env as one vector env, from the
    same arguments: `vector_env(n_envs, **arguments)` returns a gymnasium VectorEnv with the single
    env's spaces, or None where the actors should step single envs (e.g. `maze_cli.envs.atari.make_atari`,
    whose `env.backend=envpool` gives each actor one envpool). `env.vectorize=false` turns it off."""

    def __call__(self, *args: Any, **arguments: Any) -> gym.Env: ...

    def vector_env(self, n_envs: int, **arguments: Any) -> gym.vector.VectorEnv | None: ...


class EnvSource(abc.ABC):
    """Builds the envs of a run, and says how they may be stepped and what to follow in them.

    A subclass builds one env per call; every other member has the answer of a plain single-agent
    env, and a subclass may replace an attribute by a property or set it per instance. A subclass
    whose `vector_env` can return a vector env also overrides `without_vectorization`, so that
    replay workers, which need every step to be a transition, can turn it off.
    """

    # The possible agents of a multi-agent (PettingZoo) env; None for a single-agent env.
    agents: tuple[str, ...] | None = None
    # `env.policy_groups` of a multi-agent env: each group's observation and action space (one policy
    # each, `maze_cli.envs.policy_groups`); None: one policy shared by all agents.
    policy_groups: Mapping[str, tuple[gym.Space, gym.Space]] | None = None
    # A turn-based game (`maze_cli.envs.turn_based`): one policy plays every seat; evaluation plays it
    # against fixed opponents.
    turn_based: bool = False
    # `selfplay` settings of a turn-based game (pool_size, pool_share, snapshot_every: maze_cli.parallel.selfplay);
    # None: every seat plays the current policy.
    selfplay: Mapping[str, Any] | None = None
    # The env statistics the actors and evaluation follow: {info key: reduction}.
    info_stats: Mapping[str, str] = MappingProxyType({})
    # The bound of the rewards the learner sees (the stats keep the env's own); None: unclipped.
    reward_clip: float | None = None

    @abc.abstractmethod
    def __call__(self) -> gym.Env:
        """A fresh env."""

    def vector_env(self, n_envs: int) -> gym.vector.VectorEnv | None:
        """`n_envs` envs as one vector env, or None where the actors step single envs in a loop."""
        return None

    def without_vectorization(self) -> EnvSource:
        """The same envs, always built one by one: this source, where `vector_env` builds none."""
        return self

    def parallel_env(self) -> Any:
        """A fresh multi-agent env as a PettingZoo `ParallelEnv`; only a source with `agents` builds one."""
        raise TypeError(f"{self.describe()} builds single-agent envs, not a multi-agent ParallelEnv")

    def training_parallel_env(self) -> Any:
        """The multi-agent env the actors step (evaluation steps `parallel_env`'s); the same here."""
        return self.parallel_env()

    def action_mask_key(self, observation_space: gym.Space, action_space: gym.Space) -> str | None:
        """The observation key that holds the action mask (`maze_cli.envs.action_mask`): PettingZoo's
        `action_mask` where the observations have it, else none."""
        return find_mask_key(observation_space, action_space, None)

    def describe(self) -> str:
        """The env's name in messages and logs."""
        return type(self).__name__


@dataclass(frozen=True)
class CallableEnvSource(EnvSource):
    """A plain callable that returns a gymnasium.Env, as an `EnvSource` with the default answers.
    Picklable where the callable is, so subprocess and Ray actors take it as they took the callable."""

    make_env: Callable[[], gym.Env]

    def __call__(self) -> gym.Env:
        return self.make_env()

    def describe(self) -> str:
        return repr(self.make_env)


def as_env_source(env_factory: EnvSource | Callable[[], gym.Env]) -> EnvSource:
    """`env_factory` itself if it is an `EnvSource`, else the plain callable wrapped as one."""
    return env_factory if isinstance(env_factory, EnvSource) else CallableEnvSource(env_factory)
