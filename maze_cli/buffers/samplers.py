"""Which stored items a batch holds and how much each counts: uniform or prioritized sampling, seeded."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np
import torch

from maze_cli.buffers._checks import require_float, require_int
from maze_cli.buffers.sum_tree import SumTree


class Sampler(abc.ABC):
    """Chooses slots to sample and their importance weights.

    A sampler sees only slot indices, never the items, so a new sampling rule never touches how items
    are stored. The buffer tells it which slots were written (`on_add`) and the learner's TD errors
    (`update_priorities`); samplers that weigh nothing ignore both, hence the no-op defaults.
    """

    prioritized: ClassVar[bool] = False  # whether it wants the learner's TD errors (`update_priorities`)

    def on_add(self, indices: np.ndarray) -> None:
        """Slots just written (new items or overwritten old ones)."""

    @abc.abstractmethod
    def sample(self, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """`n` slot indices in [0, size) and their importance weights (float32, one per index)."""

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """The learner's TD errors of the items in `indices`."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to sample on identically after a resume, readable by
        `torch.load(weights_only=True)`: tensors and plain Python values only."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


class UniformSampler(Sampler):
    """Every stored item equally likely; all weights 1."""

    def __init__(self, seed: int):
        self.rng = seeded_generator(seed)

    def sample(self, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        return self.rng.integers(0, size, n), np.ones(n, dtype=np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": generator_state(self.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


class PrioritizedSampler(Sampler):
    """Proportional prioritized replay (Schaul et al. 2016).

    P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |delta_i| + eps; new items get the largest
    priority seen so far. Importance weights w_i = (N P(i))^-beta / max_j w_j (max over the batch),
    with beta annealed linearly from `beta` to `beta_final` over `beta_anneal_samples` sample calls.
    Sampling is stratified: one draw from each of n equal slices of the total priority mass.
    """

    prioritized = True

    def __init__(self, capacity: int, seed: int, alpha: float = 0.6, beta: float = 0.4, beta_final: float = 1.0,
                 beta_anneal_samples: int = 100_000, eps: float = 1e-6):
        self.capacity = require_int("capacity", capacity, minimum=1)
        self.alpha = require_float("alpha", alpha, low=0.0)
        self.beta0 = require_float("beta", beta, low=0.0, high=1.0)
        self.beta_final = require_float("beta_final", beta_final, low=0.0, high=1.0)
        self.anneal = require_int("beta_anneal_samples", beta_anneal_samples, minimum=1)
        self.eps = require_float("eps", eps, low=0.0, low_open=True)  # 0 would let an item's priority vanish
        self.rng = seeded_generator(seed)
        self.tree = SumTree(self.capacity)
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

    def state_dict(self) -> dict[str, Any]:
        return {"rng": generator_state(self.rng), "tree": torch.from_numpy(self.tree.tree.copy()),
                "max_priority": float(self.max_priority), "calls": int(self.calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        tree = torch.as_tensor(state["tree"]).numpy()  # a tensor; a numpy array in checkpoints before the split
        if tree.shape != self.tree.tree.shape:
            raise ValueError(f"the saved sum tree has {tree.shape[0]} nodes, this one {self.tree.tree.shape[0]}; "
                             "use the same capacity to resume")
        self.rng.bit_generator.state = state["rng"]
        self.tree.tree[:] = tree
        self.max_priority, self.calls = float(state["max_priority"]), int(state["calls"])


def seeded_generator(seed: int) -> np.random.Generator:
    """numpy's default generator (PCG64) for a non-negative integer seed, the one source of a sampler's randomness."""
    return np.random.default_rng(require_int("seed", seed, minimum=0))


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """The bit generator's state in plain Python values. PCG64's is already str and int, but other bit
    generators hold numpy arrays (MT19937's key), which `torch.load(weights_only=True)` refuses;
    numpy accepts the lists back when the state is restored."""
    return _plain(rng.bit_generator.state)


def _plain(value: Any) -> Any:
    """`value` with numpy arrays turned into lists and numpy scalars into Python numbers, recursively."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value
