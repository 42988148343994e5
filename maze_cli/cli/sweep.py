"""A run's objective (what `train` returns to a sweeper), and after a multirun (`train -m ...`):
`summary.csv` and `summary.png` in the sweep dir.

One CSV row per job (its overrides, best and final return, env steps, wall time; returns are eval
returns when the jobs evaluated; its objective, what `train` returned to the sweeper). The plot shows that same return and, beside it, the training
return: per setting of the overrides other than `seed`, the mean across seeds with the min-max spread.
"""

from __future__ import annotations

import csv
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from maze_cli.config.schema import TrainConfig
from maze_cli.disk import STOPPED_BY_FULL_DISK, DiskFull, writing
from maze_cli.stats.plots import read_stats
from maze_cli.stats.writers import read_rows

log = logging.getLogger("maze_cli")


def _curve_key(stats: list[dict]) -> str:
    """The return the sweep is judged on: eval when the runs evaluated, else training."""
    return "eval/return_mean" if any("eval/return_mean" in row for row in stats) else "train/return_mean"


REDUCTIONS = {"max": max, "min": min, "last": lambda v: v[-1], "mean": lambda v: math.fsum(v) / len(v)}


def objective_of(rows: list[dict[str, Any]], key: str | None, reduce: str, evaluated: bool) -> tuple[float, str]:
    """A run's objective from its epoch rows, and the key it was read from: `key` reduced over the
    epochs by `reduce`; with no key the best eval return, or without evaluation the last training
    window mean (the epochs' mean return while the window was never full). NaN: no epoch has it."""
    if key is None:
        key, reduce = ("eval/return_mean", "max") if evaluated else ("train/return_window_mean", "last")
    values = [float(row[key]) for row in rows if isinstance(row.get(key), (int, float))]
    if not values and key == "train/return_window_mean":
        values = [float(row["train/return_mean"]) for row in rows if isinstance(row.get("train/return_mean"), (int, float))]
    return (REDUCTIONS[reduce](values) if values else math.nan), key


def objective(run_dir: Path, t: TrainConfig) -> float:
    """The run's objective for a sweeper, from its stats.jsonl (every epoch, over any resumes):
    `sweep.objective` reduced by `sweep.reduce` (`objective_of`). NaN where no epoch has the key
    (a sweeper counts the trial failed)."""
    value, key = objective_of(read_rows(run_dir / "stats.jsonl"), t.sweep.objective, t.sweep.reduce, t.eval.interval > 0)
    if math.isnan(value):
        log.warning(f"sweep.objective: no epoch of the run has '{key}'; the objective is NaN")
    return value


def _job_objective(job_dir: Path, stats: list[dict[str, Any]]) -> tuple[float, str]:
    """The objective a job returned, from its saved config (`sweep.*`, `eval.interval`) and its rows."""
    config_file = job_dir / ".hydra" / "config.yaml"
    config = (yaml.safe_load(config_file.read_text()) or {}) if config_file.is_file() else {}
    sweep = config.get("sweep") or {}
    evaluated = (config.get("eval") or {}).get("interval", 1) > 0
    return objective_of(stats, sweep.get("objective"), sweep.get("reduce", "max"), evaluated)


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    jobs = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: (len(p.name), p.name)):
        stats = read_stats(job_dir)
        if not stats:
            continue
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
        overrides = [o.removeprefix("++") if o.startswith("++env.") else o for o in overrides]  # as typed (train's env.<key>)
        key = _curve_key(stats)
        returns = [row[key] for row in stats if key in row]
        objective, objective_key = _job_objective(job_dir, stats)
        jobs.append({
            "job": job_dir.name,
            "overrides": " ".join(overrides),
            "group": " ".join(o for o in overrides if not o.lstrip("+").startswith("seed=")) or "(all)",
            "return_key": key,
            "best_return": max(returns) if returns else None,
            "final_return": returns[-1] if returns else None,
            "env_steps": stats[-1]["env_steps"],
            "wall_time_s": stats[-1]["time_s"],
            "objective": objective,
            "objective_key": objective_key,
            "curves": {  # the return the CSV reports, and the training return (one point per epoch)
                key: [(row["env_steps"], row[key]) for row in stats if key in row],
                "train/return_mean": [(row["env_steps"], row["train/return_mean"]) for row in stats if "train/return_mean" in row],
            },
        })
    return jobs


