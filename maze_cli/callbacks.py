"""Callbacks: a user's code at the start of training, at every epoch's end, and at the end.

`callbacks.<name>._target_=my_pkg.MyCallback` (or a YAML file `callbacks/<name>.yaml` in
`--config-dir`, chosen with `+callbacks=<name>`) builds the class with its other keys as arguments;
any number of them, called in the order of their names. Each hook is optional:

- `on_train_start(run_dir, config)`: once, before the first epoch (`config`: the run's resolved config);
- `on_epoch_end(epoch, stats) -> bool | None`: after each epoch's evaluation, before its row is
  written, so keys it adds to `stats` are written with the row; True stops the run cleanly after
  this epoch (stop reason `callback <name>`);
- `on_train_end(result)`: once training has stopped (`result`: stop_reason, env_steps, time_s, objective).

They run in the learner's process (learner 0 with several learners). Callbacks are config, never
pickled into a checkpoint: a resumed run builds them again from its saved config. A hook that raises
stops the run with one line naming the callback; `last.pt` is written and the actors stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from maze_cli.errors import ConfigError, MazeCliError, first_line

HOOKS = ("on_train_start", "on_epoch_end", "on_train_end")


class Callback(Protocol):
    """What a callback may define (every hook is optional)."""

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None: ...

    def on_epoch_end(self, epoch: int, stats: dict[str, Any]) -> bool | None: ...

    def on_train_end(self, result: dict[str, Any]) -> None: ...


class CallbackFailed(MazeCliError, RuntimeError):
    """A callback's hook raised: the run stops (with last.pt written) and says which callback."""


class Callbacks:
    """The run's callbacks, built from `callbacks.<name>` configs, and their hooks called by name."""

    def __init__(self, configs: dict[str, dict[str, Any]]):
        from hydra.utils import instantiate

        self.callbacks: dict[str, Any] = {}
        for name in sorted(configs):
            try:
                self.callbacks[name] = instantiate(configs[name], _convert_="all")
            except Exception as err:  # noqa: BLE001 - the user's constructor: its message, in one line
                cause = err.__cause__ or err
                raise ConfigError(f"callbacks.{name}: building {configs[name]['_target_']} failed "
                                  f"({type(cause).__name__}: {first_line(cause)})") from None

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def _call(self, name: str, hook: str, *args: Any) -> Any:
        method = getattr(self.callbacks[name], hook, None)
        if method is None:
            return None
        try:
            return method(*args)
        except Exception as err:  # noqa: BLE001 - any error of the user's code ends the run, named
            target = f"{type(self.callbacks[name]).__module__}.{type(self.callbacks[name]).__qualname__}"
            raise CallbackFailed(f"callbacks.{name} ({target}) raised in {hook}: {type(err).__name__}: {first_line(err)}") from err

    def train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        for name in self.callbacks:
            self._call(name, "on_train_start", run_dir, config)

    def epoch_end(self, epoch: int, stats: dict[str, Any]) -> str | None:
        """Every callback's `on_epoch_end`; the name of the first that asked to stop, or None."""
        stop = None
        for name in self.callbacks:
            if self._call(name, "on_epoch_end", epoch, stats) is True and stop is None:
                stop = name
        return stop

    def train_end(self, result: dict[str, Any]) -> None:
        for name in self.callbacks:
            self._call(name, "on_train_end", result)
