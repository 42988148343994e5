"""Choose an algorithm's defaults on a suite of envs, not on one: wall time to a target and return at a
fixed step budget, for each candidate setting, env and seed.

    python benchmarks/suite.py                                          # IMPALA's defaults as they are
    python benchmarks/suite.py --candidate defaults= --candidate envs8=runner.envs_per_actor=8
    python benchmarks/suite.py --envs cartpole goalgrid --seeds 1 2 --out benchmarks/SUITE.md
    python benchmarks/suite.py --suite heldout                          # the held-out suite (never tuned on)

The suite: CartPole-v1 and Acrobot-v1 (vector observations), GoalGrid (benchmarks/suite_envs.py: a
7x7 goal-reaching task with Dict observations, agent and goal), PointReach (suite_envs.py: Box
actions, steer a point to a goal), Pendulum-v1 (Box actions), Lander (suite_envs.py: discrete thrusters,
long episodes, a shaped reward and +-100 at the end: the kind of task LunarLander is), MiniGrid-Empty-5x5 (a sparse reward
from a third-party package: 1 - 0.9 t / 100 at the goal, 0 otherwise; Dict of a 7x7x3 view and a
direction; needs the `minigrid` extra), MinAtar Breakout (10x10x4 images, the CNN policy; needs the
`minatar` extra), MPE's simple_spread (3 agents, one shared policy; `multiagent` extra; no target: its
return at the budget is the figure), with discrete actions and with Box ones. Each run is one `train` process,
`eval.interval=0 target_window=100 target_return=<target> max_time_s=<cap>` (and `max_env_steps` out of
the way: the time cap ends a run that misses its target), and every candidate is judged by the same rule:

- time to target: whole-process wall seconds (start-up and shutdown included) until the mean return
  of the last 100 training episodes reaches the env's target, checked after every iteration;
  "-" where the time cap came first;
- env steps to target: the same runs' env steps when it was reached. Envs differ in speed (Lander steps
  faster than LunarLander, benchmarks/SUITE.md), and a setting that learns less per sample can win a fast
  env on seconds and lose a slow one: the two columns together show it;
- return at budget: that window mean at the last epoch within `budget` env steps; "solved" where
  the run reached the target before the budget.

MiniGrid (and DoorKey in the held-out suite) is judged on evaluation instead (`eval.interval=1`, the
mean return of 10 evaluation episodes, the most likely action, after every epoch): its failure is a
policy whose samples find the goal while its most likely action does not, which the training episodes
do not show.

The held-out suite (`--suite heldout`, HELDOUT below) is where a default chosen on the suite above is
reported and never tuned: LunarLander-v3 (discrete; `box2d`), its continuous version (Box), MiniGrid
DoorKey-5x5 (a sparse reward behind a key and a door, Dict observations; judged on evaluation), CartPole
with its velocities hidden (memory, `policy.core=lstm`), MinAtar Asterix (pixels) and MPE's
simple_reference (two agents that must talk; `multiagent` extra), with discrete actions and with Box
ones. The last three have no target: their return at the budget is the figure.

Candidates run interleaved (seed by seed, env by env), one process at a time, so that a busy
stretch of the machine falls on all of them alike.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from machine import machine_line
from runs import TrainRun, publish, run_train

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from suite_envs import optimal_return, reach_optimal_return  # noqa: E402


@dataclass(frozen=True)
class SuiteEnv:
    overrides: tuple[str, ...]
    target: float | None  # mean of the last 100 training episodes; None: judged at the budget only
    budget: int  # env steps at which the return is read
    cap_s: float  # wall-clock cap of one run's training
    judged_on_eval: bool = False  # the greedy evaluation's mean return instead of the training window

    @property
    def return_key(self) -> str:
        return "eval/return_mean" if self.judged_on_eval else "train/return_window_mean"


SUITE = {
    "cartpole": SuiteEnv(("+env=cartpole",), 475.0, 500_000, 60),
    "acrobot": SuiteEnv(("+env=acrobot",), -100.0, 500_000, 60),
    # within one step of the shortest path on average
    "goalgrid": SuiteEnv(("+env=goalgrid",), optimal_return() - 1.0, 300_000, 60),
    "reach": SuiteEnv(("+env=reach",), reach_optimal_return() - 2.5, 1_000_000, 60),
    "pendulum": SuiteEnv(("+env=pendulum",), -250.0, 1_000_000, 60),
    # discrete control with long episodes and a shaped reward (suite_envs.Lander; a hand-made pilot scores about 233)
    "lander": SuiteEnv(("+env=lander",), 200.0, 2_000_000, 150),
    "minigrid": SuiteEnv(("+env=gym", "env.id=MiniGrid-Empty-5x5-v0", "+env.obs_keys=[direction,image]"), 0.9, 400_000, 120,
                         judged_on_eval=True),
    "minatar": SuiteEnv(("+env=minatar",), 10.0, 2_000_000, 180),
    # memory, with a recurrent core: name the first of the episode's symbols at its last step (suite_envs.RepeatFirst);
    # 2 symbols over 6 steps, and (harder) 4 over 8
    "repeat2": SuiteEnv(("+env=repeat", "env.n_symbols=2", "env.length=6", "policy.core=lstm"), 0.9, 1_000_000, 240),
    "repeat4": SuiteEnv(("+env=repeat", "env.n_symbols=4", "env.length=8", "policy.core=lstm"), 0.9, 1_000_000, 240),
    # several agents: MPE simple_spread, 3 agents cover 3 landmarks, one shared policy (no target: the return at the budget)
    "spread": SuiteEnv(("+env=simple_spread",), None, 1_500_000, 180),
    # the same with Box actions (a force per axis): where the reward scaler's default is decided for several agents
    "spreadbox": SuiteEnv(("+env=simple_spread", "env.continuous_actions=true"), None, 1_500_000, 180),
}
# Held out: never tuned on. Defaults are chosen on SUITE (the development suite) and reported here, one env of each
# kind a user brings: discrete and Box control, a sparse reward, memory, Dict observations, pixels, several agents.
HELDOUT = {
    "lunar": SuiteEnv(("+env=gym", "env.id=LunarLander-v3"), 200.0, 2_000_000, 150),
    "lunarbox": SuiteEnv(("+env=gym", "env.id=LunarLander-v3", "+env.kwargs.continuous=true"), 200.0, 2_000_000, 150),
    # sparse (1 - 0.9 t / 250 at the goal behind a locked door) and Dict (direction, 7x7x3 view)
    "doorkey": SuiteEnv(("+env=gym", "env.id=MiniGrid-DoorKey-5x5-v0", "+env.obs_keys=[direction,image]"), 0.9,
                        1_000_000, 150, judged_on_eval=True),
    "nocartpole": SuiteEnv(("+env=gym", "env.id=CartPole-v1", "env.wrappers=[suite_envs.HideVelocities]",
                            "policy.core=lstm"), 400.0, 2_000_000, 180),
    # (SpaceInvaders is not held out: minatar_impala.yaml's entropy_coef was chosen on it and Breakout)
    "asterix": SuiteEnv(("+env=minatar", "env.id=MinAtar/Asterix-v1"), None, 1_500_000, 150),
    "reference": SuiteEnv(("+env=reference",), None, 1_500_000, 180),  # MPE simple_reference: 2 agents talk
    "referencebox": SuiteEnv(("+env=reference", "env.continuous_actions=true"), None, 1_500_000, 180),  # its Box actions
}
SUITES = {"dev": SUITE, "heldout": HELDOUT}
ENV_CONFIGS = {"reference.yaml": "_target_: mpe2.simple_reference_v3.parallel_env\nmax_cycles: 25\ncontinuous_actions: false\n",
               "goalgrid.yaml": "_target_: suite_envs.GoalGrid\n", "reach.yaml": "_target_: suite_envs.PointReach\n",
               "lander.yaml": "_target_: suite_envs.Lander\n", "tiltlander.yaml": "_target_: suite_envs.TiltLander\n",
               "repeat.yaml": "_target_: suite_envs.RepeatFirst\nn_symbols: 4\nlength: 8\npaced: false\n",
               "reachwide.yaml": "_target_: suite_envs.PointReach\naction_range: [0.0, 10.0]\n",
               "hover.yaml": "_target_: suite_envs.Hover\n", "corridor.yaml": "_target_: suite_envs.CueCorridor\n"}


def write_env_configs(config_dir: Path) -> Path:
    """The suite's own env configs (ENV_CONFIGS) under `config_dir`/env, for `hydra.searchpath`; returns `config_dir`."""
    (config_dir / "env").mkdir(parents=True)
    for file, text in ENV_CONFIGS.items():
        (config_dir / "env" / file).write_text(text)
    return config_dir


