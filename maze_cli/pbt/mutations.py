"""The keys population-based training changes (`pbt.mutations`): which of them can change mid-run,
their ranges, and how a running member takes new values."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Mapping

from maze_cli.config.validation import suggest
from maze_cli.errors import ConfigError

# An algorithm's keys that its update reads afresh each time (or, replay_ratio, its loop each
# iteration): a new value applies from the next update. Every other key shapes what a run builds.
MUTABLE = frozenset({
    "lr", "alpha_lr", "adam_eps", "max_grad_norm", "entropy_coef", "value_coef", "clip_range", "clip_value", "gamma",
    "gae_lambda", "vtrace_lambda", "rho_bar", "c_bar", "target_kl", "n_epochs", "tau", "policy_noise", "noise_clip",
    "policy_delay", "target_update_interval", "replay_ratio", "final_epsilon",
})


STEPS_ACROSS = 8  # an explore that perturbs moves a key by this fraction of its range


@dataclass(frozen=True)
class Mutation:
    """One key PBT changes within [low, high]; `integer` keys are rounded."""

    key: str  # algorithm.<name>
    low: float
    high: float
    integer: bool = False

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    @property
    def log_scale(self) -> bool:
        """Drawn log-uniformly: both bounds positive and a decade or more apart (learning rates)."""
        return self.low > 0 and self.high / self.low >= 10

    def clip(self, value: float) -> float | int:
        """`value` within the range (an explored value may step out of it), rounded for an integer key."""
        value = min(max(float(value), self.low), self.high)
        return int(round(value)) if self.integer else value

    def explore(self, value: float, rng: random.Random, resample_probability: float) -> float | int:
        """A copied member's new value: drawn anew from the range with `resample_probability`, else
        `value` moved one step up or down."""
        if rng.random() < resample_probability:
            return self.draw(rng)
        return self.perturb(value, up=rng.random() < 0.5)

    def draw(self, rng: random.Random) -> float | int:
        """A value from the whole range: log-uniform on a log scale, else uniform."""
        if self.log_scale:
            return self.clip(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return self.clip(rng.uniform(self.low, self.high))

    def perturb(self, value: float, up: bool) -> float | int:
        """`value` moved by 1/STEPS_ACROSS of the range (of its logarithm on a log scale), so that a
        few explores cross a range of any width (a fixed factor of 1.2, Tune's, needs thirty to cross
        [1e-5, 3e-3], and never leaves 0 on a linear range); at a bound, the other way."""
        def step(towards_high: bool) -> float:
            sign = 1 if towards_high else -1
            if self.log_scale:
                return value * (self.high / self.low) ** (sign / STEPS_ACROSS)
            return value + sign * max((self.high - self.low) / STEPS_ACROSS, 1 if self.integer else 0)

        moved, slack = step(up), 1e-9 * (self.high - self.low)  # (a last step that lands on a bound, give or take rounding)
        if not self.low - slack <= moved <= self.high + slack:
            moved = step(not up)
        return self.clip(moved)


def check_mutations(mutations: Mapping[str, Any], algorithm: Mapping[str, Any]) -> list[Mutation]:
    """`pbt.mutations` checked against the run's algorithm config: each key one the learner reads at
    each update, each range two numbers, low < high, around the run's own value. A ConfigError names
    the first bad key and its fix."""
    if not mutations:
        raise ConfigError("pbt.population needs pbt.mutations, the keys PBT changes and their ranges, e.g. "
                          "'pbt.mutations={algorithm.lr: [1e-5, 3e-3]}'")
    return [_mutation(key, bounds, algorithm) for key, bounds in mutations.items()]


def _mutation(key: str, bounds: Any, algorithm: Mapping[str, Any]) -> Mutation:
    section, _, name = key.partition(".")
    mutable = ", ".join(f"algorithm.{k}" for k in sorted(MUTABLE & set(algorithm)))
    if section != "algorithm" or not name:
        raise ConfigError(f"pbt.mutations: {key} cannot change mid-run: PBT changes the algorithm's keys that its update "
                          f"reads, here {mutable}")
    if name not in algorithm:
        target = str(algorithm.get("_target_", "the algorithm")).rsplit(".", 1)[-1]
        raise ConfigError(f"pbt.mutations: {key}: {target} has no such key{suggest(name, list(algorithm))}; it can change "
                          f"{mutable}")
    if name not in MUTABLE:
        raise ConfigError(f"pbt.mutations: {key} cannot change mid-run (it shapes what the run builds); PBT can change "
                          f"{mutable}")
    if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2 and all(_number(b) for b in bounds)):
        raise ConfigError(f"pbt.mutations: {key}: expected a range [low, high] of two numbers, got {bounds!r}")
    low, high = float(bounds[0]), float(bounds[1])
    if not low < high:
        raise ConfigError(f"pbt.mutations: {key}: the range [{bounds[0]}, {bounds[1]}] is empty; give [low, high] with low < high")
    value = algorithm[name]
    if not _number(value):
        raise ConfigError(f"pbt.mutations: {key} is {value!r} in this run; set a starting value, e.g. {key}={bounds[0]}")
    if not low <= float(value) <= high:
        raise ConfigError(f"pbt.mutations: {key}={value}, where every member starts, is outside its range [{bounds[0]}, "
                          f"{bounds[1]}]; widen the range or set {key} within it")
    return Mutation(key, low, high, integer=isinstance(value, int))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def describe(values: Mapping[str, float]) -> str:
    """`algorithm.lr=0.0003, ...`: the values of changed keys in one line of the log."""
    return ", ".join(f"{key}={value:.4g}" for key, value in values.items())


def apply_values(run: Any, values: Mapping[str, float]) -> None:
    """Set `values` ({algorithm.<key>: value}) on a running `maze_cli.algorithms.base.Run`: the objective
    reads its config at each update, the learner takes the optimizer settings anew, the replay loop
    its ratio and a reward scaler its discount; so each applies from the next update, with the
    actors, the buffer and the networks as they are."""
    objective = run.learner.objective
    for key, value in values.items():
        name = key.split(".", 1)[1]
        setattr(objective.hp, name, value)
        if name == "replay_ratio":
            run.loop.replay_ratio = value
        if name == "gamma" and getattr(objective, "reward_scaler", None) is not None:
            objective.reward_scaler.gamma = value
    run.learner.follow_optimizer_settings()
