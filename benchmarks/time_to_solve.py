"""Whole-process wall time of `train` to its target return, per seed, as a Markdown table.

    python benchmarks/time_to_solve.py --seeds 1 2 3 -- +env=cartpole runner=subproc

Runs the real console script once per seed (one at a time, so runs do not share the cores),
each in a temporary run dir, and reads the run's own stats.jsonl for env steps and throughput.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from machine import machine_line
from runs import TrainRun, run_train


def solve(overrides: list[str], seeds: list[int], workdir: Path) -> list[TrainRun]:
    """One run per seed, one after another."""
    return [run_train([*overrides, f"seed={seed}"], workdir / f"seed{seed}") for seed in seeds]


def table(runs: list[TrainRun], seeds: list[int]) -> str:
    lines = ["| seed | solved | whole-process wall s | training s | env steps | median steps/s | median updates/s | peak PSS MiB |",
             "|---:|:---:|---:|---:|---:|---:|---:|---:|"]
    for seed, r in zip(seeds, runs):
        last = r.rows[-1]
        lines.append(f"| {seed} | {'yes' if r.solved else 'no'} | {r.wall_s:.1f} | {last['time_s']:.1f} | {last['env_steps']:,} | "
                     f"{r.steady('sps', skip=1):,.0f} | {r.updates_per_s(skip=1):,.0f} | {r.peak_pss_mib:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("overrides", nargs="*", default=["+env=cartpole", "runner=subproc"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = solve(args.overrides, args.seeds, Path(tmp))
    print(f"`train {' '.join(args.overrides)}`; {machine_line()}\n")
    print(table(runs, args.seeds))
    print(f"\nmedian whole-process wall time: {statistics.median(r.wall_s for r in runs):.1f} s; "
          f"median steady-state env steps/s: {statistics.median(r.steady('sps', skip=1) for r in runs):,.0f}")


if __name__ == "__main__":
    main()
