"""DistributedActors: actors collect rollouts in parallel; the learner takes them in batches.

The base class holds what every backend shares: the rollout spec, seeds, epoch stats, policy
versions, the one collect loop, and failure handling, whose decisions (restart budget, a restarted
actor's seeds, the silence clock behind `rollout_timeout_s`) are its `ActorSupervisor`'s. A backend
only decides where the actors run and how rollouts and weights travel; it reports what went wrong
through `_actor_failed` and knows how to replace one actor (`_restart_actor`).
"""

from __future__ import annotations

import abc
import copy
import inspect
import logging
import time
from typing import Any, Callable, TypeVar

import gymnasium as gym
import torch
from torch import nn

from maze_cli.envs.info_stats import raise_error
from maze_cli.envs.source import EnvSource, as_env_source
from maze_cli.envs.spaces import action_spec, observation_specs
from maze_cli.errors import first_line
from maze_cli.parallel.schedule import Job, RolloutSchedule
from maze_cli.parallel.supervision import ActorFailure, ActorSupervisor
from maze_cli.records import Rollout, RolloutInfo, RolloutSpec, TensorSpec
from maze_cli.stats.aggregator import EpochStatsAggregator, LogStatsLevel

log = logging.getLogger("maze_cli")
_Record = TypeVar("_Record")  # a rollout, or where a backend keeps one (a slot)


