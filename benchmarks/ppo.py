"""maze_cli's PPO, APPO, IMPALA, SAC and DQN against Stable-Baselines3 PPO, SAC and DQN: whole-process wall time
to the target, both sides judged by the same rule.

    python benchmarks/ppo.py                                   # every task and method, seeds 1 2 3, rule (a)
    python benchmarks/ppo.py --rule eval                       # the same judged by rule (b): evaluation on the same seeds
    python benchmarks/ppo.py --out benchmarks/PPO.md           # also write the Markdown there
    python benchmarks/ppo.py --seeds 1 --tasks cartpole --methods ppo sb3 --max-s 120
    python benchmarks/ppo.py --tasks pendulum --methods sac sb3-sac    # SAC against SB3 SAC
    python benchmarks/ppo.py --rule eval --tasks cartpole acrobot --methods dqn sb3-dqn   # DQN against SB3 DQN

Tasks and the one stopping rule both sides are judged by: the mean return of the last `window`
finished training episodes (no separate evaluation) reaches the target, CartPole-v1 >= 475 and
Acrobot-v1 >= -100 over 100 episodes, Pendulum-v1 >= -200 over 10. maze_cli runs as
`train +env=<task> algorithm=<method> eval.interval=0 target_window=<window> max_time_s=<max-s>`;
SB3 runs benchmarks/sb3_baseline.py with rl-zoo's PPO (or SAC) settings for that env (which needs the
optional `bench` extra: pip install 'maze_cli[bench]'). That is rule (a); `--rule eval` judges both
sides by rule (b) instead: 10 deterministic evaluation episodes on the same env seeds reach the
target, maze_cli evaluating once an epoch (its default) and SB3 every as many env steps as that
maze_cli run's epochs hold (its counterpart: PPO, APPO or IMPALA for SB3 PPO, SAC for SB3 SAC, whichever
ran first on the task, so list it before the SB3 method; `--sb3-eval-every N` sets SB3's interval
instead, e.g. finer than an IMPALA epoch). Both are timed as whole processes, start-up and shutdown included, one run at a time so that no two share the cores. A run that does not reach
the target counts as infinitely slow in the median.

SAC (`algorithm=sac`) and SB3 SAC run on Pendulum only (rl-zoo has no SAC settings for the discrete
tasks), judged by the same rule; DQN (`algorithm=dqn`) and SB3 DQN on CartPole and Acrobot only. A full run is 42 runs; on 2 cores expect roughly 15-30 minutes (SB3
SAC takes the longest), and never more than 42 x (--max-s + start-up) at most.
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
# Off-policy pairs, SAC against SB3 SAC and DQN against SB3 DQN (rl-zoo settings): only where SB3 has the task
SAC_TASKS = {"pendulum": "sac"}
DQN_TASKS = {"cartpole": "dqn", "acrobot": "dqn-acrobot"}
OFF_POLICY = {"sac": SAC_TASKS, "sb3-sac": SAC_TASKS, "dqn": DQN_TASKS, "sb3-dqn": DQN_TASKS}  # method -> its tasks
METHODS = ("ppo", "appo", "impala", "sb3", "sac", "sb3-sac", "dqn", "sb3-dqn")
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


def overrides(task: str, method: str, seed: int, max_s: float, judge: str) -> list[str]:
    """`train` for one run; judge "window": the last N training episodes, "eval": maze_cli's default
    deterministic evaluation of 10 episodes each epoch."""
    target, window = rule(task)
    judged = ["eval.interval=0", f"target_window={window}"] if judge == "window" else ["eval.interval=1", "eval.episodes=10"]
    return [f"+env={task}", f"algorithm={method}", f"seed={seed}", *judged, f"target_return={target:g}", f"max_time_s={max_s:g}"]


# The maze_cli methods each SB3 method is compared with; under rule "eval" SB3 evaluates as often as
# the first of them that ran on the task does (so list the maze_cli method first)
COUNTERPARTS = {"sb3": ("ppo", "appo", "impala"), "sb3-sac": ("sac",), "sb3-dqn": ("dqn",)}


def applies(task: str, method: str) -> bool:
    """SAC and DQN (and their SB3 counterparts) only where SB3's task exists; the others everywhere."""
    return method not in OFF_POLICY or task in OFF_POLICY[method]


def sb3_eval_every(task: str, method: str, epoch_steps: dict[tuple[str, str], int]) -> int:
    """SB3's evaluation interval under rule "eval": one epoch of the first maze_cli counterpart that ran."""
    for (ran_task, ran_method), steps in epoch_steps.items():
        if ran_task == task and ran_method in COUNTERPARTS[method]:
            return steps
    raise SystemExit(f"--rule eval: run one of {', '.join(COUNTERPARTS[method])} on {task} before {method} "
                     "(its epoch sets SB3's evaluation interval), or give --sb3-eval-every")


def run_one(task: str, method: str, seed: int, max_s: float, workdir: Path, judge: str = "window",
            epoch_steps: dict[tuple[str, str], int] | None = None, sb3_every: int | None = None) -> Outcome:
    """One run; a failure is reported and recorded rather than losing the runs before it. Under rule
    "eval", a maze_cli run records its epoch's env steps in `epoch_steps`, and its SB3 counterpart
    evaluates every that many steps (or every `sb3_every`), on the same 10 episode seeds."""
    epoch_steps = {} if epoch_steps is None else epoch_steps
    try:
        if method in COUNTERPARTS:
            extra = []
            if judge == "eval":
                every = sb3_every or sb3_eval_every(task, method, epoch_steps)
                extra = ["--eval-every", str(every), "--eval-episodes", "10"]
            return Outcome(*sb3_run(OFF_POLICY.get(method, TASKS)[task], seed, max_s, extra))
        run = run_train(overrides(task, method, seed, max_s, judge), workdir / f"{task}-{method}-{seed}",
                        timeout_s=max_s + SHUTDOWN_SLACK_S)
        steps = [row["env_steps"] for row in run.rows]
        sizes = [b - a for a, b in zip(steps, steps[1:])] or steps[:1]
        epoch_steps.setdefault((task, method), int(statistics.median(sizes)))
        return Outcome(run.wall_s, run.solved)
    except (SystemExit, subprocess.TimeoutExpired) as error:
        print(error, file=sys.stderr, flush=True)
        return Outcome(math.nan, False, failed=True)


