"""Action masks: an observation key that says which discrete actions are legal now.

The mask travels with the observation (`env.action_mask_key`), so actors, the learner, evaluation and
`rollout` all see the one the env gave at that step. A policy applies it to its logits (or Q-values)
before any use of the distribution: an illegal entry is set to -1e9 (or its dtype's lowest value, if
higher), so softmax gives it probability 0 in sampling and log-probs, `p log p` stays 0 in the entropy
and SAC's `p (alpha log p - Q)` (a finite log p, never `0 * -inf`), argmax never picks it, and no
gradient reaches it.

A mask has one entry per logit: `n` for `Discrete(n)`, `sum(nvec)` for `MultiDiscrete(nvec)`
(each part's entries in order), with nonzero for legal.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from maze_cli.errors import ConfigError

MASK_KEY = "action_mask"  # PettingZoo's name, and what `env.action_mask_key: null` looks for
FROM_INFO = "info"  # `env.action_mask_key=info`: the env gives its mask as info["action_mask"]


def mask_size(action_space: gym.Space) -> int | None:
    """Entries a mask of this action space has; None where actions cannot be masked (Box)."""
    if isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return sum(mask_parts(action_space))
    return None


def mask_parts(action_space: gym.Space) -> list[int]:
    """The sizes of the independent choices a mask covers (one for Discrete)."""
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return [int(n) for n in action_space.nvec.flatten()]
    return [int(action_space.n)]


def find_mask_key(observation_space: gym.Space, action_space: gym.Space, key: str | bool | None) -> str | None:
    """The observation key that holds the action mask, checked against the spaces.

    `key` None: `action_mask` where a Dict observation has it (PettingZoo's layout), else no mask;
    False: no mask (the key, if any, stays an observation like the others). A key named that does not
    exist, or a mask whose shape or dtype cannot be one for this action space, is a ConfigError naming
    the key and the fix."""
    if key is False:
        return None
    if key is True or not (key is None or isinstance(key, str)):
        raise ConfigError(f"env.action_mask_key={key}: give the observation key of the mask, null (found by itself) "
                          f"or false (no mask)")
    keys = list(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else []
    if key == FROM_INFO:  # moved into the observations by InfoActionMask
        key = MASK_KEY
    if key is None:
        if MASK_KEY not in keys:
            return None
        key = MASK_KEY
    elif key not in keys:
        found = f"its keys are {keys}" if keys else f"its observations are a {type(observation_space).__name__}, not a Dict"
        raise ConfigError(f"env.action_mask_key={key}: the env's observations have no key '{key}' ({found}); "
                          f"name the key that holds the mask, or set env.action_mask_key=null")
    size = mask_size(action_space)
    if size is None:
        raise ConfigError(f"env.action_mask_key={key}: actions of {action_space} cannot be masked (only Discrete and "
                          f"MultiDiscrete); set env.action_mask_key=null, or drop the key from the observations")
    sub = observation_space[key]
    shape = tuple(getattr(sub, "shape", None) or ())
    if isinstance(sub, gym.spaces.MultiBinary):
        ok = shape == (size,)
    else:
        ok = isinstance(sub, gym.spaces.Box) and shape == (size,) and (
            np.issubdtype(sub.dtype, np.integer) or np.issubdtype(sub.dtype, np.bool_) or
            (np.all(sub.low >= 0) and np.all(sub.high <= 1)))
    if not ok:
        raise ConfigError(f"env.action_mask_key={key}: the mask's space is {sub}, but a mask for {action_space} is a "
                          f"MultiBinary({size}) or a Box of shape ({size},) with values 0 (illegal) and 1 (legal)")
    return key


ILLEGAL = -1e9  # what a forbidden logit becomes: exp() of it is 0, and it stays finite when scaled


def apply_mask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`logits [..., P]` with the entries where `mask [..., P]` is 0 set to ILLEGAL."""
    return logits.masked_fill(mask == 0, max(ILLEGAL, torch.finfo(logits.dtype).min))


def check_legal(mask: np.ndarray, parts: list[int], where: str) -> None:
    """Raise if a mask leaves some choice without a legal action (a ValueError naming `where`)."""
    start = 0
    for size in parts:
        if not np.any(mask[..., start:start + size]):
            raise ValueError(f"{where}: the action mask allows no action"
                             f"{'' if len(parts) == 1 else f' for entries {start}..{start + size - 1}'}; an env must leave "
                             f"at least one legal action in every observation it returns")
        start += size


class LegalActionCheck(gym.Wrapper):
    """Checks every observation an episode goes on from: a mask that allows no action is an error that
    names the episode's step, where the actor would otherwise pick a forbidden action unseen."""

    def __init__(self, env: gym.Env, key: str):
        super().__init__(env)
        self.key, self.parts, self.steps = key, mask_parts(env.action_space), 0
        self.name = env.spec.id if env.spec else str(env)

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        self.steps = 0
        check_legal(np.asarray(observation[self.key]), self.parts, f"env {self.name}, reset")
        return observation, info

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if not (terminated or truncated):
            check_legal(np.asarray(observation[self.key]), self.parts, f"env {self.name}, episode step {self.steps}")
        return observation, reward, terminated, truncated, info


class InfoActionMask(gym.Wrapper):
    """For an env that gives its mask as `info["action_mask"]`: the mask moved into the observations
    under `action_mask`, where every policy finds it (a Dict observation gains the key; any other
    becomes `{"obs": ..., "action_mask": ...}`). A step that ends the episode may leave the mask out
    (then all actions count as legal there); any other step without one is an error naming it."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        size = mask_size(env.action_space)
        if size is None:
            raise ConfigError(f"env.action_mask_key={FROM_INFO}: actions of {env.action_space} cannot be masked (only "
                              f"Discrete and MultiDiscrete); set env.action_mask_key=false")
        self.size = size
        mask_space = gym.spaces.Box(0, 1, (size,), np.int8)
        space = env.observation_space
        self.is_dict = isinstance(space, gym.spaces.Dict)
        self.observation_space = gym.spaces.Dict({**(space.spaces if self.is_dict else {"obs": space}), MASK_KEY: mask_space})
        self.steps = 0

    def _observation(self, observation: Any, info: dict, ends: bool) -> dict:
        mask = info.get(MASK_KEY)
        if mask is None:
            if not ends:
                raise ValueError(f"env.action_mask_key={FROM_INFO}: the env's info has no '{MASK_KEY}' at "
                                 f"{'reset' if self.steps == 0 else f'episode step {self.steps}'}; give it at every step")
            mask = np.ones(self.size, np.int8)
        mask = np.asarray(mask).astype(np.int8).reshape(self.size)
        return {**(observation if self.is_dict else {"obs": observation}), MASK_KEY: mask}

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        self.steps = 0
        return self._observation(observation, info, ends=False), info

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return self._observation(observation, info, ends=terminated or truncated), reward, terminated, truncated, info


def gives_mask_in_info(env: gym.Env) -> bool:
    """Whether a freshly built env gives its mask in `info` (reset once) and not in its observations."""
    space = env.observation_space
    if mask_size(env.action_space) is None or (isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces):
        return False
    _, info = env.reset(seed=0)
    return MASK_KEY in info
