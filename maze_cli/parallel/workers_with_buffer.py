"""Workers that fill a replay buffer: the off-policy half of maze_cli.

`BaseDistributedWorkersWithBuffer` wraps any `DistributedActors` (sequential, subprocess, Ray:
the same actor loop and transports), as TorchRL's collectors take a `replay_buffer=`: a worker is
an actor whose rollouts go into a replay buffer instead of straight to the learner. Subprocess and
Ray workers keep collecting while the learner updates, up to their queue bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from maze_cli.buffers import ReplayBuffer
from maze_cli.envs.source import EnvSource
from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.policies.random_policy import RandomPolicy
from maze_cli.records import Rollout, TensorSpec, Transitions
from maze_cli.stats.aggregator import EpochStatsAggregator, LogStatsLevel


def initial_sampling_policy_or_random(policy: nn.Module, initial: nn.Module | None = None) -> nn.Module:
    """The policy that fills the replay buffer before learning starts, to pass to the actors as
    `initial_policy=`: `initial` if given, else uniform random actions over `policy`'s spaces."""
    return initial if initial is not None else RandomPolicy(policy.observation_space, policy.action_space, policy.action_mask_key)


@dataclass
class SampledBatch:
    """What `sample_batch` hands the learner: transitions plus what prioritized replay needs back."""

    transitions: Transitions
    indices: np.ndarray  # buffer items sampled, to update their priorities
    weights: torch.Tensor  # importance weight per transition (ones for uniform replay)
    steps_per_item: int  # transitions per buffer item (1, or n_rollout_steps without splitting)


def _item_specs(spec, split: bool, n_step: int = 1) -> dict[str, TensorSpec]:
    """Fields of one buffer item: a transition (with its horizon for n-step returns), or one env's whole rollout."""
    scalar = {"reward": TensorSpec((), torch.float32), "terminated": TensorSpec((), torch.bool)}
    if split:
        items = {f"obs/{k}": s for k, s in spec.observations.items()}
        items |= {f"next_obs/{k}": s for k, s in spec.observations.items()}
        if n_step > 1:
            items["horizon"] = TensorSpec((), torch.int16)
        return items | {"action": spec.action} | scalar
    T = spec.n_steps

    def seq(s: TensorSpec, n: int = T) -> TensorSpec:
        return TensorSpec((n, *s.shape), s.dtype)

    items = {f"obs/{k}": seq(s, T + 1) for k, s in spec.observations.items()}
    items |= {f"final_obs/{k}": seq(s) for k, s in spec.observations.items()}
    items |= {"action": seq(spec.action), "truncated": seq(TensorSpec((), torch.bool))}
    return items | {k: seq(s) for k, s in scalar.items()}


