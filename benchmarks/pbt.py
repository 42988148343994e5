"""Population-based training against single runs from the same start (`docs/pbt.md`).

    python benchmarks/pbt.py run --seeds 1 2 3                       # CartPole from lr=1e-5, 4 members, 1M env steps each
    python benchmarks/pbt.py run --seeds 1 --single                  # the single runs from the same lr, same seeds
    python benchmarks/pbt.py cost --seeds 1 2 3                      # PBT's own cost: a population against 4 runs side by side
    python benchmarks/pbt.py report

Each population is `train +env=cartpole pbt.population=4 'pbt.mutations={algorithm.lr: [1e-5, 3e-3]}'
algorithm.lr=1e-5 max_env_steps=1000000 seed=<s>` (each member's budget; the packaged CartPole config stops a
member that reaches its target); a single run is the same command without `pbt.*`. Judged by the same rule on
both sides: the best evaluation any run of the command reached (for a population: its best member's). Rows go
to benchmarks/results/pbt.jsonl; `report` prints a table with every seed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = Path(sys.executable).with_name("train")

RESULTS = Path(__file__).parent / "results" / "pbt.jsonl"
TASK = ["+env=cartpole", "algorithm.lr=1e-5", "max_env_steps=1000000"]
POPULATION = ["pbt.population=4", "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}"]


def best_eval(run_dir: Path) -> tuple[float | None, int]:
    """The best evaluation of the runs under `run_dir` (a population's members, or the run itself) and the
    env steps they trained in all."""
    best, steps = None, 0
    for stats in [run_dir / "stats.jsonl", *sorted(run_dir.glob("member_*/stats.jsonl"))]:
        if not stats.is_file():
            continue
        rows = [json.loads(line) for line in stats.read_text().splitlines() if line.strip()]
        evals = [row["eval/return_mean"] for row in rows if "eval/return_mean" in row]
        if evals:
            best = max(evals) if best is None else max(best, max(evals))
        steps += max((row["env_steps"] for row in rows), default=0)
    return best, steps


def run(seeds: list[int], single: bool, results: Path, runs_dir: Path) -> None:
    for seed in seeds:
        label = "single" if single else "pbt-4"
        overrides = [*TASK, *([] if single else POPULATION), f"seed={seed}"]
        run_dir = runs_dir / f"{label}-seed{seed}"
        start = time.perf_counter()
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")}
        proc = subprocess.run([str(TRAIN), *overrides, f"hydra.run.dir={run_dir}"], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=4 * 3600)
        if proc.returncode != 0:
            raise SystemExit(f"train {' '.join(overrides)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        best, steps = best_eval(run_dir)
        exploits = len((run_dir / "pbt.jsonl").read_text().splitlines()) if (run_dir / "pbt.jsonl").is_file() else 0
        row = {"label": label, "seed": seed, "best_eval": best, "env_steps": steps, "exploits": exploits,
               "wall_s": time.perf_counter() - start, "command": "train " + " ".join(overrides)}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def cost(seeds: list[int], results: Path, runs_dir: Path, budget: int) -> None:
    """The population's env steps per second against the same 4 runs side by side without PBT (4 `train`
    processes started together), both to the full budget (`target_return=null`), one after the other;
    each side's time is its commands' whole wall time, start-up included."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")}
    for seed in seeds:
        common = [*TASK[:-1], f"max_env_steps={budget}", "target_return=null", f"seed={seed}"]
        start = time.perf_counter()
        population = runs_dir / f"cost-pbt-seed{seed}"
        subprocess.run([str(TRAIN), *common, *POPULATION, f"hydra.run.dir={population}"], check=True, capture_output=True,
                       env=env, stdin=subprocess.DEVNULL)
        pbt_s = time.perf_counter() - start
        pbt_steps = best_eval(population)[1]
        start = time.perf_counter()
        procs = [subprocess.Popen([str(TRAIN), *common[:-1], f"seed={seed * 100 + i}", f"hydra.run.dir={runs_dir / f'cost-side-seed{seed}-{i}'}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, stdin=subprocess.DEVNULL)
                 for i in range(4)]
        if any(proc.wait() for proc in procs):
            raise SystemExit("a run side by side failed")
        side_s = time.perf_counter() - start
        side_steps = sum(best_eval(runs_dir / f"cost-side-seed{seed}-{i}")[1] for i in range(4))
        row = {"label": "cost", "seed": seed, "budget": budget, "pbt_steps_per_s": pbt_steps / pbt_s, "side_by_side_steps_per_s": side_steps / side_s,
               "ratio": (pbt_steps / pbt_s) / (side_steps / side_s), "pbt_wall_s": pbt_s, "side_by_side_wall_s": side_s}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def report(results: Path) -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    print("| command | seed | best evaluation | env steps in all | exploits | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in sorted((r for r in rows if r["label"] != "cost"), key=lambda r: (r["label"], r["seed"])):
        print(f"| {row['label']} | {row['seed']} | {row['best_eval']:.1f} | {row['env_steps']:,} | {row['exploits']} | "
              f"{row['wall_s']:.0f} |")
    costs = [r for r in rows if r["label"] == "cost"]
    if costs:
        print("\n| env steps a run | seed | population env steps/s | 4 runs side by side env steps/s | ratio |")
        print("|---:|---:|---:|---:|---:|")
        for row in costs:
            print(f"| {row.get('budget', 1_000_000):,} | {row['seed']} | {row['pbt_steps_per_s']:,.0f} | "
                  f"{row['side_by_side_steps_per_s']:,.0f} | {row['ratio']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--seeds", type=int, nargs="+", required=True)
    go.add_argument("--single", action="store_true", help="single runs from the same start instead of populations")
    go.add_argument("--results", type=Path, default=RESULTS)
    go.add_argument("--runs-dir", type=Path, help="where the run dirs go (default: a new temporary folder, kept)")
    price = sub.add_parser("cost")
    price.add_argument("--seeds", type=int, nargs="+", required=True)
    price.add_argument("--results", type=Path, default=RESULTS)
    price.add_argument("--runs-dir", type=Path)
    price.add_argument("--budget", type=int, default=1_000_000, help="each run's (each member's) env steps")
    rep = sub.add_parser("report")
    rep.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.command in ("run", "cost"):
        runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="maze-pbt-"))
        print(f"run dirs under {runs_dir}", flush=True)
        if args.command == "run":
            run(args.seeds, args.single, args.results, runs_dir)
        else:
            cost(args.seeds, args.results, runs_dir, args.budget)
    else:
        report(args.results)


if __name__ == "__main__":
    main()
