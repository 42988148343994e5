"""The algorithm contract: what an algorithm writes, and what it leaves to the shared parts.

An algorithm's update is an `Objective`: its modules (the policy the actors act with, and whatever
else it trains or keeps, such as critics and their targets), its optimizer groups, and the gradient
steps a batch makes, each a `Step` of named losses and metrics. The `maze_cli.learner.Learner` runs
an objective and owns everything else, once: optimizers and their checkpoint state, the lr
schedule over the run's budget, the update and env-step counters, precision and compilation,
gradient averaging over several learners, the finiteness check and the metrics of an epoch.

Batches reach an objective from one of two loops: `OnPolicyLoop` (rollouts `[T, B]` from actors:
IMPALA, APPO, PPO) and `ReplayLoop` (transitions sampled from a replay buffer at a replay ratio:
SAC, TD3). The loops own their timings; an algorithm file holds its objective, its config and the
`build` that wires them (maze_cli/algorithms/base.py).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Iterator, Protocol, Union

import torch
from torch import nn

if TYPE_CHECKING:
    from maze_cli.buffers import ReplayBuffer
    from maze_cli.distributed import LearnerGroup
    from maze_cli.parallel.distributed_actors import DistributedActors
    from maze_cli.parallel.workers_with_buffer import SampledBatch
    from maze_cli.records import Rollout
    from maze_cli.stats.aggregator import EpochStatsAggregator

# What an objective learns from: rollouts `[T, B]` from actors, or transitions sampled from a replay buffer.
Batch = Union["Rollout", "SampledBatch"]
Metrics = dict[str, Union[torch.Tensor, float]]  # named numbers of an update, tensors until an epoch's row reads them
StateDict = dict[str, object]  # plain data of a checkpoint


@dataclass
class OptimizerGroup:
    """Parameters stepped together by one Adam.

    :param loss: the name of this group's loss among the metrics (what a non-finite loss is reported as).
    :param max_grad_norm: clip the group's joint gradient norm; its norm before clipping becomes the
        metric `grad_norm` (`grad_norm/<group>` where several groups clip).
    :param clip_parts: parts of `params` whose gradient norms are clipped to `max_grad_norm` each on its own
        (None: their joint norm), so that one network's large gradient does not shrink another's step;
        `grad_norm` is still the joint norm before clipping.
    :param anneal: the lr falls linearly to 0 over the run's budget (`max_env_steps`, or `max_time_s` where that ends first).
    :param adaptive_kl: the `approx_kl` (a metric of the batch's summary) each batch's update aims at: after a
        batch above twice it the lr falls by 1.5x (to lr/100 at most), after one under half of it it rises by
        1.5x (to lr at most). None: no such schedule.
    """

    params: list[nn.Parameter]
    lr: float
    loss: str
    eps: float = 1e-8
    max_grad_norm: float | None = None
    anneal: bool = False
    clip_parts: list[list[nn.Parameter]] | None = None
    adaptive_kl: float | None = None


@dataclass(frozen=True)
class UpdateContext:
    """What an update reads of the learner that runs it, handed to each call of the objective: an
    objective holds no learner, and its update is a function of its modules, the batch and this."""

    device: torch.device
    updates: int  # updates made before this batch's
    env_steps: int  # env steps every learner consumed before this batch (the schedules' clock)
    progress_left: float  # 1 at the start of the run's budget, 0 at its end (what annealed settings scale by)
    lrs: Mapping[str, float]  # each optimizer group's lr for this batch
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # forward passes' precision
    group: "LearnerGroup | None" = None  # the data-parallel learners this one updates with; None: alone

    @property
    def pool(self) -> Callable | None:
        """How running statistics (observation normalizer, reward scale) pool every learner's samples; None alone."""
        return None if self.group is None else self.group.pooled_moments


@dataclass
class Step:
    """One gradient step: a loss per optimizer group (each backpropagated into its own group only).

    :param samples: how many samples the losses average over on this learner, where that differs
        between learners (several learners then weight their gradients by it).
    :param ends_update: whether this step ends an update (what `learner/updates` counts and
        `Objective.after_update` follows): SAC's critic step is followed by its actor step, both one update.
    :param forward_s: seconds of forward passes outside the learner's loss functions before this step
        (e.g. a batch's targets), counted with the learner's forward time.
    """

    losses: dict[str, torch.Tensor]
    metrics: dict[str, torch.Tensor | float] = field(default_factory=dict)
    samples: torch.Tensor | None = None
    ends_update: bool = True
    forward_s: float = 0.0


class Objective(abc.ABC):
    """An algorithm's update: modules, optimizer groups and the steps of a batch. What an update needs
    of the learner that runs it comes in as an `UpdateContext`; what it reports goes out in its steps
    and its summary."""

    title: ClassVar[str] = "the loss"  # how logs name this algorithm's loss functions
    # methods the learner runs under autocast and, with learner.compile=true, compiles (shapes fixed by the config)
    compiled: ClassVar[tuple[str, ...]] = ()
    policy: nn.Module

    def modules(self) -> dict[str, nn.Module]:
        """Every module with state: "policy" (the one actors act with and checkpoints are played with) and the rest."""
        return {"policy": self.policy}

    @abc.abstractmethod
    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        """The parameters each optimizer steps (asked once, after the modules moved to the learner's device)."""

    @abc.abstractmethod
    def steps(self, batch: Batch, context: UpdateContext) -> Iterator[Step]:
        """The gradient steps of one batch; each is taken before the next is asked for."""

    def env_steps(self, batch: Batch) -> int:
        """The env steps a batch consumes, towards the schedules (0: the batch does not count, as replayed ones)."""
        return 0

    def after_update(self, context: UpdateContext) -> None:
        """After each update's last step (target networks follow the online ones here)."""

    def summary(self, batch: Batch, steps: list[Metrics], context: UpdateContext) -> Metrics:
        """The metrics of a batch's update from those of its steps (recorded for the epoch); default: their union."""
        out: Metrics = {}
        for metrics in steps:
            out |= metrics
        return out

    def priorities(self) -> torch.Tensor | None:
        """The last update's per-sample priorities for prioritized replay (|TD error|); None: gives none."""
        return None

    def extra_state(self) -> StateDict:
        """State besides modules and optimizers, kept in checkpoints (e.g. the reward scaler's statistics)."""
        return {}

    def load_extra_state(self, state: StateDict) -> None:
        pass

    def load_normalizer_state(self, state: StateDict) -> None:
        """Warm start (`init_from.normalizer=true`): the statistics a new run takes from a checkpoint's `extra_state`."""


class Runner(Protocol):
    """Actors (DistributedActors) or workers with a replay buffer: what the trainer starts, feeds new
    policy versions and stops, and what the run reads of it (its actors, its replay buffer)."""

    @property
    def distributed_actors(self) -> "DistributedActors": ...  # the actors themselves (workers with a buffer wrap theirs)
    @property
    def replay_buffer(self) -> "ReplayBuffer | None": ...  # None: experience goes straight to the learner

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None: ...
    def get_epoch_stats_aggregator(self) -> "EpochStatsAggregator": ...


class Loop(Protocol):
    """What the trainer drives (maze_cli.loops): iterations, each returning the env steps it consumed,
    and the stats they leave."""

    actor_stats: "EpochStatsAggregator"  # episode_return, episode_length, policy_lag, actor_* timings
    learner_stats: "EpochStatsAggregator"  # learner/* (averaged), time/* (summed), anything else (averaged)

    def iteration(self) -> int:
        """Take experience, learn, broadcast; return the env steps consumed."""

    def updates(self) -> int:
        """Gradient updates so far."""

    def state_dict(self) -> StateDict:
        """What the loop itself must carry across a resume (plain numbers), beside the learner's state."""

    def load_state_dict(self, state: StateDict) -> None: ...
