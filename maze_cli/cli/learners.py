"""`learner.num_learners` > 1: learners 1..N-1 started beside this process (learner 0), checked first.

They run as processes of this machine, or as Ray actors when the runner's actors are Ray actors
(maze_cli/parallel/learners.py holds both kinds); what each runs, `prepare_learner` then
`follow_learner`, builds its run as learner 0's is built.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from maze_cli.checkpoint import follower_state, restore_follower_state
from maze_cli.cli.build import build_run, check_env, learner_threads, trusted_targets
from maze_cli.cli.settings import Settings, register_configs, validate
from maze_cli.contract import Loop
from maze_cli.distributed import EPOCH_END, SNAPSHOT, STOP, LearnerGroup, backend_for
from maze_cli.errors import ConfigError
from maze_cli.parallel.learners import LearnerBody, LearnerProcesses, LearnerTask, RayLearners
from maze_cli.parallel.ray_backend import RayDistributedActors
from maze_cli.parallel.ray_cluster import connect
from maze_cli.seeding import derive_seed, deterministic_torch, seed_everything
from maze_cli.start_methods import default_start_method

log = logging.getLogger("maze_cli")


@dataclass
class PreparedLearner:
    """A learner's settings and env, built before it joins the group (a failure here is reported
    while learner 0 still waits for it to be ready, not as a broken collective)."""

    task: LearnerTask
    settings: Settings
    env: tuple[Any, Any, Any]  # env factory, observation space, action space


def prepare_learner(task: LearnerTask) -> PreparedLearner:
    """Learner `task.group.rank` > 0, first part: the run's settings and env from the config."""
    register_configs()
    settings = validate(OmegaConf.create(task.config), [])
    if settings.runner.get("reproducible"):
        deterministic_torch()
    torch.set_num_threads(learner_threads(settings))
    env = check_env(settings)
    seed_everything(derive_seed(settings.train.seed, f"learner/{task.group.rank}"))
    return PreparedLearner(task, settings, env)


def follow_learner(prepared: PreparedLearner) -> None:
    """Learner `rank` > 0, second part: join the group, build its run (its share of the actors), take
    learner 0's state and follow learner 0 until it says stop."""
    task, settings = prepared.task, prepared.settings
    group = LearnerGroup(task.group)
    try:
        run = build_run(settings, *prepared.env, trusted_targets(task.config), settings.train.trust_checkpoint, group)
        start = group.broadcast_object()
        run.learner.load_state_dict(start["learner"])
        if start["resume"] is not None:  # a reproducible run's resume: this learner's actors go on as they were
            restore_follower_state(run, start["resume"][task.group.rank - 1])
        with run.runner:
            run.runner.broadcast_updated_policy(run.learner.policy.state_dict())
            follow(run.loop, group, lambda: follower_state(run, settings.train.checkpoint.replay_buffer))
    finally:
        group.close()


BODY = LearnerBody(prepare_learner, follow_learner)  # what learners 1..N-1 run, in processes or Ray actors


def start_other_learners(settings: Settings, config: dict[str, Any], closing: contextlib.ExitStack) -> LearnerGroup | None:
    """Start learners 1..N-1, wait until they join, and return this process's place among them
    (learner 0); None for one learner. They are stopped when `closing` closes."""
    options = settings.train.learner
    if options.num_learners == 1:
        return None
    on_ray = _runs_on_ray(settings)
    check_learners(settings, on_ray)
    backend = backend_for(settings.train.device)
    if on_ray:
        _connect_to_ray(settings, closing)
        peers = closing.enter_context(RayLearners(config, BODY, options.num_learners, options.collective_timeout_s, backend,
                                                  options.num_cpus_per_learner, options.num_gpus_per_learner))
    else:
        peers = closing.enter_context(LearnerProcesses(config, BODY, options.num_learners, options.collective_timeout_s, backend,
                                                       settings.runner.get("start_method") or default_start_method()))
    peers.wait_ready(timeout_s=max(120.0, options.collective_timeout_s))
    group = LearnerGroup(peers.spec, store=peers.store, explain=peers.failure)
    closing.callback(group.close)
    log.info(f"learner.num_learners={options.num_learners}: {', '.join(peers.describe())} joined learner 0 (this process)")
    return group


def _connect_to_ray(settings: Settings, closing: contextlib.ExitStack) -> None:
    """Connect to Ray with room for the actors and the other learners; a Ray this run started is
    shut down when `closing` closes, last, after the learners and every actor are gone."""
    runner, options = settings.runner, settings.train.learner
    actors_cpus = runner.get("n_actors", 1) * runner.get("num_cpus_per_actor", 1.0)
    learners_cpus = (options.num_learners - 1) * options.num_cpus_per_learner
    others = f"{options.num_learners - 1} learner{'s' if options.num_learners > 2 else ''} beside this one"
    if connect(runner.get("address"), actors_cpus + learners_cpus, f"{others} and {runner.get('n_actors', 1)} actors"):
        import ray  # an optional extra, there since connect() succeeded

        closing.callback(ray.shutdown)


def _runs_on_ray(settings: Settings) -> bool:
    """Whether the runner's actors are Ray actors (then so are the learners beside learner 0)."""
    try:
        return issubclass(get_class(settings.runner._target_), RayDistributedActors)
    except Exception:  # noqa: BLE001 - a runner class that cannot be imported fails later with its own message
        return False


def check_learners(settings: Settings, on_ray: bool = False) -> None:
    """`learner.num_learners` fits the run and the machine: each learner needs an actor of its own,
    and on CUDA a GPU of its own: one of this machine's, or with Ray learners one Ray gives it (the
    cluster's GPUs are checked when they are placed). One line naming the key, before anything starts."""
    options = settings.train.learner
    n = options.num_learners
    n_actors = settings.runner.get("n_actors")
    if n_actors is not None and n_actors < n:
        raise ConfigError(f"learner.num_learners={n}: each learner needs actors of its own, and runner.n_actors={n_actors}; "
                          f"set runner.n_actors to {n} or more (they are shared out among the learners)")
    if torch.device(settings.train.device).type != "cuda":
        return
    if on_ray:
        if options.num_gpus_per_learner <= 0:
            raise ConfigError(f"learner.num_learners={n} with device={settings.train.device} and runner=ray: each learner's Ray "
                              f"actor needs a GPU; set learner.num_gpus_per_learner=1")
        return
    if torch.cuda.device_count() < n:
        raise ConfigError(f"learner.num_learners={n} with device={settings.train.device}: each learner needs a GPU of its own "
                          f"and this machine has {torch.cuda.device_count()}; use learner.num_learners={torch.cuda.device_count()}")


def follow(loop: Loop, group: LearnerGroup, checkpoint_state: Callable[[], Any] | None = None) -> None:
    """What a learner other than learner 0 does: iterate in step with it (gradients are averaged
    inside each update) until it says stop; at each epoch's end send it this epoch's episodes and
    actor stats, which its row counts, and, when it asks (SNAPSHOT: a checkpoint of a reproducible
    run), this learner's `checkpoint_state()`."""
    while True:
        group.sum([loop.iteration()])
        decision = group.decide()
        if decision == EPOCH_END:
            stats = loop.actor_stats
            group.gather_objects({event: list(stats.values(event)) for event in stats.events()})
            stats.clear()
            loop.learner_stats.clear()  # learner 0's metrics stand for all: the weights are the same
            decision = group.decide()
            if decision == SNAPSHOT:
                group.gather_objects(None if checkpoint_state is None else checkpoint_state())
                decision = group.decide()
        if decision == STOP:
            return
