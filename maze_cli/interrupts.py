"""Ctrl-C and SIGTERM held back for the length of a write that must land whole."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM are recorded instead of raised; on the way out the handlers that
    were there come back and each recorded signal is raised again, so it takes effect just after.

    An epoch's row goes to several writers one after the other: an interrupt between two of them
    would leave the epoch in stats.jsonl and not in TensorBoard. Signal handlers can only be set
    from the main thread; elsewhere (where no handler runs anyway) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (actors stopped, last.pt written) but exiting with 143."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def raise_terminated_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread, so that a run it stops ends as on Ctrl-C."""
    signal.signal(signal.SIGTERM, _raise_terminated)
