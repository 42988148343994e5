"""Pixels: MinAtar learning within a wall-time budget, and Atari throughput against the ALE's raw limit.

    pip install -c constraints.txt -e '.[minatar,atari]'
    python benchmarks/pixels.py                                  # everything below, ~70 min on 2 cores (6 runs of 10 minutes, Pong 4)
    python benchmarks/pixels.py --minutes 2 --seeds 1 --games Breakout --out /tmp/pixels.md
    python benchmarks/pixels.py --skip-minatar --pong-seconds 120

1. MinAtar (`train +env=minatar env.id=MinAtar/<game>-v1 seed=<s> max_time_s=<minutes * 60>`, the
   shipped defaults otherwise): the evaluation return at the end and the best one, env steps/s, and
   where an epoch's time went (learner, waiting for actors), per game and seed; over 3 or more seeds, the mean and
   IQM of the last-3-evaluations means with 95% bootstrap intervals (rliable, extra `bench`).
2. Atari Pong-v5: the raw limit of the ALE on this machine (random actions through the same
   preprocessing as `+env=atari`, one process per core, agent steps and frames per second), then
   `train +env=atari env.id=ALE/Pong-v5` for `--pong-seconds` (evaluation off): its steady env
   steps/s and frames/s, and the ratio.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line
from runs import TrainRun, publish, run_train
from scores import iqm_with_interval

PONG = "ALE/Pong-v5"


# -- 1. MinAtar --------------------------------------------------------------------------------------
def minatar_run(game: str, seed: int, minutes: float, workdir: Path, extra: list[str]) -> TrainRun:
    overrides = ["+env=minatar", f"env.id=MinAtar/{game}-v1", f"seed={seed}", f"max_time_s={minutes * 60}", *extra]
    return run_train(overrides, workdir / f"{game}-{seed}", timeout_s=minutes * 60 + 300)


def eval_returns(run: TrainRun) -> list[float]:
    return [row["eval/return_mean"] for row in run.rows if "eval/return_mean" in row]


def minatar_row(game: str, seed: int, run: TrainRun) -> str:
    evals = eval_returns(run)
    last = run.rows[-1]
    learner = run.steady("time/learner_s") / run.steady("time/epoch_s")
    return (f"| {game} | {seed} | {evals[-1]:.1f} | {statistics.fmean(evals[-3:]):.1f} | {max(evals):.1f} | {last.get('train/return_window_mean', float('nan')):.1f} | "
            f"{last['env_steps']:,} | {last['env_steps'] / last['time_s']:,.0f} | {learner:.0%} | {run.steady('time/wait_actors_frac'):.0%} |")


def minatar_section(games: list[str], seeds: list[int], minutes: float, workdir: Path, extra: list[str]) -> list[str]:
    lines = [f"### MinAtar, {minutes:g} minutes of wall time per run (`train +env=minatar env.id=MinAtar/<game>-v1 seed=<s> "
             f"max_time_s={minutes * 60:g}{' ' + ' '.join(extra) if extra else ''}`)", "",
             "| game | seed | eval return (last) | mean of the last 3 evals | eval return (best) | train return (last 100 episodes) "
             "| env steps | env steps/s | learner share of an epoch | learner waiting |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for game in games:
        finals, last3 = [], []
        for seed in seeds:
            run = minatar_run(game, seed, minutes, workdir, extra)
            lines.append(minatar_row(game, seed, run))
            evals = eval_returns(run)
            finals.append(evals[-1])
            last3.append(statistics.fmean(evals[-3:]))
            print(lines[-1], file=sys.stderr, flush=True)
        lines.append(f"| {game} | median | {statistics.median(finals):.1f} | {statistics.median(last3):.1f} | | | | | | |")
        if len(last3) >= 3:
            mean, iqm, iqm_lo, iqm_hi, (mean_lo, mean_hi) = iqm_with_interval(last3)
            lines.append(f"| {game} | mean [95% CI] / IQM [95% CI] | | {mean:.1f} [{mean_lo:.1f}, {mean_hi:.1f}] / "
                         f"{iqm:.1f} [{iqm_lo:.1f}, {iqm_hi:.1f}] | | | | | | |")
    return lines


# -- 2. Atari ----------------------------------------------------------------------------------------
def atari_env():
    """Pong exactly as `+env=atari` builds it (the settings read from the packaged config)."""
    from omegaconf import OmegaConf

    from maze_cli.cli.paths import config_dir
    from maze_cli.envs.atari import make_atari
    from maze_cli.envs.factory import OWN_KEYS

    config = OmegaConf.load(config_dir() / "env" / "atari.yaml").env
    settings = {k: v for k, v in OmegaConf.to_container(config).items() if k not in ("_target_", "id", *OWN_KEYS)}
    return make_atari(PONG, **settings), int(settings["frame_skip"])


def raw_atari_steps_per_s(seconds: float) -> float:
    """Random-action agent steps/s of preprocessed Pong in this process."""
    env, _ = atari_env()
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(256):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 256
    return steps / (time.perf_counter() - start)


def atari_section(seconds: float, raw_seconds: float, workdir: Path) -> list[str]:
    cores = os.cpu_count() or 1
    with mp.get_context("spawn").Pool(cores) as pool:
        raw = sum(pool.map(raw_atari_steps_per_s, [raw_seconds] * cores))
    _, skip = atari_env()
    run = run_train(["+env=atari", f"env.id={PONG}", "target_return=null", f"max_time_s={seconds}", "eval.interval=0"],
                    workdir / "pong", timeout_s=seconds + 300)
    sps = run.steady("sps")
    learner = run.steady("time/learner_s") / run.steady("time/epoch_s")
    return [f"### Atari {PONG}, `train +env=atari env.id={PONG}` for {seconds:g} s against the ALE's raw limit", "",
            "| | agent steps/s | frames/s | of the raw limit |", "|---|---:|---:|---:|",
            f"| raw limit: random actions, same preprocessing, {cores} processes (one per core) | {raw:,.0f} | {raw * skip:,.0f} | 100% |",
            f"| `train +env=atari` (steady epochs; learner {learner:.0%} of an epoch, waiting {run.steady('time/wait_actors_frac'):.0%}) "
            f"| {sps:,.0f} | {sps * skip:,.0f} | {sps / raw:.0%} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10, help="wall time of each MinAtar run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--games", nargs="+", default=["Breakout", "SpaceInvaders"])
    parser.add_argument("--minatar-override", action="append", default=[], help="extra train overrides for the MinAtar runs")
    parser.add_argument("--pong-seconds", type=float, default=240)
    parser.add_argument("--skip-minatar", action="store_true")
    parser.add_argument("--skip-atari", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args()
    lines = [f"## Pixels: MinAtar and Atari ({datetime.date.today()})", "", machine_line(), ""]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if not args.skip_minatar:
            lines += minatar_section(args.games, args.seeds, args.minutes, workdir, args.minatar_override) + [""]
        if not args.skip_atari:
            lines += atari_section(args.pong_seconds, 20, workdir) + [""]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
