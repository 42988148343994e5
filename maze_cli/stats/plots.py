"""Learning curves as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from maze_cli.disk import DiskFull, writing
from maze_cli.stats.writers import read_rows

log = logging.getLogger("maze_cli")


def read_stats(run_dir: Path) -> list[dict]:
    """The run's epoch rows (a row a crash cut short is skipped)."""
    return read_rows(run_dir / "stats.jsonl")


def write_learning_curve(run_dir: Path) -> Path | None:
    """`learning_curve.png`: training (and eval) return against env steps."""
    stats = read_stats(run_dir)
    if not stats:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("train/return_mean", "train return (epoch mean)"), ("eval/return_mean", "eval return")):
        points = [(row["env_steps"], row[key]) for row in stats if key in row]
        if points:
            ax.plot(*zip(*points), marker="." if key.startswith("eval") else None, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.grid(alpha=0.3)
    if ax.lines:  # no episode ended yet: an empty plot, without a legend (matplotlib warns on an empty one)
        ax.legend()
    fig.tight_layout()
    out = run_dir / "learning_curve.png"
    tmp = out.with_suffix(".tmp.png")
    try:
        with writing(out):
            fig.savefig(tmp, dpi=100)
            tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out


def draw_learning_curve(run_dir: Path) -> None:
    """`write_learning_curve`, where a curve that cannot be drawn (matplotlib, a full disk) costs a
    warning, never the run: it is a picture of stats.jsonl, which is already saved."""
    try:
        write_learning_curve(run_dir)
    except Exception as err:  # noqa: BLE001
        log.warning(f"learning_curve.png not written: {err if isinstance(err, DiskFull) else f'{type(err).__name__}: {err}'}")


def start_learning_curve(run_dir: Path) -> threading.Thread:
    """`write_learning_curve` in a thread, started once the run's last row is written: it draws
    while the actors stop (which is mostly waiting), so the command ends sooner. Join it before
    the command ends. A curve that cannot be drawn costs a warning, never the finished run."""

    thread = threading.Thread(target=draw_learning_curve, args=(run_dir,), name="learning-curve")
    thread.start()
    return thread
