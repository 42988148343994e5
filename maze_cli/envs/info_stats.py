"""Env statistics: what an env reports in `info`, reduced over each episode's steps.

`env.info_stats: {<info key>: <reduction>}` names the keys to follow; an episode that reported a key
at any of its steps yields one value for it, the reduction of what it reported: `last`, `sum`,
`mean`, `max` or `min`. `is_success` at an episode's end is always followed (the convention of
Stable-Baselines3 and gymnasium-robotics) and gives the success rates. The actor reduces over an
episode, beside its return and length; the trainer reduces an epoch's episodes to their mean
(`env/<key>`, `train/success_rate`), and evaluation does the same for its episodes (`eval/...`).

Infos arrive per env: a single env's `info` dict, or gymnasium's vector-env info, whose values are
arrays with a boolean mask `_<key>` saying which envs reported them (`vector_infos` splits them).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from maze_cli.errors import ConfigError

REDUCTIONS = ("last", "sum", "mean", "max", "min")
SUCCESS_KEY = "is_success"
SUCCESS_EVENT = "is_success"  # the aggregator's event of the success flags (train/success_rate)


def event_name(key: str) -> str:
    """The event (and stats key) of info key `key`: `env/<key>`."""
    return f"env/{key}"


def check_info_stats(info_stats: Any) -> dict[str, str]:
    """`env.info_stats` as a plain {key: reduction}; anything else is one line naming the key."""
    if info_stats is None:
        return {}
    if not isinstance(info_stats, Mapping):
        raise ConfigError(f"env.info_stats: expected a mapping of info key to reduction, e.g. env.info_stats={{distance: mean}}, "
                          f"got {info_stats!r}")
    for key, reduction in info_stats.items():
        if reduction not in REDUCTIONS:
            raise ConfigError(f"env.info_stats.{key}={reduction}: unknown reduction; use one of {', '.join(REDUCTIONS)}")
    return {str(k): str(v) for k, v in info_stats.items()}


class NonNumericInfo(ConfigError):
    """An info key the stats follow holds something that is not a number."""

    def __init__(self, key: str, value: Any):
        super().__init__(f"env.info_stats.{key}: the env reported {value!r} ({type(value).__name__}) for info['{key}'], not a number; "
                         f"follow only numeric info keys (bools count as 0 and 1)")


def as_number(key: str, value: Any) -> float:
    """`value` as a float, or NonNumericInfo naming `key`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise NonNumericInfo(key, value) from None
    return number


def vector_infos(info: Mapping[str, Any], keys: Iterable[str], ended: np.ndarray, same_step: bool) -> dict[int, dict[str, Any]]:
    """A vector env's step info as {env: {key: value}} for `keys`, for the envs that reported them
    (its `_<key>` masks). In "same step" autoreset mode an env that ended this step has its final
    step's info under `final_info` (the top-level info is its new episode's reset info)."""
    per_env: dict[int, dict[str, Any]] = {}

    def take(source: Mapping[str, Any], rows: np.ndarray | None) -> None:
        for key in keys:
            values = source.get(key)
            if values is None:
                continue
            mask = np.asarray(source.get(f"_{key}", np.ones(len(values), dtype=bool)), dtype=bool)
            if rows is not None:
                mask = mask & rows
            for i in np.flatnonzero(mask):
                per_env.setdefault(int(i), {})[key] = values[i]

    if not same_step or not ended.any():
        take(info, None)
        return per_env
    take(info, ~ended)
    final = info.get("final_info")
    if isinstance(final, Mapping):
        take(final, ended)
    return per_env


class EpisodeInfoStats:
    """Running per-env reductions of the followed info keys; emits one value per key and ended
    episode (for the keys the episode reported)."""

    def __init__(self, info_stats: Mapping[str, str], n_envs: int):
        self.reductions = {**{event_name(k): r for k, r in info_stats.items()}, SUCCESS_EVENT: "last"}
        self.keys = {event_name(k): k for k in info_stats} | {SUCCESS_EVENT: SUCCESS_KEY}
        self.info_keys = tuple(dict.fromkeys(self.keys.values()))  # what to look up in an info
        self.value = {e: np.zeros(n_envs) for e in self.reductions}
        self.count = {e: np.zeros(n_envs, dtype=np.int64) for e in self.reductions}
        self.finished: dict[str, list[float]] = {e: [] for e in self.reductions}
        # The first non-numeric value seen, as its one-line message: an actor cannot stop the run
        # itself, so the message travels with its rollout and the learner raises it (`raise_error`).
        self.error: str | None = None
        self.holds_values = False  # some running episode has reported a followed key

    def observe(self, infos: Mapping[int, Mapping[str, Any]], ended: np.ndarray, skip: np.ndarray | None = None) -> None:
        """One step of every env: `infos[i]` the info env i returned (absent: nothing to follow),
        `ended[i]` its episode ended with this step, `skip[i]` the step was no part of an episode
        (an autoreset step)."""
        for i, info in infos.items():
            if skip is not None and skip[i]:
                continue
            for event, key in self.keys.items():
                if key in info:
                    try:
                        self._add(event, i, as_number(key, info[key]))
                    except NonNumericInfo as err:
                        if event != SUCCESS_EVENT:  # an is_success nobody asked for that is no number: not a success flag
                            self.error = self.error or str(err)
        if self.holds_values and ended.any():
            for i in np.flatnonzero(ended):
                self._end(int(i))

    def _add(self, event: str, i: int, x: float) -> None:
        self.holds_values = True
        reduction, value, count = self.reductions[event], self.value[event], self.count[event]
        if count[i] == 0 or reduction == "last":
            value[i] = x
        elif reduction in ("sum", "mean"):
            value[i] += x
        elif reduction == "max":
            value[i] = max(value[i], x)
        else:
            value[i] = min(value[i], x)
        count[i] += 1

    def _end(self, i: int) -> None:
        for event, reduction in self.reductions.items():
            n = self.count[event][i]
            if n:
                value = self.value[event][i]
                self.finished[event].append(float(value / n if reduction == "mean" else value))
                self.count[event][i] = 0

    def take(self) -> dict[str, list[float]]:
        """The values of the episodes ended since the last call, by event (only events with values)."""
        out = {e: v for e, v in self.finished.items() if v}
        self.finished = {e: [] for e in self.reductions}
        return out


def raise_error(error: str | None) -> None:
    """Stop the run with an actor's report of a non-numeric info value (one line naming the key)."""
    if error:
        raise ConfigError(error)


def epoch_means(values: Mapping[str, list[float]], phase: str = "train") -> dict[str, float]:
    """Epoch stats of the episodes' values, the mean over the episodes: `env/<key>` (training) or
    `eval/env/<key>` (evaluation), and `<phase>/success_rate`."""
    stats = {}
    for event, episode_values in values.items():
        if not episode_values or event not in (SUCCESS_EVENT,) and not event.startswith("env/"):
            continue
        mean = math.fsum(episode_values) / len(episode_values)
        if event == SUCCESS_EVENT:
            stats[f"{phase}/success_rate"] = mean
        else:
            stats[event if phase == "train" else f"{phase}/{event}"] = mean
    return stats
