"""The level a new user's command reaches at a small budget: `train <env> max_env_steps=<budget>` and
nothing else, judged by its last evaluation, as a fraction of the way from random play to a good policy.

    python benchmarks/levels.py                                       # the defaults on the development tasks
    python benchmarks/levels.py --suite heldout --seeds 1 2 3 4 5     # on the held-out tasks (never tuned on)
    python benchmarks/levels.py --candidate defaults= --candidate ppo=algorithm=ppo --envs reach goalgrid

benchmarks/suite.py asks how soon a setting reaches a target within a time cap, against the previous
default; it did not see what a new user sees: a setting that is fast on a fast env can sit far below a
good policy at the step budgets users and outside tables give (the RL Zoo's 100k-1M). Here each task has
a budget in env steps and a reference: the return of random play (0) and of a good policy (1): optimal,
a hand-made controller, or a solved episode. The level is (last evaluation - random) / (reference - random);
the last evaluation is `eval.episodes=20` greedy episodes at the end of the budget (not the best one seen:
a policy that finds the goal and then loses it shows as lost).

Development tasks (defaults are chosen on them): PointReach, the same with actions in [0, 10] (a Box range
wide and not centred on 0), GoalGrid (Dict), Lander (long episodes, shaped reward) and TiltLander (the same with an attitude to keep), MiniGrid-Empty-5x5
(sparse), RepeatFirst with 2 symbols (memory, `policy.core=lstm`), and paced (`recall`: the agent moves on
through 10 symbols itself, and answers with actions of their own), and Walker2d at 2M through `+env=gym` (a
long run with Box actions, where a Gaussian narrows as it learns: a policy that learns and then collapses
shows there; 15-30 minutes a run). Held-out tasks (reported, never tuned
on): Hover (a dense-reward Box task of three dims with second-order dynamics), MiniGrid-DoorKey-5x5 at 400k
(sparse, behind a key and a door), CueCorridor (a cue to recall after a walk down a corridor, `policy.core=lstm`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from machine import machine_line
from runs import publish, run_train

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import suite_envs  # noqa: E402
from suite import write_env_configs  # noqa: E402

MINIGRID = ("+env=gym", "+env.obs_keys=[direction,image]")
WALKER_REFERENCE = 3050.0  # CleanRL's published PPO on Walker2d at 1M env steps (benchmarks/MUJOCO.md)


@dataclass(frozen=True)
class LevelTask:
    overrides: tuple[str, ...]
    budget: int  # env steps
    random: float  # mean return of uniform random actions
    reference: float  # mean return of a good policy: level 1


def _random_return(make: Callable[[], gym.Env], episodes: int = 200) -> float:
    env = make()
    env.action_space.seed(0)
    return suite_envs.mean_return(env, lambda obs: env.action_space.sample(), episodes, seed=10_000)


def _minigrid(env_id: str) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        import minigrid  # noqa: F401  (registers the ids)

        return gym.make(env_id)
    return make


def tasks() -> dict[str, dict[str, LevelTask]]:
    """Both suites, their random play measured here (a second or two), their references known."""
    s = suite_envs
    reach = s.reach_optimal_return()
    dev = {
        "reach": LevelTask(("+env=reach",), 100_000, _random_return(s.PointReach), reach),
        "reachwide": LevelTask(("+env=reachwide",), 100_000, _random_return(lambda: s.PointReach(action_range=(0.0, 10.0))), reach),
        "goalgrid": LevelTask(("+env=goalgrid",), 100_000, _random_return(s.GoalGrid), s.optimal_return()),
        "lander": LevelTask(("+env=lander",), 1_000_000, _random_return(s.Lander), s.lander_controller_return()),
        "tiltlander": LevelTask(("+env=tiltlander",), 1_000_000, _random_return(s.TiltLander),
                                s.mean_return(s.TiltLander(), s.tilt_lander_pilot, 1000, 0)),
        # a long run with Box actions: a Gaussian that narrows as it learns, where a policy can learn and then collapse
        "walker": LevelTask(("+env=gym", "env.id=Walker2d-v5"), 2_000_000, _random_return(lambda: gym.make("Walker2d-v5")),
                            WALKER_REFERENCE),
        # a sparse reward of 1 - 0.9 t / 100 at the goal; the shortest path (6 steps at most) scores 0.95 or more
        "minigrid": LevelTask((*MINIGRID, "env.id=MiniGrid-Empty-5x5-v0"), 200_000, _random_return(_minigrid("MiniGrid-Empty-5x5-v0")), 0.95),
        "repeat2": LevelTask(("+env=repeat", "env.n_symbols=2", "env.length=6", "policy.core=lstm"), 300_000, 0.5, 1.0),
        # the same with answers apart from the action that moves on: recall after learning something else
        "recall": LevelTask(("+env=repeat", "env.n_symbols=2", "env.length=10", "env.paced=true", "policy.core=lstm"), 300_000,
                            _random_return(lambda: s.RepeatFirst(2, 10, paced=True)), 1.0),
    }
    heldout = {
        "hover": LevelTask(("+env=hover",), 300_000, _random_return(s.Hover), s.mean_return(s.Hover(), s.hover_controller, 200, 0)),
        # 1 - 0.9 t / 250 at the goal; a solved episode takes 10-20 steps (0.93-0.96)
        "doorkey": LevelTask((*MINIGRID, "env.id=MiniGrid-DoorKey-5x5-v0"), 400_000, _random_return(_minigrid("MiniGrid-DoorKey-5x5-v0")), 0.93),
        "corridor": LevelTask(("+env=corridor", "policy.core=lstm"), 300_000, _random_return(s.CueCorridor), 1.0),
    }
    return {"dev": dev, "heldout": heldout}


def last_eval(rows: list[dict]) -> float:
    evals = [row["eval/return_mean"] for row in rows if "eval/return_mean" in row]
    return evals[-1] if evals else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", action="append", default=[],
                        help="NAME=override[,override...] (NAME= alone: the defaults); repeat for each")
    parser.add_argument("--suite", choices=["dev", "heldout"], default="dev")
    parser.add_argument("--envs", nargs="+", help="default: every task of --suite")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args()
    suite = tasks()[args.suite]
    envs = args.envs or list(suite)
    candidates = {name: [o for o in rest.split(",") if o]
                  for name, _, rest in (spec.partition("=") for spec in args.candidate or ["defaults="])}
    levels: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config_dir = write_env_configs(Path(tmp) / "conf")
        for seed in args.seeds:
            for env in envs:
                task = suite[env]
                for name, extra in candidates.items():
                    overrides = [*task.overrides, f"max_env_steps={task.budget}", "target_return=null", f"seed={seed}",
                                 f"eval.interval_env_steps={task.budget // 5}", "eval.episodes=20", *extra,
                                 f"hydra.searchpath=[file://{config_dir}]"]
                    run = run_train(overrides, Path(tmp) / f"{name}-{env}-{seed}", timeout_s=3600, pythonpath=HERE)
                    score = last_eval(run.rows)
                    level = (score - task.random) / (task.reference - task.random)
                    levels.setdefault((name, env), []).append((level, score))
                    print(f"{name} {env} seed {seed}: level {level:.2f} (return {score:.2f}) in {run.wall_s:.0f} s",
                          file=sys.stderr, flush=True)
    lines = [f"Level at the budget (0: random play, 1: the reference), the last evaluation's return in brackets; seeds "
             f"{', '.join(map(str, args.seeds))}; {machine_line()}", "",
             "| candidate | " + " | ".join(f"{e} at {suite[e].budget / 1e3:,.0f}k" for e in envs) + " | mean |",
             "|---|" + "---|" * (len(envs) + 1)]
    for name in candidates:
        cells = [", ".join(f"{lv:.2f} ({sc:.1f})" for lv, sc in levels[name, e]) for e in envs]
        mean = statistics.mean(lv for e in envs for lv, _ in levels[name, e])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean:.2f} |")
    lines += ["", "References (random, 1): " + "; ".join(f"{e} ({suite[e].random:.1f}, {suite[e].reference:.1f})" for e in envs),
              "Candidates: " + "; ".join(f"{n}: {' '.join(o) or '(the defaults)'}" for n, o in candidates.items())]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
