"""Build the parts of a run from the validated settings: each group's `_target_` with its arguments.

The algorithm (`algorithm._target_`) receives the other groups as `Components` (the env, the policy
network's config, factories for actors and replay buffer) and builds its run from them; nothing
below this module reads the config.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Iterable

import gymnasium as gym
import torch
from omegaconf import OmegaConf

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.cli.settings import Settings
from maze_cli.envs.factory import EnvFactory
from maze_cli.errors import ConfigError
from maze_cli.seeding import derive_seed, derive_seeds


def check_device(device: str) -> None:
    """The learner's device exists here (checked once torch is loaded, before any actor starts)."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device={device}: not a torch device; use cpu, cuda or cuda:<index>") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device}: CUDA is not available on this machine; use device=cpu")


def check_env(settings: Settings) -> tuple[EnvFactory, gym.Space, gym.Space]:
    """Build one env in this process (before any actor starts) and return the factory and spaces."""
    factory = EnvFactory.for_policy(settings.env, settings.policy).resolved()
    observation_space, action_space = factory.check()
    factory = factory.with_selfplay(dataclasses.asdict(settings.train.selfplay))
    return factory, observation_space, action_space


def _target_and_arguments(section: str, config: Any) -> tuple[Any, dict[str, Any]]:
    """The class a group's config names, and the config's other keys as plain arguments."""
    from hydra.utils import get_object

    arguments = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
    target = arguments.pop("_target_")
    try:
        return get_object(target), arguments
    except Exception as err:  # noqa: BLE001 - validation already imported it once; this is belt and braces
        raise ConfigError(f"{section}._target_={target}: cannot import it ({type(err).__name__}: {err})") from None


def _construct(section: str, cls: Any, **arguments: Any) -> Any:
    """`cls(**arguments)`, arguments that do not fit its signature reported as the group's config
    problem (checked before the call, so a TypeError from inside the class stays a real crash)."""
    import inspect

    try:
        inspect.signature(cls).bind(**arguments)
    except TypeError as err:
        raise ConfigError(f"{section}: {cls.__module__}.{cls.__qualname__} cannot be built from its config: {err}") from None
    except ValueError:  # no signature to check (a builtin): let the call speak
        pass
    return cls(**arguments)


def trusted_targets(config: dict[str, Any]) -> frozenset[str]:
    """Every class the user named in the run's config: checkpoints may ask for these."""
    from maze_cli.policies.blueprint import targets_in

    return frozenset(targets_in(config))


def build_run(settings: Settings, env_factory: EnvFactory, observation_space: gym.Space, action_space: gym.Space,
              trusted: Iterable[str] = (), trust_checkpoint: bool = False, group: Any = None) -> Run:
    """The algorithm, built with every other group's component; with several learners (`group`, a
    LearnerGroup), this learner's: its share of the actors, its own seeds."""
    cls, hyperparameters = _target_and_arguments("algorithm", settings.algorithm)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"algorithm._target_={settings.algorithm._target_}: not an algorithm class (a subclass of maze_cli.algorithms.base.Algorithm)")
    algorithm = _construct("algorithm", cls, **hyperparameters)
    seed = settings.train.seed
    trusted = frozenset(trusted)

    def load_policy(path: str, where: str):
        from maze_cli.checkpoint import load_policy as load
        from maze_cli.policies.blueprint import check_spaces

        policy = load(Path(path), trusted, trust_checkpoint, where)
        check_spaces(policy, observation_space, action_space, where)
        return policy

    rank, world_size = (0, 1) if group is None else (group.rank, group.world_size)
    options = settings.train.learner
    parts = Components(
        env_factory=env_factory, observation_space=observation_space, action_space=action_space,
        network=_network_config(settings, algorithm), make_actors=_actors_factory(settings, algorithm, env_factory, rank, world_size),
        make_replay_buffer=_replay_buffer_factory(settings, rank), device=learner_device(settings.train.device, rank, world_size),
        seed=seed, load_policy=load_policy,
        action_mask_key=env_factory.action_mask_key(observation_space, action_space),
        learner={"precision": options.precision, "compile": options.compile, "compile_mode": options.compile_mode, "group": group,
                 "max_env_steps": settings.train.max_env_steps, "max_time_s": settings.train.max_time_s},
    )
    return dataclasses.replace(algorithm.build(parts), epoch_length=settings.train.epoch_length or algorithm.epoch_length)


