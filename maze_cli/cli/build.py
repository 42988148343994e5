"""Build the parts of a run from the validated settings, passing plain arguments down."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from maze_cli.cli.schema import ConfigError, Settings
from maze_cli.envs.factory import EnvConfigError, EnvFactory
from maze_cli.envs.spaces import UnsupportedSpaceError
from maze_cli.parallel import (
    BaseDistributedWorkersWithBuffer,
    DistributedActors,
    RayDistributedWorkersWithBuffer,
    SequentialDistributedActors,
    SequentialDistributedWorkersWithBuffer,
    SubprocDistributedActors,
    SubprocDistributedWorkersWithBuffer,
)
from maze_cli.seeding import derive_seed, derive_seeds


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


@dataclass
class PolicyBlueprint:
    """How to rebuild a policy anywhere (stored in checkpoints): a class path and its arguments."""

    cls: str
    kwargs: dict[str, Any]

    def build(self) -> nn.Module:
        import importlib

        module, _, name = self.cls.rpartition(".")
        return getattr(importlib.import_module(module), name)(**self.kwargs)


@dataclass
class Run:
    """Everything the trainer drives: the algorithm's loop, the actors/workers to start and stop,
    the learner (for checkpoints) and the blueprint of the policy the actors act with."""

    loop: Any
    runner: DistributedActors | BaseDistributedWorkersWithBuffer
    learner: Any
    blueprint: PolicyBlueprint


def build_run(settings: Settings, env_factory: EnvFactory, observation_space, action_space) -> Run:
    if settings.algorithm.name == "sac":
        return _build_sac(settings, env_factory, observation_space, action_space)
    return _build_impala(settings, env_factory, observation_space, action_space)


def _actor_seeds(settings: Settings) -> dict[str, list[int]]:
    r, seed = settings.runner, settings.train.seed
    return {
        "env": r.actor_env_seeds or derive_seeds(seed, "actor_env", r.n_actors),
        "agent": r.actor_agent_seeds or derive_seeds(seed, "actor_agent", r.n_actors),
    }


def _backend_kwargs(settings: Settings) -> dict[str, Any]:
    """The runner's own options, as its DistributedActors class takes them."""
    r = settings.runner
    failures = {"max_restarts": r.max_restarts, "rollout_timeout_s": r.rollout_timeout_s}
    if r.name == "ray":
        return _ray_kwargs(settings) | failures
    if r.name == "subproc":
        return {"queue_out_of_sync_factor": r.queue_out_of_sync_factor, "start_method": r.start_method} | failures
    return failures


def _ray_kwargs(settings: Settings) -> dict[str, Any]:
    r = settings.runner
    return {
        "address": r.address, "num_cpus_per_actor": r.num_cpus_per_actor, "num_gpus_per_actor": r.num_gpus_per_actor,
        "resources": dict(r.resources or {}), "max_in_flight_per_actor": r.max_in_flight_per_actor,
    }


def _hp(cls: type, config: Any) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dataclasses.asdict(config).items() if k in names})


def _build_impala(settings: Settings, env_factory: EnvFactory, observation_space, action_space) -> Run:
    from maze_cli.algorithms.impala import ImpalaHyperparameters, ImpalaLearner, ImpalaLoop

    p, r = settings.policy, settings.runner
    blueprint = PolicyBlueprint(
        "maze_cli.policies.actor_critic.ActorCritic",
        dict(observation_space=observation_space, action_space=action_space, hidden_sizes=tuple(p.hidden_sizes),
             activation=p.activation or "tanh", shared_torso=p.shared_torso),
    )
    learner = ImpalaLearner(blueprint.build(), _hp(ImpalaHyperparameters, settings.algorithm), settings.train.device)
    seeds = _actor_seeds(settings)
    common = dict(
        env_factory=env_factory, policy=learner.policy, n_rollout_steps=settings.algorithm.n_rollout_steps,
        n_actors=r.n_actors, batch_size=r.batch_size, envs_per_actor=r.envs_per_actor,
        actor_env_seeds=seeds["env"], actor_agent_seeds=seeds["agent"],
    )
    if r.name == "sequential":
        actors: DistributedActors = SequentialDistributedActors(**common, **_backend_kwargs(settings))
    elif r.name == "ray":
        from maze_cli.parallel.ray_backend import RayDistributedActors

        actors = RayDistributedActors(**common, **_backend_kwargs(settings))
    else:
        actors = SubprocDistributedActors(**common, **_backend_kwargs(settings))
    return Run(ImpalaLoop(actors, learner), actors, learner, blueprint)


