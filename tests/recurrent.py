"""A small recurrent policy network, written against the public contract as a user would."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from maze_cli.policies import PolicyNetwork
from maze_cli.policies.mlp import ObservationEncoder


class TinyGru(PolicyNetwork):
    """A GRU cell over the encoded observations; the state is reset where an episode starts."""

    def __init__(self, observation_space: gym.Space, size: int = 8):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space)
        self.cell = nn.GRUCell(self.encoder.out_dim, size)
        self.size = self.out_dim = size

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(batch_size, self.size),)

    def forward(self, observations, state, episode_start):
        x = self.encoder(observations)
        h, outputs = state[0], []
        for t in range(x.shape[0]):
            if episode_start is not None:
                h = h * (~episode_start[t]).unsqueeze(-1).float()
            h = self.cell(x[t], h)
            outputs.append(h)
        return torch.stack(outputs), (h,)