def _network_config(settings: Settings, algorithm: Algorithm) -> dict[str, Any]:
    """The policy group's config with the algorithm's choices where it left null (e.g. activation)."""
    network = OmegaConf.to_container(settings.policy, resolve=True)
    network.pop("core_inputs", None)  # the env factory's business: they arrive as observation keys
    for key, value in algorithm.network_defaults.items():
        if key in network and network[key] is None:
            network[key] = value
    return network


def learner_threads(settings: Settings) -> int:
    """The torch threads of a learner's process: `torch_threads` as set, or (null) the cores the actors
    leave it: one, except for an algorithm whose actors wait while it learns (PPO), where no actor runs
    during an update and the learner takes every core of this machine (divided among the learners).
    Reproducible mode keeps one, since results depend on the thread count and a machine's cores must
    not change them."""
    t = settings.train
    if t.torch_threads is not None:
        return t.torch_threads
    algorithm, _ = _target_and_arguments("algorithm", {"_target_": settings.algorithm._target_})
    waits = isinstance(algorithm, type) and issubclass(algorithm, Algorithm) and algorithm.actors_wait_for_learner
    if settings.runner.get("reproducible") or not waits:
        return 1
    return max(1, available_cores() // t.learner.num_learners)


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def learner_device(device: str, rank: int, world_size: int) -> str:
    """The device of learner `rank`: `device` itself for one learner; with several on CUDA, GPU
    `rank` of this machine (or of what CUDA_VISIBLE_DEVICES shows a Ray learner: its own GPU)."""
    parsed = torch.device(device)
    if world_size == 1 or parsed.type != "cuda":
        return device
    return f"cuda:{rank % max(torch.cuda.device_count(), 1)}"


def actors_share(n_actors: int, rank: int, world_size: int) -> slice:
    """Which of the run's `n_actors` actors belong to learner `rank`: contiguous shares, the first
    `n_actors % world_size` learners one actor more."""
    base, extra = divmod(n_actors, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def _actors_factory(settings: Settings, algorithm: Algorithm, env_factory: EnvFactory, rank: int = 0, world_size: int = 1):
    """`make_actors(policy=..., n_rollout_steps=..., **overrides)` for the runner group's class: with
    several learners, learner `rank`'s share of the actors, with their seeds (so no two learners'
    actors collect the same episodes)."""
    cls, options = _target_and_arguments("runner", settings.runner)
    seed = settings.train.seed
    n_actors = options.get("n_actors", 1)
    if "envs_per_actor" in options and options["envs_per_actor"] is None:
        options["envs_per_actor"] = algorithm.envs_per_actor
    if options.get("actor_env_seeds", 0) is None:
        options["actor_env_seeds"] = derive_seeds(seed, "actor_env", n_actors)
    if options.get("actor_agent_seeds", 0) is None:
        options["actor_agent_seeds"] = derive_seeds(seed, "actor_agent", n_actors)
    if world_size > 1 and "n_actors" in options:
        share = actors_share(n_actors, rank, world_size)
        options["n_actors"] = share.stop - share.start
        options["first_actor"], options["run_actors"] = share.start, n_actors
        for key in ("actor_env_seeds", "actor_agent_seeds"):
            if options.get(key) is not None:
                options[key] = list(options[key])[share]

    def make_actors(**arguments: Any):
        return _construct("runner", cls, **({"env_factory": env_factory} | options | arguments))

    return make_actors


def _replay_buffer_factory(settings: Settings, rank: int = 0):
    """`make_replay_buffer(item_specs=...)` for the replay_buffer group's class, its seed derived
    from the master seed where the config left it null (and from the learner's rank beyond the first)."""
    cls, options = _target_and_arguments("replay_buffer", settings.replay_buffer)
    if options.get("seed", 0) is None:
        options["seed"] = derive_seed(settings.train.seed, "replay_buffer" if rank == 0 else f"replay_buffer/{rank}")
    elif rank:
        options["seed"] = derive_seed(options["seed"], f"replay_buffer/{rank}")
    return functools.partial(_construct, "replay_buffer", cls, **options)


def build_trackers(loggers: dict[str, Any] | None, run_dir: Path, config: dict[str, Any]) -> list[Any]:
    """One writer per chosen `logger.<name>` (`+logger=mlflow`): `cls(run_dir=..., config=..., **its keys)`."""
    trackers = []
    for name, options in (loggers or {}).items():
        cls, arguments = _target_and_arguments(f"logger.{name}", options)
        trackers.append(_construct(f"logger.{name}", cls, run_dir=run_dir, config=config, **arguments))
    return trackers
