"""Map gymnasium spaces to tensors and back.

Observations: Box, Discrete, MultiBinary, and Dict of those (nested keys joined with '/'); a plain
space is stored under the key 'obs', a Tuple becomes a Dict keyed by position (`TupleAsDict`).
Actions: Discrete, MultiDiscrete and Box.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from maze_cli.errors import UnsupportedSpaceError
from maze_cli.records import TensorSpec

OBS_KEY = "obs"  # the key of an observation that is not a Dict (the env's own, under core inputs too)


def _numpy_to_torch_dtype(dtype: np.dtype) -> torch.dtype:
    """Floats as float32; bool and uint8 kept as they are (frames stay a byte per pixel in shared
    memory and replay buffers; networks scale them); other integers as int64."""
    if np.issubdtype(dtype, np.floating):
        return torch.float32
    if np.issubdtype(dtype, np.bool_):
        return torch.bool
    if dtype == np.uint8:
        return torch.uint8
    return torch.int64


def _flatten_spaces(space: gym.Space, prefix: str = "") -> dict[str, gym.Space]:
    if isinstance(space, gym.spaces.Dict):
        flat: dict[str, gym.Space] = {}
        for key, sub in space.spaces.items():
            flat.update(_flatten_spaces(sub, f"{prefix}{key}/"))
        return flat
    return {prefix.rstrip("/") or OBS_KEY: space}


def is_image(space: gym.Space) -> bool:
    """What the CNN policy convolves (and `normalize_images` normalizes): a Box of 3 dims, or of 2 dims of
    at least 8 a side (one channel)."""
    return isinstance(space, gym.spaces.Box) and (len(space.shape) == 3 or (len(space.shape) == 2 and min(space.shape) >= 8))


def image_shapes(space: gym.Space) -> dict[str, tuple[int, ...]]:
    """The (flattened) observation keys that are images (`is_image`), with their shapes."""
    return {key: tuple(sub.shape) for key, sub in _flatten_spaces(space).items() if is_image(sub)}


def observation_specs(space: gym.Space) -> dict[str, TensorSpec]:
    """One tensor spec per (flattened) observation key."""
    specs = {}
    for key, sub in _flatten_spaces(space).items():
        if isinstance(sub, gym.spaces.Box):
            specs[key] = TensorSpec(tuple(sub.shape), _numpy_to_torch_dtype(sub.dtype))
        elif isinstance(sub, gym.spaces.Discrete):
            specs[key] = TensorSpec((), torch.int64)
        elif isinstance(sub, gym.spaces.MultiBinary):
            specs[key] = TensorSpec(tuple(np.atleast_1d(sub.n)), torch.float32)
        else:
            where = f"at key '{key}'" if isinstance(space, gym.spaces.Dict) else "at the observation's top level"
            raise UnsupportedSpaceError(
                f"observation space {sub!r} {where} is not supported; use Box, Discrete, MultiBinary or a Dict or Tuple of those"
            )
    return specs


def has_tuple(space: gym.Space) -> bool:
    """Whether a Tuple is anywhere in the observation space (`TupleAsDict` turns it into a Dict)."""
    if isinstance(space, gym.spaces.Tuple):
        return True
    return isinstance(space, gym.spaces.Dict) and any(has_tuple(sub) for sub in space.spaces.values())


def _tuples_as_dicts(space: gym.Space) -> gym.Space:
    """Pairs, not a mapping, keep the order (a mapping's keys would be sorted as text: "10" before "2")."""
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Dict([(str(i), _tuples_as_dicts(sub)) for i, sub in enumerate(space.spaces)])
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict([(key, _tuples_as_dicts(sub)) for key, sub in space.spaces.items()])
    return space


def _tuple_observation_as_dict(space: gym.Space, observation: Any) -> Any:
    if isinstance(space, gym.spaces.Tuple):
        return {str(i): _tuple_observation_as_dict(sub, o) for i, (sub, o) in enumerate(zip(space.spaces, observation))}
    if isinstance(space, gym.spaces.Dict):
        return {key: _tuple_observation_as_dict(sub, observation[key]) for key, sub in space.spaces.items()}
    return observation


class TupleAsDict(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """A Tuple observation (at any depth) as a Dict keyed "0", "1", ...: the form the policy's encoders and
    the actors' buffers read, each entry encoded as its space says (gymnasium's Blackjack observes
    Tuple(Discrete(32), Discrete(11), Discrete(2)): three one-hots, not three numbers)."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        self.observation_space = _tuples_as_dicts(env.observation_space)

    def observation(self, observation: Any) -> Any:
        return _tuple_observation_as_dict(self.env.observation_space, observation)


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


def actions_to_env(space: gym.Space, actions: np.ndarray) -> list[Any]:
    """`action_to_env` for every row of a batch of actions, converted in one go (what an actor
    stepping single envs pays per step, not per env)."""
    n = len(actions)
    if isinstance(space, gym.spaces.Discrete):
        actions = actions.astype(np.int64, copy=False)
        return (actions + int(space.start)).tolist() if space.start else actions.tolist()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return list(actions.reshape(n, *space.nvec.shape).astype(space.dtype) + space.start)
    return list(np.clip(actions.reshape(n, *space.shape), space.low, space.high).astype(space.dtype))


class ObservationWriter:
    """Writes raw observations (one per env, or already batched) into preallocated `[B, ...]` targets:
    torch tensors, or numpy arrays (an actor writes numpy views of its record: an assignment per key
    costs a fraction of a tensor copy).

    Built once per actor so the per-step work is a stack and a copy per key, nothing more.
    """

    def __init__(self, space: gym.Space):
        self.space = space
        self.keys = list(observation_specs(space))
        self.is_dict = isinstance(space, gym.spaces.Dict)
        self.offsets = {
            key: int(sub.start) for key, sub in _flatten_spaces(space).items() if isinstance(sub, gym.spaces.Discrete) and int(sub.start)
        }

    def _lookup(self, obs: Any, key: str) -> Any:
        if not self.is_dict:
            return obs
        for part in key.split("/"):
            obs = obs[part]
        return obs

    def write(self, observations: list[Any], out: dict[str, torch.Tensor | np.ndarray]) -> None:
        """Write one observation per env."""
        for key in self.keys:
            self._copy(key, np.asarray([self._lookup(o, key) for o in observations]), out[key])

    def write_batch(self, observations: Any, out: dict[str, torch.Tensor | np.ndarray]) -> None:
        """Write an already batched observation (arrays with a leading env dim, as a vectorized env returns)."""
        for key in self.keys:
            self._copy(key, np.asarray(self._lookup(observations, key)), out[key])

    def _copy(self, key: str, values: np.ndarray, target: torch.Tensor | np.ndarray) -> None:
        if key in self.offsets:
            values = np.asarray(values - self.offsets[key])
        if isinstance(target, np.ndarray):
            target[...] = values.reshape(target.shape)
        else:
            target.copy_(torch.from_numpy(values).reshape(target.shape))

    def write_one(self, observation: Any, index: int, out: dict[str, torch.Tensor | np.ndarray]) -> None:
        """Overwrite column `index` (used when one env resets)."""
        for key in self.keys:
            self._copy(key, np.asarray(self._lookup(observation, key)), out[key][index : index + 1])


# JSON-able space descriptions: checkpoints store a policy's spaces as plain data (no pickles), and
# `space_from_dict(space_to_dict(s)) == s`. Infinite bounds are the strings "inf" / "-inf", so
# `json.dumps(..., allow_nan=False)` accepts every description.

_SERIALIZABLE = "Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple"


def _bounds_to_list(values: np.ndarray, unbounded: np.ndarray, inf: str) -> Any:
    """Nested lists of Python numbers; entries that are infinite (or declared unbounded) become strings."""
    out = values.astype(object)  # elements become Python int / float / bool
    if values.dtype.kind == "f":
        out[np.isposinf(values)] = "inf"
        out[np.isneginf(values)] = "-inf"
    out[unbounded] = inf  # signed-int boxes built with ±inf store the dtype's limit, not inf
    return out.tolist()


def _bounds_from_list(values: Any, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The bounds array in `dtype` and where it is unbounded ("inf" / "-inf").

    A float dtype holds the infinities; an int dtype holds its own limits there (as Box itself does)."""
    limits = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype) if dtype.kind in "iu" else None

    def convert(v: Any) -> Any:
        if isinstance(v, list):
            return [convert(x) for x in v]
        if v == "inf":
            return float("inf") if dtype.kind == "f" else int(limits.max)
        if v == "-inf":
            return float("-inf") if dtype.kind == "f" else int(limits.min)
        if isinstance(v, str):
            raise ValueError(f"Box bound '{v}' is not a number; the only strings allowed are 'inf' and '-inf'")
        return v

    def unbounded(v: Any) -> Any:
        return [unbounded(x) for x in v] if isinstance(v, list) else v in ("inf", "-inf")

    return np.array(convert(values), dtype=dtype), np.array(unbounded(values), dtype=bool)


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """A JSON-able description of `space` (lists, dicts, strings, ints, floats, bools only).

    Box, Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple of those; a Dict keeps its key order.
    Raises UnsupportedSpaceError naming the space's type (and its key inside a Dict) for anything
    else. Seeds are not kept.
    """
    return _space_to_dict(space, "")


def _space_to_dict(space: gym.Space, path: str) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": [int(d) for d in space.shape],
            "dtype": np.dtype(space.dtype).name,
            "low": _bounds_to_list(space.low, ~space.bounded_below, "-inf"),
            "high": _bounds_to_list(space.high, ~space.bounded_above, "inf"),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": np.dtype(space.dtype).name}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec).astype(object).tolist(),
            "start": np.asarray(space.start).astype(object).tolist(),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": [int(d) for d in n] if isinstance(n, (tuple, list, np.ndarray)) else int(n)}
    if isinstance(space, gym.spaces.Dict):
        spaces = {}
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise UnsupportedSpaceError(
                    f"Dict space key {key!r} at '{path or '/'}' is a {type(key).__name__}; only string keys can be stored"
                )
            spaces[key] = _space_to_dict(sub, f"{path}{key}/")
        return {"type": "Dict", "spaces": spaces}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [_space_to_dict(sub, f"{path}{i}/") for i, sub in enumerate(space.spaces)]}
    where = f" at '{path.rstrip('/')}'" if path else ""
    raise UnsupportedSpaceError(
        f"cannot store a {type(space).__name__} space{where} ({space!r}); use {_SERIALIZABLE}"
    )


