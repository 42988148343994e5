"""Memory of a process tree: summed PSS (proportional set size, so shared pages count once)."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
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


def tree_pss_mib(pid: int) -> tuple[int, float]:
    """(number of processes, summed PSS in MiB) of the tree under `pid`."""
    pids = descendants(pid)
    return len(pids), sum(pss_kib(p) for p in pids) / 1024


class PeakMemory:
    """Samples a process tree's summed PSS in a thread until stopped; keeps the peak.

    Every `interval_s` for the first `fine_s` seconds (start-up, where processes appear), then every
    `coarse_s`: reading smaps_rollup walks a process's page tables in the kernel, and at 4 samples a
    second of a learner and its actors the sampler itself took a tenth of a core from the run it measured."""

    def __init__(self, pid: int, interval_s: float = 0.25, fine_s: float = 15.0, coarse_s: float = 2.0):
        self.pid, self.interval_s, self.fine_s, self.coarse_s = pid, interval_s, fine_s, coarse_s
        self.peak_mib, self.peak_processes = 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            n, mib = tree_pss_mib(self.pid)
            if mib > self.peak_mib:
                self.peak_mib, self.peak_processes = mib, n
            self._stop.wait(self.interval_s if time.monotonic() - start < self.fine_s else self.coarse_s)
