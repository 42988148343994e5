"""An exported model behind the policy contract that `rollout` plays (`rollout model=<file.onnx>`), so that
its episodes and report are a checkpoint's: the same env (built from the config the model's metadata
carries, under the same allow-list), the same seeds, the same loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.errors import ConfigError, first_line
from maze_cli.export.contract import ACTION, FORMAT, STATE, STATE_OUT, observation_inputs
from maze_cli.export.formats import load_model
from maze_cli.playing import check_env_callables, env_for_policy
from maze_cli.policies.base import Observations, State


class ExportedModelPolicy(nn.Module):
    """A model `export-policy` wrote (ONNX, or TorchScript), acting greedily on maze_cli's observation tensors.

    `env_config` and `policy_config` are the run's, from the model's metadata: what `rollout` builds the env from."""

    def __init__(self, path: Path):
        super().__init__()
        where = f"model={path}"
        if not path.is_file():
            raise ConfigError(f"{where}: no such file")
        fmt = "torchscript" if path.read_bytes()[:4] == b"PK\x03\x04" else "onnx"
        try:
            self.run, meta = load_model(path, fmt)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - onnxruntime and torch raise several kinds for a file they cannot read
            raise ConfigError(f"{where}: not a model {'onnxruntime' if fmt == 'onnx' else 'torch.jit'} can read "
                              f"({type(err).__name__}: {first_line(err)})") from None
        if meta.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a model written by export-policy (its metadata has no format '{FORMAT}')")
        from maze_cli.envs.spaces import space_from_dict

        self.observation_space = space_from_dict(json.loads(meta["observation_space"]))
        self.action_space = space_from_dict(json.loads(meta["action_space"]))
        self.inputs = observation_inputs(self.observation_space, json.loads(meta.get("action_mask_from_info", "false")))
        self.state_size = int(meta["state_size"])
        self.env_config, self.policy_config = json.loads(meta["env"]), json.loads(meta["policy"])
        self.group = meta.get("group")  # a policy group's model
        self._action_start = np.asarray(getattr(self.action_space, "start", 0)).reshape(-1) if not isinstance(
            self.action_space, gym.spaces.Box) else None

    def initial_state(self, batch_size: int) -> State:
        return (torch.zeros(batch_size, self.state_size),) if self.state_size else ()

    @property
    def is_recurrent(self) -> bool:
        return self.state_size > 0

    def act(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None,
            deterministic: bool = True) -> tuple[torch.Tensor, torch.Tensor, State]:
        """The model's greedy action in the policy's units (`action_to_env` maps it back to the env's), zero
        log-probs, and its next state (zeroed first where an episode starts)."""
        if not deterministic:
            raise ConfigError("an exported model acts greedily: deterministic=false needs the checkpoint")
        feeds = {}
        for i in self.inputs:  # back to the env's dtype and numbering, as the model takes them
            x = observations[i.key].cpu().numpy().astype(i.dtype)
            feeds[i.name] = x + i.start if i.start else x
        if self.state_size:
            carried = state[0] if episode_start is None else state[0] * (~episode_start).float().unsqueeze(-1)
            feeds[STATE] = carried.cpu().numpy()
        outputs = self.run(feeds)
        actions = outputs[ACTION]
        if self._action_start is not None:  # from the env's numbering back to the policy's (from 0)
            actions = actions - (self._action_start if actions.ndim > 1 else self._action_start[0])
        next_state = (torch.from_numpy(outputs[STATE_OUT]),) if self.state_size else ()
        return torch.from_numpy(actions), torch.zeros(len(actions)), next_state


def load_model_played(path: Path, allow: Sequence[str], trust: bool):
    """(policy, env factory) of a model `export-policy` wrote: its env from the config in its metadata,
    under the same allow-list as a checkpoint's."""
    where = f"model={path}"
    policy = ExportedModelPolicy(path)
    check_env_callables(policy.env_config, allow, trust, where, "the model's metadata")
    if policy.group is not None:
        raise ConfigError(f"{where}: the model of policy group '{policy.group}' plays only its group's agents; "
                          f"rollout plays every agent: play the checkpoint instead")
    return policy, env_for_policy(policy, policy.env_config, policy.policy_config, where)
