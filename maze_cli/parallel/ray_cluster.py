"""Ray itself, as maze_cli's actors and learners use it: imported with the extra's message, started or
joined, asked what a cluster lacks, and read for why an actor died."""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any

from maze_cli.errors import RAY_MISSING

log = logging.getLogger("maze_cli")


def import_ray():
    """Ray, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


def shortfall(total: dict[str, float], needs: dict[str, float], n: int) -> dict[str, float]:
    """What `n` of something needing `needs` each would take in all, for each resource the cluster's
    `total` has less of (empty: the cluster holds them all)."""
    return {k: v * n for k, v in needs.items() if v and total.get(k, 0.0) < v * n}


def connect(address: str | None, cpus_needed: float, needed_by: str, log_to_driver: bool = True) -> bool:
    """Start or join Ray unless this process already is part of it (a learner's Ray actor, or a
    `train` that connected for its learners); whether this call connected (and so must shut down).

    address None starts a fresh Ray here ("local"), never an accidental join of a running cluster,
    with enough CPUs for `cpus_needed`: Ray counts CPUs to place actors, it does not pin them; like
    runner=subproc, more actors than cores share the cores rather than wait forever for a core.
    `log_to_driver=False`: the output of Ray's workers stays in Ray's log files (a population's
    members write their own train.log)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    resources: dict[str, Any] = {}
    if address is None:
        cores = os.cpu_count() or 1
        needed = math.ceil(cpus_needed)
        if needed > cores:
            log.info(f"local Ray with {needed} CPUs for {needed_by} on {cores} cores: they share the cores")
        resources["num_cpus"] = max(cores, needed)
    ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING, configure_logging=False,
             log_to_driver=log_to_driver, **resources)
    return True


def kill(ray, handle) -> None:
    """Kill a Ray actor for good (Ray restarts none of ours); one already gone is fine."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        pass


def died_reason(err: Exception) -> str:
    """Ray's account of an actor's death, short: the traceback when its `__init__` raised, else
    which process died and Ray's exit detail (without Ray's general advice around it)."""
    text = str(err).strip()
    if "creation task" in text or not text:
        return text or type(err).__name__
    pid, ip = re.search(r"\bpid: (\d+)", text), re.search(r"\bip: (\S+)", text)
    detail = re.search(r"Worker exit detail: (.*?)(?: Some common causes|$)", text, re.S)
    where = f"process {pid.group(1)} on {ip.group(1)}" if pid and ip else "its process"
    return f"{where} is gone" + (f" ({detail.group(1).strip()})" if detail else f": {text.splitlines()[0]}")
