"""A long run with faults injected: restarts seen, the run finished, memory of all its processes.

    python benchmarks/soak.py --minutes 20 --fault-every-s 180 --out soak.csv

Runs `train` (IMPALA CartPole, target off) on an env whose every actor process raises or SIGKILLs
itself once, about `--fault-every-s` after it started (so with 2 actors a fault every ~1.5 min),
samples the summed PSS of the train process and all its descendants every 15 s, and prints the
restarts, how the run ended and the memory trend.
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

from procmem import tree_pss_mib

HERE = Path(__file__).resolve().parent
TRAIN = Path(sys.executable).with_name("train")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--fault-every-s", type=float, default=180)
    parser.add_argument("--out", default="soak.csv")
    parser.add_argument("--runner", default="subproc", choices=("subproc", "ray"))
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    config_dir = run_dir / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "flaky.yaml").write_text(f"_target_: soak_env.FlakyCartPole\nevery_s: {args.fault_every_s}\n")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    cmd = [str(TRAIN), "--config-dir", str(config_dir), "+env=flaky", f"runner={args.runner}", "target_return=null",
           f"max_time_s={args.minutes * 60}", "max_env_steps=100000000000", "runner.max_restarts=1000",
           f"hydra.run.dir={run_dir / 'run'}"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    while proc.poll() is None:
        n_processes, mib = tree_pss_mib(proc.pid)
        samples.append((round(time.monotonic() - start), n_processes, round(mib)))
        time.sleep(15)
    err = proc.stderr.read()
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "processes", "pss_mib"])
        writer.writerows(samples)
    log = (run_dir / "run" / "train.log").read_text()
    restarts = log.count("restarting it: restart")
    skipped_evals = log.count("skipped, training goes on")
    steady = [s[2] for s in samples if s[0] >= 60] or [s[2] for s in samples]
    print(f"exit code {proc.returncode}; {restarts} actor restarts; {skipped_evals} evaluations skipped; "
          f"last log line: {log.strip().splitlines()[-1]}")
    print(f"summed PSS MiB over time (t_s, processes, MiB): first {samples[1] if len(samples) > 1 else samples[0]}, "
          f"last {samples[-1]}; after the first minute min {min(steady)}, max {max(steady)}")
    if proc.returncode != 0:
        print(err[-2000:])
    print(f"samples: {args.out}; run dir: {run_dir / 'run'}")


if __name__ == "__main__":
    main()
