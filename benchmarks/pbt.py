"""Population-based training against single runs from the same start (`docs/pbt.md`).

    python benchmarks/pbt.py run --seeds 1 2 3                       # CartPole from lr=1e-5, 4 members, 1M env steps each
    python benchmarks/pbt.py run --seeds 1 --single                  # the single runs from the same lr, same seeds
    python benchmarks/pbt.py run --task breakout --seeds 1 2 3       # MinAtar Breakout, 4 members, 2M env steps each
    python benchmarks/pbt.py run --task breakout --seeds 1 2 3 --single  # 4 independent runs side by side, 2M each
    python benchmarks/pbt.py run --task spaceinvaders --seeds 1 2 3     # the same on a game no PBT setting was chosen on
    python benchmarks/pbt.py cost --seeds 1 2 3                      # PBT's own cost: a population against 4 runs side by side
    python benchmarks/pbt.py cost --seeds 1 2 3 --packaged-lr        # the same, both sides from CartPole's own lr
    python benchmarks/pbt.py report

Each population is `train +env=cartpole pbt.population=4 'pbt.mutations={algorithm.lr: [1e-5, 3e-3]}'
algorithm.lr=1e-5 max_env_steps=1000000 seed=<s>` (each member's budget; the packaged CartPole config stops a
member that reaches its target); a single run is the same command without `pbt.*`. Judged by the same rule on
both sides: the best evaluation any run of the command reached (for a population: its best member's). Rows go
to benchmarks/results/pbt.jsonl; `report` prints a table with every seed.

MinAtar Breakout (`--task breakout`): `train +env=minatar max_env_steps=2000000` at its defaults, a population of
4 changing the learning rate and the entropy coefficient from the defaults' values, against 4 independent runs of
the same command started together (the same total env steps, the same starting values, the CPUs shared alike).
Both sides are judged by the best evaluation any of their runs reached and by the best last evaluation.
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
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import cpu_model  # noqa: E402
from zoo import code_version  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "pbt.jsonl"
TASK = ["+env=cartpole", "algorithm.lr=1e-5", "max_env_steps=1000000"]
POPULATION = ["pbt.population=4", "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}"]
MINATAR_POPULATION = ["pbt.population=4", "pbt.mutations={algorithm.lr: [2e-4, 2e-2], algorithm.entropy_coef: [0.002, 0.1]}",
                      "pbt.interval_env_steps=200000"]
TASKS = {  # task: (its command, what makes it a population, how many independent runs it is set against)
    "cartpole": (TASK, POPULATION, 1),
    "breakout": (["+env=minatar", "max_env_steps=2000000"], MINATAR_POPULATION, 4),
    # not the task any PBT setting was chosen on: where a choice made on the two above is tried
    "spaceinvaders": (["+env=minatar", "env.id=MinAtar/SpaceInvaders-v1", "max_env_steps=2000000"], MINATAR_POPULATION, 4),
}


def evaluations(run_dir: Path) -> tuple[list[list[float]], int]:
    """The evaluations of each run under `run_dir` (a population's members, or the run itself) and the env
    steps they trained in all."""
    runs, steps = [], 0
    for stats in [run_dir / "stats.jsonl", *sorted(run_dir.glob("member_*/stats.jsonl"))]:
        if not stats.is_file():
            continue
        rows = [json.loads(line) for line in stats.read_text().splitlines() if line.strip()]
        runs.append([row["eval/return_mean"] for row in rows if "eval/return_mean" in row])
        steps += max((row["env_steps"] for row in rows), default=0)
    return runs, steps


def fresh(run_dir: Path) -> str:
    """`hydra.run.dir=<run_dir>`, a dir that does not exist yet. `train` itself refuses a dir holding a run,
    but only once the commands started beside it are running; an earlier benchmark's dir is refused here,
    before any command starts, along with a dir an earlier command left without a row."""
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists, from an earlier benchmark: give --runs-dir a new folder (or leave it out)")
    return f"hydra.run.dir={run_dir}"


def judged(run_dirs: list[Path]) -> dict:
    """Both rules over runs taken together: the best evaluation any reached, the best last evaluation."""
    runs, steps = [], 0
    for run_dir in run_dirs:
        found, trained = evaluations(run_dir)
        runs, steps = runs + [evals for evals in found if evals], steps + trained
    return {"best_eval": max((max(evals) for evals in runs), default=None),
            "best_last_eval": max((evals[-1] for evals in runs), default=None), "env_steps": steps}


def run(task: str, seeds: list[int], single: bool, results: Path, runs_dir: Path, overrides: list[str], tag: str = "") -> None:
    """Populations of `task`, or (`single`) the independent runs set against them: one run, or several
    started together with seeds of their own (`seed * 100 + i`). `overrides` go on every command and
    into the label, and so does `tag` (a note of what differs: the code, the load)."""
    command, population, independent = TASKS[task]
    command = [*command, *overrides]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")}
    for seed in seeds:
        label = ("single" if independent == 1 else f"independent-{independent}") if single else "pbt-4"
        if task != "cartpole":
            label = f"{task}-{label}"
        label = " ".join([label, *overrides, *([tag] if tag else [])])
        name = label.replace(" ", "_").replace("=", "-")
        jobs = ([(f"seed={seed}", runs_dir / f"{name}-seed{seed}")] if not single or independent == 1 else
                [(f"seed={seed * 100 + i}", runs_dir / f"{name}-seed{seed}-{i}") for i in range(independent)])
        start = time.perf_counter()
        procs = [subprocess.Popen([str(TRAIN), *command, *([] if single else population), seeded, fresh(run_dir)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)
                 for seeded, run_dir in jobs]
        for proc, (seeded, _) in zip(procs, jobs):
            _, err = proc.communicate(timeout=4 * 3600)
            if proc.returncode != 0:
                raise SystemExit(f"train {' '.join(command)} {seeded} failed (exit {proc.returncode}):\n{err[-3000:]}")
        run_dirs = [run_dir for _, run_dir in jobs]
        journal = run_dirs[0] / "pbt.jsonl"
        exploits = len(journal.read_text().splitlines()) if journal.is_file() else 0
        row = {"label": label, "seed": seed, **judged(run_dirs), "exploits": exploits, "wall_s": time.perf_counter() - start,
               "machine": cpu_model(), "commit": code_version(),
               "command": "train " + " ".join([*command, *([] if single else population), f"seed={seed}"])}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def cost(seeds: list[int], results: Path, runs_dir: Path, budget: int, packaged_lr: bool = False,
         overrides: tuple[str, ...] = ()) -> None:
    """The population's env steps per second against the same 4 runs side by side without PBT (4 `train`
    processes started together), both to the full budget (`target_return=null`), one after the other;
    each side's time is its commands' whole wall time, start-up included, and, beside it, the ratio
    while training (`training_rate`). `packaged_lr`: both sides from CartPole's own learning rate, not
    1e-5, so that the plain runs' policies are as good as the members' and play evaluation episodes as
    long: what is left is what PBT itself costs (its evaluations at each interval, its mechanics, its start).
    `overrides` go on both sides' commands (`pbt.*` keys change nothing in a plain run)."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")}
    for seed in seeds:
        start_lr = [] if packaged_lr else [TASK[1]]
        common = [TASK[0], *start_lr, f"max_env_steps={budget}", "target_return=null", *overrides, f"seed={seed}"]
        start = time.perf_counter()
        population = runs_dir / f"cost-pbt-seed{seed}"
        subprocess.run([str(TRAIN), *common, *POPULATION, fresh(population)], check=True, capture_output=True,
                       env=env, stdin=subprocess.DEVNULL)
        pbt_s = time.perf_counter() - start
        pbt_steps = evaluations(population)[1]
        start = time.perf_counter()
        procs = [subprocess.Popen([str(TRAIN), *common[:-1], f"seed={seed * 100 + i}", fresh(runs_dir / f"cost-side-seed{seed}-{i}")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, stdin=subprocess.DEVNULL)
                 for i in range(4)]
        if any(proc.wait() for proc in procs):
            raise SystemExit("a run side by side failed")
        side_s = time.perf_counter() - start
        side_steps = sum(evaluations(runs_dir / f"cost-side-seed{seed}-{i}")[1] for i in range(4))
        members, side = sorted(population.glob("member_*")), [runs_dir / f"cost-side-seed{seed}-{i}" for i in range(4)]
        row = {"label": "cost", "seed": seed, "budget": budget, "start_lr": "packaged" if packaged_lr else TASK[1].split("=")[1],
               "overrides": list(overrides), "machine": cpu_model(), "commit": code_version(), "pbt_steps_per_s": pbt_steps / pbt_s, "side_by_side_steps_per_s": side_steps / side_s,
               "ratio": (pbt_steps / pbt_s) / (side_steps / side_s), "pbt_wall_s": pbt_s, "side_by_side_wall_s": side_s,
               **training_ratios(members, side)}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def training_rate(run_dirs: list[Path], without_eval: bool = False) -> float:
    """Env steps per second of runs trained together, counting their training time alone (the longest
    run's `time_s`): start-up and shutdown left out; `without_eval`, their evaluations' seconds too."""
    totals = []
    for run_dir in run_dirs:
        rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines() if line.strip()]
        eval_s = sum(row.get("time/eval_s") or 0.0 for row in rows) if without_eval else 0.0
        totals.append((rows[-1]["env_steps"], rows[-1]["time_s"] - eval_s))
    return sum(steps for steps, _ in totals) / max(seconds for _, seconds in totals)