def run_all(tasks: list[str], methods: list[str], seeds: list[int], max_s: float, judge: str = "window",
            sb3_every: int | None = None) -> dict[tuple[str, str], list[Outcome]]:
    """Every (task, method) over the seeds, one run at a time, a progress line after each."""
    results: dict[tuple[str, str], list[Outcome]] = {}
    epoch_steps: dict[tuple[str, str], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            for method in (m for m in methods if applies(task, m)):
                results[task, method] = []
                for seed in seeds:
                    outcome = run_one(task, method, seed, max_s, Path(tmp), judge, epoch_steps, sb3_every)
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
    sb3 = {"sb3": "SB3 PPO (rl-zoo settings)", "sb3-sac": "SB3 SAC (rl-zoo settings)", "sb3-dqn": "SB3 DQN (rl-zoo settings)"}
    return sb3.get(method, f"maze_cli `algorithm={method}`")


def rule_line(tasks: list[str], judge: str = "window", sb3_every: int | None = None) -> str:
    if judge == "eval":
        every = f"{sb3_every:,} env steps" if sb3_every else "as many env steps as one maze_cli epoch of its counterpart holds"
        targets = "; ".join(f"{SB3_TASKS[TASKS[t]]['env']} >= {rule(t)[0]:g}" for t in tasks)
        return ("Stopping rule (b), the same on both sides: the mean return of 10 deterministic evaluation episodes on the same "
                "env seeds (maze_cli's eval seeds for the run's seed) reaches the target; maze_cli evaluates once an epoch "
                f"(its default), SB3 every {every}: {targets}.")
    parts = []
    for task in tasks:
        target, window = rule(task)
        parts.append(f"{SB3_TASKS[TASKS[task]]['env']} >= {target:g} over the last {window}")
    return ("Stopping rule (a), the same on both sides: the mean return of the last N finished training episodes "
            f"(no separate evaluation) reaches the target: {'; '.join(parts)}.")


def times_table(results: dict[tuple[str, str], list[Outcome]], seeds: list[int]) -> list[str]:
    lines = [f"| task / method | {' | '.join(f'seed {s}' for s in seeds)} | median |", "|---|" + "---:|" * (len(seeds) + 1)]
    for (task, method), outcomes in results.items():
        cells = " | ".join(o.cell() for o in outcomes)
        lines.append(f"| {task} / {method_name(method)} | {cells} | {fmt_median(median(outcomes))} |")
    return lines


def ratio_table(results: dict[tuple[str, str], list[Outcome]], tasks: list[str]) -> list[str]:
    """maze_cli's median over SB3's for each pair that ran: PPO, APPO and IMPALA against SB3 PPO, SAC against SB3 SAC."""
    lines = ["| task | maze_cli | median s | SB3 | median s | ratio | goal | met |", "|---|---|---:|---|---:|---:|---:|:---:|"]
    for task in tasks:
        pairs = [(ours, theirs) for theirs, counterparts in COUNTERPARTS.items() for ours in counterparts]
        for ours_method, theirs_method in pairs:
            if (task, ours_method) not in results or (task, theirs_method) not in results:
                continue
            ours, theirs = median(results[task, ours_method]), median(results[task, theirs_method])
            both = math.isfinite(ours) and math.isfinite(theirs)
            ratio = f"{ours / theirs:.2f}" if both else "n/a"
            met = math.isfinite(ours) and (not math.isfinite(theirs) or ours / theirs <= GOAL)
            lines.append(f"| {task} | {ours_method.upper()} | {fmt_median(ours)} | {method_name(theirs_method).split(' (')[0]} | "
                         f"{fmt_median(theirs)} | {ratio} | <= {GOAL} | {'yes' if met else 'no'} |")
    return lines if len(lines) > 2 else []


def report(results: dict[tuple[str, str], list[Outcome]], tasks: list[str], seeds: list[int], max_s: float, judge: str = "window",
           sb3_every: int | None = None) -> str:
    out = [f"## Against Stable-Baselines3, rule ({'a' if judge == 'window' else 'b'}), {datetime.date.today()}", "", machine_line(), "",
           rule_line(tasks, judge, sb3_every), "",
           f"Whole-process wall seconds, start-up and shutdown included; each run capped at {max_s:g} s of training; "
           "an unsolved run counts as infinitely slow in the median.", "", *times_table(results, seeds)]
    ratios = ratio_table(results, tasks)
    if ratios:
        out += ["", "### maze_cli against SB3, the same rule", "", *ratios]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--max-s", type=float, default=300, help="training-time budget of each run, both sides")
    parser.add_argument("--rule", choices=["window", "eval"], default="window",
                        help="window: (a) the last N training episodes, both sides; eval: (b) 10 deterministic evaluation "
                             "episodes on the same seeds, both sides")
    parser.add_argument("--sb3-eval-every", type=int, help="rule (b): SB3 evaluates every this many env steps instead of "
                                                               "as often as its maze_cli counterpart")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args()
    results = run_all(args.tasks, args.methods, args.seeds, args.max_s, args.rule, args.sb3_eval_every)
    text = report(results, args.tasks, args.seeds, args.max_s, args.rule, args.sb3_eval_every)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
