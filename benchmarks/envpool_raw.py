"""Raw Atari env steps/s in one process: gymnasium's path against envpool (`env.backend=envpool`).

    pip install -c constraints.txt -e '.[atari,envpool]'
    python benchmarks/envpool_raw.py                          # 16 and 64 envs, 3 runs of 7 s per variant: 2 min timed,
                                                              # plus building the envs (slow on a loaded machine)
    python benchmarks/envpool_raw.py --envs 64 --runs 1 --seconds 5 --out benchmarks/PIXELS.md

What an actor's env batch costs without any policy: `--envs` copies of `+env=atari`'s Pong-v5 (its
shipped settings: frame skip 4, 84x84 gray, 4 frames stacked, up to 30 no-ops, sticky actions 0.25),
random actions drawn for the whole batch each step. gymnasium: the envs stepped one by one in a loop
(a finished one reset at once), as `EnvList` does; envpool: one `EnvpoolAtari` with `--threads`
threads, as an actor gets it. The variants run alternately (gymnasium, envpool 2 threads, envpool
1 thread, then again), so that a change in the machine's load hits them alike; every run's figure
is printed, as agent steps/s (frames/s = 4x). Prints a Markdown section; `--out` appends it to a file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from machine import machine_line, version

PONG = "ALE/Pong-v5"


def atari_settings() -> dict:
    """`+env=atari`'s settings as make_atari's arguments."""
    from maze_cli.cli.paths import config_dir

    config = OmegaConf.to_container(OmegaConf.load(config_dir() / "env" / "atari.yaml").env)
    return {k: v for k, v in config.items() if k not in ("_target_", "reward_clip", "id", "backend", "envpool_threads")}


def gymnasium_envs(n_envs: int) -> list:
    """Built once per size and reused by its runs: 64 ALE envs take long to build on a loaded machine."""
    from maze_cli.envs.atari import make_atari

    return [make_atari(PONG, **atari_settings()) for _ in range(n_envs)]


def gymnasium_steps_per_s(envs: list, seconds: float, seed: int) -> float:
    n_envs = len(envs)
    for i, env in enumerate(envs):
        env.reset(seed=seed * n_envs + i)
    rng, n_actions = np.random.default_rng(seed), int(envs[0].action_space.n)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for env, action in zip(envs, rng.integers(0, n_actions, n_envs)):
            _, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                env.reset()
        steps += n_envs
    return steps / (time.perf_counter() - start)


def envpool_steps_per_s(n_envs: int, seconds: float, threads: int) -> float:
    from maze_cli.envs.atari import make_atari_vector

    env = make_atari_vector(n_envs, backend="envpool", envpool_threads=threads, id=PONG, **atari_settings())
    env.reset(seed=0)
    rng, n_actions = np.random.default_rng(0), int(env.single_action_space.n)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, n_actions, n_envs))  # envpool resets a finished env on the next step itself
        steps += n_envs
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="envpool's num_threads, one variant each")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=7.0)
    parser.add_argument("--out", type=Path, help="append the Markdown section to this file")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    rows = []
    for n in args.envs:
        envs = gymnasium_envs(n)
        variants = [("gymnasium, envs in a loop", lambda run: gymnasium_steps_per_s(envs, args.seconds, run))]
        variants += [(f"envpool, {t} thread{'s' if t != 1 else ''}", lambda run, t=t: envpool_steps_per_s(n, args.seconds, t))
                     for t in args.threads]
        figures: dict[str, list[float]] = {name: [] for name, _ in variants}
        for run in range(args.runs):
            for name, measure in variants:
                figures[name].append(measure(run))
                print(f"{n} envs, {name}, run {run + 1}: {figures[name][-1]:,.0f} agent steps/s", flush=True)
        for env in envs:
            env.close()
        base = statistics.median(figures[variants[0][0]])
        for name, values in figures.items():
            median = statistics.median(values)
            rows.append(f"| {n} | {name} | {' / '.join(f'{v:,.0f}' for v in values)} | {median:,.0f} | {median * 4:,.0f} | {median / base:.2f}x |")
    lines = [f"### Raw Atari env steps/s, gymnasium vs envpool ({datetime.date.today().isoformat()}, `benchmarks/envpool_raw.py`)", "",
             f"{machine_line()}, ale-py {version('ale-py')}, envpool {version('envpool')}; one process, {PONG} with "
             f"`+env=atari`'s settings (sticky actions 0.25, up to 30 no-ops), random actions, {args.seconds:g} s per run, "
             f"variants run alternately; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
             f"(the machine is shared: the figures are relative).", "",
             "| envs | backend | agent steps/s, each run | median | frames/s | vs gymnasium |", "|---:|---|---|---:|---:|---:|",
             *rows, ""]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
