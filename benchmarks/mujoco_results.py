"""MuJoCo results like the field reports them: learning curves and final returns of several seeds,
maze_cli beside Stable-Baselines3 (run on the same machine) and the published figures.

    python benchmarks/mujoco_results.py run --algorithm ppo --envs Hopper-v5 HalfCheetah-v5 Walker2d-v5 --seeds 1 2 3
    python benchmarks/mujoco_results.py run --algorithm sac --envs Hopper-v5 --seeds 1 --minutes 30
    python benchmarks/mujoco_results.py sb3 --algorithm ppo --envs HalfCheetah-v5 --seeds 1          # SB3, rl-zoo settings
    python benchmarks/mujoco_results.py run --algorithm td3 --envs Pendulum-v1 --seeds 1 2 3 --max-env-steps 20000 --eval-every 2000
    python benchmarks/mujoco_results.py report --out benchmarks/MUJOCO_TABLE.md --plot docs/results/mujoco.png

`run` trains `train +env=mujoco env.id=<id> algorithm=<a> seed=<s>` (the family's settings, nothing
tuned per id) for the budget: `--max-env-steps` (default 1M, the field's budget) or `--minutes` of
training. `sb3` trains SB3's PPO or SAC with rl-baselines3-zoo's settings for the id (hyperparams/ppo.yml,
sac.yml: PPO with VecNormalize on observations and rewards) for the same budget. Both sides are judged by
one rule: every 10,000 env steps, 10 deterministic episodes on the same 10 seeds (maze_cli's evaluation
seeds for seed s), their mean return; a run's figure is its last evaluation within the budget. Each run
appends one JSON line to benchmarks/results/mujoco.jsonl, so that seeds can be added run by run.

`report` prints, per algorithm, env and side, every seed's figure, the mean and the interquartile mean
with 95% stratified-bootstrap intervals (rliable, extra `bench`), and draws the curves with the
published figure beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import machine_line  # noqa: E402
from runs import publish, run_train  # noqa: E402
from scores import iqm_with_interval  # noqa: E402

RESULTS = HERE / "results" / "mujoco.jsonl"
EVAL_EVERY = 10_000
EVAL_EPISODES = 10
# Published figures at 1M env steps (MuJoCo v4 envs): CleanRL's benchmark reports of ppo_continuous_action.py
# and sac_continuous_action.py (docs.cleanrl.dev, "rl-algorithms/ppo" and "rl-algorithms/sac").
PUBLISHED = {
    ("ppo", "Hopper-v5"): (2231.0, "CleanRL PPO, 1M steps"),
    ("ppo", "HalfCheetah-v5"): (1823.0, "CleanRL PPO, 1M steps"),
    ("ppo", "Walker2d-v5"): (3050.0, "CleanRL PPO, 1M steps"),
    ("sac", "Hopper-v5"): (2310.0, "CleanRL SAC, 1M steps"),
    ("sac", "Walker2d-v5"): (3591.0, "CleanRL SAC, 1M steps"),
}
# rl-baselines3-zoo's tuned MuJoCo settings (hyperparams/ppo.yml, the v3 entries; sac.yml)
ZOO_PPO_NET = dict(log_std_init=-2, ortho_init=False, activation="relu", net_arch=dict(pi=[256, 256], vf=[256, 256]))
ZOO_PPO = {
    "HalfCheetah-v5": dict(batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
                           n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096, policy_kwargs=ZOO_PPO_NET),
    "Hopper-v5": dict(batch_size=32, n_steps=512, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
                      n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671, policy_kwargs=ZOO_PPO_NET),
    "Walker2d-v5": dict(batch_size=32, n_steps=512, gamma=0.99, learning_rate=5.05041e-05, ent_coef=0.000585045, clip_range=0.1,
                        n_epochs=20, gae_lambda=0.95, max_grad_norm=1, vf_coef=0.871923),
}
ZOO_SAC = dict(learning_starts=10_000)
# hyperparams/td3.yml: the MuJoCo entries, and Pendulum-v1's own
ZOO_TD3 = dict(learning_starts=10_000, train_freq=1, gradient_steps=1, learning_rate=3e-4, batch_size=256, net_arch=[400, 300])
ZOO_TD3_PENDULUM = dict(learning_starts=10_000, gamma=0.98, buffer_size=200_000, train_freq=(1, "episode"), gradient_steps=-1,
                        learning_rate=1e-3, net_arch=[400, 300])
ENV_CONFIG = {"Pendulum-v1": "pendulum"}  # the +env= of an id outside the MuJoCo family (default: mujoco)


def eval_seeds(seed: int) -> list[int]:
    from maze_cli.seeding import derive_seeds

    return derive_seeds(seed, "eval_env", EVAL_EPISODES)


def save(record: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")


def budget_overrides(args) -> list[str]:
    if args.minutes:
        return [f"max_time_s={args.minutes * 60}", "max_env_steps=100000000"]
    return [f"max_env_steps={args.max_env_steps}"]


def run_maze(args) -> None:
    for seed in args.seeds:
        for env_id in args.envs:
            with tempfile.TemporaryDirectory() as tmp:
                overrides = [f"+env={ENV_CONFIG.get(env_id, 'mujoco')}", f"env.id={env_id}", f"algorithm={args.algorithm}",
                             f"seed={seed}", "target_return=null", f"eval.interval_env_steps={args.eval_every}", f"eval.episodes={EVAL_EPISODES}", *budget_overrides(args),
                             *args.override]
                run = run_train(overrides, Path(tmp) / "run", timeout_s=(args.minutes or 60) * 60 + 600)
            curve = [(r["env_steps"], r["time_s"], r["eval/return_mean"]) for r in run.rows if "eval/return_mean" in r]
            record = dict(side="maze_cli", algorithm=args.algorithm, env=env_id, seed=seed, budget=budget_text(args),
                          overrides=args.override, curve=curve, wall_s=run.wall_s, machine=machine_line())
            save(record)
            print(f"maze_cli {args.algorithm} {env_id} seed {seed}: {curve[-1][2]:.1f} at {curve[-1][0]:,} env steps, "
                  f"{run.wall_s:.0f} s", file=sys.stderr, flush=True)


def budget_text(args) -> str:
    return f"{args.minutes} min" if args.minutes else f"{args.max_env_steps:,} env steps"


def run_sb3(args) -> None:
    for seed in args.seeds:
        for env_id in args.envs:
            curve, wall = sb3_curve(args.algorithm, env_id, seed, args.max_env_steps, args.minutes, args.eval_every)
            save(dict(side="sb3", algorithm=args.algorithm, env=env_id, seed=seed, budget=budget_text(args), overrides=[],
                      curve=curve, wall_s=wall, machine=machine_line()))
            print(f"sb3 {args.algorithm} {env_id} seed {seed}: {curve[-1][2]:.1f} at {curve[-1][0]:,} env steps, {wall:.0f} s",
                  file=sys.stderr, flush=True)


def sb3_curve(algorithm: str, env_id: str, seed: int, max_env_steps: int, minutes: float | None, eval_every: int = EVAL_EVERY):
    """SB3 with the zoo's settings; the curve of (env steps, training seconds, eval mean return)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(2 if algorithm == "sac" else 1)  # SAC: the threads of maze_cli's SAC learner (tuning/mujoco_sac.yaml)
    venv = DummyVecEnv([lambda: gym.make(env_id)])
    if algorithm == "ppo":
        venv = VecNormalize(venv)
        kwargs = dict(ZOO_PPO[env_id])
        net = dict(kwargs.pop("policy_kwargs", {}))
        if net.get("activation") == "relu":
            net["activation_fn"] = torch.nn.ReLU
        net.pop("activation", None)
        model = PPO("MlpPolicy", venv, seed=seed, policy_kwargs=net, **kwargs)
    elif algorithm == "td3":
        kwargs = dict(ZOO_TD3_PENDULUM if env_id == "Pendulum-v1" else ZOO_TD3)
        net = kwargs.pop("net_arch")
        n = int(np.prod(venv.action_space.shape))
        noise = NormalActionNoise(np.zeros(n), 0.1 * np.ones(n))
        model = TD3("MlpPolicy", venv, seed=seed, action_noise=noise, policy_kwargs=dict(net_arch=net), **kwargs)
    else:
        model = SAC("MlpPolicy", venv, seed=seed, **ZOO_SAC)
    seeds = eval_seeds(seed)
    curve: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    def evaluate() -> float:
        returns = []
        for s in seeds:
            env = gym.make(env_id)
            obs, _ = env.reset(seed=s)
            total, done = 0.0, False
            while not done:
                o = venv.normalize_obs(obs) if isinstance(venv, VecNormalize) else obs
                action, _ = model.predict(o, deterministic=True)
                obs, r, terminated, truncated, _ = env.step(action)
                total += r
                done = terminated or truncated
            returns.append(total)
        return float(np.mean(returns))

    class Cadence(BaseCallback):
        """An evaluation every `eval_every` env steps, and one when the time budget ends (maze_cli's
        trainer makes its last evaluation as its clock stops it too)."""

        def _on_step(self) -> bool:
            training_s = time.perf_counter() - start  # evaluations included, as maze_cli's time_s
            out_of_time = bool(minutes) and training_s >= minutes * 60
            if self.num_timesteps % eval_every == 0 or out_of_time:
                curve.append((self.num_timesteps, training_s, evaluate()))
                print(f"  {self.num_timesteps:,} steps, {training_s:.0f} s: {curve[-1][2]:.1f}", file=sys.stderr, flush=True)
            return not out_of_time

    model.learn(total_timesteps=max_env_steps if not minutes else 100_000_000, callback=Cadence())
    return curve, time.perf_counter() - start


