"""A user's own components, as a user would write them outside maze_cli (used by tests/test_components.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import torch
from torch import nn

from maze_cli.algorithms.impala import Impala


class ResidualMlp(nn.Module):
    """A policy network as docs/components.md shows it: a plain torch module with an `out_dim`, whose
    forward maps the observation dict to features."""

    def __init__(self, observation_space: gym.Space, width: int = 32):
        super().__init__()
        self.inp = nn.Linear(math.prod(observation_space.shape), width)
        self.block = nn.Sequential(nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.out_dim = width

    def forward(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.inp(observations["obs"].flatten(start_dim=-1).float())
        return x + self.block(x)


@dataclass
class LoudImpala(Impala):
    """A user's algorithm: IMPALA that says it was used (a marker file) and takes one key of its own."""

    marker: str = ""

    def build(self, parts):
        with open(self.marker, "w") as f:
            f.write(f"lr={self.lr} network={parts.network['_target_']}")
        return super().build(parts)


class CsvWriter:
    """A tracker of a user's own (`+logger=csv` from --config-dir): every epoch's return to a CSV file."""

    def __init__(self, run_dir, config: dict, filename: str = "returns.csv"):
        self.file = open(run_dir / filename, "w")
        self.file.write(f"# seed {config['seed']}\nepoch,return\n")

    def write(self, stats: dict) -> None:
        self.file.write(f"{stats['epoch']},{stats.get('train/return_mean', '')}\n")

    def close(self) -> None:
        self.file.close()


class NeedsMissingPackageWriter(CsvWriter):
    """A tracker that names a package which is not installed."""

    requires = ("no_such_tracker_package", "nosuch")


class StopAtEpoch:
    """A callback: adds `cb/epoch` to every row, stops the run at epoch `stop_at`, and notes its
    start and end hooks in `out_dir` (start.json, end.json)."""

    def __init__(self, out_dir: str, stop_at: int = 2):
        self.out_dir, self.stop_at = Path(out_dir), stop_at

    def on_train_start(self, run_dir, config):
        (self.out_dir / "start.json").write_text(json.dumps({"run_dir": str(run_dir), "env": config["env"]}))

    def on_epoch_end(self, epoch, stats):
        stats["cb/epoch"] = epoch
        return epoch >= self.stop_at

    def on_train_end(self, result):
        (self.out_dir / "end.json").write_text(json.dumps(result))


class RaisingCallback:
    """Fault injection: a callback whose `on_epoch_end` raises at epoch `fail_at`."""

    def __init__(self, fail_at: int = 2):
        self.fail_at = fail_at

    def on_epoch_end(self, epoch, stats):
        if epoch >= self.fail_at:
            raise RuntimeError("injected failure in a callback")


class NoHooks:
    """Not a callback: none of the hooks."""
