"""Errors a user can act on: printed as one line, never as a traceback (torch-free on purpose).

Every error maze_cli raises for bad input or a failed run derives from `MazeCliError`; the
command-line entry points recognise them by type and exit with the error's `exit_code`.
"""

from __future__ import annotations

RAY_MISSING = "runner=ray needs Ray, an optional extra: pip install 'maze_cli[ray]' (or pip install ray)"


def first_line(message: object) -> str:
    """The first non-blank line of an error or message, stripped ("" if there is none): what a
    one-line report quotes of a longer message."""
    return next((line.strip() for line in str(message).splitlines() if line.strip()), "")


class MazeCliError(Exception):
    """An error whose message is complete in one line (or a few, for an actor's traceback)."""

    exit_code = 1


class ConfigError(MazeCliError, ValueError):
    """Input that cannot run (a config value, a file, an env); the message names the key and the fix."""

    exit_code = 2


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: unreadable, not maze_cli's, from another version, or untrusted."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint file that is cut short or garbled (a crash or a full disk while it was written)."""


class EnvConfigError(ConfigError):
    """An env config that cannot produce an env."""


class UnsupportedSpaceError(ConfigError):
    """A space maze_cli cannot map to tensors."""


class TrainingDiverged(MazeCliError, RuntimeError):
    """A NaN or infinite loss stopped the run; the message names the epoch and the last good checkpoint."""


class NonFiniteLoss(FloatingPointError):
    """A loss became NaN or infinite: the weights are no longer worth training or saving."""

    def __init__(self, name: str, value: float):
        self.name, self.value = name, value
        super().__init__(f"{name} became {value}")
