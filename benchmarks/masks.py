"""Action masks on `+env=masked_choice`: each algorithm with its mask and without it (`env.action_mask_key=false`),
seeds 1-5, the same env-step budget, against the best play (the highest legal action every step) and
uniform random legal play.

    python benchmarks/masks.py --algorithms impala ppo dqn --seeds 1 2 3 4 5 --out benchmarks/results/masks.md

The rule both sides share: the last evaluation's mean return (10 greedy episodes, the run's evaluation
seeds) after `--env-steps` env steps, the mean return of the last 100 training episodes (sampled actions),
and the illegal actions per episode in training (the last epoch) and in that evaluation. Every run is appended to benchmarks/results/masks.jsonl.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from machine import machine_line
from runs import publish, run_train
from scores import iqm_with_interval

RESULTS = Path(__file__).parent / "results" / "masks.jsonl"
# env steps per algorithm: DQN makes a quarter of an update per transition, so it gets fewer steps for a like time
# (short: given long enough, the greedy policy learns the rule without its mask too; training's sampled
# episodes still end on illegal actions)
BUDGETS = {"impala": 30_000, "ppo": 30_000, "appo": 30_000, "dqn": 20_000, "sac": 10_000}


def reference_returns(episodes: int = 2000) -> dict[str, float]:
    """Mean returns of the best play and of uniform random legal play."""
    from maze_cli.envs.masked_choice import MaskedChoice

    env, rng, out = MaskedChoice(), np.random.default_rng(0), {}
    for name in ("best play", "random legal play"):
        total = 0.0
        for episode in range(episodes):
            env.reset(seed=episode)
            done = False
            while not done:
                legal = np.flatnonzero(env._legal)
                action = env.best_action() if name == "best play" else int(rng.choice(legal))
                _, reward, terminated, truncated, _ = env.step(action)
                total += reward
                done = terminated or truncated
        out[name] = total / episodes
    return out


def one_run(algorithm: str, masked: bool, seed: int, env_steps: int, workdir: Path) -> dict:
    overrides = ["+env=masked_choice", f"algorithm={algorithm}", "runner=sequential", f"seed={seed}",
                 f"max_env_steps={env_steps}", "target_return=null", *([] if masked else ["env.action_mask_key=false"])]
    run = run_train(overrides, workdir / f"{algorithm}-{masked}-{seed}", timeout_s=1800)
    last = run.rows[-1]
    return {"algorithm": algorithm, "masked": masked, "seed": seed, "env_steps": last["env_steps"],
            "eval_return": last["eval/return_mean"], "eval_illegal": last["eval/env/illegal"],
            "train_return": last.get("train/return_window_mean"),
            "train_illegal": last.get("env/illegal"), "wall_s": round(run.wall_s, 1), "machine": machine_line()}


def report(entries: list[dict], references: dict[str, float]) -> list[str]:
    lines = [f"References over 2,000 episodes: best play {references['best play']:.2f}, "
             f"uniform random legal play {references['random legal play']:.2f}.", "",
             "| algorithm | mask | env steps | eval return, seeds in order | mean [95% CI] | IQM [95% CI] | training return (last 100 episodes) | illegal per eval episode | illegal per training episode (last epoch) |",
             "|---|---|---:|---|---|---|---|---|---|"]
    groups: dict[tuple[str, bool], list[dict]] = {}
    for entry in entries:
        groups.setdefault((entry["algorithm"], entry["masked"]), []).append(entry)
    for (algorithm, masked), runs in groups.items():
        runs.sort(key=lambda e: e["seed"])
        returns = [e["eval_return"] for e in runs]
        mean, iqm, lo, hi, (mlo, mhi) = iqm_with_interval(returns) if len(returns) > 1 else (returns[0],) * 4 + ((returns[0],) * 2,)
        eval_illegal = " / ".join(f"{e['eval_illegal']:.1f}" for e in runs)
        train_illegal = " / ".join(f"{e['train_illegal']:.2f}" for e in runs)
        train_return = " / ".join(f"{e['train_return']:.1f}" for e in runs)
        lines.append(f"| {algorithm} | {'on' if masked else 'off'} | {runs[0]['env_steps']:,} | "
                     f"{' / '.join(f'{r:.1f}' for r in returns)} | {mean:.1f} [{mlo:.1f}, {mhi:.1f}] | {iqm:.1f} [{lo:.1f}, {hi:.1f}] | "
                     f"{train_return} | {eval_illegal} | {train_illegal} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["impala", "ppo", "dqn"], choices=sorted(BUDGETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--env-steps", type=int, help="one budget for every algorithm (default: BUDGETS)")
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--report-only", action="store_true", help="report the runs in masks.jsonl, run nothing")
    args = parser.parse_args()
    if not args.report_only:
        with tempfile.TemporaryDirectory() as tmp:
            for algorithm in args.algorithms:
                for masked in (True, False):
                    for seed in args.seeds:
                        entry = one_run(algorithm, masked, seed, args.env_steps or BUDGETS[algorithm], Path(tmp))
                        RESULTS.parent.mkdir(exist_ok=True)
                        with RESULTS.open("a") as f:
                            f.write(json.dumps(entry) + "\n")
                        print(json.dumps(entry), flush=True)
    entries = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    publish([f"Machine: {entries[-1]['machine']}", ""] + report(entries, reference_returns()), args.out)


if __name__ == "__main__":
    main()
