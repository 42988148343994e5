"""Reproducible mode's fixed schedule of rollouts (`runner.reproducible=true`).

In the asynchronous mode the order in which rollouts arrive, and the policy version each was collected
with, depend on timing. Here both are fixed, as in Cleanba: the learner's batch b holds the rollouts
g = b * batch_size ... (b + 1) * batch_size - 1, rollout g is collected by actor g % n_actors (so each
actor's rollouts follow one another in the order of g), batch b is requested when the learner starts to
collect batch b - lag, with the policy version it holds at that moment, and the learner takes a
batch's rollouts in the order of g, whenever they arrive. With lag 1 the actors collect the next batch
while the learner updates on this one (collection still overlaps learning); with lag 0 (PPO) they
wait for every update. Every random draw then depends on the seed alone, on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    """One scheduled rollout: the `index`-th of batch `batch` (rollout g = batch * batch_size + index),
    collected by `actor` with policy version `version`."""

    batch: int
    index: int
    actor: int
    version: int


class RolloutSchedule:
    """Which actor collects which rollout, with which policy version, and in which order the learner
    takes them. The backends ask it what to request (`due`) and which batch comes next (`next_batch`)."""

    def __init__(self, n_actors: int, batch_size: int, lag: int):
        if lag < 0:
            raise ValueError("lag must be at least 0")
        self.n_actors = n_actors
        self.batch_size = batch_size
        self.lag = lag
        self.requested = 0  # batches requested so far
        self.consumed = 0  # batches the learner has taken

    def due(self, policy_version: int) -> list[Job]:
        """The rollouts to request now, as the learner starts to collect batch `consumed`: every batch
        up to `consumed + lag` not requested yet, with the version the learner holds now."""
        jobs = []
        for batch in range(self.requested, self.consumed + self.lag + 1):
            for index in range(self.batch_size):
                g = batch * self.batch_size + index
                jobs.append(Job(batch, index, g % self.n_actors, policy_version))
        self.requested = max(self.requested, self.consumed + self.lag + 1)
        return jobs

    @property
    def next_batch(self) -> int:
        return self.consumed

    def taken(self) -> None:
        """The learner took batch `consumed`, whole and in order."""
        self.consumed += 1

    @property
    def versions_kept(self) -> int:
        """How many of the newest policy versions a backend keeps for the requests still open: a request
        made now is collected before the learner's `lag + 1`-th broadcast from now (it takes the batch
        first), so lag + 1, and a ring of that many weight buffers indexed by version never overwrites
        one still to be read."""
        return self.lag + 1
