"""Collects values of named events over an epoch and reduces them (mean, min, max, sum, count).

A value may be a number or a 0-d tensor (a learner's metric, possibly on a GPU): tensors are kept
as they are and read back together, in one transfer, the first time the epoch's values are asked for,
so that recording a metric never makes the learner wait for its device."""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from typing import Any, Iterable


class LogStatsLevel(enum.Enum):
    """Stats are kept per epoch; step and episode values are reduced into the epoch."""

    EPOCH = "epoch"


_REDUCERS = {
    "mean": lambda v: math.fsum(v) / len(v),
    "min": min,
    "max": max,
    "sum": math.fsum,
    "count": len,
}


class EpochStatsAggregator:
    """Values recorded under an event name, reduced on demand. Cleared at each epoch's end."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)
        self._tensors: list[tuple[str, Any]] = []  # (event, 0-d tensor) not yet read back

    def add(self, event: str, value: Any) -> None:
        if hasattr(value, "detach"):  # a tensor: read back with the others at the epoch's end
            self._tensors.append((event, value))
        else:
            self._values[event].append(float(value))

    def _read_tensors(self) -> None:
        """Every pending tensor to a float, in one stack and one transfer (in the order recorded)."""
        if not self._tensors:
            return
        import torch

        pending, self._tensors = self._tensors, []
        by_device: dict[Any, list[int]] = defaultdict(list)
        for i, (_, value) in enumerate(pending):
            by_device[value.device].append(i)
        floats: list[float] = [0.0] * len(pending)
        for indices in by_device.values():
            values = torch.stack([pending[i][1].detach().float().reshape(()) for i in indices]).tolist()
            for i, v in zip(indices, values):
                floats[i] = v
        for (event, _), v in zip(pending, floats):
            self._values[event].append(v)

    def extend(self, event: str, values: Iterable[float]) -> None:
        self._values[event].extend(float(v) for v in values)

    def values(self, event: str) -> list[float]:
        """The raw values recorded under `event` this epoch (a view; do not modify)."""
        self._read_tensors()
        return self._values.get(event, [])

    def events(self) -> list[str]:
        self._read_tensors()
        return [e for e, v in self._values.items() if v]

    def get(self, event: str, name: str = "mean") -> float | None:
        """The reduced value of `event`, or None when nothing was recorded this epoch."""
        if name not in _REDUCERS:
            raise ValueError(f"unknown reduction '{name}'; use one of {', '.join(_REDUCERS)}")
        self._read_tensors()
        values = self._values.get(event)
        if not values:
            return 0 if name in ("count", "sum") else None
        return _REDUCERS[name](values)

    def clear(self) -> None:
        self._values.clear()
        self._tensors.clear()
