"""Where epoch stats go: the console table, `stats.jsonl` and TensorBoard, all from one dict."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from maze_cli.disk import writing

log = logging.getLogger("maze_cli")


class StatsWriter(Protocol):
    def write(self, stats: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _json_value(value: Any) -> Any:
    """A stat as JSON holds it: a number that is NaN or infinite (a value function's explained variance where
    the returns do not vary) as null, since JSON has no NaN; strings and lists as they are."""
    if isinstance(value, (str, bool, int, list, dict)) or value is None:
        return value
    if isinstance(value, np.integer):
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else None


def parse_row(line: str) -> dict[str, Any] | None:
    """One row of stats.jsonl; None for a blank line or one a crash cut short (power loss, a kill
    in the middle of a write), which every reader skips instead of failing on."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every whole row of a stats.jsonl file (none if it does not exist)."""
    if not path.is_file():
        return []
    return [row for row in map(parse_row, path.read_text(encoding="utf-8").splitlines()) if row is not None]


class JsonlWriter:
    """One JSON object per epoch, flushed at once, so a crash loses at most the current epoch."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "a", encoding="utf-8")

    def rewind(self, epoch: int, env_steps: int) -> int:
        """On resume: drop the rows after the checkpoint's `epoch` (a run killed between checkpoints
        trains those epochs again); returns how many were dropped. The file is rewritten atomically."""
        self.file.close()
        text = self.path.read_text(encoding="utf-8")
        rows = [(line, parse_row(line)) for line in text.splitlines()]
        kept = [line + "\n" for line, row in rows if row is not None and row.get("epoch", 0) <= epoch]
        if "".join(kept) != text:  # rows after the checkpoint, or a line a crash cut short
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            tmp.replace(self.path)
        self.file = open(self.path, "a", encoding="utf-8")
        return sum(1 for _, row in rows if row is not None) - len(kept)

    def write(self, stats: dict[str, Any]) -> None:
        with writing(self.path):
            self.file.write(json.dumps({key: _json_value(value) for key, value in stats.items()}, allow_nan=False) + "\n")
            self.file.flush()

    def close(self) -> None:
        with writing(self.path):
            self.file.close()


class TensorBoardWriter:
    """Every numeric stat as a scalar at step `env_steps`."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def rewind(self, epoch: int, env_steps: int) -> None:
        """On resume: TensorBoard hides what was written after the checkpoint's step (its purge_step)."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=env_steps + 1)

    def write(self, stats: dict[str, Any]) -> None:
        step = int(stats["env_steps"])
        for key, value in stats.items():
            if key != "env_steps" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, global_step=step)
        with writing(self.log_dir):
            self.writer.flush()

    def add_video(self, tag: str, frames: list, step: int) -> None:
        """An animated GIF in TensorBoard's images tab (what SummaryWriter.add_video writes, without moviepy)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        from maze_cli.video import gif_bytes

        height, width, channels = frames[0].shape
        image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=gif_bytes(frames))
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), global_step=step)
        with writing(self.log_dir):
            self.writer.flush()

    def close(self) -> None:
        with writing(self.log_dir):
            self.writer.close()


class WritesTo:
    """A writer whose library writes files of its own under `path` (a tracker's local store): a
    full disk there comes out as `DiskFull`, as for the run's own files."""

    def __init__(self, writer: StatsWriter, path: Path):
        self.writer, self.path = writer, path

    def write(self, stats: dict[str, Any]) -> None:
        with writing(self.path):
            self.writer.write(stats)

    def close(self) -> None:
        with writing(self.path):
            self.writer.close()


# (stat key, column title, format) of the console table; a key "a|b" shows the first one present.
_COLUMNS = [
    ("epoch", "epoch", "{:>5d}"),
    ("env_steps", "env steps", "{:>10,d}"),
    ("time_s", "time", "{:>6.1f}s"),
    ("sps", "steps/s", "{:>8,.0f}"),
    ("train/return_mean", "return", "{:>8.1f}"),
    ("train/return_window_mean", "ret(win)", "{:>8.1f}"),
    ("train/episode_length_mean", "ep len", "{:>7.1f}"),
    ("eval/return_mean", "eval", "{:>8.1f}"),
    ("learner/loss|learner/critic_loss|learner/td_loss", "loss", "{:>8.3f}"),
    ("learner/entropy", "entropy", "{:>7.3f}"),
    ("policy_lag_mean", "lag", "{:>5.2f}"),
    ("time/wait_actors_frac", "wait", "{:>5.0%}"),
]

_TEAM_COLUMN = ("env/team_return", "team", "{:>8.1f}")


class ConsoleTable:
    """A fixed-width row per epoch, at most one every `min_interval_s` (short epochs would flood the
    terminal; stats.jsonl and TensorBoard keep every epoch), the header repeated every
    `header_every` rows. The last epoch is always shown, at `close()` if it was held back."""

    def __init__(self, header_every: int = 20, min_interval_s: float = 1.0, team: bool = False):
        self.header_every = header_every
        # a multi-agent env's `return` is an agent's: `team` beside it is the team's (env/team_return)
        self.columns = _COLUMNS[:5] + [_TEAM_COLUMN] + _COLUMNS[5:] if team else _COLUMNS
        self.min_interval_s = min_interval_s
        self.rows = 0
        self._last_shown = -math.inf
        self._held: dict[str, Any] | None = None

    def _cell(self, stats: dict[str, Any], key: str, title: str, fmt: str) -> str:
        width = max(len(title), len(fmt.format(0) if "d" in fmt else fmt.format(0.0)))
        value = next((stats[k] for k in key.split("|") if k in stats), None)
        text = "-" if value is None else fmt.format(value)
        return text.rjust(width)

    def write(self, stats: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last_shown < self.min_interval_s:
            self._held = stats
            return
        self._show(stats)
        self._last_shown = now

    def _show(self, stats: dict[str, Any]) -> None:
        if self.rows % self.header_every == 0:
            widths = [max(len(t), len(f.format(0) if "d" in f else f.format(0.0))) for _, t, f in self.columns]
            log.info(" ".join(t.rjust(w) for (_, t, _), w in zip(self.columns, widths)))
        log.info(" ".join(self._cell(stats, k, t, f) for k, t, f in self.columns))
        self.rows += 1
        self._held = None

    def flush(self) -> None:
        """Show the row held back, if any (the trainer calls this before its closing line)."""
        if self._held is not None:
            self._show(self._held)

    def close(self) -> None:
        self.flush()
