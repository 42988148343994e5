"""Run the real `train` console script as a user would, and read back what the run wrote."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from procmem import PeakMemory

TRAIN = Path(sys.executable).with_name("train")


@dataclass
class TrainRun:
    overrides: list[str]
    wall_s: float  # whole process, start-up and shutdown included
    rows: list[dict]  # stats.jsonl, one row per epoch
    solved: bool  # stopped because the target return was reached
    peak_pss_mib: float  # summed over the train process and all its children
    peak_processes: int
    run_dir: Path | None = None  # where it wrote

    def steady(self, key: str, skip: int = 2) -> float:
        """Median of `key` over the epochs after the first `skip` (which include start-up)."""
        values = [row[key] for row in self.rows[skip:] if key in row] or [row[key] for row in self.rows if key in row]
        return statistics.median(values) if values else float("nan")

    def eval_curve(self) -> list[tuple[int, float]]:
        """(env steps, evaluation mean return) of every evaluation: a background evaluation's row names
        the weights it judged (eval/snapshot_env_steps)."""
        return [(row.get("eval/snapshot_env_steps", row["env_steps"]), row["eval/return_mean"])
                for row in self.rows if "eval/return_mean" in row]

    def updates_per_s(self, skip: int = 2) -> float:
        rows = self.rows[skip:] if len(self.rows) > skip + 1 else self.rows
        pairs = list(zip(rows, rows[1:]))
        rates = [(b["learner/updates"] - a["learner/updates"]) / b["time/epoch_s"] for a, b in pairs]
        return statistics.median(rates) if rates else float("nan")


def run_train(overrides: list[str], run_dir: Path, timeout_s: float = 900, pythonpath: Path | None = None,
              prefix: list[str] = ()) -> TrainRun:
    """`train <overrides>` in `run_dir`; raises SystemExit with its stderr if it fails. `pythonpath`: a
    folder the run imports env classes from (prepended to PYTHONPATH, for the actors too). `prefix`:
    a command that runs train (its arguments follow), e.g. one that gives it a mount namespace."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
    start = time.perf_counter()
    proc = subprocess.Popen([*prefix, str(TRAIN), *overrides, f"hydra.run.dir={run_dir}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
    with PeakMemory(proc.pid) as memory:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"train {' '.join(overrides)} failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    return TrainRun(overrides, wall, rows, "stopped: target_return" in stdout, memory.peak_mib, memory.peak_processes, run_dir)


def publish(lines: list[str], out: Path | None) -> None:
    """A benchmark's Markdown report: printed, and written to `out` (the `--out` option) if given."""
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(text + "\n")