def within_budget(record: dict) -> list:
    """The run's evaluations within its budget: for a time budget, those stamped by its end (1% slack: a
    run's last evaluation is stamped a moment after the clock stops it), whichever side ran past it."""
    budget = record["budget"]
    if not budget.endswith(" min"):
        return record["curve"]
    seconds = float(budget.split()[0]) * 60 * 1.01
    return [c for c in record["curve"] if c[1] <= seconds] or record["curve"][:1]


def final(record: dict) -> list:
    """A run's figure: its last evaluation within the budget, (env steps, seconds, mean return)."""
    return within_budget(record)[-1]


def report(args) -> None:
    records = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    lines = ["| algorithm | env | side | budget | every seed (last evaluation) | mean [95% CI] | IQM [95% CI] | published |",
             "|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in records:  # a candidate's overrides make a side of their own
        side = " ".join([r["side"], *r["overrides"]])
        runs = groups.setdefault((r["algorithm"], r["env"], side, r["budget"]), [])
        if all(run["seed"] != r["seed"] for run in runs):  # a seed run again (e.g. alone, for its time) counts once: its first run
            runs.append(r)
    for (algorithm, env_id, side, budget), runs in sorted(groups.items()):
        runs = sorted(runs, key=lambda r: r["seed"])
        finals = [final(r) for r in runs]
        values = [f[2] for f in finals]
        seeds = ", ".join(f"s{r['seed']}: {f[2]:,.0f} ({f[0] / 1e3:,.0f}k, {f[1] / 60:.1f} min)" for r, f in zip(runs, finals))
        if len(values) >= 2:
            mean, iqm, lo, hi, (mean_lo, mean_hi) = iqm_with_interval(values)
            mean_text, iqm_text = f"{mean:,.0f} [{mean_lo:,.0f}, {mean_hi:,.0f}]", f"{iqm:,.0f} [{lo:,.0f}, {hi:,.0f}]"
        else:
            mean_text, iqm_text = f"{values[0]:,.0f} (one seed)", "-"
        published = PUBLISHED.get((algorithm, env_id))
        lines.append(f"| {algorithm} | {env_id} | {side} | {budget} | {seeds} | {mean_text} | {iqm_text} | "
                     f"{f'{published[0]:,.0f} ({published[1]})' if published else '-'} |")
    lines += ["", f"Machine of the last run: {records[-1]['machine']}" if records else ""]
    publish(lines, args.out)
    if args.plot:
        plot(groups, args.plot)


# Panels: one row per algorithm (PPO's five ids take two), the reported ids first, three panels a row.
ALGORITHMS = ("ppo", "sac", "td3")
REPORTED = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
PLOT_COLUMNS = 3
# maze_cli with today's settings and SB3 in strong colours; a candidate or a superseded setting (a side with
# overrides) in a muted one, so that it never reads as today's figure.
SIDE_COLORS = {"maze_cli": "tab:blue", "sb3": "tab:orange"}
OTHER_COLORS = ("tab:gray", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:pink")


def plot_rows(groups: dict) -> list[list[tuple[str, str]]]:
    """The panels, row by row: each algorithm starts a row; within it the reported ids first, in the
    order of REPORTED, then the others by name; at most PLOT_COLUMNS a row."""
    rows = []
    def first(order: tuple, name: str) -> tuple:
        return order.index(name) if name in order else len(order), name

    for algorithm in sorted({a for a, _, _, _ in groups}, key=lambda a: first(ALGORITHMS, a)):
        envs = sorted({e for a, e, _, _ in groups if a == algorithm}, key=lambda e: first(REPORTED, e))
        rows += [[(algorithm, e) for e in envs[i:i + PLOT_COLUMNS]] for i in range(0, len(envs), PLOT_COLUMNS)]
    return rows


def short_budget(budget: str) -> str:
    """A budget as a legend shows it: "1,000,000 env steps" -> "1M env steps", "30.0 min" -> "30 min"."""
    if budget.endswith(" min"):
        return f"{float(budget.split()[0]):g} min"
    steps = int(budget.split()[0].replace(",", ""))
    return f"{steps / 1e6:g}M env steps" if steps >= 1_000_000 else f"{steps / 1e3:g}k env steps"


def plot(groups: dict, path: Path) -> None:
    """A grid of learning curves, one panel per algorithm and env, every seed a thin line, the published
    figure dashed, each panel's legend below it. About 1,500 px wide at three panels a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = plot_rows(groups)
    fig, axes = plt.subplots(len(rows), PLOT_COLUMNS, figsize=(5 * PLOT_COLUMNS, 4.8 * len(rows)), squeeze=False,
                             layout="constrained")
    others = sorted({side for _, _, side, _ in groups if side not in SIDE_COLORS})
    colors = {**SIDE_COLORS, **{side: OTHER_COLORS[i % len(OTHER_COLORS)] for i, side in enumerate(others)}}
    for row_axes, row in zip(axes, rows):
        for ax in row_axes[len(row):]:
            ax.set_visible(False)
        for ax, (algorithm, env_id) in zip(row_axes, row):
            panel = [((side, budget), runs) for (a, e, side, budget), runs in sorted(groups.items())
                     if (a, e) == (algorithm, env_id)]
            most = max(within_budget(r)[-1][0] for _, runs in panel for r in runs)
            scale, unit = (1e6, "millions") if most >= 200_000 else (1e3, "thousands")
            for (side, budget), runs in sorted(panel, key=lambda p: p[0][0] in SIDE_COLORS):  # today's on top
                today = side in SIDE_COLORS
                for i, r in enumerate(sorted(runs, key=lambda r: r["seed"])):
                    steps, _, returns = zip(*within_budget(r))
                    label = f"{side}, {short_budget(budget)}, {len(runs)} seed{'s' * (len(runs) > 1)}"
                    ax.plot(np.asarray(steps) / scale, returns, color=colors[side], lw=1.3 if today else 0.9,
                            alpha=0.85 if today else 0.5, label=label if i == 0 else None)
            if (algorithm, env_id) in PUBLISHED:
                value, source = PUBLISHED[algorithm, env_id]
                ax.axhline(value, color="black", ls="--", lw=1, label=f"{source}: {value:,.0f}")
            ax.set_title(f"{algorithm.upper()} {env_id}", fontsize=11)
            ax.set_xlabel(f"env steps ({unit})", fontsize=9)
            ax.set_ylabel("eval return (10 episodes)", fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "sb3"):
        p = sub.add_parser(name)
        p.add_argument("--algorithm", choices=("ppo", "sac", "td3"), required=True)
        p.add_argument("--envs", nargs="+", default=["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5"])
        p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
        p.add_argument("--max-env-steps", type=int, default=1_000_000)
        p.add_argument("--minutes", type=float, help="a training-time budget instead of the env steps")
        p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="env steps between evaluations (both sides)")
        if name == "run":
            p.add_argument("--override", action="append", default=[], help="a train override (a candidate setting)")
    p = sub.add_parser("report")
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    args = parser.parse_args()
    {"run": run_maze, "sb3": run_sb3, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
