"""A container's small /dev/shm: Pong's env steps/s with its shared memory in a file, against /dev/shm.

    pip install -c constraints.txt -e '.[atari]'      # and root, for a mount namespace (unshare -m)
    python benchmarks/shm.py                           # two runs of 120 s, one after the other
    python benchmarks/shm.py --seconds 60 --out /tmp/shm.md

`train +env=atari env.id=ALE/Pong-v5 eval.interval=0 max_time_s=<seconds>` twice: with this
machine's /dev/shm, then under a 64 MiB /dev/shm (Docker's default; a tmpfs in a mount namespace of
its own), where the rollout slots do not fit and `runner.shared_memory=auto` puts them in a file in
the temp dir. Steady env steps/s as in benchmarks/pixels.py (the median over the epochs after the
first two). Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import tempfile
from pathlib import Path

from machine import machine_line
from runs import publish, run_train

PONG = "ALE/Pong-v5"
SMALL_SHM = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"']


def filesystem(path: str) -> str:
    """`df`'s type and source of the filesystem that holds `path`."""
    out = subprocess.run(["df", "--output=fstype,source", path], capture_output=True, text=True).stdout.split()
    return f"{out[2]} ({out[3]})" if len(out) >= 4 else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    args = parser.parse_args()
    overrides = ["+env=atari", f"env.id={PONG}", "target_return=null", f"max_time_s={args.seconds}", "eval.interval=0"]
    temp = tempfile.gettempdir()
    lines = [f"## A small /dev/shm: Pong from a file ({datetime.date.today()})", "", machine_line(), "",
             f"`train {' '.join(overrides)}`; the file is in {temp}, on {filesystem(temp)}", "",
             "| /dev/shm | rollout slots and weights in | env steps/s (steady) | learner waiting | epochs |",
             "|---|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, prefix in (("this machine's", []), ("64 MiB", SMALL_SHM)):
            run = run_train(overrides, Path(tmp) / name.split()[0], timeout_s=args.seconds + 300, prefix=prefix)
            log = (Path(tmp) / name.split()[0] / "train.log").read_text()
            where = f"a file in {temp}" if "it is in a file under" in log else "/dev/shm"
            waiting = run.steady("time/wait_actors_frac")
            lines.append(f"| {name} | {where} | {run.steady('sps'):,.0f} | {waiting:.0%} | {len(run.rows)} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