class BaseDistributedWorkersWithBuffer:
    """Distributed workers that fill a replay buffer, for off-policy learners: any DistributedActors
    (sequential, subprocess or Ray) plus a replay buffer built for their rollouts.

    `collect_rollouts` moves finished rollouts into the buffer; `sample_batch` draws from it.
    The caller builds the actors for this role:

    - `initial_policy=initial_sampling_policy_or_random(policy, initial)`: what the workers act
      with until the first broadcast (uniform random unless another policy is given);
    - `batch_size=rollouts_per_iteration`: the rollouts each `collect_rollouts` adds;
    - an env source without vectorization (`env_factory.without_vectorization()`; a plain callable
      has none): envs stepped one by one have no autoreset steps, so every step is a transition for the
      buffer (the replay ratio makes the learner, not env stepping, the bottleneck here). Actors
      whose env source may vectorize are refused with a ValueError.

    :param actors: the actors that collect (not started yet: `start()` starts them, `stop()` stops them).
    :param replay_buffer: called as `replay_buffer(item_specs=...)` with the fields of one buffer
        item (a transition, or one env's whole rollout), e.g.
        `functools.partial(UniformReplayBuffer, capacity=100_000, seed=3)`.
    :param batch_size: items per `sample_batch` (transitions, or whole rollouts without splitting).
    :param initial_buffer_size: transitions `init_replay_buffer` collects before learning.
    :param split_rollouts_into_transitions: store single transitions (True) or whole rollouts.
    :param n_step, gamma: store n-step transitions (`Transitions.from_rollout`: rewards summed with
        discount `gamma` over up to `n_step` steps, within the episode and the rollout); needs splitting.
    """

    def __init__(
        self,
        actors: DistributedActors,
        replay_buffer: Callable[..., ReplayBuffer],
        batch_size: int,
        initial_buffer_size: int,
        split_rollouts_into_transitions: bool,
        n_step: int = 1,
        gamma: float = 1.0,
    ):
        if not isinstance(actors, DistributedActors):
            raise TypeError(f"actors must be a DistributedActors, not {type(actors).__name__}")
        if _may_vectorize(actors.env_factory):
            raise ValueError(
                "workers with a replay buffer need actors whose envs are stepped one by one (a vectorized env's "
                "autoreset steps are no transitions): build the actors with env_factory.without_vectorization()"
            )
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if n_step < 1 or (n_step > 1 and not split_rollouts_into_transitions):
            raise ValueError(f"n_step={n_step}: n-step transitions need n_step >= 1 and split_rollouts_into_transitions")
        self.actors = actors
        self.batch_size = batch_size
        self.initial_buffer_size = initial_buffer_size
        self.split = split_rollouts_into_transitions
        self.n_step, self.gamma = n_step, gamma
        self.replay_buffer: ReplayBuffer = replay_buffer(item_specs=_item_specs(actors.rollout_spec, self.split, n_step))
        self.env_steps = 0

    @property
    def distributed_actors(self) -> DistributedActors:
        """As a run's runner (`Runner`): the actors that fill the buffer."""
        return self.actors

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.actors.start()

    def stop(self) -> None:
        self.actors.stop()

    def alive_pids(self) -> list[int]:
        """PIDs of the actors' processes still running, where the actors have such a list (subproc)."""
        alive_pids = getattr(self.actors, "alive_pids", None)
        if alive_pids is None:
            raise AttributeError(f"{type(self.actors).__name__} keeps no list of actor processes")
        return alive_pids()

    def __enter__(self) -> "BaseDistributedWorkersWithBuffer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def checkpoint_state(self) -> dict | None:
        """The actors' part of a reproducible run's checkpoint (the buffer is the checkpoint's own)."""
        return self.actors.checkpoint_state()

    def restore_checkpoint_state(self, state: dict) -> None:
        self.actors.restore_checkpoint_state(state)

    # -- data flow -----------------------------------------------------------------------------
    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Publish new worker weights; the first broadcast also retires the initial sampling policy."""
        self.actors.broadcast_updated_policy(state_dict)

    def collect_rollouts(self) -> tuple[float, float, float]:
        """Move the actors' next batch of finished rollouts (their `batch_size`: the rollouts per
        iteration) into the buffer; returns
        (queue size before, queue size after, seconds spent dequeuing)."""
        batch, before, after, dequeue_s = self.actors.collect_outputs("cpu")
        self._add(batch)
        return before, after, dequeue_s

    def init_replay_buffer(self) -> None:
        """Collect with the initial sampling policy until the buffer holds `initial_buffer_size` transitions."""
        while self.env_steps < self.initial_buffer_size:
            self.collect_rollouts()

    def _add(self, batch: Rollout) -> None:
        self.env_steps += batch.rewards.numel()
        if self.split:
            t = Transitions.from_rollout(batch, self.n_step, self.gamma)
            items = {f"obs/{k}": v for k, v in t.observations.items()}
            items |= {f"next_obs/{k}": v for k, v in t.next_observations.items()}
            items |= {"action": t.actions, "reward": t.rewards, "terminated": t.terminated}
            if t.horizon is not None:
                items["horizon"] = t.horizon
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
            transitions = Transitions(group("obs/"), items["action"], items["reward"], group("next_obs/"), items["terminated"],
                                      items.get("horizon"))
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
        return self.actors.get_epoch_stats_aggregator()

    def get_stats_value(self, event: str, level: LogStatsLevel = LogStatsLevel.EPOCH, name: str | None = None) -> float | None:
        return self.actors.get_stats_value(event, level, name)


def _may_vectorize(source: EnvSource) -> bool:
    """Whether the actors may step this source's envs through a vectorized implementation: it is
    not already its own `without_vectorization()`."""
    return source.without_vectorization() != source
