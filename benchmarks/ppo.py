"""maze_cli's PPO, APPO and IMPALA against Stable-Baselines3 PPO: whole-process wall time to the target.

    python benchmarks/ppo.py                                   # 3 tasks x 4 methods x seeds 1 2 3
    python benchmarks/ppo.py --out benchmarks/PPO.md           # also write the Markdown there
    python benchmarks/ppo.py --seeds 1 --tasks cartpole --methods ppo sb3 --max-s 120

Tasks and the one stopping rule both sides are judged by: the mean return of the last `window`
finished training episodes (no separate evaluation) reaches the target, CartPole-v1 >= 475 and
Acrobot-v1 >= -100 over 100 episodes, Pendulum-v1 >= -200 over 10. maze_cli runs as
`train +env=<task> algorithm=<method> eval.interval=0 target_window=<window> max_time_s=<max-s>`;
SB3 runs benchmarks/sb3_baseline.py with rl-zoo's PPO settings for that env (which needs the
optional `bench` extra: pip install 'maze_cli[bench]'). Both are timed as whole processes, start-up
and shutdown included, one run at a time so that no two share the cores. A run that does not reach
the target counts as infinitely slow in the median.

A full run is 36 runs; on 2 cores expect roughly 30-60 minutes (SB3 on Acrobot and Pendulum takes
the longest), and never more than 36 x (--max-s + start-up), about 3 hours at the default 300 s.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import fmt_solve, sb3_run
from machine import machine_line
from runs import run_train
from sb3_baseline import TASKS as SB3_TASKS

# maze_cli's env config name -> the sb3_baseline.py task, whose target and window are the rule for both sides
TASKS = {"cartpole": "ppo-cartpole", "acrobot": "ppo-acrobot", "pendulum": "ppo-pendulum"}
METHODS = ("ppo", "appo", "impala", "sb3")
GOAL = 0.5  # maze_cli PPO median / SB3 PPO median
SHUTDOWN_SLACK_S = 300  # past max_time_s a run is only starting up or shutting down; past this it is hung


@dataclass
class Outcome:
    wall_s: float
    solved: bool
    failed: bool = False  # the process exited with an error or hung: its time says nothing

    @property
    def time_to_target(self) -> float:
        """Wall time if solved, else infinity, so that a median over seeds never rewards giving up early."""
        return self.wall_s if self.solved else math.inf

    def cell(self) -> str:
        return "failed" if self.failed else fmt_solve(self.wall_s, self.solved)


def rule(task: str) -> tuple[float, int]:
    """(target, window) for a task, read from the SB3 side so both sides stop on the same numbers."""
    sb3 = SB3_TASKS[TASKS[task]]
    return sb3["target"], sb3["window"]


def overrides(task: str, method: str, seed: int, max_s: float) -> list[str]:
    target, window = rule(task)
    return [f"+env={task}", f"algorithm={method}", f"seed={seed}", "eval.interval=0", f"target_return={target:g}",
            f"target_window={window}", f"max_time_s={max_s:g}"]


def run_one(task: str, method: str, seed: int, max_s: float, workdir: Path) -> Outcome:
    """One run; a failure is reported and recorded rather than losing the runs before it."""
    try:
        if method == "sb3":
            return Outcome(*sb3_run(TASKS[task], seed, max_s))
        run = run_train(overrides(task, method, seed, max_s), workdir / f"{task}-{method}-{seed}",
                        timeout_s=max_s + SHUTDOWN_SLACK_S)
        return Outcome(run.wall_s, run.solved)
    except (SystemExit, subprocess.TimeoutExpired) as error:
        print(error, file=sys.stderr, flush=True)
        return Outcome(math.nan, False, failed=True)


def run_all(tasks: list[str], methods: list[str], seeds: list[int], max_s: float) -> dict[tuple[str, str], list[Outcome]]:
    """Every (task, method) over the seeds, one run at a time, a progress line after each."""
    results: dict[tuple[str, str], list[Outcome]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            for method in methods:
                results[task, method] = []
                for seed in seeds:
                    outcome = run_one(task, method, seed, max_s, Path(tmp))
                    results[task, method].append(outcome)
                    print(f"{task} {method} seed {seed}: {outcome.wall_s:.1f} s, "
                          f"{'failed' if outcome.failed else 'solved' if outcome.solved else 'not solved'}",
                          file=sys.stderr, flush=True)
    return results


def median(outcomes: list[Outcome]) -> float:
    return statistics.median(o.time_to_target for o in outcomes)


def fmt_median(seconds: float) -> str:
    return f"{seconds:.1f}" if math.isfinite(seconds) else "not solved"


def method_name(method: str) -> str:
    return "SB3 PPO (rl-zoo settings)" if method == "sb3" else f"maze_cli `algorithm={method}`"


def rule_line(tasks: list[str]) -> str:
    parts = []
    for task in tasks:
        target, window = rule(task)
        parts.append(f"{SB3_TASKS[TASKS[task]]['env']} >= {target:g} over the last {window}")
    return ("Stopping rule, the same on both sides: the mean return of the last N finished training episodes "
            f"(no separate evaluation) reaches the target: {'; '.join(parts)}.")


def times_table(results: dict[tuple[str, str], list[Outcome]], seeds: list[int]) -> list[str]:
    lines = [f"| task / method | {' | '.join(f'seed {s}' for s in seeds)} | median |", "|---|" + "---:|" * (len(seeds) + 1)]
    for (task, method), outcomes in results.items():
        cells = " | ".join(o.cell() for o in outcomes)
        lines.append(f"| {task} / {method_name(method)} | {cells} | {fmt_median(median(outcomes))} |")
    return lines


def ratio_table(results: dict[tuple[str, str], list[Outcome]], tasks: list[str]) -> list[str]:
    """maze_cli PPO's median over SB3 PPO's, per task where both ran."""
    lines = ["| task | maze_cli PPO median s | SB3 PPO median s | ratio | goal | met |", "|---|---:|---:|---:|---:|:---:|"]
    for task in tasks:
        if (task, "ppo") not in results or (task, "sb3") not in results:
            continue
        ours, theirs = median(results[task, "ppo"]), median(results[task, "sb3"])
        both = math.isfinite(ours) and math.isfinite(theirs)
        ratio = f"{ours / theirs:.2f}" if both else "n/a"
        met = math.isfinite(ours) and (not math.isfinite(theirs) or ours / theirs <= GOAL)
        lines.append(f"| {task} | {fmt_median(ours)} | {fmt_median(theirs)} | {ratio} | <= {GOAL} | {'yes' if met else 'no'} |")
    return lines if len(lines) > 2 else []


def report(results: dict[tuple[str, str], list[Outcome]], tasks: list[str], seeds: list[int], max_s: float) -> str:
    out = [f"## PPO against Stable-Baselines3, {datetime.date.today()}", "", machine_line(), "", rule_line(tasks), "",
           f"Whole-process wall seconds, start-up and shutdown included; each run capped at {max_s:g} s of training; "
           "an unsolved run counts as infinitely slow in the median.", "", *times_table(results, seeds)]
    ratios = ratio_table(results, tasks)
    if ratios:
        out += ["", "### maze_cli PPO against SB3 PPO", "", *ratios]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--max-s", type=float, default=300, help="training-time budget of each run, both sides")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args()
    results = run_all(args.tasks, args.methods, args.seeds, args.max_s)
    text = report(results, args.tasks, args.seeds, args.max_s)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
