"""Validate the composed config and build the parts of a run from plain arguments."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from maze_cli.algorithms.impala import ImpalaHyperparameters, ImpalaLearner
from maze_cli.cli.schema import SCHEMAS, ConfigError, TrainConfig, validate_group, validate_section
from maze_cli.envs.factory import EnvConfigError, EnvFactory
from maze_cli.envs.spaces import UnsupportedSpaceError
from maze_cli.parallel import DistributedActors, SequentialDistributedActors, SubprocDistributedActors
from maze_cli.policies import ActorCritic
from maze_cli.seeding import derive_seeds


class NoEnvError(ConfigError):
    """`train` was run without `+env=...`."""

    def __init__(self, options: list[str]):
        listed = ", ".join(options) if options else "(none found)"
        super().__init__(f"no env chosen: add +env=<name>, one of: {listed} (or your own env config via --config-dir)")


@dataclass
class Settings:
    """The validated config of a run, as plain typed objects."""

    train: TrainConfig
    env: dict[str, Any]
    algorithm: Any
    policy: Any
    runner: Any


def validate(cfg: DictConfig, env_options: list[str]) -> Settings:
    """Check every key of the composed config; raise ConfigError naming the first bad one."""
    if cfg.get("env") is None:
        raise NoEnvError(env_options)
    top = {k: cfg[k] for k in cfg if k not in SCHEMAS and k != "env"}
    train = validate_section(TrainConfig, top, "", "train")
    try:
        env = OmegaConf.to_container(cfg.env, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"env.{err.key}: a value is required (e.g. +env=gym env.id=Acrobot-v1)") from None
    if not isinstance(env, dict):
        raise ConfigError(f"env: expected a mapping of env settings, got {env!r}")
    groups = {section: validate_group(section, cfg[section]) for section in SCHEMAS}
    runner = groups["runner"]
    for key in ("actor_env_seeds", "actor_agent_seeds"):
        seeds = getattr(runner, key)
        if seeds is not None and len(seeds) != runner.n_actors:
            raise ConfigError(f"runner.{key} has {len(seeds)} seeds: give one per actor (runner.n_actors={runner.n_actors})")
    start_method = getattr(runner, "start_method", None)
    if start_method is not None and start_method not in mp.get_all_start_methods():
        raise ConfigError(f"runner.start_method={start_method}: not available here; use one of {', '.join(mp.get_all_start_methods())}")
    _check_device(train.device)
    return Settings(train=train, env=env, **groups)


def _check_device(device: str) -> None:
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
