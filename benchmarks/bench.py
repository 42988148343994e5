"""maze_cli's throughput, time to solve and memory on this machine, in one run, as Markdown.

    python benchmarks/bench.py                  # everything below, ~10 min on 2 cores
    python benchmarks/bench.py --sb3            # plus Stable-Baselines3 baselines (pip install 'maze_cli[bench]')
    python benchmarks/bench.py --sb3 --out benchmarks/RESULTS.md   # the result file docs/benchmarks.md shows
    python benchmarks/bench.py --seconds 10 --no-ray --out /tmp/bench.md

1. The raw limit: random-action `env.step` of CartPole-v1 in one process, in one process per core,
   and gymnasium's vectorized CartPole (64 envs) in one process.
2. IMPALA CartPole env steps/s for runner=sequential, subproc and ray with 1, 2 and 4 actors
   (median epoch after start-up, target and evaluation off), with where the learner's time went.
3. SAC Pendulum env steps/s and updates/s.
4. Time to solve, whole process, seeds 1-3: IMPALA CartPole to 475 and SAC Pendulum to -200 with
   the shipped defaults; and the peak memory (summed PSS of all processes) of the CartPole runs.
5. The targets, met or not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line
from runs import TrainRun, run_train

HERE = Path(__file__).resolve().parent


# -- 1. the raw limit ---------------------------------------------------------------------------
def raw_steps_per_s(seconds: float, vector_envs: int = 0) -> float:
    """Random-action steps/s of CartPole-v1 in this process (a vectorized batch if `vector_envs`)."""
    import gymnasium as gym
    import numpy as np

    rng = np.random.default_rng(0)
    if vector_envs:
        env = gym.make_vec("CartPole-v1", num_envs=vector_envs, vectorization_mode="vector_entry_point")
        env.reset(seed=0)
        actions = rng.integers(0, 2, size=(1024, vector_envs))
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for a in actions[:256]:
                env.step(a)
            steps += 256 * vector_envs
        return steps / (time.perf_counter() - start)
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    actions = rng.integers(0, 2, size=4096).tolist()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        steps += len(actions)
    return steps / (time.perf_counter() - start)


def raw_limit(seconds: float) -> dict[str, float]:
    cores = os.cpu_count() or 1
    with mp.get_context("spawn").Pool(cores) as pool:
        per_process = pool.map(raw_steps_per_s, [seconds] * cores)
    return {"one process": raw_steps_per_s(seconds), f"{cores} processes (one per core)": sum(per_process),
            "vectorized, 64 envs, one process": raw_steps_per_s(seconds, vector_envs=64)}


# -- 2./3. throughput -------------------------------------------------------------------------------
def throughput_run(overrides: list[str], seconds: float, workdir: Path, name: str) -> TrainRun:
    return run_train([*overrides, "target_return=null", f"max_time_s={seconds}", "eval.interval=0"], workdir / name)


def impala_rows(seconds: float, runners: list[str], actor_counts: list[int], workdir: Path, limit: float) -> list[str]:
    lines = ["| runner | actors | env steps/s | of the raw limit | updates/s | learner waiting | policy lag |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for runner in runners:
        for n in actor_counts:
            r = throughput_run(["+env=cartpole", f"runner={runner}", f"runner.n_actors={n}"], seconds, workdir, f"impala-{runner}-{n}")
            sps = r.steady("sps")
            lines.append(f"| {runner} | {n} | {sps:,.0f} | {sps / limit:.0%} | {r.updates_per_s():,.0f} | "
                         f"{r.steady('time/wait_actors_frac'):.0%} | {r.steady('policy_lag_mean'):.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def breakdown(run: TrainRun) -> str:
    """Where one epoch's time went, learner and actors (actor times summed over actors)."""
    keys = ["time/wait_actors_s", "time/dequeue_s", "time/learner_s", "time/broadcast_s", "time/actor_env_step_s",
            "time/actor_inference_s", "time/actor_record_s", "time/actor_wait_s"]
    epoch = run.steady("time/epoch_s")
    parts = [f"{k.removeprefix('time/').removesuffix('_s')} {run.steady(k) / epoch:.0%}" for k in keys if k in run.rows[-1]]
    return ", ".join(parts)


# -- 4. time to solve ---------------------------------------------------------------------------
def sb3_run(task: str, seed: int, max_s: float | None = None, extra: list[str] = ()) -> tuple[float, bool]:
    """One sb3_baseline.py run in its own process, timed whole like `train`: (wall s, solved).
    `extra`: more sb3_baseline.py arguments (e.g. --eval-every)."""
    budget = [] if max_s is None else ["--max-s", str(max_s)]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "sb3_baseline.py"), task, "--seed", str(seed), *budget, *extra],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sb3 {task} seed {seed} failed:\n{proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])["solved"]