def space_from_dict(description: dict[str, Any]) -> gym.Space:
    """The space described by `space_to_dict`'s output."""
    if not isinstance(description, dict) or "type" not in description:
        raise UnsupportedSpaceError(f"not a space description (a dict with a 'type' key): {description!r}")
    kind = description["type"]
    if kind == "Box":
        dtype = np.dtype(description["dtype"])
        low, low_unbounded = _bounds_from_list(description["low"], dtype)
        high, high_unbounded = _bounds_from_list(description["high"], dtype)
        space = gym.spaces.Box(low=low, high=high, shape=tuple(description["shape"]), dtype=dtype)
        # An int Box built from ±inf holds its dtype's limits and remembers that they mean "unbounded".
        space.bounded_below = space.bounded_below & ~np.broadcast_to(low_unbounded, space.shape)
        space.bounded_above = space.bounded_above & ~np.broadcast_to(high_unbounded, space.shape)
        return space
    if kind == "Discrete":
        return gym.spaces.Discrete(description["n"], start=description.get("start", 0), dtype=description.get("dtype", "int64"))
    if kind == "MultiDiscrete":
        dtype = np.dtype(description.get("dtype", "int64"))
        return gym.spaces.MultiDiscrete(
            np.array(description["nvec"], dtype=dtype), dtype=dtype, start=np.array(description["start"], dtype=dtype)
        )
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(description["n"])
    if kind == "Dict":
        # A list of pairs keeps the stored key order (a plain dict would be sorted by gymnasium).
        return gym.spaces.Dict([(key, space_from_dict(sub)) for key, sub in description["spaces"].items()])
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_dict(sub) for sub in description["spaces"]])
    raise UnsupportedSpaceError(f"space type '{kind}' is not supported; stored spaces are {_SERIALIZABLE}")
