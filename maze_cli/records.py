"""The rollout record: time-major tensors plus the policy version they were collected with.

One record type serves every backend. An actor writes a rollout of `T` steps from `B` envs into a
record (in shared memory for the subprocess backend), and the learner concatenates several records
along the batch dimension. Shapes: observations `[T+1, B, ...]` (the last row is the observation to
bootstrap from), everything per step `[T, B, ...]`, the policy version `[B]`.

`terminated[t]` / `truncated[t]` mark an episode that ended after step t. Then `observations[t+1]`
is already the first observation of the next episode, so for a truncated episode (a time limit:
the state was not terminal) the actor keeps its real last observation in `final_observations[t]`
(zeros elsewhere), and learners bootstrap from it.

`autoreset[t]` marks a step that was no transition: a vectorized env in gymnasium's "next step"
autoreset mode spent it resetting an env that ended at t-1 (action ignored, reward 0,
`observations[t+1]` the new episode's first). Learners leave such steps out.

`episode_start[t]` (`[T+1, B]`, like the observations) marks `observations[t]` as the first of an
episode: where a recurrent policy's state was reset. `initial_state` is the policy's state before step 0 (batch first, `[B, ...]` per
tensor; empty for feed-forward policies), so the learner unrolls the core exactly as the actor did.
`env_id[b]` names the env column b came from (actor index x envs per actor + the env's index in its
actor), so a learner can follow one env across rollouts.

Fresh records are filled with poison (NaN for floats, the smallest integer for ints), so a field an
actor forgot to write shows up at once instead of passing as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import torch


@dataclass(frozen=True)
class TensorSpec:
    """Shape (without time and batch dims) and dtype of one tensor in a record."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class RolloutSpec:
    """Everything needed to preallocate a rollout record."""

    observations: dict[str, TensorSpec]
    action: TensorSpec
    n_steps: int
    n_envs: int
    state: tuple[TensorSpec, ...] = ()  # the policy's recurrent state, per env

    def allocate(self, shared: bool = False, n_slots: int | None = None, memory=None) -> "Rollout":
        """A poisoned record; in shared memory when `shared`, so that another process can fill it.

        With `n_slots`, every tensor gets a leading slot dimension (`Rollout.slot(i)` is one
        record): a whole pool of records lives in a handful of shared-memory blocks. `memory` (a
        `maze_cli.parallel.shared_memory.Memory`) says where, when not torch's /dev/shm: each tensor
        is `memory.tensor(shape, dtype, fill)`, always in the same order.
        """
        slots = () if n_slots is None else (n_slots,)

        def empty(leading: tuple[int, ...], spec: TensorSpec) -> torch.Tensor:
            if memory is not None:
                return memory.tensor(slots + leading + spec.shape, spec.dtype, poison(spec.dtype))
            tensor = torch.full(slots + leading + spec.shape, poison(spec.dtype), dtype=spec.dtype)
            return tensor.share_memory_() if shared else tensor

        t, b = self.n_steps, self.n_envs
        return Rollout(
            observations={k: empty((t + 1, b), s) for k, s in self.observations.items()},
            actions=empty((t, b), self.action),
            behaviour_logp=empty((t, b), TensorSpec((), torch.float32)),
            rewards=empty((t, b), TensorSpec((), torch.float32)),
            terminated=empty((t, b), TensorSpec((), torch.bool)),
            truncated=empty((t, b), TensorSpec((), torch.bool)),
            autoreset=empty((t, b), TensorSpec((), torch.bool)),
            final_observations={k: empty((t, b), s) for k, s in self.observations.items()},
            policy_version=empty((b,), TensorSpec((), torch.int64)),
            episode_start=empty((t + 1, b), TensorSpec((), torch.bool)),
            initial_state=tuple(empty((b,), spec) for spec in self.state),
            env_id=empty((b,), TensorSpec((), torch.int64)),
        )


