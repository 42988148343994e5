"""Reproducible mode (`runner.reproducible=true`): are runs of one seed one run, and what does it cost?

    python benchmarks/reproducible.py same --out /tmp/same.md      # identical runs: rows and weights
    python benchmarks/reproducible.py speed --out /tmp/speed.md    # env steps/s against the asynchronous mode
    python benchmarks/reproducible.py spread --seeds 1 2 3 4 5 --minutes 10   # MinAtar Breakout, both modes

1. `same`: the same command three times per runner (and the runners against each other): CartPole with
   IMPALA on subproc and Ray, SAC on Pendulum, IMPALA on MinAtar Breakout for 1M env steps. Two runs are the
   same when every row of stats.jsonl matches apart from timings and every tensor of last.pt's learner state
   is equal (`maze_cli.stats.same_run`). Each subproc and Ray run is also repeated stopped half way, at an
   epoch's end, and resumed: it should be the run that never stopped.
2. `speed`: the steady env steps/s (median over the epochs after the first two) of the same config in both
   modes, runs alternating, `--rounds` of each: CartPole, MinAtar Breakout, Atari Pong.
3. `spread`: MinAtar Breakout for `--minutes` per seed in both modes, alternating by seed: the mean of the
   last 3 evaluations per seed, the spread between seeds, mean and IQM with 95% bootstrap intervals
   (rliable, extra `bench`), and the rollouts' mean policy lag.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml
from machine import machine_line
from runs import TrainRun, publish, run_train
from scores import iqm_with_interval

from maze_cli.stats import same_run

SAME = {  # name: overrides, each run three times per runner
    "cartpole": ["+env=cartpole", "seed=3"],
    "sac-pendulum": ["+env=pendulum", "algorithm=sac", "seed=3", "max_env_steps=20000", "checkpoint.replay_buffer=true"],
    "minatar-1M": ["+env=minatar", "seed=3", "max_env_steps=1000000", "target_return=null"],
}
SPEED = {
    "cartpole": ["+env=cartpole", "target_return=null", "max_time_s=60", "eval.interval=0"],
    "minatar-breakout": ["+env=minatar", "target_return=null", "max_time_s=90", "eval.interval=0"],
    "pong": ["+env=atari", "env.id=ALE/Pong-v5", "target_return=null", "max_time_s=150", "eval.interval=0"],
}


def first_difference(a: TrainRun, b: TrainRun) -> str:
    return same_run.first_difference(a.run_dir, b.run_dir)


def resumed_difference(straight: TrainRun, overrides: list[str], run_dir: Path) -> str:
    """The straight run again, stopped about half way at the end of an epoch that evaluated (every
    stop evaluates) and resumed to its end: where it parts from the straight run."""
    rows = [row for row in straight.rows[:-1] if "eval/return_mean" in row] or straight.rows[:-1]
    if not rows:
        return "-"
    stop = rows[len(rows) // 2]
    budget = yaml.safe_load((straight.run_dir / "config.yaml").read_text())["max_env_steps"]
    run_train([*overrides, f"max_env_steps={stop['env_steps']}"], run_dir, timeout_s=3600)
    resumed = run_train([f"resume={run_dir}", f"max_env_steps={budget}"], run_dir, timeout_s=3600)
    return f"epoch {stop['epoch']}: {first_difference(straight, resumed)}"


def same(workdir: Path) -> list[str]:
    lines = ["| task | runner | runs | rows | env steps | against the first run | against subproc's first | stopped and resumed |",
             "|---|---|---:|---:|---:|---|---|---|"]
    for name, overrides in SAME.items():
        runners = ["subproc", "ray", "sequential"] if name == "cartpole" else ["subproc", "sequential"]
        reference = None
        for runner in runners:
            runs = []
            for i in range(3 if runner != "sequential" else 1):
                runs.append(run_train([*overrides, f"runner={runner}", "runner.reproducible=true"], workdir / f"{name}-{runner}-{i}",
                                      timeout_s=3600))
            reference = reference or runs[0]
            within = ", ".join(first_difference(runs[0], r) for r in runs[1:]) or "-"
            resumed = "-" if runner == "sequential" else resumed_difference(
                runs[0], [*overrides, f"runner={runner}", "runner.reproducible=true"], workdir / f"{name}-{runner}-resumed")
            lines.append(f"| {name} | {runner} | {len(runs)} | {len(runs[0].rows)} | {runs[0].rows[-1]['env_steps']:,} | {within} | "
                         f"{first_difference(reference, runs[0]) if runs[0] is not reference else '-'} | {resumed} |")
            print(lines[-1], flush=True)
    return lines


def speed(workdir: Path, rounds: int, tasks: list[str]) -> list[str]:
    lines = ["| task | asynchronous env steps/s (each run) | reproducible (each run) | ratio of medians |", "|---|---|---|---:|"]
    for name in tasks:
        rates: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for reproducible in (False, True):
                run = run_train([*SPEED[name], f"runner.reproducible={str(reproducible).lower()}"], workdir / f"{name}-{r}-{reproducible}",
                                timeout_s=1200)
                rates[reproducible].append(run.steady("sps"))
        ratio = statistics.median(rates[True]) / statistics.median(rates[False])
        lines.append(f"| {name} | {' / '.join(f'{x:,.0f}' for x in rates[False])} | {' / '.join(f'{x:,.0f}' for x in rates[True])} | {ratio:.2f}x |")
        print(lines[-1], flush=True)
    return lines


def spread(workdir: Path, seeds: list[int], minutes: float) -> list[str]:
    lines = ["| mode | mean of the last 3 evaluations, per seed | mean [95% CI] | IQM [95% CI] | min-max | env steps (median) | "
             "policy lag (mean) |", "|---|---|---|---|---|---:|---:|"]
    results: dict[bool, list[tuple[float, int, float]]] = {False: [], True: []}
    for seed in seeds:
        for reproducible in (False, True):
            run = run_train(["+env=minatar", f"seed={seed}", f"max_time_s={minutes * 60:g}", "target_return=null",
                             f"runner.reproducible={str(reproducible).lower()}"], workdir / f"breakout-{seed}-{reproducible}",
                            timeout_s=minutes * 60 + 600)
            evals = [row["eval/return_mean"] for row in run.rows if "eval/return_mean" in row]
            lag = statistics.fmean(row["policy_lag_mean"] for row in run.rows if "policy_lag_mean" in row)
            results[reproducible].append((statistics.fmean(evals[-3:]), run.rows[-1]["env_steps"], lag))
            print(seed, reproducible, results[reproducible][-1], flush=True)
    for reproducible, values in results.items():
        lines.append(spread_line("reproducible" if reproducible else "asynchronous", values))
    return lines


def spread_line(mode: str, values: list[tuple[float, int, float]]) -> str:
    """One mode's row: every seed's score (mean of its last 3 evaluations), mean and IQM with 95% intervals."""
    scores = [v for v, _, _ in values]
    mean, iqm, iqm_lo, iqm_hi, (mean_lo, mean_hi) = iqm_with_interval(scores)
    return (f"| {mode} | {', '.join(f'{v:.1f}' for v in scores)} | {mean:.1f} [{mean_lo:.1f}, {mean_hi:.1f}] | "
            f"{iqm:.1f} [{iqm_lo:.1f}, {iqm_hi:.1f}] | {min(scores):.1f}-{max(scores):.1f} | "
            f"{statistics.median(s for _, s, _ in values):,.0f} | {statistics.fmean(lag for _, _, lag in values):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["same", "speed", "spread"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", default=list(SPEED), choices=list(SPEED))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.what == "same":
            lines = same(Path(tmp))
        elif args.what == "speed":
            lines = speed(Path(tmp), args.rounds, args.tasks)
        else:
            lines = spread(Path(tmp), args.seeds, args.minutes)
    publish([f"{machine_line()}", "", *lines], args.out)


if __name__ == "__main__":
    main()
