"""Validate the composed config and build the parts of a run from plain arguments."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from maze_cli.algorithms.impala import ImpalaHyperparameters, ImpalaLearner
from maze_cli.cli.schema import ConfigError, Settings
from maze_cli.envs.factory import EnvConfigError, EnvFactory
from maze_cli.envs.spaces import UnsupportedSpaceError
from maze_cli.parallel import DistributedActors, SequentialDistributedActors, SubprocDistributedActors
from maze_cli.policies import ActorCritic
from maze_cli.seeding import derive_seeds


def check_device(device: str) -> None:
    """The learner's device exists here (checked once torch is loaded, before any actor starts)."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device={device}: not a torch device; use cpu, cuda or cuda:<index>") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device}: CUDA is not available on this machine; use device=cpu")


def check_env(settings: Settings) -> tuple[EnvFactory, Any, Any]:
    """Build one env in this process (before any actor starts) and return the factory and spaces."""
    try:
        factory = EnvFactory(settings.env)
        observation_space, action_space = factory.check()
    except (EnvConfigError, UnsupportedSpaceError) as err:
        raise ConfigError(str(err)) from None
    return factory, observation_space, action_space


def build_policy(settings: Settings, observation_space, action_space) -> ActorCritic:
    p = settings.policy
    return ActorCritic(observation_space, action_space, tuple(p.hidden_sizes), p.activation, p.shared_torso)


def build_learner(settings: Settings, policy: ActorCritic) -> ImpalaLearner:
    names = {f.name for f in dataclasses.fields(ImpalaHyperparameters)}
    hp = ImpalaHyperparameters(**{k: v for k, v in dataclasses.asdict(settings.algorithm).items() if k in names})
    return ImpalaLearner(policy, hp, settings.train.device)


def build_actors(settings: Settings, env_factory: EnvFactory, policy: ActorCritic) -> DistributedActors:
    r, seed = settings.runner, settings.train.seed
    common = dict(
        env_factory=env_factory,
        policy=policy,
        n_rollout_steps=settings.algorithm.n_rollout_steps,
        n_actors=r.n_actors,
        batch_size=r.batch_size,
        envs_per_actor=r.envs_per_actor,
        actor_env_seeds=r.actor_env_seeds or derive_seeds(seed, "actor_env", r.n_actors),
        actor_agent_seeds=r.actor_agent_seeds or derive_seeds(seed, "actor_agent", r.n_actors),
    )
    if r.name == "sequential":
        return SequentialDistributedActors(**common)
    return SubprocDistributedActors(**common, queue_out_of_sync_factor=r.queue_out_of_sync_factor, start_method=r.start_method)
