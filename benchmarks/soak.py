"""A long run with faults injected: restarts seen, the run finished, memory of all its processes.

    python benchmarks/soak.py --minutes 20 --fault-p 1.5e-7 --out soak.csv

Runs `train` (IMPALA CartPole, subprocess actors, target off) on an env that raises or SIGKILLs
its own process at random (about every few minutes at ~40k steps/s), samples the summed PSS of the
train process and all its descendants every 15 s, and prints restarts, the end and the memory trend.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = Path(sys.executable).with_name("train")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--fault-p", type=float, default=1.5e-7)
    parser.add_argument("--out", default="soak.csv")
    parser.add_argument("--runner", default="subproc", choices=("subproc", "ray"))
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    config_dir = run_dir / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "flaky.yaml").write_text(f"_target_: soak_env.FlakyCartPole\np: {args.fault_p}\n")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    cmd = [str(TRAIN), "--config-dir", str(config_dir), "+env=flaky", f"runner={args.runner}", "target_return=null",
           f"max_time_s={args.minutes * 60}", "max_env_steps=100000000000", "runner.max_restarts=1000",
           f"hydra.run.dir={run_dir / 'run'}"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    while proc.poll() is None:
        pids = descendants(proc.pid)
        samples.append((round(time.monotonic() - start), len(pids), sum(pss_kib(p) for p in pids) // 1024))
        time.sleep(15)
    err = proc.stderr.read()
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "processes", "pss_mib"])
        writer.writerows(samples)
    log = (run_dir / "run" / "train.log").read_text()
    restarts = log.count("restarting it: restart")
    steady = [s[2] for s in samples if s[0] >= 60] or [s[2] for s in samples]
    print(f"exit code {proc.returncode}; {restarts} restarts; last log line: {log.strip().splitlines()[-1]}")
    print(f"summed PSS MiB over time (t_s, processes, MiB): first {samples[1] if len(samples) > 1 else samples[0]}, "
          f"last {samples[-1]}; after the first minute min {min(steady)}, max {max(steady)}")
    if proc.returncode != 0:
        print(err[-2000:])
    print(f"samples: {args.out}; run dir: {run_dir / 'run'}")


if __name__ == "__main__":
    main()
