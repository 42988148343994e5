"""A user's own components, as a user would write them outside maze_cli (used by tests/test_components.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
