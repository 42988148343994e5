"""A small env whose actions are legal only some of the time: what action masks are for (`+env=masked_choice`).

Each step some of the `n_actions` actions are legal (each with probability `p_legal`, at least one);
the observation is `{"obs": the legal actions as 0/1 floats, "action_mask": the same as int8}`. A legal
action `a` pays `a / (n_actions - 1)`, so the best play takes the highest legal action every step; an
illegal one costs `illegal_penalty` and ends the episode. `info["illegal"]` is 1 on such a step
(`env.info_stats={illegal: sum}` counts them). With masks a policy never takes one; without, it must
learn the rule from the observation while every mistake ends its episode.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class MaskedChoice(gym.Env):
    def __init__(self, n_actions: int = 8, p_legal: float = 0.3, episode_steps: int = 20, illegal_penalty: float = 1.0):
        if n_actions < 2 or not 0 < p_legal <= 1 or episode_steps < 1:
            raise ValueError("MaskedChoice needs n_actions >= 2, 0 < p_legal <= 1 and episode_steps >= 1")
        self.n_actions, self.p_legal, self.episode_steps, self.illegal_penalty = n_actions, p_legal, episode_steps, illegal_penalty
        self.action_space = gym.spaces.Discrete(n_actions)
        self.observation_space = gym.spaces.Dict({
            "obs": gym.spaces.Box(0.0, 1.0, (n_actions,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (n_actions,), np.int8),
        })
        self._legal = np.ones(n_actions, np.int8)
        self._t = 0

    def _draw(self) -> dict[str, np.ndarray]:
        legal = (self.np_random.random(self.n_actions) < self.p_legal).astype(np.int8)
        legal[self.np_random.integers(self.n_actions)] = 1  # at least one
        self._legal = legal
        return {"obs": legal.astype(np.float32), "action_mask": legal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {"illegal": 0}

    def step(self, action):
        action = int(action)
        self._t += 1
        if not self._legal[action]:
            observation = {"obs": np.zeros(self.n_actions, np.float32), "action_mask": np.zeros(self.n_actions, np.int8)}
            return observation, -self.illegal_penalty, True, False, {"illegal": 1}
        reward = action / (self.n_actions - 1)
        return self._draw(), reward, False, self._t >= self.episode_steps, {"illegal": 0}

    def best_action(self) -> int:
        """The highest legal action: the optimal play (benchmarks compare against it)."""
        return int(np.flatnonzero(self._legal)[-1])