def initial_sampling_policy(spec: Any, observation_space, action_space) -> nn.Module | None:
    """None or 'random': uniform random (None lets the workers default to it); a checkpoint path;
    or a mapping with `_target_` called with the spaces and its other keys."""
    if spec is None or spec == "random":
        return None
    if isinstance(spec, str):
        from maze_cli.checkpoint import load_policy

        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"algorithm.initial_sampling_policy={spec}: no such checkpoint file")
        return load_policy(path)
    if isinstance(spec, dict) and "_target_" in spec:
        from hydra.utils import instantiate

        return instantiate(spec, observation_space=observation_space, action_space=action_space, _convert_="all")
    raise ConfigError(
        f"algorithm.initial_sampling_policy={spec}: use null (uniform random), a checkpoint path, or a mapping with _target_"
    )


def _build_sac(settings: Settings, env_factory: EnvFactory, observation_space, action_space) -> Run:
    from maze_cli.algorithms.sac import SacHyperparameters, SacLearner, SacLoop

    a, p, r, rb = settings.algorithm, settings.policy, settings.runner, settings.replay_buffer
    activation = p.activation or "relu"
    blueprint = PolicyBlueprint(
        "maze_cli.algorithms.sac.SacPolicy",
        dict(observation_space=observation_space, action_space=action_space, hidden_sizes=tuple(p.hidden_sizes),
             activation=activation),
    )
    try:
        policy = blueprint.build()
    except UnsupportedSpaceError as err:
        raise ConfigError(str(err)) from None
    learner = SacLearner(policy, _hp(SacHyperparameters, a), tuple(p.hidden_sizes), activation, settings.train.device)
    seeds = _actor_seeds(settings)
    prioritized = {k: v for k, v in dataclasses.asdict(rb).items() if k not in ("name", "capacity", "seed")}
    common = dict(
        env_factory=env_factory, worker_policy=learner.policy, n_rollout_steps=a.n_rollout_steps, n_workers=r.n_actors,
        batch_size=a.batch_size, rollouts_per_iteration=a.rollouts_per_iteration,
        initial_sampling_policy=initial_sampling_policy(a.initial_sampling_policy, observation_space, action_space),
        replay_buffer_size=rb.capacity, initial_buffer_size=a.initial_buffer_size,
        split_rollouts_into_transitions=a.split_rollouts_into_transitions, env_instance_seeds=seeds["env"],
        replay_buffer_seed=rb.seed if rb.seed is not None else derive_seed(settings.train.seed, "replay_buffer"),
        envs_per_worker=r.envs_per_actor, worker_agent_seeds=seeds["agent"], replay_buffer=rb.name,
        prioritized=prioritized if rb.name == "prioritized" else None, backend_options=_backend_kwargs(settings),
    )
    if r.name == "sequential":
        workers: BaseDistributedWorkersWithBuffer = SequentialDistributedWorkersWithBuffer(**common)
    elif r.name == "ray":
        workers = RayDistributedWorkersWithBuffer(**common)
    else:
        workers = SubprocDistributedWorkersWithBuffer(**common)
    return Run(SacLoop(workers, learner, a.replay_ratio, rb.name == "prioritized"), workers, learner, blueprint)
