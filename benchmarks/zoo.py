"""maze_cli's defaults against the RL Zoo's tuned PPO, the way a new user meets them: one `train` command
per env and seed, nothing set but the env, the budget, the seed and target_return=null (the whole budget runs).

    python benchmarks/zoo.py random                                     # random-policy returns, cached in results/zoo_random.json
    python benchmarks/zoo.py run --seeds 1 2 3                          # maze_cli's defaults, label "defaults"
    python benchmarks/zoo.py run --seeds 1 2 3 --label lr1e-3 --override algorithm.lr=1e-3   # a candidate default
    python benchmarks/zoo.py sb3 --seeds 1 2 3                          # SB3's PPO untuned, label "sb3-untuned"
    python benchmarks/zoo.py report --out benchmarks/ZOO.md --plot docs/results/zoo.png
    python benchmarks/zoo.py run --seeds 1 --envs cartpole pendulum --budget-scale 0.005 --results /tmp/zoo.jsonl  # a smoke test

The figures: rl-baselines3-zoo's benchmark.md, its PPO rows (one agent per env trained with the Zoo's
tuned hyperparams/ppo.yml, its mean return over about 150k evaluation env steps); the budgets are the
Zoo's n_timesteps, except MountainCarContinuous-v0, whose Zoo figure is at 20k env steps with gSDE and is
judged here at 100k. LunarLanderContinuous-v3 is registered by gymnasium 1.x (LunarLander-v3 with
continuous=True), so every env is a plain id.

`run`: `train +env=gym env.id=<id> max_env_steps=<budget> target_return=null seed=<s>` plus `--override`s
and nothing else, one process at a time, seed-major. A run's score is its last evaluation (maze_cli
evaluates at its last epoch: `eval.episodes` episodes on fixed seeds, the most likely action; either side
stops at the first epoch or rollout boundary past the budget, and records the env steps it reached). `sb3`:
`PPO("MlpPolicy", gym.make(id), seed=s).learn(budget)`, what an SB3 user gets without the Zoo, then the
same evaluation (sb3_baseline.evaluate: maze_cli's eval seeds, deterministic actions). Each run appends
one JSON line to benchmarks/results/zoo.jsonl (`--results` elsewhere); a failed run is recorded with
its error and the rest go on.

`report`: normalized score = (score - random) / (zoo - random), random being the mean return of uniform
random actions (`random`). Per env and label every seed's raw and normalized score and their IQM; per
label the mean and IQM of all (env, seed) normalized scores with 95% stratified-bootstrap intervals
(rliable), how many envs it is ahead of sb3-untuned, and the bars: mean >= 0.95, every env's IQM >= 0.8.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import commit, machine_line  # noqa: E402
from figures import finish_grid  # noqa: E402
from runs import publish, run_train  # noqa: E402

RESULTS = HERE / "results" / "zoo.jsonl"
RANDOM = HERE / "results" / "zoo_random.json"
SB3_LABEL = "sb3-untuned"
BARS = (0.95, 0.8)  # mean normalized score over all runs; every env's IQM


@dataclass(frozen=True)
class Task:
    id: str
    budget: int  # env steps: the Zoo's n_timesteps
    zoo: float  # the Zoo's PPO mean return


TASKS = {
    "cartpole": Task("CartPole-v1", 100_000, 500.0),
    "acrobot": Task("Acrobot-v1", 1_000_000, -73.5),
    "mountaincar": Task("MountainCar-v0", 1_000_000, -110.4),
    "lunarlander": Task("LunarLander-v3", 1_000_000, 242.1),
    "lunarlander-continuous": Task("LunarLanderContinuous-v3", 1_000_000, 270.9),
    "pendulum": Task("Pendulum-v1", 100_000, -172.2),
    "mountaincar-continuous": Task("MountainCarContinuous-v0", 100_000, 88.3),  # the Zoo's: 20k env steps, gSDE
    "bipedalwalker": Task("BipedalWalker-v3", 5_000_000, 213.3),
}
BY_ID = {task.id: task for task in TASKS.values()}


def eval_episodes() -> int:
    """maze_cli's default `eval.episodes`, so that SB3 is judged on as many episodes as maze_cli."""
    from maze_cli.config.schema import EvalConfig

    return EvalConfig().episodes


