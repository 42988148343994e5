"""CartPole that fails on a schedule, for the soak run: raises in `step`, or SIGKILLs its process.

Each process that steps these envs fails once, at a random moment about `every_s` seconds after it
started (uniform over 0.5x-1.5x); a restarted actor is a new process with a new schedule. In the
learner's own process (evaluation) it only ever raises: a SIGKILL there would be the learner's death.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import gymnasium as gym
import numpy as np

_FAULT_AT: dict[int, float] = {}  # pid -> monotonic time of this process's fault


class FlakyCartPole(gym.Wrapper):
    """CartPole-v1 whose process fails once, `every_s` seconds (+-50%) after its first env was built."""

    def __init__(self, every_s: float = 180.0):
        super().__init__(gym.make("CartPole-v1"))
        rng = np.random.default_rng()  # OS entropy: every process its own schedule
        self.kill = rng.random() < 0.5 and multiprocessing.parent_process() is not None
        _FAULT_AT.setdefault(os.getpid(), time.monotonic() + every_s * rng.uniform(0.5, 1.5))

    def step(self, action):
        fault_at = _FAULT_AT.get(os.getpid())
        if fault_at is not None and time.monotonic() >= fault_at:
            del _FAULT_AT[os.getpid()]
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected soak failure")
        return self.env.step(action)
