"""Argument checks shared by the buffer parts, so a bad config value fails at construction with its name."""

from __future__ import annotations

import numbers


def require_int(name: str, value: object, minimum: int) -> int:
    """`value` as an int, or a ValueError naming `name`; bools are refused (True is not a capacity)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def require_float(name: str, value: object, low: float, high: float = float("inf"), low_open: bool = False) -> float:
    """`value` as a float in [low, high] (or (low, high] when `low_open`), or a ValueError naming `name`."""
    interval = f"{'(' if low_open else '['}{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    if not (low < value <= high if low_open else low <= value <= high):
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)
