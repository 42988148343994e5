"""The previous action and reward as observations (`policy.core_inputs`), as the IMPALA paper feeds
its LSTM.

They are added by a wrapper on every env the factory builds, so actors, records, the learner's
unroll, evaluation and `rollout` see them without knowing: to all of them they are two more
observation keys. At an episode's start both are zeros (no action taken yet).
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from maze_cli.config.schema import CORE_INPUTS
from maze_cli.envs.spaces import OBS_KEY
from maze_cli.errors import ConfigError


def check_core_inputs(inputs: Sequence[str]) -> tuple[str, ...]:
    """The configured inputs, checked: known names, the observation among them."""
    inputs = tuple(inputs)
    for name in inputs:
        if name not in CORE_INPUTS:
            raise ConfigError(f"policy.core_inputs: '{name}' is not an input; use some of {', '.join(CORE_INPUTS)}")
    if "obs" not in inputs:
        raise ConfigError(f"policy.core_inputs={list(inputs)}: the observation must be one of them (start with obs)")
    return inputs


def adds_inputs(inputs: Sequence[str] | None) -> bool:
    return bool(inputs) and any(name != "obs" for name in check_core_inputs(inputs))


class PreviousActionReward(gym.Wrapper):
    """Observations become a Dict: the env's observation (its own keys if it is a Dict, else `obs`),
    `prev_action` (one-hot for Discrete actions, the action itself for Box) and `prev_reward`
    (clipped to +-`reward_clip` where set, as the learner sees rewards)."""

    def __init__(self, env: gym.Env, inputs: Sequence[str], reward_clip: float | None = None):
        super().__init__(env)
        inputs = check_core_inputs(inputs)
        self.prev_action = "prev_action" in inputs
        self.prev_reward = "prev_reward" in inputs
        self.reward_clip = reward_clip
        self._dict_observations = isinstance(env.observation_space, gym.spaces.Dict)
        spaces: dict[str, gym.Space] = dict(env.observation_space.spaces) if self._dict_observations else {OBS_KEY: env.observation_space}
        added: dict[str, gym.Space] = {}
        if self.prev_action:
            added["prev_action"] = self._action_input_space(env.action_space)
        if self.prev_reward:
            added["prev_reward"] = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        clash = sorted(set(spaces) & set(added))
        if clash:
            raise ConfigError(f"policy.core_inputs: the env's observation already has a key '{clash[0]}'")
        self.observation_space = gym.spaces.Dict({**spaces, **added})
        self._zeros = {k: np.zeros(s.shape, s.dtype) for k, s in added.items()}

    @staticmethod
    def _action_input_space(action_space: gym.Space) -> gym.spaces.Box:
        if isinstance(action_space, gym.spaces.Discrete):
            return gym.spaces.Box(0.0, 1.0, (int(action_space.n),), np.float32)
        if isinstance(action_space, gym.spaces.Box):
            return gym.spaces.Box(-np.inf, np.inf, action_space.shape, np.float32)
        raise ConfigError(f"policy.core_inputs=prev_action: supported for Discrete and Box actions, not {action_space}")

    def _observation(self, observation: Any, added: dict[str, np.ndarray]) -> dict[str, Any]:
        own = dict(observation) if self._dict_observations else {OBS_KEY: observation}
        return {**own, **added}

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict]:
        observation, info = self.env.reset(**kwargs)
        return self._observation(observation, {k: v.copy() for k, v in self._zeros.items()}), info

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        added: dict[str, np.ndarray] = {}
        if self.prev_action:
            if isinstance(self.env.action_space, gym.spaces.Discrete):
                added["prev_action"] = np.zeros(self._zeros["prev_action"].shape, np.float32)
                added["prev_action"][int(action) - int(self.env.action_space.start)] = 1.0
            else:
                added["prev_action"] = np.asarray(action, np.float32).reshape(self._zeros["prev_action"].shape)
        if self.prev_reward:
            clipped = float(reward) if self.reward_clip is None else float(np.clip(reward, -self.reward_clip, self.reward_clip))
            added["prev_reward"] = np.array([clipped], np.float32)
        return self._observation(observation, added), reward, terminated, truncated, info
