"""The loop of every off-policy algorithm (SAC, TD3): workers fill a replay buffer, the learner
samples from it at a fixed replay ratio; and the run such an algorithm builds around its learner."""

from __future__ import annotations

import time
from typing import Any

from maze_cli.algorithms.base import Components, Run
from maze_cli.errors import ConfigError
from maze_cli.learner import Learner
from maze_cli.parallel.workers_with_buffer import BaseDistributedWorkersWithBuffer, initial_sampling_policy_or_random
from maze_cli.policies.blueprint import initial_sampling_policy


def check_single_agent(parts: Components, algorithm: str) -> None:
    """A replay buffer holds one agent's transitions: a multi-agent env is refused in one line."""
    if parts.env_factory.agents:  # finished agents' steps are no transitions for the buffer
        raise ConfigError(f"algorithm={algorithm}: a multi-agent (PettingZoo) env trains with algorithm=impala, appo or ppo; "
                          f"{algorithm.upper()}'s replay buffer takes single-agent envs only")


def check_feed_forward(policy: Any, parts: Components, algorithm: str) -> None:
    if policy.is_recurrent:
        raise ConfigError(f"algorithm={algorithm} takes feed-forward policy networks only; policy._target_="
                          f"{parts.network['_target_']} is recurrent (use algorithm=impala, appo or ppo for a recurrent core)")


def replay_run(parts: Components, learner: Learner, hp: Any, blueprint: dict[str, Any],
               split_rollouts_into_transitions: bool = True, n_step: int = 1) -> Run:
    """The run of an off-policy algorithm: actors that step their envs one by one (no autoreset
    steps, so every step is a transition) and fill the replay buffer, first with the initial
    sampling policy (`hp.initial_sampling_policy`: uniform random, a checkpoint or a class), and the
    replay loop. `hp` has the replay keys: n_rollout_steps, rollouts_per_iteration, batch_size,
    initial_buffer_size, replay_ratio (and gamma, for `n_step` > 1: n-step transitions)."""
    policy = learner.policy
    initial = initial_sampling_policy(hp.initial_sampling_policy, parts.observation_space, parts.action_space, parts.load_policy)
    one_by_one = parts.env_factory.without_vectorization()  # no autoreset steps: every step is a transition
    actors = parts.make_actors(policy=policy, n_rollout_steps=hp.n_rollout_steps, env_factory=one_by_one,
                               batch_size=hp.rollouts_per_iteration, initial_policy=initial_sampling_policy_or_random(policy, initial))
    workers = BaseDistributedWorkersWithBuffer(actors, parts.make_replay_buffer, batch_size=hp.batch_size,
                                               initial_buffer_size=hp.initial_buffer_size,
                                               split_rollouts_into_transitions=split_rollouts_into_transitions,
                                               n_step=n_step, gamma=hp.gamma if n_step > 1 else 1.0)
    return Run(ReplayLoop(workers, learner, hp.replay_ratio), workers, learner, blueprint)


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
