"""What one step of a batch of envs returns, whichever kind of batch (`maze_cli.envs.batch`) steps them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class BatchStep:
    """What one step of a batch of `n` envs returns."""

    observations: Any  # the next observation of each env (the first of a new episode after an end)
    rewards: np.ndarray  # [n] float32
    terminated: np.ndarray  # [n] bool
    truncated: np.ndarray  # [n] bool, never together with terminated
    final_observations: dict[int, Any]  # env -> last observation of its truncated episode
    autoreset: np.ndarray  # [n] bool: this step only reset the env (no transition)
    # env -> its info, for the envs whose info may hold a followed key (an ended episode's is its last step's)
    infos: dict[int, Any] = field(default_factory=dict)