def training_ratios(members: list[Path], side: list[Path]) -> dict:
    """The population's training rate against the side-by-side runs', with and without evaluation, and each side's
    evaluations: a member evaluates at each interval, a plain run at each epoch, and a better policy's evaluation
    episodes last longer (CartPole's: up to 500 steps), so that evaluation takes a share of its own in the cost."""
    def count(run_dirs: list[Path]) -> int:
        return sum(len(found) for d in run_dirs for found in evaluations(d)[0])

    return {"training_ratio": training_rate(members) / training_rate(side),
            "training_ratio_without_eval": training_rate(members, True) / training_rate(side, True),
            "pbt_evaluations": count(members), "side_by_side_evaluations": count(side)}


def report(results: Path) -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    print("| command | seed | best evaluation | best last evaluation | env steps in all | exploits | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    levels = sorted((r for r in rows if r["label"] != "cost"), key=lambda r: (r["label"], r["seed"]))
    for row in levels:
        last = row.get("best_last_eval")
        print(f"| {row['label']} | {row['seed']} | {row['best_eval']:.1f} | {'' if last is None else f'{last:.1f}'} | "
              f"{row['env_steps']:,} | {row['exploits']} | {row['wall_s']:.0f} |")
    print("\n| command | rule | seeds | mean [95% bootstrap CI] |")
    print("|---|---|---:|---|")
    for label in sorted({r["label"] for r in levels}):
        for rule in ("best_eval", "best_last_eval"):
            values = [r[rule] for r in levels if r["label"] == label and r.get(rule) is not None]
            if values:
                low, high = bootstrap_interval(values)
                print(f"| {label} | {rule} | {len(values)} | {sum(values) / len(values):.1f} [{low:.1f}, {high:.1f}] |")
    costs = [r for r in rows if r["label"] == "cost"]
    if costs:
        print("\n| env steps a run | starting lr, settings | seed | machine | population env steps/s | 4 runs side by side env steps/s | ratio | "
              "ratio while training | ratio while training, evaluations left out | evaluations (population / side by side) |")
        print("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for row in costs:
            training, without = (f"{row[key]:.2f}x" if key in row else "" for key in ("training_ratio", "training_ratio_without_eval"))
            counts = f"{row['pbt_evaluations']} / {row['side_by_side_evaluations']}" if "pbt_evaluations" in row else ""
            settings = " ".join([row.get("start_lr", "1e-5"), *row.get("overrides", [])])
            print(f"| {row.get('budget', 1_000_000):,} | {settings} | {row['seed']} | {row.get('machine', '')} | {row['pbt_steps_per_s']:,.0f} | "
                  f"{row['side_by_side_steps_per_s']:,.0f} | {row['ratio']:.2f}x | {training} | {without} | {counts} |")


def bootstrap_interval(values: list[float], draws: int = 10_000) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of `values` over seeds."""
    import numpy as np

    rng = np.random.default_rng(0)
    means = rng.choice(np.asarray(values), size=(draws, len(values))).mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--seeds", type=int, nargs="+", required=True)
    go.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    go.add_argument("--single", action="store_true", help="independent runs from the same start instead of populations")
    go.add_argument("--override", action="append", default=[], help="a key=value on every command (and in the label)")
    go.add_argument("--tag", default="", help="a word added to the label (what differs from earlier rows)")
    go.add_argument("--results", type=Path, default=RESULTS)
    go.add_argument("--runs-dir", type=Path, help="where the run dirs go (default: a new temporary folder, kept)")
    price = sub.add_parser("cost")
    price.add_argument("--seeds", type=int, nargs="+", required=True)
    price.add_argument("--results", type=Path, default=RESULTS)
    price.add_argument("--runs-dir", type=Path)
    price.add_argument("--budget", type=int, default=1_000_000, help="each run's (each member's) env steps")
    price.add_argument("--packaged-lr", action="store_true", help="both sides from CartPole's own learning rate, not 1e-5")
    price.add_argument("--override", action="append", default=[], help="a key=value on both sides' commands")
    rep = sub.add_parser("report")
    rep.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.command in ("run", "cost"):
        runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="maze-pbt-"))
        print(f"run dirs under {runs_dir}", flush=True)
        if args.command == "run":
            run(args.task, args.seeds, args.single, args.results, runs_dir, args.override, args.tag)
        else:
            cost(args.seeds, args.results, runs_dir, args.budget, args.packaged_lr, tuple(args.override))
    else:
        report(args.results)


if __name__ == "__main__":
    main()
