"""Atari Pong learned within a wall-clock budget: maze_cli's defaults against Sample Factory's Atari settings.

    pip install -c constraints.txt -e '.[atari,bench]'
    python benchmarks/atari_pong.py ours --seeds 1 --minutes 30
    # Sample Factory 2.1.1 in a venv of its own (it pins gymnasium < 1.0):
    python3 -m venv /tmp/sf && /tmp/sf/bin/pip install -c constraints.txt sample-factory==2.1.1 ale-py==0.9.1
    # its workers are spawned processes that must register ALE's envs too: a .pth line imports ale_py in each
    echo "import ale_py" > "$(/tmp/sf/bin/python -c 'import site; print(site.getsitepackages()[0])')/ale_py_register.pth"
    python benchmarks/atari_pong.py sf --sf-python /tmp/sf/bin/python --seeds 1 --minutes 30
    python benchmarks/atari_pong.py report

maze_cli: `train +env=atari env.id=ALE/Pong-v5 seed=<s> max_time_s=<budget> target_return=18`, the shipped
defaults otherwise (PPO with tuning/atari_ppo.yaml, the settings Sample Factory's share, pixels normalized as its are; ALE v5 with sticky actions 0.25, evaluation every 100k env steps; `--extra algorithm=impala`: IMPALA). Sample Factory:
`sf_examples.atari.train_atari --env=atari_pong` with its own Atari defaults (PPO, 8 workers, PongNoFrameskip-v4:
no sticky actions) on the CPU for the same number of seconds of training. The rule both sides share: the mean
return of the last 100 training episodes (unclipped scores), sampled over time; maze_cli's greedy evaluation
is recorded beside it. Every run is appended to benchmarks/results/pong.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line
from runs import run_train

RESULTS = Path(__file__).parent / "results" / "pong.jsonl"

# Sample Factory's own entry point, with ale-py imported first: ale-py >= 0.9 registers its envs on import
SF_MAIN = """
import sys
import ale_py  # noqa: F401
from sf_examples.atari.train_atari import main
sys.exit(main())
"""


def record(entry: dict) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(entry) + "\n")


def ours(seed: int, minutes: float, workdir: Path, extra: list[str]) -> dict:
    overrides = ["+env=atari", "env.id=ALE/Pong-v5", f"seed={seed}", f"max_time_s={minutes * 60:g}", "target_return=18", *extra]
    run = run_train(overrides, workdir / f"pong-{seed}", timeout_s=minutes * 60 + 600)
    curve = [[row["env_steps"], row["time_s"], row.get("train/return_window_mean"), row.get("eval/return_mean")] for row in run.rows]
    last = run.rows[-1]
    return {"side": "maze_cli", "seed": seed, "minutes": minutes, "overrides": extra, "curve": curve,
            "eval_share": last.get("time/eval_share"), "solved": run.solved, "wall_s": run.wall_s}


def sample_factory(python: str, seed: int, minutes: float, workdir: Path, extra: list[str]) -> dict:
    """Sample Factory for `minutes` of training, counted from its first report; its log gives frames and the
    100-episode mean as it goes.

    Sample Factory 2.1.1 never advances the clock that `--train_for_seconds` is checked against, so the run is
    stopped from here: SIGINT to its process group once the budget has passed (it saves and exits), SIGKILL
    if it is still there a minute later.
    """
    args = ["--env=atari_pong", f"--experiment=pong_{seed}", f"--train_dir={workdir}", "--device=cpu", f"--seed={seed}",
            *extra]
    log_path = workdir / f"sf-{seed}.log"
    start = time.perf_counter()
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([python, "-c", SF_MAIN, *args], stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        first_report = None
        while proc.poll() is None:
            time.sleep(5)
            if first_report is None and "Total num frames" in log_path.read_text(errors="replace"):
                first_report = time.perf_counter()
            waited = time.perf_counter() - start
            if (first_report and time.perf_counter() - first_report > minutes * 60) or waited > minutes * 60 + 600:
                break
        stop_group(proc)
    wall = time.perf_counter() - start
    log = log_path.read_text(errors="replace")
    if first_report is None:
        raise SystemExit(f"Sample Factory made no report (exit {proc.returncode}):\n{log[-3000:]}")
    curve, frames, first = [], 0, None
    stamp = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+)\]")
    for line in log.splitlines():
        when = stamp.search(line)
        if (m := re.search(r"Total num frames: (\d+)", line)):
            frames = int(m.group(1))
            if when and first is None:
                first = stamp_seconds(when)
        if (m := re.search(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]", line)) and when and first is not None:
            t = stamp_seconds(when)
            if t - first <= minutes * 60:
                curve.append([frames // 4, round(t - first, 1), float(m.group(1)), None])  # agent steps: frames / skip 4
    return {"side": "sample_factory", "seed": seed, "minutes": minutes, "overrides": extra, "curve": curve,
            "wall_s": wall}


def stamp_seconds(when: re.Match) -> float:
    """A log line's `[YYYY-mm-dd HH:MM:SS,mmm]` stamp as seconds since the epoch."""
    return time.mktime(time.strptime(when.group(1), "%Y-%m-%d %H:%M:%S")) + int(when.group(2)) / 1000


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the run's whole process group (its workers too), SIGKILL to what is left after a minute."""
    for sig, grace in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def summary(entry: dict) -> str:
    curve = entry["curve"]
    train = [c[2] for c in curve if c[2] is not None]
    evals = [c[3] for c in curve if c[3] is not None]
    steps, seconds = curve[-1][0], curve[-1][1]
    best_eval = f"{max(evals):.1f}" if evals else "-"
    last_eval = f"{evals[-1]:.1f}" if evals else "-"
    share = f"{entry['eval_share']:.0%}" if entry.get("eval_share") is not None else "-"
    return (f"| {entry['side']} | {entry['seed']} | {entry['minutes']:g} min | {train[-1] if train else float('nan'):.1f} | "
            f"{last_eval} | {best_eval} | {steps:,} | {steps / max(seconds, 1e-9):,.0f} | {share} |")


def report(entries: list[dict]) -> list[str]:
    lines = ["| side | seed | budget | last 100 training episodes | eval (last) | eval (best) | agent steps | agent steps/s | eval share |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    return lines + [summary(e) for e in entries]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["ours", "sf", "report"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--sf-python", help="the python of a venv with sample-factory 2.1.1 and ale-py")
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides (maze_cli) or flags (Sample Factory)")
    args = parser.parse_args()
    if args.what == "report":
        print("\n".join(report([json.loads(line) for line in RESULTS.read_text().splitlines()])))
        return
    if args.what == "sf" and not args.sf_python:
        sys.exit("sf needs --sf-python: the python of a venv with sample-factory 2.1.1 and ale-py (see --help)")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            if args.what == "ours":
                entry = ours(seed, args.minutes, Path(tmp), args.extra)
            else:
                entry = sample_factory(args.sf_python, seed, args.minutes, Path(tmp), args.extra)
            entry["machine"] = machine_line()
            record(entry)
            print("\n".join(report([entry])), flush=True)


if __name__ == "__main__":
    main()
