"""After a multirun (`train -m ...`): `summary.csv` and `summary.png` in the sweep dir.

One CSV row per job (its overrides, best and final return, env steps, wall time; returns are eval
returns when the jobs evaluated); one curve of training return per setting of the overrides other
than `seed`, the mean across seeds with the min-max spread.
"""

from __future__ import annotations

import csv
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from maze_cli.stats.plots import read_stats

log = logging.getLogger("maze_cli")


def _curve_key(stats: list[dict]) -> str:
    """The return the sweep is judged on: eval when the runs evaluated, else training."""
    return "eval/return_mean" if any("eval/return_mean" in row for row in stats) else "train/return_mean"


def collect_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    jobs = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: (len(p.name), p.name)):
        stats = read_stats(job_dir)
        if not stats:
            continue
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
        key = _curve_key(stats)
        returns = [row[key] for row in stats if key in row]
        jobs.append({
            "job": job_dir.name,
            "overrides": " ".join(overrides),
            "group": " ".join(o for o in overrides if not o.lstrip("+").startswith("seed=")) or "(all)",
            "return_key": key,
            "best_return": max(returns) if returns else None,
            "final_return": returns[-1] if returns else None,
            "env_steps": stats[-1]["env_steps"],
            "wall_time_s": stats[-1]["time_s"],
            # The curve uses the training return: one point per epoch (evaluations are sparser).
            "curve": [(row["env_steps"], row["train/return_mean"]) for row in stats if "train/return_mean" in row],
        })
    return jobs


def write_summary_csv(jobs: list[dict[str, Any]], path: Path) -> None:
    fields = ["job", "overrides", "return_key", "best_return", "final_return", "env_steps", "wall_time_s"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(jobs)


def write_summary_png(jobs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[list[tuple[int, float]]]] = defaultdict(list)
    for job in jobs:
        if job["curve"]:
            groups[job["group"]].append(job["curve"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for group, curves in groups.items():
        end = min(c[-1][0] for c in curves)
        grid = np.linspace(min(c[0][0] for c in curves), max(end, min(c[0][0] for c in curves) + 1), 100)
        values = np.array([np.interp(grid, *zip(*c)) for c in curves])
        ax.plot(grid, values.mean(0), label=f"{group} (n={len(curves)})")
        if len(curves) > 1:
            ax.fill_between(grid, values.min(0), values.max(0), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return (epoch mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class SweepSummary(Callback):
    """Hydra callback: summarise the sweep once every job has ended."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = collect_jobs(sweep_dir) if sweep_dir.is_dir() else []
        if not jobs:
            return
        write_summary_csv(jobs, sweep_dir / "summary.csv")
        write_summary_png(jobs, sweep_dir / "summary.png")
        log.info(f"sweep summary: {sweep_dir / 'summary.csv'}, {sweep_dir / 'summary.png'}")
