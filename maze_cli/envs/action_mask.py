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


def choices_without_legal_action(mask: np.ndarray, parts: list[int]) -> np.ndarray:
    """For masks `[..., P]`: which of the choices (`parts`, in order) have no legal action, `[..., len(parts)]`."""
    starts = np.cumsum([0, *parts[:-1]])
    return np.stack([~np.any(mask[..., start:start + size], axis=-1) for start, size in zip(starts, parts)], axis=-1)


def check_legal(mask: np.ndarray, parts: list[int], where: str) -> None:
    """Raise if a mask `[P]` leaves some choice without a legal action (a ValueError naming `where`)."""
    empty = choices_without_legal_action(mask, parts)
    if empty.any():
        part = int(np.argmax(empty))
        start = sum(parts[:part])
        raise ValueError(f"{where}: the action mask allows no action"
                         f"{'' if len(parts) == 1 else f' for entries {start}..{start + parts[part] - 1}'}; an env must leave "
                         f"at least one legal action in every observation it returns")


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


class VectorLegalActionCheck(gym.vector.VectorWrapper):
    """`LegalActionCheck` for a vectorized env (its own implementation, or envpool's): every sub-env's
    mask at every step, but for a sub-env whose episode has just ended (no action follows that
    observation's mask). The error names the sub-env and its episode step."""

    def __init__(self, env: gym.vector.VectorEnv, key: str, name: str):
        super().__init__(env)
        self.key, self.parts, self.name = key, mask_parts(env.single_action_space), name
        # gymnasium's "next step" autoreset: a sub-env that ends returns its last observation, and the next step resets it
        self.next_step = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP) == gym.vector.AutoresetMode.NEXT_STEP
        self.steps = np.zeros(env.num_envs, np.int64)  # steps into each sub-env's episode (0: its reset)
        self.ended = np.zeros(env.num_envs, bool)  # which sub-envs' episodes ended at the last step

    def _check(self, observations: dict, live: np.ndarray) -> None:
        bad = np.flatnonzero(live & choices_without_legal_action(np.asarray(observations[self.key]), self.parts).any(-1))
        if bad.size:
            i = int(bad[0])
            where = "reset" if self.steps[i] == 0 else f"episode step {self.steps[i]}"
            check_legal(np.asarray(observations[self.key][i]), self.parts, f"env {self.name} (vectorized, sub-env {i}), {where}")

    def reset(self, **kwargs):
        observations, info = self.env.reset(**kwargs)
        self.steps[:], self.ended[:] = 0, False
        self._check(observations, np.ones(self.num_envs, bool))
        return observations, info

    def step(self, actions):
        observations, rewards, terminated, truncated, info = self.env.step(actions)
        ended = np.asarray(terminated) | np.asarray(truncated)
        if self.next_step:  # this step reset the sub-envs that ended at the last; those ending now show their last mask
            self.steps = np.where(self.ended, 0, self.steps + 1)
            live = ~ended
        else:  # same-step autoreset: an ending sub-env's observation is already its next episode's first
            self.steps = np.where(ended, 0, self.steps + 1)
            live = np.ones(self.num_envs, bool)
        self.ended = ended
        self._check(observations, live)
        return observations, rewards, terminated, truncated, info


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
