"""pbt.jsonl: one row per exploit-and-explore of a population (who copied whom, when, the values of
the changed keys before and after, both scores), and what a person reads of a finished population."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from maze_cli.disk import writing

JOURNAL = "pbt.jsonl"


def member_dir(run_dir: Path, index: int) -> Path:
    """Where member `index` of the population in `run_dir` keeps its run."""
    return run_dir / f"member_{index}"


def _ranked_row(rows: list[dict[str, Any]], by: str = "eval") -> tuple[dict[str, Any] | None, str | None]:
    """The row and key PBT ranks a member by: its latest evaluation where it has evaluated, even where
    rows without one came after it (a run evaluating every few epochs must not be ranked by its
    sampled training episodes between two evaluations, whose scale a greedy evaluation's need not
    share); a run that never evaluated, or `by="train"` (`pbt.score`): its latest training returns
    (train/return_window_mean, train/return_mean until the window is full)."""
    training = ("train/return_window_mean", "train/return_mean")
    for keys in ((training,) if by == "train" else (("eval/return_mean",), training)):
        for row in reversed(rows):
            key = next((k for k in keys if row.get(k) is not None), None)
            if key is not None:
                return row, key
    return None, None


def score_of(rows: list[dict[str, Any]], by: str = "eval") -> float | None:
    """What PBT ranks a member by (`_ranked_row`); None before the member has any."""
    row, key = _ranked_row(rows, by)
    return None if row is None else float(row[key])


def score_error(rows: list[dict[str, Any]], episodes: int, window: int, by: str = "eval") -> float:
    """The standard error of `score_of(rows, by)`: an evaluation's spread over its `episodes`, or the
    training window's over its `window` episodes; 0 for training returns before the window is full,
    whose spread is not kept."""
    row, key = _ranked_row(rows, by)
    spread, count = {"eval/return_mean": ("eval/return_std", episodes),
                     "train/return_window_mean": ("train/return_window_std", window)}.get(key, (None, 1))
    if spread is None:
        return 0.0
    return float(row.get(spread) or 0.0) / max(1, count) ** 0.5


COPY_ORDER = "copy.json"  # in a member's dir: the checkpoint it copies and the values it explores, before its next interval


def order_copy(member: Path, checkpoint: str, values: dict[str, float], donor: int) -> None:
    """Tell a member to copy `checkpoint` (a finished save: the scheduler waits for it) and take `values`
    before it trains on; written whole (a temp file renamed), so the member never reads half of it."""
    temp = member / f".{COPY_ORDER}.tmp"
    with writing(temp):
        temp.write_text(json.dumps({"checkpoint": checkpoint, "values": values, "donor": donor}), encoding="utf-8")
    os.replace(temp, member / COPY_ORDER)


def take_copy_order(member: Path) -> dict[str, Any] | None:
    """The copy order waiting for this member, removed as it is read (None: none)."""
    path = member / COPY_ORDER
    if not path.is_file():
        return None
    order = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    return order


def record(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one row to the population's pbt.jsonl (written by the driver alone)."""
    path = run_dir / JOURNAL
    with writing(path), path.open("a", encoding="utf-8") as journal:
        journal.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **row}) + "\n")


def read(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / JOURNAL
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def values_over_steps(rows: list[dict[str, Any]], member: int, start: dict[str, float]) -> dict[str, list[tuple[int, float]]]:
    """Each changed key's value of `member` over env steps: its start, then every explore it made."""
    series = {key: [(0, value)] for key, value in start.items()}
    for row in rows:
        if row["member"] == member:
            for key, value in row["after"].items():
                series.setdefault(key, []).append((row["env_steps"], value))
    return series


def draw_population(run_dir: Path, members: list[Path], start: dict[str, float]) -> Path | None:
    """pbt.png: each member's return over env steps (eval where it evaluated, else training) and, below,
    each changed key of each member over env steps."""
    from maze_cli.stats.writers import read_rows

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read(run_dir)
    fig, axes = plt.subplots(1 + len(start), 1, figsize=(8, 3 + 2.2 * len(start)), sharex=True, squeeze=False)
    for index, member in enumerate(members):
        stats = read_rows(member / "stats.jsonl")
        key = "eval/return_mean" if any("eval/return_mean" in row for row in stats) else "train/return_mean"
        points = [(row["env_steps"], row[key]) for row in stats if key in row]
        if points:
            axes[0][0].plot(*zip(*points), label=f"member {index}")
        for ax, (name, series) in zip(axes[1:], values_over_steps(rows, index, start).items()):
            steps, values = zip(*series)
            ax[0].step([*steps, max(p[0] for p in points) if points else steps[-1]], [*values, values[-1]], where="post")
            ax[0].set_ylabel(name)
            if min(values) > 0 and max(values) / min(values) >= 10:
                ax[0].set_yscale("log")
    axes[0][0].set_ylabel("return (eval where evaluated)")
    axes[-1][0].set_xlabel("env steps")
    if axes[0][0].lines:
        axes[0][0].legend(fontsize="small")
    for ax in axes:
        ax[0].grid(alpha=0.3)
    fig.tight_layout()
    path = run_dir / "pbt.png"
    with writing(path):
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