class DistributedActors(abc.ABC):
    """The base class for all distributed actors.

    :param env_factory: builds one env (picklable for the subprocess backend): an `EnvSource` such as
        `EnvFactory`, or a plain callable returning a gymnasium.Env (`as_env_source` wraps it).
    :param policy: the policy module; each actor works on its own copy.
    :param n_rollout_steps: steps per rollout (T).
    :param n_actors: number of actors.
    :param batch_size: rollouts per learner batch; a batch has `batch_size * envs_per_actor` columns.
    :param envs_per_actor: envs each actor steps with one batched forward pass.
    :param actor_env_seeds: one env seed per actor.
    :param actor_agent_seeds: one sampling seed per actor.
    :param initial_policy: acted with until the first broadcast (e.g. uniform random exploration).
    :param max_restarts: failed actors restarted per run (fresh envs, seeds derived from the actor's
        seed and its restart count, the lost rollout dropped); one more failure ends the run.
    :param rollout_timeout_s: an actor that delivered no rollout for this long is treated as failed
        (None: never). Every backend shares this clock (`_check_silent`); one that cannot watch from
        outside (sequential) enforces it its own way but reports through the same `_failure`.
    :param max_policy_lag: rollouts collected more than this many policy versions behind the learner
        are dropped on arrival (their episodes still count in the stats; the `dropped_rollouts` stat
        counts them). None: every rollout is used.
    :param on_policy: actors start a rollout only when the learner asks for it, right after a
        broadcast: `batch_size` rollouts per policy version, so every batch holds the current version
        only (policy lag 0, as PPO needs) and actors idle while the learner updates (the
        `actor_idle_frac` stat says how much). Implies `max_policy_lag=0`.
    :param reproducible: collect on a fixed schedule (`maze_cli.parallel.schedule`): actor g % n_actors
        collects rollout g with the version the learner held when it started to collect the batch before
        (policy lag exactly 1; 0 with `on_policy`), and each batch is taken in the order of g, so that a
        run depends on its seeds alone, whatever the timing. Needs `max_policy_lag` >= 1 unless `on_policy`.
    """

    def __init__(
        self,
        env_factory: EnvSource | Callable[[], gym.Env],
        policy: nn.Module,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        envs_per_actor: int = 1,
        actor_env_seeds: list[int] | None = None,
        actor_agent_seeds: list[int] | None = None,
        initial_policy: nn.Module | None = None,
        max_restarts: int = 0,
        rollout_timeout_s: float | None = None,
        max_policy_lag: int | None = None,
        on_policy: bool = False,
        reproducible: bool = False,
        first_actor: int = 0,
        run_actors: int | None = None,
    ):
        if n_actors < 1 or batch_size < 1 or n_rollout_steps < 1 or envs_per_actor < 1:
            raise ValueError("n_actors, batch_size, n_rollout_steps and envs_per_actor must be at least 1")
        self.env_factory = as_env_source(env_factory)
        # The actors' template: a CPU copy, so a learner on another device never leaks into actors.
        self.policy = copy.deepcopy(policy).cpu()
        self.n_rollout_steps = n_rollout_steps
        self.n_actors = n_actors
        self.batch_size = batch_size
        self.envs_per_actor = envs_per_actor
        self.actor_env_seeds = self._check_seeds("actor_env_seeds", actor_env_seeds, list(range(n_actors)))
        self.actor_agent_seeds = self._check_seeds("actor_agent_seeds", actor_agent_seeds, list(range(1000, 1000 + n_actors)))
        self.initial_policy = initial_policy
        self.first_actor = first_actor
        self.run_actors = n_actors if run_actors is None else run_actors
        if not 0 <= first_actor <= self.run_actors - n_actors:
            raise ValueError(f"actors {first_actor}..{first_actor + n_actors - 1} are not among the run's {self.run_actors}")
        if max_policy_lag is not None and max_policy_lag < 0:
            raise ValueError("max_policy_lag must be at least 0 (or None: no limit)")
        self.on_policy = on_policy
        self.max_policy_lag = 0 if on_policy else max_policy_lag
        self.schedule = RolloutSchedule(n_actors, batch_size, lag=0 if on_policy else 1) if reproducible else None
        if self.schedule and self.max_policy_lag is not None and self.max_policy_lag < self.schedule.lag:
            raise ValueError(f"reproducible mode collects every rollout {self.schedule.lag} policy version behind the learner, "
                             f"and max_policy_lag={self.max_policy_lag} would drop them all: set it to 1 or more")
        self._diverged = False  # reproducible mode: a restarted actor made the run depend on more than its seeds
        self._cannot_save: str | None = None  # reproducible mode: why the actors' state cannot go into a checkpoint
        self._resume: dict | None = None  # reproducible mode: the state a resumed run's actors start from
        self.supervisor = ActorSupervisor(self.actor_env_seeds, self.actor_agent_seeds, max_restarts, rollout_timeout_s)
        self.rollout_timeout_s = rollout_timeout_s
        self.rollout_spec = self._rollout_spec(policy)
        self.policy_version = 0
        self.epoch_stats = EpochStatsAggregator()

    def _check_seeds(self, name: str, seeds: list[int] | None, default: list[int]) -> list[int]:
        if seeds is None:
            return default
        if len(seeds) != self.n_actors:
            raise ValueError(f"{name} has {len(seeds)} seeds; give one per actor ({self.n_actors})")
        return [int(s) for s in seeds]

    def run_envs(self, index: int) -> tuple[range, int]:
        """Actor `index`'s envs as run-wide ids, and the number of envs of the whole run."""
        first = (self.first_actor + index) * self.envs_per_actor
        return range(first, first + self.envs_per_actor), self.run_actors * self.envs_per_actor

    def _rollout_spec(self, policy: nn.Module) -> RolloutSpec:
        """Record shapes from the policy: its spaces, and its recurrent state per env (none for
        feed-forward policies), which each record keeps as it was at the rollout's start."""
        return RolloutSpec(
            observations=observation_specs(policy.observation_space),
            action=action_spec(policy.action_space),
            n_steps=self.n_rollout_steps,
            n_envs=self.envs_per_actor,
            state=tuple(TensorSpec(tuple(s.shape[1:]), s.dtype) for s in policy.initial_state(1)),
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the actors; each one's silence clock starts once they all are up."""
        self._start_actors()
        self.supervisor.started()

    @abc.abstractmethod
    def _start_actors(self) -> None:
        """Start the actors (the backend's part of `start`)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the actors and release their resources; safe to call twice."""

    def __enter__(self) -> "DistributedActors":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- data flow -----------------------------------------------------------------------------
    @abc.abstractmethod
    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Publish the newest policy version to the actors."""

    def collect_outputs(self, learner_device: str) -> tuple[Rollout, float, float, float]:
        """Take `batch_size` rollouts; return (time-major batch `[T, batch_size*envs_per_actor, ...]`,
        queue size before, queue size after, seconds spent dequeuing).

        The one loop of every backend: each supplies only how a rollout arrives (`_next_rollout`), how
        many wait (`_queue_size`), how a scheduled one is asked for (`_request_job`, `_wait_for_next_batch`)
        and, where it keeps rollouts in slots, how a slot reads and is given back (`_rollout_of`, `_release`)."""
        self._check_actors()
        if self.schedule:
            for job in self.schedule.due(self.policy_version):
                self._request_job(job)
        queue_before = self._queue_size() + (len(self._arrived) if self.schedule else 0)
        start = time.perf_counter()
        records = self._take_batch()
        dequeue_time = time.perf_counter() - start
        batch = Rollout.cat([self._rollout_of(record) for record in records]).to(learner_device)
        for record in records:
            self._release(record)
        return batch, float(queue_before), float(self._queue_size()), dequeue_time

    def _take_batch(self) -> list[_Record]:
        """The next batch's records: the schedule's next batch whole, or the first `batch_size` rollouts
        to arrive that are recent enough (`_record_rollout` drops the others)."""
        if self.schedule:
            self._wait_for_next_batch()
            return self._take_arrived_batch()
        records: list[_Record] = []
        while len(records) < self.batch_size:
            arrived = self._next_rollout(len(records))
            if arrived is None:
                continue
            record, info = arrived
            if self._record_rollout(info):
                records.append(record)
            else:
                self._release(record)
        return records

    def _check_actors(self) -> None:
        """Before a batch is taken: recover actors that died or went silent (where the backend can see it)."""

    @abc.abstractmethod
    def _next_rollout(self, received: int) -> tuple[_Record, RolloutInfo] | None:
        """The next rollout in, waiting for it (`received` of this batch are in already); None after a
        failure was recovered from, or a message that brought no rollout."""

    @abc.abstractmethod
    def _queue_size(self) -> int:
        """Rollouts that have arrived and wait for the learner."""

    @abc.abstractmethod
    def _request_job(self, job: Job) -> None:
        """Reproducible mode: ask the job's actor for its rollout, with the job's policy version."""

    @abc.abstractmethod
    def _wait_for_next_batch(self) -> None:
        """Reproducible mode: wait until every rollout of `schedule.next_batch` is in `self._arrived` (not taken)."""

    def _rollout_of(self, record: _Record) -> Rollout:
        """The rollout a record holds (the record itself, unless the backend keeps rollouts in slots)."""
        return record

    def _release(self, record: _Record) -> None:
        """The learner is done with a record (a backend with slots gives the slot back)."""

    def _record_rollout(self, info: RolloutInfo) -> bool:
        """Account one received rollout in the epoch stats (and as a sign of life of its actor);
        False if it is to be dropped, being older than `max_policy_lag` versions."""
        self.supervisor.heard_from(info.actor_index)
        stats = self.epoch_stats
        stats.extend("episode_return", info.episode_returns)
        stats.extend("episode_length", info.episode_lengths)
        raise_error(info.info_error)
        for event, values in info.episode_info.items():  # env statistics: env/<key>, is_success
            stats.extend(event, values)
        lag = self.policy_version - info.policy_version
        if self.max_policy_lag is not None and lag > self.max_policy_lag:
            stats.add("dropped_rollouts", 1)
            return False
        stats.add("env_steps", info.env_steps)
        stats.add("policy_lag", lag)
        for name, seconds in info.timings.items():
            stats.add(name, seconds)
        busy = sum(info.timings.get(k, 0.0) for k in ("actor_env_step_s", "actor_inference_s", "actor_record_s"))
        if "actor_wait_s" in info.timings and busy > 0:
            wait = info.timings["actor_wait_s"]
            stats.add("actor_idle_frac", wait / (wait + busy))
        return True

    def _take_arrived_batch(self) -> list[_Record]:
        """Reproducible mode: batch `schedule.next_batch` out of `self._arrived` (job -> (record, info),
        each backend's rollouts in and not yet taken), whole, in the schedule's order."""
        batch = self.schedule.next_batch
        jobs = [job for job in self._arrived if job.batch == batch]
        return self._take_in_order({job.index: self._arrived.pop(job) for job in jobs})

    def _take_in_order(self, arrived: dict[int, tuple[_Record, RolloutInfo]]) -> list[_Record]:
        """Reproducible mode: batch `schedule.next_batch` from its rollouts (by index in the batch, in
        whatever order they arrived; each a record or where the backend keeps it), accounted and
        returned in the order of the schedule."""
        records = []
        for index in range(self.batch_size):
            record, info = arrived[index]
            self._record_rollout(info)  # never dropped: the schedule's lag is within max_policy_lag
            records.append(record)
        self.schedule.taken()
        return records

    # -- a reproducible run's resume -----------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any] | None:
        """Reproducible mode, between two updates: what a resumed run needs to go on as this one does.
        The batch the learner takes next (requested before this update) is waited for, so that no
        request is open; then the schedule's place, that batch's rollouts and every actor's snapshot
        (`Actor.snapshot`: its envs pickled). None where the run cannot be resumed as the same run:
        not reproducible, an actor restarted, or envs that cannot be pickled (said once, in one line)."""
        if self.schedule is None or self._diverged or self._cannot_save:
            return None
        if self.schedule.requested > self.schedule.next_batch:  # (on-policy, nothing is requested between updates)
            self._wait_for_next_batch()
        try:
            snapshots = self._actor_snapshots()
        except ActorFailure:
            raise
        except Exception as err:  # an env pickle refuses: a lock, a handle to a simulator, ...
            self._cannot_save = first_line(err) or type(err).__name__
            log.warning(f"runner.reproducible: the actors' envs cannot be saved ({self._cannot_save}), so a resumed run "
                        f"will not be the one that never stopped")
            return None
        return {"policy_version": self.policy_version, "requested": self.schedule.requested, "consumed": self.schedule.consumed,
                "arrived": self._arrived_rollouts(), "actors": snapshots}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Before `start`: the actors will start from `state` (a `checkpoint_state` of this config)."""
        if self.schedule is None or len(state["actors"]) != self.n_actors:
            raise ValueError("a reproducible run's actor state fits only the same runner config")
        self.schedule.requested, self.schedule.consumed = state["requested"], state["consumed"]
        # The resumed learner publishes its weights before the first collect; that broadcast must be
        # the version the saved run held, which its next requests name.
        self.policy_version = state["policy_version"] - 1
        self._resume = state

    def _resume_snapshot(self, index: int) -> bytes | None:
        """Actor `index`'s saved state, for its first start in a resumed run (a restart starts anew)."""
        if self._resume is None or self.supervisor.actor_restarts[index]:
            return None
        return self._resume["actors"][index]

    def _actor_snapshots(self) -> list[bytes]:
        """Every actor's `Actor.snapshot()`, in actor order, taken while none has a request open."""
        raise NotImplementedError

    def _arrived_rollouts(self) -> list[tuple[Job, Rollout, RolloutInfo]]:
        """The rollouts in and not yet taken (the next batch's), each a copy of its own."""
        return [(job, Rollout.cat([self._rollout_of(record)]), copy.deepcopy(info)) for job, (record, info) in self._arrived.items()]

    # -- failures (the decisions are the supervisor's) -----------------------------------------
    def _actor_failed(self, index: int, details: str) -> None:
        """A backend noticed that actor `index` raised, died or hung: restart it or end the run."""
        self._recover(self.supervisor.failure(index, details))

    def _check_silent(self) -> None:
        """Recover actors that delivered nothing for `rollout_timeout_s` (backends call this while
        the learner waits, and before each collect: the others may keep the queue full while one hangs)."""
        for failure in self.supervisor.silent([self._owes_rollout_since(i) for i in range(self.n_actors)]):
            self._recover(failure)

    def _owes_rollout_since(self, index: int) -> float | None:
        """Since when actor `index` owes the learner a rollout (None: it owes none now, being idle
        on purpose). Actors that always work on one owe it since their last delivery; on-policy
        backends, whose actors idle between requests, say when the open request was taken."""
        return self.supervisor.last_seen[index]

    def _recover(self, failure: ActorFailure) -> None:
        """Restart the failed actor within the budget, or end the run with the failure."""
        self.supervisor.admit(failure)
        index = failure.actor_index
        self.epoch_stats.add("actor_restarts", 1)
        if self.schedule and not self._diverged:
            self._diverged = True
            log.warning(f"runner.reproducible: actor {index} restarts with new seeds, so from this epoch on the run is no "
                        f"longer the one its seed alone gives")
        self._restart_actor(index)
        self.supervisor.heard_from(index)

    def _restart_actor(self, index: int) -> None:
        """Replace actor `index` with a fresh one built with `supervisor.seeds(index)` (the backend's
        part of a restart; its rollouts in flight are dropped)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart actors")

    @property
    def distributed_actors(self) -> "DistributedActors":
        """As a run's runner (`Runner`): the actors are these."""
        return self

    replay_buffer = None  # as a run's runner: rollouts go straight to the learner

    # -- stats ---------------------------------------------------------------------------------
    def get_epoch_stats_aggregator(self) -> EpochStatsAggregator:
        """The aggregator holding this epoch's actor stats (episode returns, lag, timings)."""
        return self.epoch_stats

    def get_stats_value(self, event: str, level: LogStatsLevel = LogStatsLevel.EPOCH, name: str | None = None) -> float | None:
        """One value of the epoch stats, e.g. `get_stats_value("episode_return", name="mean")`, or an
        env statistic: `get_stats_value("env/distance")` (its mean over the epoch's episodes)."""
        if level is not LogStatsLevel.EPOCH:
            raise ValueError("only epoch-level statistics are kept")
        return self.epoch_stats.get(event, name or "mean")


_Init = TypeVar("_Init", bound=Callable[..., None])


def takes_actor_options(init: _Init) -> _Init:
    """For a backend's `__init__(self, <DistributedActors' first five>, <its own options>, **options)`
    that passes `options` on to DistributedActors: its signature becomes its own parameters followed
    by DistributedActors' other options (keyword-only), those it redefines left out. So each shared
    option is written once, in DistributedActors.__init__, while a config check (`inspect.signature`)
    and help() still see every key the backend takes, and a misspelt key is still refused by name."""
    own = inspect.signature(init)
    parameters = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in parameters}
    shared = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
              for name, p in inspect.signature(DistributedActors.__init__).parameters.items() if name not in names]
    init.__signature__ = own.replace(parameters=parameters + shared)
    return init