def poison(dtype: torch.dtype) -> float | int | bool:
    """The value a fresh record holds until an actor writes it: NaN, the smallest int, or False."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


@dataclass
class Rollout:
    """Time-major tensors of one or more rollouts (see the module docstring for shapes)."""

    observations: dict[str, torch.Tensor]
    actions: torch.Tensor
    behaviour_logp: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    autoreset: torch.Tensor
    final_observations: dict[str, torch.Tensor]
    policy_version: torch.Tensor
    episode_start: torch.Tensor | None = None
    initial_state: tuple[torch.Tensor, ...] = ()
    env_id: torch.Tensor | None = None

    # Fields whose batch dimension comes first (the others are time-major: [T, B, ...]).
    BATCH_FIRST = ("policy_version", "initial_state", "env_id")

    @property
    def dones(self) -> torch.Tensor:
        """The episode ended after this step, for either reason."""
        return self.terminated | self.truncated

    @property
    def nbytes(self) -> int:
        """Bytes held by all of this record's tensors (observations in their own dtype)."""
        return sum(t.element_size() * t.nelement() for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the record, in the order of its fields (a dict's in the order of its keys)."""
        tensors: list[torch.Tensor] = []
        for f in fields(self):
            value = getattr(self, f.name)
            tensors += list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, tuple) else [value]
        return [t for t in tensors if t is not None]

    def copy_(self, other: "Rollout") -> "Rollout":
        """Copy `other` (a record of the same spec) into this one's tensors, in place."""
        for mine, theirs in zip(self.tensors(), other.tensors(), strict=True):
            mine.copy_(theirs)
        return self

    @property
    def n_steps(self) -> int:
        return self.actions.shape[0]

    @property
    def n_envs(self) -> int:
        return self.actions.shape[1]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Rollout":
        """Apply `fn` to every tensor, keeping the structure."""
        return Rollout(**{f.name: _apply(getattr(self, f.name), fn) for f in fields(self)})

    def slot(self, index: int) -> "Rollout":
        """Record `index` of a pool made by `RolloutSpec.allocate(n_slots=...)` (a view, no copy)."""
        return self.map(lambda t: t[index])

    def to(self, device: str | torch.device) -> "Rollout":
        return self.map(lambda t: t.to(device, non_blocking=True))

    @staticmethod
    def cat(rollouts: list["Rollout"]) -> "Rollout":
        """Concatenate rollouts along the batch dimension (a fresh copy, never a view of a slot)."""
        first = rollouts[0]
        values = {}
        for f in fields(first):
            value = getattr(first, f.name)
            dim = 0 if f.name in Rollout.BATCH_FIRST else 1
            parts = [getattr(r, f.name) for r in rollouts]
            if isinstance(value, dict):
                values[f.name] = {k: torch.cat([p[k] for p in parts], dim=dim) for k in value}
            elif isinstance(value, tuple):
                values[f.name] = tuple(torch.cat(group, dim=dim) for group in zip(*parts))
            else:
                values[f.name] = None if value is None else torch.cat(parts, dim=dim)
        return Rollout(**values)


def _apply(value, fn: Callable[[torch.Tensor], torch.Tensor]):
    """`fn` on a tensor, on each tensor of a dict or tuple; None stays None."""
    if isinstance(value, dict):
        return {k: fn(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(fn(v) for v in value)
    return None if value is None else fn(value)


@dataclass
class RolloutInfo:
    """Small metadata that travels beside a rollout (through a queue, by value)."""

    actor_index: int
    policy_version: int
    env_steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    # env statistics of the episodes that ended: event (`env/<key>`, `is_success`) -> one value per episode
    episode_info: dict[str, list[float]] = field(default_factory=dict)
    info_error: str | None = None  # a followed info key held a non-numeric value: the learner stops the run with it
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Transitions:
    """Flat transitions `[N, ...]`, what an off-policy learner trains on.

    `next_observations` is the real successor of `observations` (the final observation for a
    truncated episode), and `terminated` says whether bootstrapping from it must stop. With n-step
    returns, `rewards` is the discounted sum of the `horizon` rewards between the two (at most n:
    fewer where the episode or the rollout ends first), and the bootstrap is discounted by
    gamma^horizon; `horizon` None means single steps.
    """

    observations: dict[str, torch.Tensor]
    actions: torch.Tensor
    rewards: torch.Tensor
    next_observations: dict[str, torch.Tensor]
    terminated: torch.Tensor
    horizon: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.actions.shape[0]

    @staticmethod
    def from_rollout(rollout: Rollout, n_step: int = 1, gamma: float = 1.0) -> "Transitions":
        """Split a time-major rollout `[T, B]` into `T*B` transitions (it must hold no autoreset steps:
        replay workers step their envs one by one); with `n_step` > 1, n-step ones (discount `gamma`)
        that end where an episode ends or the rollout does."""
        T, B = rollout.n_steps, rollout.n_envs
        if rollout.autoreset.any():
            raise ValueError("a rollout with autoreset steps cannot be split into transitions; build its envs with vectorize=False")
        truncated = rollout.truncated

        def flat(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(T * B, *t.shape[2:])

        def successors(key: str) -> torch.Tensor:
            nxt = rollout.observations[key][1:]
            mask = truncated.reshape(T, B, *([1] * (nxt.dim() - 2)))
            return torch.where(mask, rollout.final_observations[key], nxt)

        observations = {k: flat(v[:T]) for k, v in rollout.observations.items()}
        if n_step == 1:
            return Transitions(observations, flat(rollout.actions), flat(rollout.rewards),
                               {k: flat(successors(k)) for k in rollout.observations}, flat(rollout.terminated))
        returns, last = _n_step_returns(rollout.rewards, rollout.terminated | truncated, n_step, gamma)
        envs = torch.arange(B).expand(T, B)
        start = torch.arange(T).unsqueeze(1).expand(T, B)
        return Transitions(
            observations=observations,
            actions=flat(rollout.actions),
            rewards=flat(returns),
            next_observations={k: flat(successors(k)[last, envs]) for k in rollout.observations},
            terminated=flat(rollout.terminated[last, envs]),
            horizon=flat(last - start + 1).to(torch.int16),
        )

    def to(self, device: str | torch.device) -> "Transitions":
        return Transitions(
            {k: v.to(device) for k, v in self.observations.items()},
            self.actions.to(device),
            self.rewards.to(device),
            {k: v.to(device) for k, v in self.next_observations.items()},
            self.terminated.to(device),
            None if self.horizon is None else self.horizon.to(device),
        )


def _n_step_returns(rewards: torch.Tensor, ended: torch.Tensor, n: int, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For each step t of `[T, B]` rewards: the discounted sum of rewards t..e and the last step e, where
    e is t + n - 1, or earlier where an episode ends (`ended[e]`) or the rollout does (T - 1)."""
    T, B = rewards.shape
    envs = torch.arange(B).expand(T, B)
    start = torch.arange(T).unsqueeze(1).expand(T, B)
    returns = torch.zeros(T, B, dtype=torch.float32)
    last = start.clone()
    going = torch.ones(T, B, dtype=torch.bool)  # the n-step window from t still takes steps
    discount = 1.0
    for j in range(n):
        step = start + j
        going &= step < T
        at = step.clamp(max=T - 1)
        returns += torch.where(going, discount * rewards[at, envs].float(), 0.0)
        last = torch.where(going, at, last)
        going &= ~ended[at, envs]
        discount *= gamma
    return returns, last
