"""Workers that fill a replay buffer: the off-policy half of maze_cli.

They reuse DistributedActors (the same actor loop and, for subprocesses, the same shared-memory
transport): a worker is an actor whose rollouts go into a replay buffer instead of straight to the
learner. Subprocess workers keep collecting while the learner updates, up to the queue bound.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.buffers import ReplayBuffer, make_replay_buffer
from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.parallel.sequential import SequentialDistributedActors
from maze_cli.parallel.subproc import SubprocDistributedActors
from maze_cli.policies.random_policy import RandomPolicy
from maze_cli.records import Rollout, TensorSpec, Transitions
from maze_cli.stats.aggregator import EpochStatsAggregator, LogStatsLevel


@dataclass
class SampledBatch:
    """What `sample_batch` hands the learner: transitions plus what prioritized replay needs back."""

    transitions: Transitions
    indices: np.ndarray  # buffer items sampled, to update their priorities
    weights: torch.Tensor  # importance weight per transition (ones for uniform replay)
    steps_per_item: int  # transitions per buffer item (1, or n_rollout_steps without splitting)


def _item_specs(spec, split: bool) -> dict[str, TensorSpec]:
    """Fields of one buffer item: a transition, or one env's whole rollout."""
    scalar = {"reward": TensorSpec((), torch.float32), "terminated": TensorSpec((), torch.bool)}
    if split:
        items = {f"obs/{k}": s for k, s in spec.observations.items()}
        items |= {f"next_obs/{k}": s for k, s in spec.observations.items()}
        return items | {"action": spec.action} | scalar
    T = spec.n_steps

    def seq(s: TensorSpec, n: int = T) -> TensorSpec:
        return TensorSpec((n, *s.shape), s.dtype)

    items = {f"obs/{k}": seq(s, T + 1) for k, s in spec.observations.items()}
    items |= {f"final_obs/{k}": seq(s) for k, s in spec.observations.items()}
    items |= {"action": seq(spec.action), "truncated": seq(TensorSpec((), torch.bool))}
    return items | {k: seq(s) for k, s in scalar.items()}


