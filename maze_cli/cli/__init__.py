"""Entry points: compose the config, validate it, build the parts, run."""

import atexit
import functools
import gc
import os
import sys
from collections.abc import Callable

SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a program whose reader went away


def leave_quickly() -> None:
    """Make this process skip the interpreter's last garbage collections when it exits.

    At exit CPython collects garbage over every object still alive, and with torch, Hydra and
    gymnasium loaded that walk costs 0.3-0.6 s of every command. Freezing those objects (in an
    exit handler, so only a process that is really ending is affected) skips the walk; the other
    exit handlers, module teardown and the flushing of open files still run as usual.
    """
    atexit.register(gc.freeze)


def quiet_on_closed_pipe(main: Callable[[], None]) -> Callable[[], None]:
    """Wrap a console script so that `train --help | head` ends quietly: when the reader of stdout goes
    away, exit with the shell's code for SIGPIPE instead of a BrokenPipeError traceback. stdout is
    pointed at /dev/null first, so the interpreter's own flush at exit cannot raise it again."""

    @functools.wraps(main)
    def wrapped() -> None:
        try:
            main()
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(SIGPIPE_EXIT)

    return wrapped


def parse_key_values(argv: list[str], schema: type, command: str, help_text: str, example: str):
    """A `key=value` command line (`rollout`, `export-policy`) checked against `schema`: `--help` prints
    `help_text`, anything else not of that form is a ConfigError showing `example`."""
    from omegaconf import OmegaConf

    from maze_cli.config.validation import validate_section
    from maze_cli.errors import ConfigError

    if any(a in ("-h", "--help") for a in argv):
        print(help_text)
        sys.exit(0)
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ConfigError(f"{bad[0]}: arguments are key=value, e.g. {command} {example}")
    return validate_section(schema, OmegaConf.from_dotlist(argv), "", command)


def run_command(command: str, run) -> None:
    """Run a console script's `run()`: an error of maze_cli's is one line on stderr and its exit code; Ctrl-C exits 130."""
    from maze_cli.errors import MazeCliError

    leave_quickly()
    try:
        run()
    except MazeCliError as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


@quiet_on_closed_pipe
def train_main() -> None:
    """Console script `train`. A bare `train --help` is printed from the packaged config alone, in a
    fraction of a second; every other command line goes to maze_cli.cli.train."""
    if sys.argv[1:] in (["--help"], ["-h"]):
        from maze_cli.cli.help_page import train_help

        print(train_help())
        return
    from maze_cli.cli.train import main

    main()
