"""The critics the off-policy algorithms share: two Q-networks of the policy's network config (SAC, TD3)."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from maze_cli.policies.base import Observations
from maze_cli.policies.mlp import linear
from maze_cli.policies.network import build_network

ACTION_KEY = "_action"  # the action's key among a Box-action critic's inputs


def critic_space(observation_space: gym.Space, action_space: gym.Space) -> gym.Space:
    """What a critic sees: the observation, plus the action as one more key for Box actions."""
    if isinstance(action_space, gym.spaces.Discrete):
        return observation_space
    keys = dict(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else {"obs": observation_space}
    return gym.spaces.Dict({**keys, ACTION_KEY: action_space})


class TwinCritic(nn.Module):
    """Q1 and Q2, each a policy network of the same config: of (s, a) for Box actions (the action one
    more input key), or of s for every Discrete action at once."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, network: dict):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        space = critic_space(observation_space, action_space)
        n_out = int(action_space.n) if self.discrete else 1
        self.nets = nn.ModuleList(build_network(network, space) for _ in range(2))
        self.heads = nn.ModuleList(linear(net.out_dim, n_out, 1.0) for net in self.nets)

    def forward(self, observations: Observations, actions: torch.Tensor | None = None):
        if not self.discrete:
            observations = {**observations, ACTION_KEY: actions}
        q1, q2 = (head(net(observations, (), None)[0]) for net, head in zip(self.nets, self.heads))
        return (q1, q2) if self.discrete else (q1.squeeze(-1), q2.squeeze(-1))