def code_version() -> str:
    """machine.commit(), marked `+dirty` where the package or its configs have uncommitted changes:
    a run of a work in progress must not pass for the commit's."""
    root = HERE.parent
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "maze_cli", "conf", "pyproject.toml"], cwd=root,
                           capture_output=True, text=True).stdout.strip()
    return commit() + ("+dirty" if dirty else "")


def save(record: dict, results: Path) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:
        f.write(json.dumps(record) + "\n")


def budget(task: Task, scale: float) -> int:
    return max(1, round(task.budget * scale))


def progress(i: int, n: int, record: dict) -> None:
    head = f"[{i}/{n}] {record['label']} {record['env']} seed {record['seed']}"
    if "error" in record:
        lines = record["error"].strip().splitlines() or ["?"]
        reason = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1])
        print(f"{head}: FAILED after {record['wall_s']:.0f} s: {reason}", flush=True)
    else:
        print(f"{head}: {record['score']:.1f} at {record['env_steps']:,} env steps, {record['wall_s']:.0f} s "
              f"({record['algorithm']})", flush=True)


def run_maze(args) -> None:
    """Seed-major, one process at a time: a table stopped halfway still has whole seeds."""
    import yaml

    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="zoo-runs-"))
    print(f"run dirs under {runs_dir}", flush=True)
    jobs = [(seed, name) for seed in args.seeds for name in args.envs]
    for i, (seed, name) in enumerate(jobs, 1):
        task, steps = TASKS[name], budget(TASKS[name], args.budget_scale)
        overrides = ["+env=gym", f"env.id={task.id}", f"max_env_steps={steps}", "target_return=null", f"seed={seed}",
                     *args.override]
        run_dir = runs_dir / args.label / name / f"seed{seed}"
        record = dict(label=args.label, side="maze_cli", env=task.id, seed=seed, budget=steps, budget_scale=args.budget_scale,
                      overrides=args.override, run_dir=str(run_dir), machine=machine_line(), commit=code_version(),
                      command=shlex.join(["train", *overrides, f"hydra.run.dir={run_dir}"]))
        start = time.perf_counter()
        try:
            run = run_train(overrides, run_dir, timeout_s=args.timeout_h * 3600)
            curve = run.eval_curve()
            config = (run_dir / "config.yaml").read_text()
            record.update(score=curve[-1][1], env_steps=run.rows[-1]["env_steps"], wall_s=run.wall_s,
                          algorithm=yaml.safe_load(config)["algorithm"]["_target_"], curve=curve)
        except (SystemExit, Exception) as error:  # recorded, and the table goes on
            record.update(error=str(error)[-3000:] or type(error).__name__, wall_s=time.perf_counter() - start)
        save(record, args.results)
        progress(i, len(jobs), record)


