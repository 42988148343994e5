"""A sum tree over priorities: O(log n) to update a leaf and to find the leaf at a prefix sum."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Leaves hold priorities; each inner node the sum of its children. Batched and vectorised:
    a batch of updates or look-ups walks the tree level by level, one numpy op per level."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.size = 2  # at least one inner node above the leaves
        while self.size < capacity:
            self.size *= 2
        self.tree = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(indices) + self.size]

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of `indices` and recompute their ancestors from their children."""
        nodes = np.asarray(indices, dtype=np.int64) + self.size
        self.tree[nodes] = priorities
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """For each value v in [0, total), the leaf i with sum(p[:i]) <= v < sum(p[:i+1])."""
        values = np.asarray(prefix_sums, dtype=np.float64).copy()
        nodes = np.ones(values.shape, dtype=np.int64)
        while nodes[0] < self.size:
            left = 2 * nodes
            go_right = values >= self.tree[left]
            values -= np.where(go_right, self.tree[left], 0.0)
            nodes = left + go_right
        return np.minimum(nodes - self.size, self.capacity - 1)
