"""The learner loop, the same for every backend and algorithm: iterate, log at epoch end, stop on budget.

An algorithm supplies a `Loop` (maze_cli.contract): one `iteration()` takes experience from its actors or
workers, learns from it and publishes new weights. The Trainer owns epochs, budgets and stats.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from maze_cli.budget import Budget, EvalSchedule
from maze_cli.contract import Loop
from maze_cli.distributed import CONTINUE, EPOCH_END, STOP, LearnerGroup
from maze_cli.envs.info_stats import epoch_means, event_name
from maze_cli.errors import ConfigError
from maze_cli.evaluation import BackgroundEvaluation, Snapshot
from maze_cli.interrupts import interrupts_deferred
from maze_cli.stats.aggregator import EpochStatsAggregator
from maze_cli.stats.writers import StatsWriter

log = logging.getLogger("maze_cli")
PAUSED = "paused"  # `Trainer.run(pause_at=...)` returned at an epoch's end, before the budget's end


@dataclass
class TrainResult:
    epochs: int
    env_steps: int
    time_s: float
    stop_reason: str
    return_window_mean: float | None


class Trainer:
    """Drives actors and a learner until the budget is spent; emits one stats dict per epoch.

    The hooks (`on_epoch_end`, `on_best_snapshot`, `before_others_go_on`) are called with the trainer
    first, so that what they save (a checkpoint) reads the counters of the moment without holding
    the trainer: each side is built whole, the hooks' owner first."""

    def __init__(
        self,
        loop: Loop,
        budget: Budget,
        writers: Sequence[StatsWriter],
        progress: bool | None = None,
        evaluate: Callable[[], dict[str, float]] | None = None,
        eval_interval: int = 0,
        eval_interval_env_steps: int | None = None,
        eval_interval_s: float | None = None,
        on_epoch_end: Callable[[Trainer, dict[str, Any]], None] | None = None,
        evaluate_first: bool = False,
        group: LearnerGroup | None = None,
        info_keys: Sequence[str] = (),
        callbacks: Any = None,
        background_eval: BackgroundEvaluation | None = None,
        on_best_snapshot: Callable[[Trainer, Snapshot], None] | None = None,
        before_others_go_on: Callable[[Trainer, str | None], None] | None = None,
    ):
        self.loop = loop
        # evaluation of weight snapshots in a thread (eval.background): results join a later epoch's row, and a
        # snapshot with a new best return is handed to `on_best_snapshot` (best.pt from its weights)
        self.background_eval = background_eval if evaluate is not None and eval_interval > 0 else None
        self.on_best_snapshot = on_best_snapshot
        self.info_keys = list(info_keys)  # env.info_stats: warned about once if the first episodes report none
        self.callbacks = callbacks  # maze_cli.callbacks.Callbacks: called with each epoch's row before it is written
        self.group = group  # with several learners: this is learner 0, the one that decides and writes
        self.budget = budget
        self.writers = list(writers)
        self._writing_to = self.writers  # with the trackers of `run`
        self.progress = progress
        self.evaluate = evaluate if eval_interval > 0 else None
        self.eval_schedule = EvalSchedule(eval_interval if evaluate is not None else 0, eval_interval_env_steps, eval_interval_s)
        self.on_epoch_end = on_epoch_end
        # several learners: called at each epoch's end with its stop reason while the others still wait for
        # learner 0's decision, the last moment at which their state is this epoch's (a checkpoint takes it)
        self.before_others_go_on = before_others_go_on
        self.evaluate_first = evaluate_first  # a warm start: epoch 0 is the policy as loaded
        self.env_steps = 0
        self.epoch = 0
        self.updates, self._updated_env_steps = 0, 0  # this process's updates and the env steps they brought
        self.time_offset = 0.0  # seconds trained before a resume
        self.best_eval: float | None = None
        self.window: deque[float] = deque(maxlen=budget.target_window)

    @property
    def update_env_steps(self) -> float | None:
        """The env steps an update brings, on average over this process's updates (None before the first)."""
        return self._updated_env_steps / self.updates if self.updates else None

    def state_dict(self) -> dict[str, Any]:
        """Counters a resumed run continues from."""
        return {"env_steps": self.env_steps, "epoch": self.epoch, "window": list(self.window),
                "best_eval": self.best_eval, "time_s": self.time_offset + self.elapsed, "eval": self.eval_schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env_steps, self.epoch, self.best_eval = state["env_steps"], state["epoch"], state["best_eval"]
        self.window.extend(state["window"])
        self.time_offset = state["time_s"]
        if "eval" in state:  # absent from checkpoints written before evaluation had a schedule
            self.eval_schedule.load_state_dict(state["eval"])
        else:
            self.eval_schedule.last_env_steps, self.eval_schedule.last_time_s = self.env_steps, self.time_offset

    def window_mean(self) -> float | None:
        """Mean return of the last `target_window` episodes (None until the window is full)."""
        if len(self.window) < self.window.maxlen:
            return None
        return math.fsum(self.window) / len(self.window)

    def window_std(self) -> float | None:
        """Standard deviation of the window's returns (None until it is full): the spread that tells PBT
        (`pbt.score=train`, `pbt.copy_margin`) a member's lead from the noise of its episodes."""
        mean = self.window_mean()
        return None if mean is None else math.sqrt(math.fsum((r - mean) ** 2 for r in self.window) / len(self.window))

    def _stop_reason(self, elapsed: float, judge_window: bool = True) -> str | None:
        """Budget checks after each update; with evaluation on, the target is judged on eval instead.
        With several learners the training window is judged at the epoch's end only, once it holds
        every learner's episodes (`judge_window=False` before)."""
        b = self.budget
        mean = self.window_mean() if judge_window else None
        if self.evaluate is None and b.target_return is not None and mean is not None and mean >= b.target_return:
            return "target_return"
        if self.env_steps >= b.max_env_steps:
            return "max_env_steps"
        if b.max_time_s is not None and self.time_offset + elapsed >= b.max_time_s:
            return "max_time_s"
        return None

    @property
    def elapsed(self) -> float:
        """Seconds of this session's training loop (frozen once it returns: shutting actors down and
        writing files afterwards is not training time a resumed run should be charged for)."""
        if not hasattr(self, "_start"):
            return 0.0
        return getattr(self, "_end", time.perf_counter()) - self._start

    def run(self, trackers: Sequence[StatsWriter] = (), pause_at: int | None = None) -> TrainResult:
        """Train to the budget's end. `trackers`: writers that get every row of this run besides
        `writers` (experiment trackers, opened by the caller at the last moment, closed by it).
        `pause_at`: return once this many env steps are reached, with the stop reason `PAUSED` and no
        closing line (a population's member between two reports); the next call goes on from there, its
        clock too. The epoch under way closes at that update (a shorter row, and its evaluation if one is
        due), so that a member reports at the interval it was given, not at the next epoch's end: with a
        learner of several processes, whose epochs end together, at the end of the epoch."""
        self._writing_to = [*self.writers, *trackers]
        start = self._start = time.perf_counter()
        first_epoch, first_steps = self.epoch, self.env_steps
        reason = None
        if self.evaluate_first and self.evaluate is not None and self.epoch == 0:
            self._evaluate_before_training()
        # Log lines go through tqdm while the bar is up, so table rows never tear the bar.
        with logging_redirect_tqdm(), tqdm(
            total=self.budget.max_env_steps, unit="step", unit_scale=True, disable=None if self.progress is None else not self.progress,
            dynamic_ncols=True, leave=False,
        ) as bar:
            while reason is None:
                reason = self._epoch(start, bar, pause_at if self.group is None else None)
                if reason is None and pause_at is not None and self.env_steps >= pause_at:
                    reason = PAUSED
        self._end = time.perf_counter()
        elapsed = self._end - start
        if reason == PAUSED:  # this part's seconds join those before, as a resumed run's do
            self.time_offset += elapsed
            self._start = self._end
            return TrainResult(self.epoch, self.env_steps, elapsed, reason, self.window_mean())
        for writer in self._writing_to:  # a console row held back is shown before the closing line
            getattr(writer, "flush", lambda: None)()
        line = f"stopped: {reason} after {self.env_steps:,} env steps, {self.epoch} epochs"
        if first_epoch > 0:  # a resumed run: totals, and this session's share
            line += (f" and {self.time_offset + elapsed:.1f}s in all; this session: {self.epoch - first_epoch} epochs, "
                     f"{self.env_steps - first_steps:,} env steps, {elapsed:.1f}s")
        else:
            line += f", {elapsed:.1f}s"
        log.info(line)
        return TrainResult(self.epoch, self.env_steps, elapsed, reason, self.window_mean())

    def _epoch(self, start: float, bar, pause_at: int | None = None) -> str | None:
        """One epoch: its updates (fewer where `pause_at` env steps come first), then its row (stats,
        evaluation) to every writer; the stop reason.

        Interrupted (Ctrl-C, SIGTERM) after an update, the epoch still gets its row, without the
        evaluation, before the interrupt goes on: every epoch the learner trained appears once in
        stats.jsonl and TensorBoard, and the checkpoint written on the way out counts it."""
        epoch_start, steps_before = time.perf_counter(), self.env_steps
        reason, stats = None, None

        def close_epoch() -> dict[str, Any]:
            self.epoch += 1
            return self._epoch_stats(self.time_offset + time.perf_counter() - start, time.perf_counter() - epoch_start, steps_before)

        try:
            for i in range(self.budget.epoch_length):
                self._one_update()
                bar.update(self.env_steps - bar.n)
                reason = self._stop_reason(time.perf_counter() - start, judge_window=self.group is None)
                if self.group is not None:
                    self.group.decide(EPOCH_END if reason or i == self.budget.epoch_length - 1 else CONTINUE)
                if reason or (pause_at is not None and self.env_steps >= pause_at):
                    break
            if self.group is not None:
                self._take_other_learners_episodes()
                reason = reason or self._stop_reason(time.perf_counter() - start)
            with interrupts_deferred():  # an interrupt amid the row's making would count the epoch twice
                stats = close_epoch()
            if self.background_eval is not None:
                reason = self._evaluate_in_background(stats, reason)
            elif self.evaluate is not None and (reason is not None or self.eval_schedule.due(self.epoch, self.env_steps, stats["time_s"])):
                reason = self._evaluate_into(stats, reason)
            reason = self._call_callbacks(stats, reason)
            if self.group is not None:
                if self.before_others_go_on is not None:
                    self.before_others_go_on(self, reason)
                self.group.decide(STOP if reason else CONTINUE)
        except KeyboardInterrupt:
            if stats is None and self.env_steps > steps_before:
                stats = close_epoch()
            if stats is not None:
                self._write(stats)
            raise
        self._write(stats)
        if self.on_epoch_end is not None:
            self.on_epoch_end(self, stats)
        return reason

    def _call_callbacks(self, stats: dict[str, Any], reason: str | None) -> str | None:
        """The callbacks' `on_epoch_end` (keys they add go into the row); a callback that asks to stop
        becomes the stop reason. One that raises still gets the row written before the run stops."""
        if not self.callbacks:
            return reason
        try:
            stop = self.callbacks.epoch_end(self.epoch, stats)
        except Exception:
            self._write(stats)
            raise
        return reason or (f"callback {stop}" if stop else None)

    def _write(self, stats: dict[str, Any]) -> None:
        """The row to every writer; an interrupt meanwhile waits until all have it."""
        with interrupts_deferred():
            for writer in self._writing_to:
                writer.write(stats)

    def _evaluate_before_training(self) -> None:
        """Epoch 0: the evaluation of the policy as it starts, written like an epoch's (and eligible
        for best.pt), so a warm start's curve begins at the checkpoint's level. It never stops the run."""
        stats: dict[str, Any] = {"epoch": 0, "env_steps": 0, "time_s": 0.0}
        self._evaluate_into(stats, None)
        if "eval/return_mean" in stats:
            log.info(f"before training: eval return {stats['eval/return_mean']:.1f} over the same episodes as every evaluation")
        self._write(stats)
        if self.on_epoch_end is not None:
            self.on_epoch_end(self, stats)

    def _evaluate_into(self, stats: dict[str, Any], reason: str | None) -> str | None:
        """Add this epoch's evaluation to `stats`; the stop reason, "target_return" if eval reached it.

        An env that raises during evaluation skips that evaluation with a warning: the same env
        failing in an actor costs one restart, so here it must not cost the whole run."""
        start = time.perf_counter()
        try:
            stats.update(self.evaluate())
        except ConfigError:  # bad input (a non-numeric env statistic): the run stops with its one line
            raise
        except Exception as err:  # noqa: BLE001 - any env error
            log.warning(f"evaluation in epoch {self.epoch} failed ({type(err).__name__}: {err}); skipped, training goes on")
            log.debug("evaluation failure", exc_info=True)
            stats["eval/failures"] = 1
            return reason
        stats["time/eval_s"] = time.perf_counter() - start
        time_after = stats["time_s"] + stats["time/eval_s"]
        self.eval_schedule.evaluated(self.env_steps, time_after, stats["time/eval_s"])
        return self._judge_eval(stats, reason, time_after)

    def _judge_eval(self, stats: dict[str, Any], reason: str | None, time_s: float) -> str | None:
        """The row's share of time spent evaluating, the best return so far; "target_return" if the
        evaluation reached the target."""
        stats["time/eval_share"] = self.eval_schedule.spent_s / max(time_s, 1e-9)
        eval_mean = stats["eval/return_mean"]
        if self.best_eval is None or eval_mean > self.best_eval:
            self.best_eval = eval_mean
        stats["eval/best_return_mean"] = self.best_eval
        target = self.budget.target_return
        if reason is None and target is not None and eval_mean >= target:
            return "target_return"
        return reason

    def _evaluate_in_background(self, stats: dict[str, Any], reason: str | None) -> str | None:
        """eval.background: a finished snapshot's evaluation joins this row (`eval/snapshot_env_steps` says
        which weights it judged); a new one starts when due and none runs. At the run's end the learner
        waits for the one in flight, then evaluates the final weights itself unless the snapshot reached
        the target: the last row's evaluation is of the weights the run ends with, as without it."""
        background = self.background_eval
        t0 = time.perf_counter()
        snapshot = background.take(wait=reason is not None)
        self.eval_schedule.spent_s += time.perf_counter() - t0  # the learner's wait at the end, if any
        if snapshot is not None:
            reason = self._snapshot_into(stats, snapshot, reason)
        if reason is not None:
            if reason != "target_return":  # the final weights, evaluated here
                for key in [k for k in stats if k.startswith("eval/")]:
                    del stats[key]
                reason = self._evaluate_into(stats, reason)
            return reason
        if not background.busy and self.eval_schedule.due(self.epoch, self.env_steps, stats["time_s"]):
            copy_s = background.start(self.epoch, self.env_steps)
            self.eval_schedule.evaluated(self.env_steps, stats["time_s"], copy_s)
        return reason

    def _snapshot_into(self, stats: dict[str, Any], snapshot: Snapshot, reason: str | None) -> str | None:
        if snapshot.error is not None:
            if isinstance(snapshot.error, ConfigError):
                raise snapshot.error
            err = snapshot.error
            log.warning(f"evaluation of epoch {snapshot.epoch}'s weights failed ({type(err).__name__}: {err}); skipped, training goes on")
            stats["eval/failures"] = 1
            return reason
        best_before = self.best_eval
        stats.update(snapshot.stats)
        stats["eval/snapshot_env_steps"] = snapshot.env_steps
        stats["time/eval_s"] = snapshot.seconds
        reason = self._judge_eval(stats, reason, stats["time_s"])
        if self.best_eval != best_before and self.on_best_snapshot is not None:
            self.on_best_snapshot(self, snapshot)
        return reason

    def _one_update(self) -> None:
        returns = self.loop.actor_stats.values("episode_return")
        n_episodes = len(returns)
        steps = self.loop.iteration()
        steps = steps if self.group is None else int(self.group.sum([steps])[0])
        self.env_steps += steps
        self.updates, self._updated_env_steps = self.updates + 1, self._updated_env_steps + steps
        self.window.extend(self.loop.actor_stats.values("episode_return")[n_episodes:])

    def _take_other_learners_episodes(self) -> None:
        """The epoch's episodes and actor stats of the other learners, into this learner's: the row
        counts every learner's actors."""
        stats = self.loop.actor_stats
        for share in (self.group.gather_objects(None) or [])[1:]:
            for event, values in share.items():
                stats.extend(event, values)
            self.window.extend(share.get("episode_return", []))

    def _warn_unreported(self, actor: EpochStatsAggregator) -> None:
        """At the first epoch with ended episodes: one warning for each `env.info_stats` key none of
        them reported (a misspelt key, or one the env puts in no step's info)."""
        if not self.info_keys or not actor.values("episode_return"):
            return
        missing = [k for k in self.info_keys if not actor.values(event_name(k))]
        n = len(actor.values("episode_return"))
        for key in missing:
            log.warning(f"env.info_stats.{key}: none of the first {n} episodes reported info['{key}']; "
                        f"check the key's spelling against the env's info (env/{key} stays out of the stats)")
        self.info_keys = []

    def _epoch_stats(self, elapsed: float, epoch_s: float, steps_before: int) -> dict[str, Any]:
        actor, learner = self.loop.actor_stats, self.loop.learner_stats
        stats: dict[str, Any] = {
            "epoch": self.epoch,
            "env_steps": self.env_steps,
            "time_s": round(elapsed, 3),
            "sps": (self.env_steps - steps_before) / max(epoch_s, 1e-9),
            "train/episodes": actor.get("episode_return", "count"),
            "train/return_mean": actor.get("episode_return", "mean"),
            "train/return_min": actor.get("episode_return", "min"),
            "train/return_max": actor.get("episode_return", "max"),
            "train/episode_length_mean": actor.get("episode_length", "mean"),
            "train/return_window_mean": self.window_mean(),
            "train/return_window_std": self.window_std(),
            "learner/updates": self.loop.updates(),
            "policy_lag_mean": actor.get("policy_lag", "mean"),
            "policy_lag_max": actor.get("policy_lag", "max"),
            "actor_restarts": actor.get("actor_restarts", "sum"),
            "dropped_rollouts": actor.get("dropped_rollouts", "sum"),
            "actor_idle_frac": actor.get("actor_idle_frac", "mean"),
        }
        stats |= epoch_means({event: actor.values(event) for event in actor.events()})
        self._warn_unreported(actor)
        for event in learner.events():
            stats[event] = learner.get(event, "sum" if event.startswith("time/") else "mean")
        stats["time/epoch_s"] = epoch_s
        if "time/wait_actors_s" in stats:
            stats["time/wait_actors_frac"] = stats["time/wait_actors_s"] / max(epoch_s, 1e-9)
        for event in ("actor_env_step_s", "actor_inference_s", "actor_record_s", "actor_wait_s"):
            if actor.values(event):
                stats[f"time/{event}"] = actor.get(event, "sum")
        actor.clear()
        learner.clear()
        return {k: v for k, v in stats.items() if v is not None}