class BaseDistributedWorkersWithBuffer(abc.ABC):
    """The base class for all distributed workers with buffer.

    :param env_factory: builds one env.
    :param worker_policy: the policy the workers act with once the learner broadcasts it.
    :param n_rollout_steps: steps per worker rollout.
    :param n_workers: number of workers.
    :param batch_size: items per `sample_batch` (transitions, or whole rollouts without splitting).
    :param rollouts_per_iteration: rollouts added to the buffer by each `collect_rollouts`.
    :param initial_sampling_policy: acts until the first broadcast (None: uniform random).
    :param replay_buffer_size: buffer capacity in items.
    :param initial_buffer_size: transitions `init_replay_buffer` collects before learning.
    :param split_rollouts_into_transitions: store single transitions (True) or whole rollouts.
    :param env_instance_seeds: one env seed per worker.
    :param replay_buffer_seed: seeds the buffer's sampling.
    :param backend_options: passed on to the backend's DistributedActors (e.g. max_restarts,
        queue_out_of_sync_factor, start_method, or Ray's address and resources).
    """

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        worker_policy: nn.Module,
        n_rollout_steps: int,
        n_workers: int,
        batch_size: int,
        rollouts_per_iteration: int,
        initial_sampling_policy: nn.Module | None,
        replay_buffer_size: int,
        initial_buffer_size: int,
        split_rollouts_into_transitions: bool,
        env_instance_seeds: list[int] | None,
        replay_buffer_seed: int,
        envs_per_worker: int = 1,
        worker_agent_seeds: list[int] | None = None,
        replay_buffer: str = "uniform",
        prioritized: dict | None = None,
        backend_options: dict | None = None,
    ):
        self.batch_size = batch_size
        self.initial_buffer_size = initial_buffer_size
        self.split = split_rollouts_into_transitions
        initial = initial_sampling_policy or RandomPolicy(worker_policy.observation_space, worker_policy.action_space)
        # Envs one by one: no autoreset steps, so every step is a transition for the buffer (the
        # replay ratio makes the learner, not env stepping, the bottleneck of off-policy training).
        if hasattr(env_factory, "without_vectorization"):
            env_factory = env_factory.without_vectorization()
        self.workers = self._make_workers(
            env_factory=env_factory, policy=worker_policy, n_rollout_steps=n_rollout_steps, n_actors=n_workers,
            batch_size=rollouts_per_iteration, envs_per_actor=envs_per_worker, actor_env_seeds=env_instance_seeds,
            actor_agent_seeds=worker_agent_seeds, initial_policy=initial, **(backend_options or {}),
        )
        specs = _item_specs(self.workers.rollout_spec, self.split)
        self.replay_buffer: ReplayBuffer = make_replay_buffer(replay_buffer, replay_buffer_size, specs, replay_buffer_seed, **(prioritized or {}))
        self.env_steps = 0

    @abc.abstractmethod
    def _make_workers(self, **kwargs) -> DistributedActors:
        """The actors that do the collecting (sequential, subprocess, ...)."""

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.workers.start()

    def stop(self) -> None:
        self.workers.stop()

    def __enter__(self) -> "BaseDistributedWorkersWithBuffer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- data flow -----------------------------------------------------------------------------
    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Publish new worker weights; the first broadcast also retires the initial sampling policy."""
        self.workers.broadcast_updated_policy(state_dict)

    def collect_rollouts(self) -> tuple[float, float, float]:
        """Move `rollouts_per_iteration` finished rollouts into the buffer; returns
        (queue size before, queue size after, seconds spent dequeuing)."""
        batch, before, after, dequeue_s = self.workers.collect_outputs("cpu")
        self._add(batch)
        return before, after, dequeue_s

    def init_replay_buffer(self) -> None:
        """Collect with the initial sampling policy until the buffer holds `initial_buffer_size` transitions."""
        while self.env_steps < self.initial_buffer_size:
            self.collect_rollouts()

    def _add(self, batch: Rollout) -> None:
        self.env_steps += batch.rewards.numel()
        if self.split:
            t = Transitions.from_rollout(batch)
            items = {f"obs/{k}": v for k, v in t.observations.items()}
            items |= {f"next_obs/{k}": v for k, v in t.next_observations.items()}
            items |= {"action": t.actions, "reward": t.rewards, "terminated": t.terminated}
        else:  # one item per env column: time-major [T, B] -> [B, T]
            items = {f"obs/{k}": v.transpose(0, 1) for k, v in batch.observations.items()}
            items |= {f"final_obs/{k}": v.transpose(0, 1) for k, v in batch.final_observations.items()}
            items |= {
                "action": batch.actions.transpose(0, 1), "reward": batch.rewards.transpose(0, 1),
                "terminated": batch.terminated.transpose(0, 1), "truncated": batch.truncated.transpose(0, 1),
            }
        self.replay_buffer.add(items)

    def sample_batch(self, learner_device: str) -> SampledBatch:
        """`batch_size` items from the buffer as transitions on the learner's device."""
        items, indices, weights = self.replay_buffer.sample(self.batch_size)

        def group(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in items.items() if k.startswith(prefix)}

        if self.split:
            transitions = Transitions(group("obs/"), items["action"], items["reward"], group("next_obs/"), items["terminated"])
            steps = 1
        else:
            def tm(v: torch.Tensor) -> torch.Tensor:
                return v.transpose(0, 1)

            rollout = Rollout(
                observations={k: tm(v) for k, v in group("obs/").items()}, actions=tm(items["action"]),
                behaviour_logp=torch.zeros_like(tm(items["reward"])), rewards=tm(items["reward"]), terminated=tm(items["terminated"]),
                truncated=tm(items["truncated"]), autoreset=torch.zeros_like(tm(items["terminated"])), final_observations={k: tm(v) for k, v in group("final_obs/").items()},
                policy_version=torch.zeros(len(indices), dtype=torch.int64),
            )
            transitions = Transitions.from_rollout(rollout)
            steps = rollout.n_steps
            weights = weights.repeat(steps)  # time-major flattening: step t of every item, then t+1
        return SampledBatch(transitions.to(learner_device), indices, weights.to(learner_device), steps)

    def update_priorities(self, batch: SampledBatch, td_errors: torch.Tensor) -> None:
        """Feed |TD error| back to a prioritized buffer (per item: the mean over its steps)."""
        errors = td_errors.detach().abs().reshape(batch.steps_per_item, -1).mean(0)
        self.replay_buffer.update_priorities(batch.indices, errors.cpu().numpy())

    # -- stats ---------------------------------------------------------------------------------
    def get_epoch_stats_aggregator(self) -> EpochStatsAggregator:
        return self.workers.get_epoch_stats_aggregator()

    def get_stats_value(self, event: str, level: LogStatsLevel = LogStatsLevel.EPOCH, name: str | None = None) -> float | None:
        return self.workers.get_stats_value(event, level, name)


class SequentialDistributedWorkersWithBuffer(BaseDistributedWorkersWithBuffer):
    """Workers in the learner's process, collecting only when asked (deterministic)."""

    def _make_workers(self, **kwargs) -> DistributedActors:
        return SequentialDistributedActors(**kwargs)


class SubprocDistributedWorkersWithBuffer(BaseDistributedWorkersWithBuffer):
    """Workers in subprocesses that keep collecting while the learner updates (up to the queue bound)."""

    def _make_workers(self, **kwargs) -> DistributedActors:
        return SubprocDistributedActors(**kwargs)

    def alive_pids(self) -> list[int]:
        return self.workers.alive_pids()


class RayDistributedWorkersWithBuffer(BaseDistributedWorkersWithBuffer):
    """Workers as Ray actors (see RayDistributedActors for the Ray options)."""

    def _make_workers(self, **kwargs) -> DistributedActors:
        from maze_cli.parallel.ray_backend import RayDistributedActors

        return RayDistributedActors(**kwargs)
