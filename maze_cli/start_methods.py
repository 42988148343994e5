"""How actor processes are started; kept free of torch so the CLI can warm the forkserver up first."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import tempfile

# What the forkserver imports once, so each actor forks with torch and the actor loop loaded.
_FORKSERVER_PRELOAD = ["__main__", "torch", "gymnasium", "maze_cli.parallel.subproc"]

START_METHODS = ("forkserver", "spawn", "fork")  # what runner.start_method may name; a platform has some of them


def default_start_method() -> str:
    """forkserver where the platform has it (fast, safe with threads), else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def check_start_method(start_method: str | None) -> str:
    """The method actor processes start with: `start_method`, or the default for None; a ValueError
    naming the platform's methods when it lacks this one."""
    method = start_method or default_start_method()
    if method not in mp.get_all_start_methods():
        raise ValueError(f"start_method={method}: not available here; use one of {', '.join(mp.get_all_start_methods())}")
    return method


def warm_up_start_method(start_method: str | None) -> None:
    """Start the forkserver now; it imports torch in its own process while the learner sets up,
    so the first actor starts without that wait. Harmless if called twice or for other methods."""
    method = start_method or default_start_method()
    quiet_resource_tracker()
    current = mp.get_start_method(allow_none=True)
    if current is not None and current not in mp.get_all_start_methods():
        # Inside e.g. a joblib/loky worker the process-wide method is one a child cannot name;
        # children would fail to start, so use a standard one for this process.
        mp.set_start_method(method, force=True)
    if method != "forkserver":
        return
    from multiprocessing import forkserver

    short_socket_dir()
    mp.get_context("forkserver").set_forkserver_preload(_FORKSERVER_PRELOAD)
    forkserver.ensure_running()


_SOCKET_PATH_MAX = 100  # a Unix socket's path holds at most 107 bytes; multiprocessing adds ~30 to its dir


def short_socket_dir() -> None:
    """The forkserver listens on a Unix socket in multiprocessing's temp dir, made under TMPDIR; under a long
    TMPDIR its path passes what a socket's path may hold and the forkserver cannot start ("AF_UNIX path too
    long"). Then multiprocessing gets a dir of its own under /tmp, removed at exit, as it would make itself."""
    from multiprocessing import util

    config = mp.current_process()._config  # where util.get_temp_dir keeps its dir (stable since Python 3.4)
    if config.get("tempdir") is not None or len(tempfile.gettempdir()) + 30 <= _SOCKET_PATH_MAX or not os.path.isdir("/tmp"):
        return
    directory = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    util.Finalize(None, shutil.rmtree, args=[directory], exitpriority=-100)
    config["tempdir"] = directory


def quiet_resource_tracker() -> None:
    """A child process killed outright (SIGKILL, out of memory) cannot unregister its semaphores; the
    resource tracker frees them at the end and warns about each, below the one line that says what
    happened. The tracker takes this process's -W options when it starts (first use or forkserver)."""
    option = "ignore:resource_tracker:UserWarning"
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)
