"""Entry points: compose the config, validate it, build the parts, run."""

import atexit
import gc


def leave_quickly() -> None:
    """Make this process skip the interpreter's last garbage collections when it exits.

    At exit CPython collects garbage over every object still alive, and with torch, Hydra and
    gymnasium loaded that walk costs 0.3-0.6 s of every command. Freezing those objects (in an
    exit handler, so only a process that is really ending is affected) skips the walk; the other
    exit handlers, module teardown and the flushing of open files still run as usual.
    """
    atexit.register(gc.freeze)


def train_main() -> None:
    """Console script `train`. A bare `train --help` is printed from the packaged config alone, in a
    fraction of a second; every other command line goes to maze_cli.cli.train."""
    import sys

    if sys.argv[1:] in (["--help"], ["-h"]):
        from maze_cli.cli.help_page import train_help

        print(train_help())
        return
    from maze_cli.cli.train import main

    main()
