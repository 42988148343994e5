"""The module that is exported: raw env observations in, the contract's outputs out
(`maze_cli.export.contract`), the policy's whole step inside.

Inside the graph: each observation cast from the env's dtype to the one the policy takes (a Discrete
observation counted from 0), the policy kind's greedy step (`maze_cli.export.heads`: observation
normalization with its frozen statistics, image scaling and layout, the action mask), and the action
mapped to the env's space (Discrete and MultiDiscrete `start` added, a Box action clipped to its bounds).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.envs.spaces import observation_specs
from maze_cli.export.contract import ACTION, STATE, STATE_OUT, ObservationInput, observation_inputs
from maze_cli.export.heads import Head
from maze_cli.policies.base import State


class PolicyGraph(nn.Module):
    """`forward(*observation inputs[, state]) -> (action, *head outputs[, state_out])`; `mask_from_info`: the env
    gives its mask in `info` (the input `action_mask`)."""

    def __init__(self, head: Head, mask_from_info: bool = False):
        super().__init__()
        self.head = head
        self.policy = head.policy  # a submodule: its weights and buffers are the graph's constants
        space = self.policy.observation_space
        self.mask_from_info = mask_from_info
        self.inputs: list[ObservationInput] = observation_inputs(space, mask_from_info)
        specs = observation_specs(space)
        self._dtypes = [specs[i.key].dtype for i in self.inputs]
        self._state_shapes = [tuple(s.shape[1:]) for s in self.policy.initial_state(1)]
        self.state_size = sum(math.prod(shape) for shape in self._state_shapes)
        self.outputs = (ACTION, *head.outputs) + ((STATE_OUT,) if self.state_size else ())
        self.input_names = [i.name for i in self.inputs] + ([STATE] if self.state_size else [])
        self._action = _ActionToEnv(self.policy.action_space)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        observations = {}
        for spec, dtype, x in zip(self.inputs, self._dtypes, inputs):
            x = x.to(dtype)
            observations[spec.key] = x - spec.start if spec.start else x
        state = self.split_state(inputs[len(self.inputs)]) if self.state_size else ()
        outputs, state = self.head.graph(observations, state)
        outputs[ACTION] = self._action(outputs[ACTION])
        if self.state_size:
            outputs[STATE_OUT] = self.join_state(state)
        return tuple(outputs[name] for name in self.outputs)

    def split_state(self, state: torch.Tensor) -> State:
        """The policy's state tuple from the contract's one `[B, state_size]` tensor."""
        parts, start = [], 0
        for shape in self._state_shapes:
            size = math.prod(shape)
            parts.append(state[:, start:start + size].reshape(-1, *shape))
            start += size
        return tuple(parts)

    @staticmethod
    def join_state(state: State) -> torch.Tensor:
        """The contract's `[B, state_size]` tensor from the policy's state tuple."""
        return torch.cat([s.reshape(s.shape[0], -1) for s in state], dim=-1)

    def example_inputs(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Inputs of `batch` rows in the contract's dtypes (what tracing runs the graph on)."""
        observations = [torch.from_numpy(np.full((batch, *i.shape), i.start, dtype=i.dtype)) for i in self.inputs]
        return tuple(observations) + ((torch.zeros(batch, self.state_size),) if self.state_size else ())


class _ActionToEnv(nn.Module):
    """A policy's action `[B]` or `[B, d]` in the env's space, as `maze_cli.envs.spaces.action_to_env` maps one."""

    def __init__(self, space: gym.Space):
        super().__init__()
        self.kind = type(space).__name__
        if isinstance(space, gym.spaces.Discrete):
            self.start = int(space.start)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self.register_buffer("offset", torch.as_tensor(np.asarray(space.start).reshape(-1), dtype=torch.int64))
        else:
            self.register_buffer("low", torch.as_tensor(space.low.reshape(-1), dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high.reshape(-1), dtype=torch.float32))

    def forward(self, action: torch.Tensor) -> torch.Tensor:
        if self.kind == "Discrete":
            action = action.long()
            return action + self.start if self.start else action
        if self.kind == "MultiDiscrete":
            return action.long() + self.offset
        return torch.minimum(torch.maximum(action.float(), self.low), self.high)
