"""Replay buffers built from parts: preallocated tensor storage, a circular writer, a sampler.

Storage is one tensor per field with a leading capacity dimension, so memory is known from the
shapes alone (`nbytes`) and adding or sampling never creates a Python object per transition.
"""

from __future__ import annotations

import numpy as np
import torch

from maze_cli.buffers.sum_tree import SumTree
from maze_cli.records import TensorSpec


class UniformSampler:
    """Every stored item equally likely."""

    def __init__(self, generator: np.random.Generator):
        self.rng = generator

    def on_add(self, indices: np.ndarray) -> None:
        pass

    def sample(self, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        return self.rng.integers(0, size, n), np.ones(n, dtype=np.float32)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        pass

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]


class PrioritizedSampler:
    """Proportional prioritized replay (Schaul et al. 2016).

    P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |delta_i| + eps; new items get the largest
    priority seen so far. Importance weights w_i = (N P(i))^-beta / max_j w_j (max over the batch),
    with beta annealed linearly from `beta` to `beta_final` over `beta_anneal_samples` sample calls.
    Sampling is stratified: one draw from each of n equal slices of the total priority mass.
    """

    def __init__(self, capacity: int, generator: np.random.Generator, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_anneal_samples: int = 100_000, eps: float = 1e-6):
        self.rng = generator
        self.tree = SumTree(capacity)
        self.alpha, self.beta0, self.beta_final, self.anneal, self.eps = alpha, beta, beta_final, beta_anneal_samples, eps
        self.max_priority = 1.0
        self.calls = 0

    @property
    def beta(self) -> float:
        frac = min(1.0, self.calls / max(1, self.anneal))
        return self.beta0 + frac * (self.beta_final - self.beta0)

    def on_add(self, indices: np.ndarray) -> None:
        self.tree.update(indices, np.full(len(indices), self.max_priority**self.alpha))

    def sample(self, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        total = self.tree.total
        bounds = np.linspace(0.0, total, n + 1)
        draws = self.rng.uniform(bounds[:-1], bounds[1:])
        indices = np.minimum(self.tree.find(draws), size - 1)
        probs = self.tree[indices] / total
        weights = (size * probs) ** (-self.beta)
        self.calls += 1
        return indices, (weights / weights.max()).astype(np.float32)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        priorities = np.abs(td_errors) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(indices, priorities**self.alpha)

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "tree": self.tree.tree.copy(), "max_priority": self.max_priority, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.tree.tree[:] = state["tree"]
        self.max_priority, self.calls = state["max_priority"], state["calls"]


class ReplayBuffer:
    """A circular buffer of `capacity` items, each a dict of tensors of the shapes in `item_specs`."""

    def __init__(self, capacity: int, item_specs: dict[str, TensorSpec], sampler: UniformSampler | PrioritizedSampler):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.storage = {k: torch.zeros((capacity, *s.shape), dtype=s.dtype) for k, s in item_specs.items()}
        self.sampler = sampler
        self.next_index = 0
        self.size = 0
        self.added = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage (all preallocated)."""
        return sum(t.element_size() * t.nelement() for t in self.storage.values())

    def __len__(self) -> int:
        return self.size

    def add(self, items: dict[str, torch.Tensor]) -> np.ndarray:
        """Append items (leading dimension N), overwriting the oldest once full; returns their indices."""
        n = next(iter(items.values())).shape[0]
        indices = (self.next_index + np.arange(n)) % self.capacity
        index_tensor = torch.from_numpy(indices)
        for key, tensor in self.storage.items():
            tensor[index_tensor] = items[key]
        self.next_index = int((self.next_index + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)
        self.added += n
        self.sampler.on_add(indices)
        return indices

    def sample(self, n: int) -> tuple[dict[str, torch.Tensor], np.ndarray, torch.Tensor]:
        """`n` items, their indices (to update priorities) and importance weights."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        indices, weights = self.sampler.sample(n, self.size)
        index_tensor = torch.from_numpy(indices)
        return {k: v[index_tensor] for k, v in self.storage.items()}, indices, torch.from_numpy(weights)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        self.sampler.update_priorities(indices, td_errors)

    def state_dict(self) -> dict:
        """Everything stored (only the filled part) and the sampler's state, for checkpoints."""
        return {"storage": {k: v[: self.size].clone() for k, v in self.storage.items()}, "next_index": self.next_index,
                "size": self.size, "added": self.added, "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for key, tensor in self.storage.items():
            tensor[: state["size"]] = state["storage"][key]
        self.next_index, self.size, self.added = state["next_index"], state["size"], state["added"]
        self.sampler.load_state_dict(state["sampler"])


def make_replay_buffer(kind: str, capacity: int, item_specs: dict[str, TensorSpec], seed: int, **prioritized) -> ReplayBuffer:
    """`kind` 'uniform' or 'prioritized' (with alpha, beta, beta_final, beta_anneal_samples, eps)."""
    generator = np.random.default_rng(seed)
    if kind == "uniform":
        sampler: UniformSampler | PrioritizedSampler = UniformSampler(generator)
    elif kind == "prioritized":
        sampler = PrioritizedSampler(capacity, generator, **prioritized)
    else:
        raise ValueError(f"unknown replay buffer '{kind}'; use uniform or prioritized")
    return ReplayBuffer(capacity, item_specs, sampler)
