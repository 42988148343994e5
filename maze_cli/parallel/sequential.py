"""All actors in the learner's process, one after another: the debugging backend."""

from __future__ import annotations

import signal
import threading
import traceback
from contextlib import contextmanager
from typing import Iterator

import torch

from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.parallel.schedule import Job
from maze_cli.records import Rollout, RolloutInfo


class SequentialDistributedActors(DistributedActors):
    """Runs the same actor loop as the other backends, in process, round robin over the actors.

    Deterministic: the same seeds give the same rollouts and the same learning run. With `reproducible`
    it follows the schedule the other backends follow in that mode (each batch collected with the policy
    of one update before, on PPO the current one), so that its run is theirs.

    Takes DistributedActors' arguments. `rollout_timeout_s` is enforced from inside: nothing else
    runs while an actor collects, so an alarm signal interrupts a rollout that takes longer (only
    in the main thread, so never inside a library's worker thread); the actor is then treated as
    failed like in every other backend.
    """

    def _make_actor(self, index: int) -> Actor:
        env_seed, agent_seed = self.supervisor.seeds(index)
        return Actor(index, self.env_factory, self.policy, self.envs_per_actor, self.n_rollout_steps, env_seed, agent_seed,
                     self.initial_policy, self._resume_snapshot(index), self.run_envs(index))

    def _start_actors(self) -> None:
        self.actors = [self._make_actor(i) for i in range(self.n_actors)]
        self._records = [self.rollout_spec.allocate() for _ in range(self.batch_size)]
        self._next_actor = 0
        # reproducible mode: the weights of the versions open requests were made with, those requests,
        # and the rollouts collected ahead of the learner (only to be saved in a checkpoint)
        self._versions = {0: _copy(self.policy.state_dict())}
        self._jobs: list = []
        self._arrived: dict[Job, tuple[Rollout, RolloutInfo]] = {}
        if self._resume is not None:
            for job, rollout, info in self._resume["arrived"]:
                self._arrived[job] = (self._records[job.index].copy_(rollout), info)
            self._resume = None

    def stop(self) -> None:
        for actor in getattr(self, "actors", []):
            actor.close()
        self.actors = []

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.policy_version += 1
        self._latest = state_dict
        if self.schedule:  # kept for the requests to come; an actor loads a version when its rollout is due
            self._versions[self.policy_version] = _copy(state_dict)
            for old in [v for v in self._versions if v <= self.policy_version - self.schedule.versions_kept]:
                del self._versions[old]
            return
        for actor in self.actors:
            actor.load_policy(state_dict, self.policy_version)

    def _restart_actor(self, index: int) -> None:
        self.actors[index].close()
        self.actors[index] = self._make_actor(index)
        if self.policy_version:
            self.actors[index].load_policy(self._latest, self.policy_version)

    def _next_rollout(self, received: int) -> tuple[Rollout, RolloutInfo] | None:
        """The next actor in turn collects into the batch's `received`-th record, now."""
        record = self._records[received]
        actor = self.actors[self._next_actor]
        self._next_actor = (self._next_actor + 1) % self.n_actors
        return self._collect(actor, record)

    def _collect(self, actor: Actor, record: Rollout) -> tuple[Rollout, RolloutInfo] | None:
        """One rollout of `actor` into `record`; None after its failure was recovered from."""
        try:
            with _deadline(self.rollout_timeout_s):
                return record, actor.collect(record)
        except RolloutTimeout:
            self._recover(self.supervisor.silent_failure(actor.index, self.rollout_timeout_s))
        except Exception:
            self._actor_failed(actor.index, traceback.format_exc())
        return None

    def _queue_size(self) -> int:
        return 0  # nothing is collected ahead of the learner

    def _request_job(self, job: Job) -> None:
        self._jobs.append(job)  # collected when its batch is due: `_wait_for_next_batch`

    def _wait_for_next_batch(self) -> None:
        """Collect the next batch's rollouts now, unless a checkpoint had them collected already."""
        if self._arrived:
            return
        batch, self._jobs = self._jobs[:self.batch_size], self._jobs[self.batch_size:]
        for job, record in zip(batch, self._records):
            arrived = None
            while arrived is None:
                actor = self.actors[job.actor]
                if actor.policy_version != job.version:
                    actor.load_policy(self._versions[job.version], job.version)
                arrived = self._collect(actor, record)
            self._arrived[job] = arrived

    def _actor_snapshots(self) -> list[bytes]:
        return [actor.snapshot() for actor in self.actors]


def _copy(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state_dict of its own (the learner's tensors change in place with every update)."""
    return {k: v.detach().clone() for k, v in state_dict.items()}


class RolloutTimeout(Exception):
    """A rollout in the learner's process ran past `rollout_timeout_s`."""


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise RolloutTimeout in the body once `seconds` pass (a no-op off the main thread)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise RolloutTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
