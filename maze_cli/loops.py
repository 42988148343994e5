"""The loops a trainer drives, one iteration at a time: where batches come from, how many updates they
pay for, and when the actors get the new weights. An algorithm builds one around its learner.

- `OnPolicyLoop`: batches of rollouts from the actors (IMPALA, APPO, PPO), one update each.
- `ReplayLoop`: rollouts into a replay buffer, updates sampled from it at a replay ratio (SAC, TD3, DQN).
"""

from __future__ import annotations

import time
from typing import Any

from maze_cli.learner import Learner
from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.parallel.workers_with_buffer import BaseDistributedWorkersWithBuffer


class OnPolicyLoop:
    """One iteration: take a batch of rollouts from the actors, update, broadcast.

    The actors decide which rollouts make a batch: as they come (IMPALA), none older than
    `max_policy_lag` versions (APPO), or only the current version (PPO, `on_policy=True`)."""

    def __init__(self, actors: DistributedActors, learner: Learner):
        self.actors = actors
        self.learner = learner
        self.actor_stats = actors.get_epoch_stats_aggregator()
        self.learner_stats = learner.metrics  # the learner's metrics (tensors until read) and this loop's timings

    def updates(self) -> int:
        return self.learner.updates

    def state_dict(self) -> dict:
        return {}  # everything it carries is the learner's

    def load_state_dict(self, state: dict) -> None:
        pass

    def iteration(self) -> int:
        t0 = time.perf_counter()
        batch, queue_before, _, dequeue_s = self.actors.collect_outputs(self.learner.device)
        t1 = time.perf_counter()
        self.learner.update(batch)
        self.learner.check_finite()
        t2 = time.perf_counter()
        self.actors.broadcast_updated_policy(self.learner.policy.state_dict())
        self.learner_stats.add("queue_size", queue_before)
        self.learner.record_timings(wait_actors_s=t1 - t0, dequeue_s=dequeue_s, learner_s=t2 - t1,
                                    broadcast_s=time.perf_counter() - t2)
        return batch.rewards.numel()


class ReplayLoop:
    """One iteration: move finished rollouts into the buffer, then `replay_ratio` updates per new
    transition, then one broadcast. The first iteration fills the buffer with the initial policy.
    Where the buffer's sampler is prioritized, each update's priorities (the objective's) go back to it."""

    def __init__(self, workers: BaseDistributedWorkersWithBuffer, learner: Learner, replay_ratio: float):
        self.workers = workers
        self.learner = learner
        self.replay_ratio = replay_ratio
        self.prioritized = workers.replay_buffer.sampler.prioritized
        self.actor_stats = workers.get_epoch_stats_aggregator()
        self.learner_stats = learner.metrics  # the learner's metrics (tensors until read) and this loop's timings
        self.credit = 0.0  # updates owed, a fraction of one
        self.learning_steps = 0  # transitions collected since learning started

    def updates(self) -> int:
        return self.learner.updates

    def state_dict(self) -> dict[str, Any]:
        """The replay ratio's bookkeeping: updates owed (a fraction of one) and transitions learned from."""
        return {"credit": self.credit, "learning_steps": self.learning_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.credit, self.learning_steps = float(state["credit"]), int(state["learning_steps"])

    def _collected(self, learning_steps: int, env_steps: int) -> tuple[float, int]:
        """The transitions this iteration's updates are owed for: this learner's, or with several
        learners their mean, so that all of them make the same number of updates (each one a
        collective) and each learner's replay ratio holds on average; and the env steps every
        learner collected (the learner's count, which schedules such as DQN's epsilon follow)."""
        group = self.learner.group
        if group is None:
            return learning_steps, env_steps
        learning, collected = group.sum([learning_steps, env_steps])
        return learning / group.world_size, int(collected)

    def iteration(self) -> int:
        steps_before = self.workers.env_steps
        t0 = time.perf_counter()
        new_steps = 0  # collected for learning (the initial buffer earns no updates)
        if self.workers.env_steps == 0:
            self.workers.init_replay_buffer()
            queue_before = 0.0
        else:
            queue_before, _, _ = self.workers.collect_rollouts()
            new_steps = self.workers.env_steps - steps_before
            self.learning_steps += new_steps
        owed, collected = self._collected(new_steps, self.workers.env_steps - steps_before)
        self.credit += self.replay_ratio * owed
        self.learner.env_steps += collected
        t1 = time.perf_counter()
        sample_s = learn_s = 0.0
        n_updates = int(self.credit)
        self.credit -= n_updates
        for _ in range(n_updates):
            ta = time.perf_counter()
            batch = self.workers.sample_batch(self.learner.device)
            tb = time.perf_counter()
            self.learner.update(batch)
            if self.prioritized:
                self.workers.update_priorities(batch, self.learner.objective.priorities())
            sample_s += tb - ta
            learn_s += time.perf_counter() - tb
        self.learner.check_finite()
        t2 = time.perf_counter()
        if n_updates:
            self.workers.broadcast_updated_policy(self.learner.policy.state_dict())
        self._record(queue_before)
        self.learner.record_timings(wait_actors_s=t1 - t0, sample_s=sample_s, learner_s=learn_s,
                                    broadcast_s=time.perf_counter() - t2)
        return self.workers.env_steps - steps_before

    def _record(self, queue_before: float) -> None:
        stats, buffer = self.learner_stats, self.workers.replay_buffer
        stats.add("queue_size", queue_before)
        stats.add("buffer/size", len(buffer))
        stats.add("buffer/fill", len(buffer) / buffer.capacity)
        if self.learning_steps:
            stats.add("learner/replay_ratio", self.learner.updates / self.learning_steps)
