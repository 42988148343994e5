"""CartPole that fails now and then, for the soak run: raises in step or SIGKILLs its process."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np


class FlakyCartPole(gym.Wrapper):
    """Each step fails with probability `p`: half the time an exception, half the time SIGKILL."""

    def __init__(self, p: float = 1e-7, seed: int | None = None):
        super().__init__(gym.make("CartPole-v1"))
        self.p = p
        # Fresh OS entropy per instance: envs of one actor must not fail at the same step.
        self.rng = np.random.default_rng(seed)

    def step(self, action):
        if self.rng.random() < self.p:
            if self.rng.random() < 0.5:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected soak failure")
        return self.env.step(action)
