"""Whole-process wall time of `train` to its target return, per seed, as a Markdown table.

    python benchmarks/time_to_solve.py --seeds 1 2 3 -- +env=cartpole runner=subproc

Runs the real console script once per seed (one at a time, so runs do not share the cores),
each in a temporary run dir, and reads the run's own stats.jsonl for env steps and throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = Path(sys.executable).with_name("train")


def run_once(seed: int, overrides: list[str], workdir: Path) -> dict:
    run_dir = workdir / f"seed{seed}"
    start = time.perf_counter()
    proc = subprocess.run([str(TRAIN), *overrides, f"seed={seed}", f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=workdir)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed:\n{proc.stderr}")
    stats = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    steady = stats[1:] or stats  # the first epoch includes actor start-up
    updates = [b["learner/updates"] - a["learner/updates"] for a, b in zip(stats, stats[1:])]
    update_rates = [u / row["time/epoch_s"] for u, row in zip(updates, stats[1:])] or [0.0]
    return {
        "updates_per_s": statistics.median(update_rates),
        "seed": seed,
        "wall_s": wall,
        "train_s": stats[-1]["time_s"],
        "env_steps": stats[-1]["env_steps"],
        "solved": "stopped: target_return" in proc.stdout,
        "sps": statistics.median(row["sps"] for row in steady),
        "final_window_return": stats[-1].get("train/return_window_mean"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("overrides", nargs="*", default=["+env=cartpole", "runner=subproc"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_once(seed, args.overrides, Path(tmp)) for seed in args.seeds]
    import torch

    print(f"`train {' '.join(args.overrides)}` on {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, torch {torch.__version__}\n")
    print("| seed | solved | whole-process wall s | training s | env steps | median steps/s | median updates/s |")
    print("|---:|:---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['seed']} | {'yes' if r['solved'] else 'no'} | {r['wall_s']:.1f} | {r['train_s']:.1f} | "
              f"{r['env_steps']:,} | {r['sps']:,.0f} | {r['updates_per_s']:,.0f} |")
    print(f"\nmedian whole-process wall time: {statistics.median(r['wall_s'] for r in rows):.1f} s; "
          f"median steady-state env steps/s: {statistics.median(r['sps'] for r in rows):,.0f}")


if __name__ == "__main__":
    main()
