"""Replay buffers composed of parts: a `TensorStorage`, a `CircularWriter` and a `Sampler`.

The storage is one preallocated tensor per field, so memory is known from the shapes alone (`nbytes`)
and adding or sampling never creates a Python object per transition; the writer decides which slots
new items overwrite; the sampler decides which slots a batch reads and how much each counts. Each
part keeps its own state, and the buffer's `state_dict` is theirs together, in tensors and plain
Python values only, so a checkpoint loads with `torch.load(weights_only=True)`.

`UniformReplayBuffer` and `PrioritizedReplayBuffer` are the `_target_`s of the packaged
`replay_buffer` configs: Hydra builds them partially (capacity, seed, ...) and the workers supply
`item_specs` once they know the shapes of a rollout.
"""

from __future__ import annotations

import numpy as np
import torch

from maze_cli.buffers._checks import require_int
from maze_cli.buffers.samplers import PrioritizedSampler, Sampler, UniformSampler
from maze_cli.buffers.storage import TensorStorage
from maze_cli.buffers.writer import CircularWriter
from maze_cli.records import TensorSpec


class ReplayBuffer:
    """A circular buffer of `capacity` items, each a dict of tensors of the shapes in `item_specs`,
    sampled by `sampler`."""

    def __init__(self, capacity: int, item_specs: dict[str, TensorSpec], sampler: Sampler):
        capacity = require_int("capacity", capacity, minimum=1)
        if not isinstance(sampler, Sampler):
            raise TypeError(f"sampler must be a maze_cli.buffers.Sampler, got {type(sampler).__name__}")
        sampler_capacity = getattr(sampler, "capacity", capacity)
        if sampler_capacity != capacity:
            raise ValueError(f"the sampler was built for capacity {sampler_capacity}, the buffer has {capacity}")
        self.tensor_storage = TensorStorage(capacity, item_specs)
        self.writer = CircularWriter(capacity)
        self.sampler = sampler
        self.capacity = self.writer.capacity

    @property
    def storage(self) -> dict[str, torch.Tensor]:
        """The storage's tensors by field, all `capacity` slots (filled or not)."""
        return self.tensor_storage.tensors

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage (all preallocated)."""
        return self.tensor_storage.nbytes

    @property
    def next_index(self) -> int:
        """The slot the next item goes to."""
        return self.writer.next_index

    @property
    def size(self) -> int:
        """Items held now (at most `capacity`)."""
        return self.writer.size

    @property
    def added(self) -> int:
        """Items ever added, overwritten ones included."""
        return self.writer.added

    def __len__(self) -> int:
        return self.writer.size

    def add(self, items: dict[str, torch.Tensor]) -> np.ndarray:
        """Append items (leading dimension N), overwriting the oldest once full; returns their indices."""
        n = self.tensor_storage.count(items)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        indices = self.writer.claim(n)
        self.tensor_storage.write(indices, items)
        self.sampler.on_add(indices)
        return indices

    def sample(self, n: int) -> tuple[dict[str, torch.Tensor], np.ndarray, torch.Tensor]:
        """`n` items, their indices (to update priorities) and importance weights."""
        require_int("the number of items to sample", n, minimum=1)
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        indices, weights = self.sampler.sample(n, len(self))
        return self.tensor_storage.read(indices), indices, torch.from_numpy(weights)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """The learner's TD errors of sampled items, for samplers that prioritize by them."""
        self.sampler.update_priorities(indices, td_errors)

    def state_dict(self) -> dict:
        """The filled part of the storage, the writer's position and the sampler's state, for checkpoints."""
        return {"storage": self.tensor_storage.state_dict(len(self)), **self.writer.state_dict(),
                "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.writer.load_state_dict(state)
        self.tensor_storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])


class UniformReplayBuffer(ReplayBuffer):
    """A replay buffer that samples every stored item with equal probability (weights all 1)."""

    def __init__(self, capacity: int, item_specs: dict[str, TensorSpec], seed: int):
        super().__init__(capacity, item_specs, UniformSampler(seed))


class PrioritizedReplayBuffer(ReplayBuffer):
    """A replay buffer with proportional prioritized sampling; see `PrioritizedSampler` for the math."""

    def __init__(self, capacity: int, item_specs: dict[str, TensorSpec], seed: int, alpha: float = 0.6,
                 beta: float = 0.4, beta_final: float = 1.0, beta_anneal_samples: int = 100_000, eps: float = 1e-6):
        sampler = PrioritizedSampler(capacity, seed, alpha=alpha, beta=beta, beta_final=beta_final,
                                     beta_anneal_samples=beta_anneal_samples, eps=eps)
        super().__init__(capacity, item_specs, sampler)
