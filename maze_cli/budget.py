"""When a run stops (`Budget`: env steps, seconds, a target return) and when it evaluates (`EvalSchedule`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """When a run stops: whichever limit is reached first."""

    max_env_steps: int
    max_time_s: float | None = None
    target_return: float | None = None
    target_window: int = 100
    epoch_length: int = 20


@dataclass
class EvalSchedule:
    """When the trainer evaluates: at the end of every `interval`-th epoch, or, where
    `interval_env_steps` or `interval_s` is set, at the end of the first epoch that many env steps
    or seconds after the last evaluation (whichever comes first), so that the cadence does not hang
    on an algorithm's epoch length; and at the run's last epoch. `interval=0`: never.
    `spent_s` sums the seconds spent evaluating: the row's `time/eval_share` is its share of the run."""

    interval: int = 0
    interval_env_steps: int | None = None
    interval_s: float | None = None
    last_env_steps: int = 0
    last_time_s: float = 0.0
    spent_s: float = 0.0

    @property
    def on(self) -> bool:
        return self.interval > 0

    def due(self, epoch: int, env_steps: int, time_s: float) -> bool:
        if not self.on:
            return False
        if self.interval_env_steps is None and self.interval_s is None:
            return epoch % self.interval == 0
        return ((self.interval_env_steps is not None and env_steps - self.last_env_steps >= self.interval_env_steps)
                or (self.interval_s is not None and time_s - self.last_time_s >= self.interval_s))

    def evaluated(self, env_steps: int, time_s: float, seconds: float) -> None:
        self.last_env_steps, self.last_time_s = env_steps, time_s
        self.spent_s += seconds

    def state_dict(self) -> dict[str, float]:
        return {"last_env_steps": self.last_env_steps, "last_time_s": self.last_time_s, "spent_s": self.spent_s}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.last_env_steps, self.last_time_s, self.spent_s = state["last_env_steps"], state["last_time_s"], state["spent_s"]