def write_summary_csv(jobs: list[dict[str, Any]], path: Path) -> None:
    fields = ["job", "overrides", "return_key", "best_return", "final_return", "env_steps", "wall_time_s", "objective", "objective_key"]
    with writing(path), open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(jobs)


def write_summary_png(jobs: list[dict[str, Any]], path: Path) -> None:
    fig = summary_figure(jobs)  # selects the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt

    try:
        with writing(path):
            fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def summary_figure(jobs: list[dict[str, Any]]):
    """Two panels against env steps: the return the CSV reports (eval where the jobs evaluated) and
    the training return; per setting of the other overrides, the mean across seeds with the min-max
    spread. Jobs too short for a curve (one epoch, one evaluation) show as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judged = jobs[0]["return_key"]
    panels = [(judged, "eval return" if judged.startswith("eval/") else "training return (epoch mean)")]
    if judged != "train/return_mean":
        panels.append(("train/return_mean", "training return (epoch mean)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        groups: dict[str, list[list[tuple[int, float]]]] = defaultdict(list)
        for job in jobs:
            if job["curves"].get(key):
                groups[job["group"]].append(job["curves"][key])
        for colour, (group, curves) in enumerate(groups.items()):
            _plot_group(ax, curves, f"{group} (n={len(curves)})", f"C{colour % 10}")
        ax.set_xlabel("env steps")
        ax.set_ylabel(label)
        ax.margins(x=0.05, y=0.1)
        ax.grid(alpha=0.3)
        if groups:
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _plot_group(ax, curves: list[list[tuple[int, float]]], label: str, colour: str) -> None:
    """The mean across a group's jobs on a common grid with the min-max band; where a job has a
    single point, every job's points as markers (nothing to interpolate)."""
    if min(len(c) for c in curves) < 2:
        for i, curve in enumerate(curves):
            xs, ys = zip(*curve)
            ax.plot(xs, ys, "o-", color=colour, label=label if i == 0 else None)
        return
    start, end = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    if end <= start:  # the jobs' steps do not overlap: no common grid
        start, end = min(c[0][0] for c in curves), max(c[-1][0] for c in curves)
    grid = np.linspace(start, end, 100)
    values = np.array([np.interp(grid, *zip(*c)) for c in curves])
    ax.plot(grid, values.mean(0), color=colour, label=label)
    if len(curves) > 1:
        ax.fill_between(grid, values.min(0), values.max(0), color=colour, alpha=0.2)


class SweepSummary(Callback):
    """Hydra callback: summarise the sweep once every job has ended. A job a full disk stopped is
    left out (it did not finish; its dir keeps what it wrote), as seen by the jobs this process runs
    (Hydra's basic launcher; other launchers run jobs elsewhere, and every job with rows is summarised)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        stopped = STOPPED_BY_FULL_DISK
        jobs = [job for job in (collect_jobs(sweep_dir) if sweep_dir.is_dir() else []) if job["job"] not in stopped]
        if stopped:
            log.warning(f"sweep summary: job{'s' if len(stopped) > 1 else ''} {', '.join(sorted(stopped))} left out "
                        f"(stopped by a full disk)")
        if not jobs:
            return
        try:
            write_summary_csv(jobs, sweep_dir / "summary.csv")
            write_summary_png(jobs, sweep_dir / "summary.png")
        except DiskFull as err:
            log.warning(f"sweep summary not written: {err}; every job's stats.jsonl is in its dir")
            return
        log.info(f"sweep summary: {sweep_dir / 'summary.csv'}, {sweep_dir / 'summary.png'}")
