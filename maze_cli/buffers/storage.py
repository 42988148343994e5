"""Where replay items live: one preallocated tensor per field, indexed by slot."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from maze_cli.buffers._checks import require_int
from maze_cli.records import TensorSpec


class TensorStorage:
    """One tensor per field of `item_specs`, each with a leading dimension of `capacity` slots.

    Everything is allocated up front so that the memory a buffer needs follows from the shapes alone
    (`nbytes`) and a buffer too big for the machine fails at start, not hours into a run; writing and
    reading are one indexed copy per field, never a Python object per item. Which slots to use is not
    decided here: the writer picks them, the sampler picks what to read.
    """

    def __init__(self, capacity: int, item_specs: dict[str, TensorSpec]):
        self.capacity = require_int("capacity", capacity, minimum=1)
        if not item_specs:
            raise ValueError("item_specs must name at least one field")
        self.specs = dict(item_specs)
        self.tensors = {key: torch.zeros((self.capacity, *spec.shape), dtype=spec.dtype)
                        for key, spec in self.specs.items()}

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors (all preallocated)."""
        return sum(t.element_size() * t.nelement() for t in self.tensors.values())

    def count(self, items: Mapping[str, torch.Tensor]) -> int:
        """How many items `items` holds (its leading dimension), after checking every field is there
        with the same count, so a malformed batch fails with the field's name and not an index error."""
        missing = sorted(set(self.specs) - set(items))
        if missing:
            raise ValueError(f"items lack the fields {missing}; the storage holds {sorted(self.specs)}")
        counts = {key: items[key].shape[0] for key in self.specs}
        if len(set(counts.values())) != 1:
            raise ValueError(f"items' fields differ in their leading dimension: {counts}")
        return next(iter(counts.values()))

    def write(self, indices: np.ndarray, items: Mapping[str, torch.Tensor]) -> None:
        """Copy item i of every field into slot indices[i]."""
        if self.count(items) != len(indices):
            raise ValueError(f"{self.count(items)} items for {len(indices)} slots")
        slots = _as_index(indices)
        for key, tensor in self.tensors.items():
            tensor[slots] = items[key]

    def read(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The items in slots `indices`, field by field (copies, safe to keep while the storage changes)."""
        slots = _as_index(indices)
        return {key: tensor[slots] for key, tensor in self.tensors.items()}

    def state_dict(self, size: int) -> dict[str, torch.Tensor]:
        """The first `size` slots of every field: a partly filled buffer checkpoints only what it holds."""
        return {key: tensor[:size].clone() for key, tensor in self.tensors.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Refill the first slots from `state` (as written by `state_dict`)."""
        missing = sorted(set(self.specs) - set(state))
        if missing:
            raise ValueError(f"the saved storage lacks the fields {missing}")
        for key, tensor in self.tensors.items():
            rows = state[key]
            if rows.shape[0] > self.capacity or tuple(rows.shape[1:]) != tuple(tensor.shape[1:]):
                raise ValueError(f"saved field '{key}' has shape {tuple(rows.shape)}; "
                                 f"this storage holds up to {tuple(tensor.shape)}")
            tensor[: rows.shape[0]] = rows


def _as_index(indices: np.ndarray) -> torch.Tensor:
    """Slot indices as an int64 tensor (torch indexes with it without copying the numpy array)."""
    return torch.from_numpy(np.asarray(indices, dtype=np.int64))
