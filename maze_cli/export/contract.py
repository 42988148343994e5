"""The I/O contract of an exported policy: its inputs' names, dtypes and shapes, its outputs' names, and
the metadata it carries. Torch-free, so that what a deployment reads is stated in one place.

Inputs, batch first, any batch size:
- `obs` for an observation that is not a Dict, else `obs.<key>` per key (nested keys dotted): the env's
  raw observations in the env's own dtype (uint8 frames stay uint8; a Discrete observation is an int64
  index as the env gives it, its `start` included). An action mask inside the observation is one of them;
  a mask the env gives in `info` (`env.action_mask_key=info`) is the input `action_mask`.
- `state` (recurrent cores only): float32 `[B, state_size]`, zeros at an episode's start.

Outputs: `action`, the greedy action in the env's own space (Discrete: int64 `[B]`; MultiDiscrete: int64
`[B, k]`; Box: float32 `[B, d]`, flattened, within the space's bounds); then what the policy kind gives
(`logits`, `mean` and `log_std`, `q_values`, `value`; see `maze_cli.export.heads`); and `state_out`
(recurrent cores), the state to feed at the next step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

FORMAT = "maze_cli.policy"
OBS = "obs"
STATE, STATE_OUT = "state", "state_out"
ACTION = "action"


@dataclass(frozen=True)
class ObservationInput:
    """One observation input: the flattened key the policy knows it by (`a/b`), its input name (`obs.a.b`),
    the env's dtype and shape of one observation, and a Discrete space's `start` (the policy counts from 0)."""

    key: str
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int = 0


def input_names(keys: Sequence[str], is_dict: bool, mask_from_info: bool) -> dict[str, str]:
    """`{key: input name}`: `obs` for a plain observation, `obs.<key>` for a Dict's key (nested keys dotted).
    With `mask_from_info`, the mask maze_cli moved from `info` into the observations (`InfoActionMask`) is
    `action_mask`, and the env's own observation beside it, if it was no Dict, `obs` again."""
    from maze_cli.envs.action_mask import MASK_KEY

    if not mask_from_info:
        return {key: f"{OBS}.{key.replace('/', '.')}" if is_dict else OBS for key in keys}
    plain = set(keys) == {OBS, MASK_KEY}
    return {key: MASK_KEY if key == MASK_KEY else OBS if plain else f"{OBS}.{key.replace('/', '.')}" for key in keys}


def observation_inputs(space: gym.Space, mask_from_info: bool = False) -> list[ObservationInput]:
    """The observation inputs of a model acting in `space`, in the policy's key order."""
    from maze_cli.envs.spaces import _flatten_spaces

    spaces = _flatten_spaces(space)
    names = input_names(list(spaces), isinstance(space, gym.spaces.Dict), mask_from_info)
    inputs = []
    for key, sub in spaces.items():
        if isinstance(sub, gym.spaces.Discrete):
            inputs.append(ObservationInput(key, names[key], np.dtype(np.int64), (), int(sub.start)))
        else:
            shape = tuple(np.atleast_1d(sub.n)) if isinstance(sub, gym.spaces.MultiBinary) else tuple(sub.shape)
            inputs.append(ObservationInput(key, names[key], np.dtype(sub.dtype), shape))
    return inputs


def raw_batch(observations: Sequence[Any], inputs: Sequence[ObservationInput], is_dict: bool) -> dict[str, np.ndarray]:
    """The model's feeds for a list of raw env observations (one per env)."""

    def lookup(observation: Any, key: str) -> Any:
        if not is_dict:
            return observation
        for part in key.split("/"):
            observation = observation[part]
        return observation

    return {i.name: np.asarray([lookup(o, i.key) for o in observations], dtype=i.dtype).reshape(len(observations), *i.shape)
            for i in inputs}


def metadata(observation_space: gym.Space, action_space: gym.Space, algorithm: str, checkpoint_sha256: str,
             inputs: Sequence[ObservationInput], outputs: Sequence[str], state_size: int, env: dict, policy: dict | None,
             group: str | None = None, mask_from_info: bool = False) -> dict[str, str]:
    """The model's metadata, string to string (ONNX `metadata_props`; a TorchScript file's extra file):
    the spaces, the algorithm, maze_cli's version, the checkpoint's SHA-256, the I/O, the env config
    `rollout model=` builds its env from and, for a policy group's model, the group. Values other than
    strings are JSON."""
    from maze_cli import __version__
    from maze_cli.envs.spaces import space_to_dict

    return {
        "format": FORMAT,
        "maze_cli_version": __version__,
        "algorithm": algorithm,
        "checkpoint_sha256": checkpoint_sha256,
        "observation_space": json.dumps(space_to_dict(observation_space)),
        "action_space": json.dumps(space_to_dict(action_space)),
        "inputs": json.dumps([{"name": i.name, "dtype": i.dtype.name, "shape": ["batch", *i.shape]} for i in inputs]
                             + ([{"name": STATE, "dtype": "float32", "shape": ["batch", state_size]}] if state_size else [])),
        "outputs": json.dumps(list(outputs)),
        "state_size": str(state_size),
        "action_mask_from_info": json.dumps(mask_from_info),
        "env": json.dumps(env),
        "policy": json.dumps(policy),
        **({"group": group} if group is not None else {}),
    }
