"""Where new replay items go: a circular writer that overwrites the oldest once full."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from maze_cli.buffers._checks import require_int


class CircularWriter:
    """Hands out slots after the newest item, wrapping round to the oldest once `capacity` is reached.

    The position is state of its own, not read off the storage, so that a checkpoint restores where
    the next item goes (the oldest, not slot 0) and how many items exist (`size`, which bounds what
    the sampler may draw).
    """

    def __init__(self, capacity: int):
        self.capacity = require_int("capacity", capacity, minimum=1)
        self.next_index = 0  # the slot the next item goes to
        self.size = 0  # slots filled so far, at most capacity
        self.added = 0  # items ever added, overwritten ones included

    def claim(self, n: int) -> np.ndarray:
        """The slots for `n` new items, in order, and advance past them."""
        indices = (self.next_index + np.arange(n)) % self.capacity
        self.next_index = (self.next_index + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        self.added += n
        return indices

    def state_dict(self) -> dict[str, int]:
        return {"capacity": self.capacity, "next_index": self.next_index, "size": self.size, "added": self.added}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore the position; refuses a state saved with another capacity, whose slots would not line up."""
        capacity = int(state.get("capacity", self.capacity))  # checkpoints before the split had no capacity
        if capacity != self.capacity:
            raise ValueError(f"the saved replay buffer has capacity {capacity}, this one {self.capacity}; "
                             "use the same capacity to resume")
        self.next_index, self.size, self.added = int(state["next_index"]), int(state["size"]), int(state["added"])
