"""Map gymnasium spaces to tensors and back.

Observations: Box, Discrete, and Dict of those (nested keys joined with '/'); a plain space is
stored under the key 'obs'. Actions: Discrete, MultiDiscrete and Box.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from maze_cli.records import TensorSpec

OBS_KEY = "obs"


class UnsupportedSpaceError(ValueError):
    """A space maze_cli cannot map to tensors."""


def _numpy_to_torch_dtype(dtype: np.dtype) -> torch.dtype:
    if np.issubdtype(dtype, np.floating):
        return torch.float32
    if np.issubdtype(dtype, np.bool_):
        return torch.bool
    return torch.int64


def _flatten_spaces(space: gym.Space, prefix: str = "") -> dict[str, gym.Space]:
    if isinstance(space, gym.spaces.Dict):
        flat: dict[str, gym.Space] = {}
        for key, sub in space.spaces.items():
            flat.update(_flatten_spaces(sub, f"{prefix}{key}/"))
        return flat
    return {prefix.rstrip("/") or OBS_KEY: space}


def observation_specs(space: gym.Space) -> dict[str, TensorSpec]:
    """One tensor spec per (flattened) observation key."""
    specs = {}
    for key, sub in _flatten_spaces(space).items():
        if isinstance(sub, gym.spaces.Box):
            specs[key] = TensorSpec(tuple(sub.shape), torch.float32)
        elif isinstance(sub, gym.spaces.Discrete):
            specs[key] = TensorSpec((), torch.int64)
        elif isinstance(sub, gym.spaces.MultiBinary):
            specs[key] = TensorSpec(tuple(np.atleast_1d(sub.n)), torch.float32)
        else:
            raise UnsupportedSpaceError(
                f"observation space {sub!r} at key '{key}' is not supported; "
                "use Box, Discrete, MultiBinary or a Dict of those"
            )
    return specs


def describe_space(space: gym.Space) -> str:
    """A short human description, e.g. 'Box(4,) float32' or 'Dict(pos: Box(2,) float32, goal: Discrete(5))'."""
    if isinstance(space, gym.spaces.Dict):
        return "Dict(" + ", ".join(f"{k}: {describe_space(s)}" for k, s in space.spaces.items()) + ")"
    if isinstance(space, gym.spaces.Box):
        return f"Box{tuple(space.shape)} {space.dtype}"
    return repr(space)


def action_spec(space: gym.Space) -> TensorSpec:
    """The tensor spec of one action: a scalar index, or a flat vector (reshaped in `action_to_env`)."""
    if isinstance(space, gym.spaces.Discrete):
        return TensorSpec((), torch.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return TensorSpec((int(space.nvec.size),), torch.int64)
    if isinstance(space, gym.spaces.Box):
        return TensorSpec((int(np.prod(space.shape)),), torch.float32)
    raise UnsupportedSpaceError(
        f"action space {space!r} is not supported; use Discrete, MultiDiscrete or Box"
    )


def action_to_env(space: gym.Space, action: np.ndarray) -> Any:
    """Turn one row of the action tensor into what `env.step` expects."""
    if isinstance(space, gym.spaces.Discrete):
        return int(action) + int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return action.reshape(space.nvec.shape).astype(space.dtype) + space.start
    return np.clip(action.reshape(space.shape), space.low, space.high).astype(space.dtype)


class ObservationWriter:
    """Writes a list of raw observations (one per env) into preallocated `[B, ...]` tensors.

    Built once per actor so the per-step work is a stack and a copy per key, nothing more.
    """

    def __init__(self, space: gym.Space):
        self.space = space
        self.keys = list(observation_specs(space))
        self.is_dict = isinstance(space, gym.spaces.Dict)
        self.offsets = {
            key: int(sub.start) for key, sub in _flatten_spaces(space).items() if isinstance(sub, gym.spaces.Discrete)
        }

    def _lookup(self, obs: Any, key: str) -> Any:
        if not self.is_dict:
            return obs
        for part in key.split("/"):
            obs = obs[part]
        return obs

    def write(self, observations: list[Any], out: dict[str, torch.Tensor]) -> None:
        """Write one observation per env."""
        for key in self.keys:
            self._copy(key, np.asarray([self._lookup(o, key) for o in observations]), out)

    def write_batch(self, observations: Any, out: dict[str, torch.Tensor]) -> None:
        """Write an already batched observation (arrays with a leading env dim, as a vectorized env returns)."""
        for key in self.keys:
            self._copy(key, np.asarray(self._lookup(observations, key)), out)

    def _copy(self, key: str, values: np.ndarray, out: dict[str, torch.Tensor]) -> None:
        if key in self.offsets:
            values = values - self.offsets[key]
        out[key].copy_(torch.from_numpy(values).reshape(out[key].shape))

    def write_one(self, observation: Any, index: int, out: dict[str, torch.Tensor]) -> None:
        """Overwrite column `index` (used when one env resets)."""
        for key in self.keys:
            value = np.asarray(self._lookup(observation, key))
            if key in self.offsets:
                value = np.asarray(value - self.offsets[key])
            out[key][index].copy_(torch.from_numpy(value).reshape(out[key][index].shape))
