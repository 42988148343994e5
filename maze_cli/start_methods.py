"""How actor processes are started; kept free of torch so the CLI can warm the forkserver up first."""

from __future__ import annotations

import multiprocessing as mp

# What the forkserver imports once, so each actor forks with torch and the actor loop loaded.
_FORKSERVER_PRELOAD = ["__main__", "torch", "gymnasium", "maze_cli.parallel.subproc"]


def default_start_method() -> str:
    """forkserver where the platform has it (fast, safe with threads), else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def warm_up_start_method(start_method: str | None) -> None:
    """Start the forkserver now; it imports torch in its own process while the learner sets up,
    so the first actor starts without that wait. Harmless if called twice or for other methods."""
    if (start_method or default_start_method()) != "forkserver":
        return
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(_FORKSERVER_PRELOAD)
    forkserver.ensure_running()