@dataclass
class Outcome:
    to_target_s: float  # math.inf: the time cap came first
    at_budget: float | None  # window mean at the budget; None: solved before it
    steps: int  # env steps the run took


def outcome_of(run: TrainRun, env: SuiteEnv) -> Outcome:
    rows = run.rows
    steps = rows[-1]["env_steps"] if rows else 0
    if run.solved and steps <= env.budget:
        return Outcome(run.wall_s, None, steps)
    upto = [r for r in rows if env.return_key in r and r["env_steps"] <= env.budget]
    return Outcome(run.wall_s if run.solved else math.inf, upto[-1][env.return_key] if upto else None, steps)


def run_one(env: SuiteEnv, extra: list[str], seed: int, workdir: Path, config_dir: Path) -> Outcome:
    target = "null" if env.target is None else env.target
    # the run may go on past the budget (a time to the target beyond it counts), but never stops before it
    overrides = [*env.overrides, f"max_env_steps={max(env.budget, 100_000_000)}", *extra, f"seed={seed}", f"eval.interval={int(env.judged_on_eval)}", "target_window=100",
                 f"target_return={target}",
                 f"max_time_s={env.cap_s}", f"hydra.searchpath=[file://{config_dir}]"]
    return outcome_of(run_train(overrides, workdir, pythonpath=HERE), env)