def sb3_solve(algo: str, seeds: list[int]) -> list[tuple[float, bool]]:
    results = []
    for seed in seeds:
        results.append(sb3_run(algo, seed))
        print(f"sb3 {algo} seed {seed}: {results[-1][0]:.1f} s", file=sys.stderr, flush=True)
    return results


def fmt_solve(wall: float, solved: bool) -> str:
    return f"{wall:.1f}" if solved else f"{wall:.1f} (not solved)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20, help="length of each throughput run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--no-ray", action="store_true", help="skip runner=ray")
    parser.add_argument("--sb3", action="store_true", help="also time Stable-Baselines3 PPO and SAC on the same tasks")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args()
    runners = ["sequential", "subproc"] + ([] if args.no_ray else ["ray"])
    out = [f"## maze_cli benchmark, {datetime.date.today()}", "", f"{machine_line()}", ""]

    limits = raw_limit(min(args.seconds, 5))
    two_proc = next(v for k, v in limits.items() if "processes" in k)
    out += ["### The raw limit: random-action `env.step` of CartPole-v1", "", "| how | env steps/s |", "|---|---:|"]
    out += [f"| {k} | {v:,.0f} |" for k, v in limits.items()] + [""]
    print("\n".join(out), file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        out += [f"### IMPALA on CartPole-v1: steady-state throughput ({args.seconds:.0f} s runs, defaults otherwise)", ""]
        out += impala_rows(args.seconds, runners, args.actors, workdir, two_proc)
        default_run = throughput_run(["+env=cartpole"], args.seconds, workdir, "impala-default")
        out += ["", f"Where the default run's epoch went: {breakdown(default_run)}.", ""]

        sac = throughput_run(["+env=pendulum", "algorithm=sac"], args.seconds * 1.5, workdir, "sac")
        out += ["### SAC on Pendulum-v1 (runner=subproc, defaults)", "", "| env steps/s | updates/s |", "|---:|---:|",
                f"| {sac.steady('sps'):,.0f} | {sac.updates_per_s():,.0f} |", ""]

        cartpole = [run_train(["+env=cartpole", f"seed={s}"], workdir / f"solve-cartpole-{s}") for s in args.seeds]
        pendulum = [run_train(["+env=pendulum", "algorithm=sac", f"seed={s}"], workdir / f"solve-pendulum-{s}") for s in args.seeds]
    sb3 = {"ppo": sb3_solve("ppo", args.seeds), "sac": sb3_solve("sac", args.seeds)} if args.sb3 else {}

    seeds = " | ".join(f"seed {s}" for s in args.seeds)
    out += ["### Time to solve, whole process (seconds; start-up, evaluation and shutdown included)", "",
            f"| task | {seeds} | median |", "|---|" + "---:|" * (len(args.seeds) + 1)]
    rows = [("`train +env=cartpole` (IMPALA, eval mean >= 475)", [(r.wall_s, r.solved) for r in cartpole]),
            ("`train +env=pendulum algorithm=sac` (mean of 10 >= -200)", [(r.wall_s, r.solved) for r in pendulum])]
    if sb3:
        rows += [("SB3 PPO, rl-zoo CartPole settings (100-episode mean >= 475)", sb3["ppo"]),
                 ("SB3 SAC, rl-zoo Pendulum settings (10-episode mean >= -200)", sb3["sac"])]
    medians = {}
    for name, results in rows:
        medians[name] = statistics.median(w for w, _ in results)
        out.append(f"| {name} | " + " | ".join(fmt_solve(w, s) for w, s in results) + f" | {medians[name]:.1f} |")
    peak = max(r.peak_pss_mib for r in cartpole)
    procs = max(r.peak_processes for r in cartpole)
    out += ["", f"Peak memory of `train +env=cartpole`, summed PSS over its {procs} processes: {peak:,.0f} MiB.", ""]

    default_sps = default_run.steady("sps")
    cart, pend = medians[rows[0][0]], medians[rows[1][0]]
    out += ["### Targets", "", "| target | measured | met |", "|---|---|:---:|",
            f"| IMPALA CartPole subproc defaults >= half the raw limit ({two_proc / 2:,.0f} steps/s) | {default_sps:,.0f} steps/s | "
            f"{'yes' if default_sps >= two_proc / 2 else 'no'} |"]
    if sb3:
        ppo, sac_sb3 = medians[rows[2][0]], medians[rows[3][0]]
        out += [f"| CartPole to 475 faster than SB3 PPO ({ppo:.1f} s) | {cart:.1f} s | {'yes' if cart < ppo else 'no'} |",
                f"| Pendulum to -200 in half SB3 SAC's time ({sac_sb3 / 2:.1f} s) | {pend:.1f} s | {'yes' if pend <= sac_sb3 / 2 else 'no'} |"]
    out += [f"| Peak memory of the default CartPole run <= 1 GiB | {peak:,.0f} MiB | {'yes' if peak <= 1024 else 'no'} |"]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
