"""An Optuna search of the learning rate with `train -m hydra/sweeper=optuna`, then its best lr against the
default on fresh seeds: does the search find an lr that beats the default?

    python benchmarks/optuna_sweep.py                                  # 20 trials, 5 seeds each side
    python benchmarks/optuna_sweep.py --trials 20 --seeds 1 2 3 4 5 --out benchmarks/SWEEPS.md

The task: PPO on CartPole-v1 through `+env=gym` (no tuning file applies, so PPO's default lr of 3e-4
is the one a new user gets) with a budget of `--steps` env steps, no target, evaluation every epoch.
The objective is `train`'s default: the run's best eval return. The search runs on seed 1 (Optuna's
TPE sampler seeded too); the comparison then runs the default lr and the best trial's lr on every
seed of `--seeds`, one process at a time, alternating, and prints every seed's best eval return.
Needs the `sweep` extra (hydra-optuna-sweeper).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TRAIN = str(Path(sys.executable).with_name("train"))
TASK = ["+env=gym", "env.id=CartPole-v1", "algorithm=ppo", "target_return=null", "runner.n_actors=2"]
DEFAULT_LR = 3e-4  # PpoConfig.lr


def best_eval(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    return max(row["eval/return_mean"] for row in rows if "eval/return_mean" in row)


def sweep(trials: int, steps: int, work: Path) -> tuple[float, float, Path]:
    """The Optuna sweep; returns the best trial's lr and objective, and the sweep dir."""
    sweep_dir = work / "sweep"
    command = [TRAIN, "-m", "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.direction=maximize",
               "hydra.sweeper.sampler.seed=1", "hydra.sweeper.n_jobs=1", *TASK, f"max_env_steps={steps}", "seed=1",
               "algorithm.lr=tag(log, interval(1e-4, 3e-2))", f"hydra.sweep.dir={sweep_dir}"]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=work)
    print(f"sweep: {trials} trials in {time.perf_counter() - start:.0f} s ({sweep_dir})")
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best_lr = float(results["best_params"]["algorithm.lr"])
    return best_lr, float(results["best_value"]), sweep_dir


def run(lr: float, seed: int, steps: int, work: Path) -> float:
    run_dir = work / f"lr{lr:.6g}_seed{seed}"
    subprocess.run([TRAIN, *TASK, f"max_env_steps={steps}", f"seed={seed}", f"algorithm.lr={lr}", f"hydra.run.dir={run_dir}"],
                   check=True, stdout=subprocess.DEVNULL, cwd=work)
    return best_eval(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=15000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="optuna_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    best_lr, best_value, sweep_dir = sweep(args.trials, args.steps, work)
    trials = sorted((line.split(",") for line in (sweep_dir / "summary.csv").read_text().splitlines()[1:]), key=lambda r: r[0])
    print(f"best trial: lr={best_lr:.3g}, best eval return {best_value:.1f} (summary: {sweep_dir / 'summary.csv'}, {len(trials)} rows)")
    results: dict[float, list[float]] = {DEFAULT_LR: [], best_lr: []}
    for seed in args.seeds:
        for lr in (DEFAULT_LR, best_lr):
            results[lr].append(run(lr, seed, args.steps, work))
            print(f"seed {seed} lr {lr:.3g}: best eval return {results[lr][-1]:.1f}", flush=True)
    lines = ["| lr | " + " | ".join(f"seed {s}" for s in args.seeds) + " | median | mean |",
             "|---|" + "---|" * (len(args.seeds) + 2)]
    for lr, label in ((DEFAULT_LR, f"{DEFAULT_LR:.3g} (default)"), (best_lr, f"{best_lr:.3g} (best trial)")):
        values = results[lr]
        lines.append(f"| {label} | " + " | ".join(f"{v:.1f}" for v in values)
                     + f" | {statistics.median(values):.1f} | {statistics.fmean(values):.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