def run_sb3(args) -> None:
    """SB3's PPO as `PPO("MlpPolicy", env, seed=seed)` gives it: no Zoo settings, no VecNormalize, its
    own device and threads; wall_s is its training and evaluation in this process."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    from sb3_baseline import evaluate

    episodes = eval_episodes()
    jobs = [(seed, name) for seed in args.seeds for name in args.envs]
    for i, (seed, name) in enumerate(jobs, 1):
        task, steps = TASKS[name], budget(TASKS[name], args.budget_scale)
        record = dict(label=SB3_LABEL, side="sb3", env=task.id, seed=seed, budget=steps, budget_scale=args.budget_scale,
                      overrides=[], run_dir=None, machine=machine_line(), commit=code_version(),
                      command=f'PPO("MlpPolicy", gym.make("{task.id}"), seed={seed}).learn({steps}); '
                              f'evaluate(model, "{task.id}", {seed}, episodes={episodes})')
        start = time.perf_counter()
        try:
            model = PPO("MlpPolicy", gym.make(task.id), seed=seed)
            model.learn(steps)
            score = evaluate(model, task.id, seed, episodes)
            record.update(score=score, env_steps=int(model.num_timesteps), wall_s=time.perf_counter() - start,
                          algorithm="stable_baselines3.PPO", curve=[(int(model.num_timesteps), score)])
        except Exception as error:
            record.update(error=f"{type(error).__name__}: {error}", wall_s=time.perf_counter() - start)
        save(record, args.results)
        progress(i, len(jobs), record)


def random_returns(args) -> None:
    """Uniform random actions, episode i on env seed i (and action-space seed i), so the figure is fixed."""
    import gymnasium as gym

    cache = json.loads(RANDOM.read_text()) if RANDOM.exists() else {}
    names = args.envs or [name for name, task in TASKS.items() if task.id not in cache]
    for name in names:
        task, start = TASKS[name], time.perf_counter()
        episodes, env, returns = args.episodes, gym.make(task.id), []
        for seed in range(episodes):
            env.reset(seed=seed)
            env.action_space.seed(seed)
            done, total = False, 0.0
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        env.close()
        cache[task.id] = dict(return_mean=float(np.mean(returns)), return_std=float(np.std(returns)), episodes=episodes,
                              seeds=f"0-{episodes - 1}")
        RANDOM.write_text(json.dumps(cache, indent=1) + "\n")
        print(f"{task.id}: {cache[task.id]['return_mean']:.1f} over {episodes} episodes, {time.perf_counter() - start:.0f} s",
              flush=True)


def iqm(values) -> float:
    """The interquartile mean as rliable's aggregate_iqm takes it (scipy's trim_mean, 25% off each end)."""
    x = np.sort(np.asarray(values, dtype=float).ravel())
    k = int(0.25 * len(x))
    return float(x[k:len(x) - k].mean())


def intervals(matrix: np.ndarray, reps: int = 5000) -> tuple[dict[str, tuple[float, float, float]], str]:
    """Mean and IQM of a (seeds x envs) matrix of normalized scores with 95% intervals: rliable's
    stratified bootstrap (seeds resampled within each env), or a plain one over all runs without it."""
    try:
        from rliable import library as rly
        from rliable import metrics
    except ImportError:
        rng, flat = np.random.default_rng(0), matrix.ravel()
        samples = rng.choice(flat, size=(reps, flat.size))
        stats = {"mean": (flat.mean(), samples.mean(axis=1)), "iqm": (iqm(flat), np.array([iqm(s) for s in samples]))}
        return {k: (float(p), *map(float, np.percentile(b, [2.5, 97.5]))) for k, (p, b) in stats.items()}, \
            "plain bootstrap over all runs (rliable is not installed: pip install 'maze_cli[bench]')"
    aggregate = lambda x: np.array([metrics.aggregate_mean(x), metrics.aggregate_iqm(x)])  # noqa: E731
    point, interval = rly.get_interval_estimates({"x": matrix}, aggregate, reps=reps)
    (mean, mid), ((mean_lo, iqm_lo), (mean_hi, iqm_hi)) = point["x"], interval["x"]
    return {"mean": (mean, mean_lo, mean_hi), "iqm": (mid, iqm_lo, iqm_hi)}, "rliable, stratified bootstrap"


def shown(label: str, scale: float) -> str:
    return label if scale == 1 else f"{label} (budget x{scale:g})"


def load(args) -> dict[str, dict[str, dict[int, dict]]]:
    """label -> env id -> seed -> record (a seed run again: its last record). A run at a scaled budget is
    a label of its own, so that a smoke test never mixes with a table."""
    groups: dict[str, dict[str, dict[int, dict]]] = {}
    for line in args.results.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        label = shown(r["label"], r["budget_scale"])
        if args.labels and r["label"] not in args.labels and label not in args.labels:
            continue
        groups.setdefault(label, {}).setdefault(r["env"], {})[r["seed"]] = r
    return groups


def ahead_of_sb3(mine: dict[int, float], theirs: dict[int, float]) -> bool:
    """Mean raw score over the seeds both sides have: a seed one side lacks must not tip it."""
    common = sorted(set(mine) & set(theirs))
    return bool(common) and float(np.mean([mine[s] for s in common])) > float(np.mean([theirs[s] for s in common]))


def report(args) -> None:
    groups, randoms = load(args), json.loads(RANDOM.read_text()) if RANDOM.exists() else {}
    missing = sorted({env for by_env in groups.values() for env in by_env} - set(randoms))
    if missing:
        raise SystemExit(f"no random-policy return for {', '.join(missing)}: run `python benchmarks/zoo.py random` first")

    def normalized(env: str, score: float) -> float:
        low = randoms[env]["return_mean"]
        return (score - low) / (BY_ID[env].zoo - low)

    def scores(label: str, env: str) -> dict[int, float]:
        return {seed: r["score"] for seed, r in sorted(groups[label].get(env, {}).items()) if "error" not in r}

    order = [task.id for task in TASKS.values()]
    lines = ["| env | Zoo PPO | random | label | every seed: raw (normalized) | IQM normalized |", "|---|---|---|---|---|---|"]
    for env in order:
        for label, by_env in groups.items():
            if env not in by_env:
                continue
            ok = scores(label, env)
            cells = [f"s{seed}: {ok[seed]:,.1f} ({normalized(env, ok[seed]):.2f})" if seed in ok else f"s{seed}: failed"
                     for seed in sorted(by_env[env])]
            mid = f"{iqm([normalized(env, s) for s in ok.values()]):.2f}" if ok else "-"
            lines.append(f"| {env} | {BY_ID[env].zoo:,.1f} | {randoms[env]['return_mean']:,.1f} | {label} | {', '.join(cells)} | {mid} |")

    lines += ["", "| label | runs | mean normalized [95% CI] | IQM normalized [95% CI] | ahead of sb3-untuned "
              f"| mean >= {BARS[0]} | every env's IQM >= {BARS[1]} |", "|---|---|---|---|---|---|---|"]
    notes: set[str] = set()
    for label, by_env in groups.items():
        envs = [env for env in order if scores(label, env)]
        if not envs:
            continue
        # the stratified bootstrap needs a rectangle: the seeds every env of the label has
        seeds = sorted(set.intersection(*(set(scores(label, env)) for env in envs)))
        dropped = sum(len(scores(label, env)) for env in envs) - len(seeds) * len(envs)
        if not seeds:
            lines.append(f"| {label} | no seed on every env | - | - | - | - | - |")
            continue
        matrix = np.array([[normalized(env, scores(label, env)[seed]) for env in envs] for seed in seeds])
        stats, method = intervals(matrix)
        notes.add(method)
        scale = next(iter(next(iter(by_env.values())).values()))["budget_scale"]
        sb3 = shown(SB3_LABEL, scale)  # at the same budget
        base = [env for env in envs if scores(sb3, env)] if sb3 in groups and label != sb3 else []
        ahead = sum(ahead_of_sb3(scores(label, env), scores(sb3, env)) for env in base)
        env_iqms = {env: iqm([normalized(env, v) for v in scores(label, env).values()]) for env in envs}  # all its seeds
        complete = len(envs) == len(order)
        mean_bar = ("yes" if stats["mean"][0] >= BARS[0] else "no") if complete else f"n/a ({len(envs)} of {len(order)} envs)"
        short = [f"{env} {value:.2f}" for env, value in env_iqms.items() if value < BARS[1]]
        iqm_bar = ("yes" if not short else "no: " + ", ".join(short)) if complete else \
            f"n/a{': below on ' + ', '.join(short) if short else ''}"
        runs = f"{len(envs)} envs x {len(seeds)} seed{'s' * (len(seeds) > 1)}" + (f" ({dropped} runs left out: seeds not on every env)" if dropped else "")
        mean, mid = stats["mean"], stats["iqm"]
        lines.append(f"| {label} | {runs} | {mean[0]:.2f} [{mean[1]:.2f}, {mean[2]:.2f}] | {mid[0]:.2f} [{mid[1]:.2f}, {mid[2]:.2f}] | "
                     f"{f'{ahead} of {len(base)} envs' if base else '-'} | {mean_bar} | {iqm_bar} |")
    failed = [(label, env, seed) for label, by_env in groups.items() for env, by_seed in by_env.items()
              for seed, r in by_seed.items() if "error" in r]
    machines = sorted({r["machine"] for by_env in groups.values() for by_seed in by_env.values() for r in by_seed.values()})
    lines += ["", f"Normalized: (score - random) / (Zoo - random); a score is a run's last evaluation ({eval_episodes()} "
              f"episodes, the most likely action). Intervals: {'; '.join(sorted(notes))}. An IQM over fewer than 4 values is their mean.",
              f"Failed runs: {', '.join(f'{l} {e} s{s}' for l, e, s in failed) or 'none'}.",
              *(f"Machine: {m}" for m in machines)]
    publish(lines, args.out)
    if args.plot:
        plot(groups, randoms, args.plot)


def plot(groups: dict[str, dict[str, dict[int, dict]]], randoms: dict, path: Path) -> None:
    """One panel per env (4 x 2, 3 in each): each label's mean eval curve over its seeds (on the steps
    all of them reached), its seeds thin; the Zoo's figure dashed and random actions' dotted, the two ends
    of the normalized score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(12, 6), squeeze=False)
    colors = dict(zip(groups, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3))
    for ax, task in zip(axes.ravel(), TASKS.values()):
        for label, by_env in groups.items():
            curves = [np.asarray(r["curve"], dtype=float) for r in by_env.get(task.id, {}).values() if r.get("curve")]
            if not curves:
                continue
            marker = "o" if max(len(c) for c in curves) == 1 else None  # SB3: its final evaluation only
            for c in curves:
                ax.plot(c[:, 0], c[:, 1], color=colors[label], lw=0.6, alpha=0.35, marker=marker, ms=3)
            grid = min(curves, key=lambda c: c[-1, 0])[:, 0]
            mean = np.mean([np.interp(grid, c[:, 0], c[:, 1]) for c in curves], axis=0)
            ax.plot(grid, mean, color=colors[label], lw=1.8, marker=marker, label=label)
        ax.axhline(task.zoo, color="black", ls="--", lw=1, label="Zoo PPO")
        if task.id in randoms:
            ax.axhline(randoms[task.id]["return_mean"], color="gray", ls=":", lw=1, label="random actions")
        ax.set_title(task.id, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    finish_grid(fig, axes.ravel(), path, ncol=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "sb3", "random", "report"):
        p = sub.add_parser(name)
        if name != "report":
            p.add_argument("--envs", nargs="+", choices=list(TASKS), default=None if name == "random" else list(TASKS))
        if name in ("run", "sb3"):
            p.add_argument("--seeds", type=int, nargs="+", required=True)
            p.add_argument("--budget-scale", type=float, default=1.0, help="a fraction of each budget (a smoke test)")
        if name != "random":
            p.add_argument("--results", type=Path, default=RESULTS, help="the jsonl the runs append to / the report reads")
    run, random, rep = sub.choices["run"], sub.choices["random"], sub.choices["report"]
    run.add_argument("--label", default="defaults")
    run.add_argument("--override", nargs="+", action="extend", default=[], help="train overrides (a candidate setting)")
    run.add_argument("--runs-dir", type=Path, help="where the run dirs go (default: a new temporary folder, kept)")
    run.add_argument("--timeout-h", type=float, default=24.0, help="give up on one run after this many hours")
    random.add_argument("--episodes", type=int, default=100, help="episodes per env")
    rep.add_argument("--labels", nargs="+", help="labels to report (default: every one in the results)")
    rep.add_argument("--out", type=Path)
    rep.add_argument("--plot", type=Path)
    args = parser.parse_args()
    {"run": run_maze, "sb3": run_sb3, "random": random_returns, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
