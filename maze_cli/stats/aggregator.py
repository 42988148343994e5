"""Collects values of named events over an epoch and reduces them (mean, min, max, sum, count)."""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from typing import Iterable


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

    def add(self, event: str, value: float) -> None:
        self._values[event].append(float(value))

    def extend(self, event: str, values: Iterable[float]) -> None:
        self._values[event].extend(float(v) for v in values)

    def values(self, event: str) -> list[float]:
        """The raw values recorded under `event` this epoch (a view; do not modify)."""
        return self._values.get(event, [])

    def events(self) -> list[str]:
        return [e for e, v in self._values.items() if v]

    def get(self, event: str, name: str = "mean") -> float | None:
        """The reduced value of `event`, or None when nothing was recorded this epoch."""
        if name not in _REDUCERS:
            raise ValueError(f"unknown reduction '{name}'; use one of {', '.join(_REDUCERS)}")
        values = self._values.get(event)
        if not values:
            return 0 if name in ("count", "sum") else None
        return _REDUCERS[name](values)

    def clear(self) -> None:
        self._values.clear()