def cell_to_target(values: list[float], show: Callable[[float], str]) -> str:
    """Each seed's value and their median, "-" where the cap came first (math.inf)."""
    def text(v: float) -> str:
        return "-" if math.isinf(v) else show(v)
    return f"{', '.join(map(text, values))} (median {text(statistics.median(values))})"


def cell_time(outcomes: list[Outcome]) -> str:
    return cell_to_target([o.to_target_s for o in outcomes], lambda t: f"{t:.1f}")


def cell_steps(outcomes: list[Outcome]) -> str:
    """Env steps to the target (a run that reached it stopped there)."""
    return cell_to_target([math.inf if math.isinf(o.to_target_s) else o.steps for o in outcomes], lambda s: f"{s / 1e3:,.0f}k")


def cell_return(outcomes: list[Outcome], budget: int) -> str:
    parts = []
    for o in outcomes:
        if o.at_budget is None:
            parts.append(f"solved at {o.steps / 1e3:.0f}k")
        else:
            parts.append(f"{o.at_budget:.1f}" if o.steps >= budget else f"{o.at_budget:.1f} at {o.steps / 1e3:.0f}k")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", action="append", default=[],
                        help="NAME=override[,override...] (NAME= alone: the defaults); repeat for each")
    parser.add_argument("--algorithm", default="impala")
    parser.add_argument("--suite", choices=list(SUITES), default="dev",
                        help="dev: where defaults are chosen; heldout: where they are reported, never tuned on")
    parser.add_argument("--envs", nargs="+", choices=[*SUITE, *HELDOUT], help="default: every env of --suite")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args()
    suite = SUITES[args.suite]
    args.envs = args.envs or list(suite)
    suite = {**SUITE, **HELDOUT}
    candidates = {}
    for spec in args.candidate or ["defaults="]:
        name, _, rest = spec.partition("=")
        candidates[name] = [o for o in rest.split(",") if o]
    results: dict[tuple[str, str], list[Outcome]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config_dir = write_env_configs(Path(tmp) / "conf")
        for seed in args.seeds:
            for env in args.envs:
                for name, extra in candidates.items():
                    run_dir = Path(tmp) / f"{name}-{env}-{seed}"
                    o = run_one(suite[env], [f"algorithm={args.algorithm}", *extra], seed, run_dir, config_dir)
                    results.setdefault((name, env), []).append(o)
                    print(f"{name} {env} seed {seed}: to target {o.to_target_s:.1f}s, at budget {o.at_budget}, "
                          f"{o.steps:,} steps", file=sys.stderr, flush=True)
    lines = [f"algorithm={args.algorithm}, seeds {', '.join(map(str, args.seeds))}; {machine_line()}", "",
             "Whole-process seconds to the target (mean of the last 100 training episodes), per seed:", "",
             "| candidate | " + " | ".join((e if suite[e].target is None else f"{e} (>= {suite[e].target:g})") for e in args.envs) + " |",
             "|---|" + "---|" * len(args.envs)]
    for name in candidates:
        lines.append(f"| {name} | " + " | ".join("(at budget only)" if suite[e].target is None else cell_time(results[name, e])
                                                 for e in args.envs) + " |")
    targeted = [e for e in args.envs if suite[e].target is not None]
    if targeted:
        lines += ["", "Env steps to the target, per seed:", "",
                  "| candidate | " + " | ".join(targeted) + " |", "|---|" + "---|" * len(targeted)]
        for name in candidates:
            lines.append(f"| {name} | " + " | ".join(cell_steps(results[name, e]) for e in targeted) + " |")
    lines += ["", "Mean return of the last 100 training episodes at the step budget, per seed:", "",
              "| candidate | " + " | ".join(f"{e} at {suite[e].budget / 1e3:,.0f}k" for e in args.envs) + " |",
              "|---|" + "---|" * len(args.envs)]
    for name in candidates:
        lines.append(f"| {name} | " + " | ".join(cell_return(results[name, e], suite[e].budget) for e in args.envs) + " |")
    lines += ["", "Candidates: " + "; ".join(f"{n}: {' '.join(o) or '(the defaults)'}" for n, o in candidates.items())]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
