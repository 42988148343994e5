"""SIGKILL random actors and learners of a 2-learner run, several times: each time the run must go on
(an actor: restarted) or stop cleanly (a learner: one line, last.pt) within 30 s, and resume.

    python benchmarks/learner_kills.py --kills 8 --runner subproc
    python benchmarks/learner_kills.py --kills 6 --runner ray --out /tmp/kills.md

The run: `train +env=cartpole learner.num_learners=2 runner.n_actors=4` with no target, a checkpoint
every epoch. Each round waits for two more epochs, then kills one process drawn at random among the
actors and learners 1..N-1 (with runner=subproc: the processes a forkserver started; with runner=ray:
the Ray workers of learners and actors). An actor's death must be followed by a new epoch row within
30 s (the actor restarted); a learner's by the run's exit within 30 s, its last stderr line naming the
learner, no process of the run left, and `train resume=<dir>` starting again. At the end every epoch
must appear once in stats.jsonl, in order.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line
from procmem import descendants

TRAIN = Path(sys.executable).with_name("train")
LIMIT_S = 30.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def targets(train_pid: int, runner: str, learner_pids: set[int]) -> list[tuple[int, str]]:
    """(pid, what) of every actor and learner 1..N-1 of the run."""
    found = []
    for pid in descendants(train_pid):
        cmd = _cmdline(pid)
        if runner == "ray":
            if cmd.startswith("ray::RayLearnerBody"):
                found.append((pid, "learner"))
            elif cmd.startswith("ray::RayActorBody"):
                found.append((pid, "actor"))
        elif "forkserver" in _cmdline(_parent(pid)) and "forkserver" in cmd:
            found.append((pid, "learner" if pid in learner_pids else "actor"))
    return found


def _rows(run_dir: Path) -> list[dict]:
    from maze_cli.stats.writers import read_rows

    path = run_dir / "stats.jsonl"
    return list(read_rows(path)) if path.exists() else []


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.Popen([str(TRAIN), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env=env)


def _log(run_dir: Path) -> str:
    return (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""


def _learner_pids(run_dir: Path) -> set[int]:
    import re

    return {int(pid) for pid in re.findall(r"learner \d+ \(pid (\d+)", _log(run_dir))}


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--runner", default="subproc", choices=("subproc", "ray"))
    parser.add_argument("--seed", type=int, default=0, help="of the random choices")
    parser.add_argument("--learner-at", type=int, nargs="*", default=[], help="kills (1-based) that take a learner for sure")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    run_dir = Path(tempfile.mkdtemp(prefix="kills-")) / "run"
    first = ["+env=cartpole", f"runner={args.runner}", "learner.num_learners=2", "runner.n_actors=4", "target_return=null",
             "max_env_steps=100000000000", "eval.interval=0", "epoch_length=20", "checkpoint.interval=1",
             "runner.max_restarts=1000", f"hydra.run.dir={run_dir}"]
    lines = [f"### SIGKILL of random actors and learners, 2 learners, runner={args.runner} ({machine_line()})", "",
             f"`python benchmarks/learner_kills.py --kills {args.kills} --runner {args.runner} --seed {args.seed}"
             + (f" --learner-at {' '.join(map(str, args.learner_at))}`" if args.learner_at else "`"), "",
             "| kill | process | outcome | seconds to it | resumed |", "|---:|---|---|---:|---|"]
    proc = _start(first)
    ok = True
    for kill in range(1, args.kills + 1):
        if not _wait(lambda: len(_rows(run_dir)) >= 1 and proc.poll() is None, 120):
            sys.exit(f"the run is not running: {proc.stderr.read()[-2000:] if proc.poll() is not None else 'no epoch in 120 s'}")
        before = len(_rows(run_dir))
        _wait(lambda: len(_rows(run_dir)) >= before + 2, 120)
        candidates = targets(proc.pid, args.runner, _learner_pids(run_dir))
        if not candidates:
            sys.exit("no actor or learner process found to kill")
        if kill in args.learner_at:
            candidates = [c for c in candidates if c[1] == "learner"] or candidates
        pid, what = rng.choice(candidates)
        rows_at_kill = len(_rows(run_dir))
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        resumed = ""
        if what == "actor":
            went_on = _wait(lambda: len(_rows(run_dir)) > rows_at_kill and proc.poll() is None, LIMIT_S)
            outcome = "the run went on (a new epoch row)" if went_on else "NO new epoch row"
            ok &= went_on
        else:
            stopped = _wait(lambda: proc.poll() is not None, LIMIT_S)
            seconds = time.monotonic() - t0
            err = proc.stderr.read() if stopped else ""
            last = err.strip().splitlines()[-1] if err.strip() else ""
            left = [p for p in descendants(proc.pid) if _alive(p)] if not stopped else []
            clean = stopped and "learner" in last and "resume=" in last
            outcome = (f"stopped, exit {proc.returncode}: `{last[:160]}`" if clean else f"NOT CLEAN (stopped={stopped}, last line: {last[:200]})")
            ok &= clean and not left
            resumes = _log(run_dir).count("resumed ")
            proc = _start([f"resume={run_dir}"])
            resumed = "yes" if _wait(lambda: proc.poll() is None and _log(run_dir).count("resumed ") > resumes, 120) else "NO"
            ok &= resumed == "yes"
            lines.append(f"| {kill} | learner (pid {pid}) | {outcome} | {seconds:.1f} | {resumed} |")
            print(lines[-1], flush=True)
            continue
        lines.append(f"| {kill} | {what} (pid {pid}) | {outcome} | {time.monotonic() - t0:.1f} | {resumed} |")
        print(lines[-1], flush=True)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    rows = _rows(run_dir)
    epochs_once = [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
    ok &= epochs_once
    lines += ["", f"{len(rows)} epochs in stats.jsonl, each once and in order: {'yes' if epochs_once else 'NO'}; "
                  f"every kill handled within {LIMIT_S:.0f} s: {'yes' if ok else 'NO'}"]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n\n" + text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
