"""All actors in the learner's process, one after another: the debugging backend."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Iterator

import torch

from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.records import Rollout


class SequentialDistributedActors(DistributedActors):
    """Runs the same actor loop as the other backends, in process, round robin over the actors.

    Deterministic: the same seeds give the same rollouts and the same learning run.

    Takes DistributedActors' arguments. `rollout_timeout_s` is enforced from inside: nothing else
    runs while an actor collects, so an alarm signal interrupts a rollout that takes longer (only
    in the main thread, so never inside a library's worker thread); the actor is then treated as
    failed like in every other backend.
    """

    def _make_actor(self, index: int) -> Actor:
        env_seed, agent_seed = self.restart_seeds(index)
        return Actor(index, self.env_factory, self.policy, self.envs_per_actor, self.n_rollout_steps, env_seed, agent_seed,
                     self.initial_policy)

    def _start_actors(self) -> None:
        self.actors = [self._make_actor(i) for i in range(self.n_actors)]
        self._records = [self.rollout_spec.allocate() for _ in range(self.batch_size)]
        self._next_actor = 0

    def stop(self) -> None:
        for actor in getattr(self, "actors", []):
            actor.close()
        self.actors = []

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.policy_version += 1
        self._latest = state_dict
        for actor in self.actors:
            actor.load_policy(state_dict, self.policy_version)

    def _restart_actor(self, index: int) -> None:
        self.actors[index].close()
        self.actors[index] = self._make_actor(index)
        if self.policy_version:
            self.actors[index].load_policy(self._latest, self.policy_version)

    def collect_outputs(self, learner_device: str) -> tuple[Rollout, float, float, float]:
        start = time.perf_counter()
        for record in self._records:
            while True:
                actor = self.actors[self._next_actor]
                self._next_actor = (self._next_actor + 1) % self.n_actors
                try:
                    with _deadline(self.rollout_timeout_s):
                        info = actor.collect(record)
                    break
                except RolloutTimeout:
                    self._recover(self._silent_failure(actor.index, self.rollout_timeout_s))
                except Exception:
                    self._actor_failed(actor.index, traceback.format_exc())
            self._record_rollout(info)
        batch = Rollout.cat(self._records).to(learner_device)
        return batch, 0.0, 0.0, time.perf_counter() - start


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
