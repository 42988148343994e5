"""Uniform random actions: the default policy that fills a replay buffer before learning starts."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.envs.action_mask import apply_mask
from maze_cli.policies.distributions import make_distribution


class RandomPolicy(nn.Module):
    """Samples every action uniformly from the action space (with the torch RNG the actor seeds).

    An unbounded Box dimension is sampled from a standard normal instead. With `action_mask_key`,
    discrete actions are uniform among the legal ones the observations' mask names.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, action_mask_key: str | None = None):
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.action_mask_key = action_mask_key
        if isinstance(action_space, gym.spaces.Box):
            low, high = action_space.low.flatten(), action_space.high.flatten()
            self.bounded = torch.from_numpy(np.isfinite(low) & np.isfinite(high))
            self.low = torch.from_numpy(np.where(self.bounded, low, 0.0).astype(np.float32))
            self.width = torch.from_numpy(np.where(self.bounded, high - low, 1.0).astype(np.float32))

    def initial_state(self, batch_size: int) -> tuple:
        return ()

    @torch.no_grad()
    def act(self, observations: dict[str, torch.Tensor], state: tuple = (), episode_start: torch.Tensor | None = None,
            deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """(actions, their log-probs, the unchanged empty state), as `Policy.act`."""
        n = next(iter(observations.values())).shape[0]
        space = self.action_space
        if self.action_mask_key is not None:
            dist = make_distribution(space)
            legal = apply_mask(torch.zeros(n, dist.n_params), observations[self.action_mask_key])
            actions, logp = dist.sample_with_log_prob(legal)
        elif isinstance(space, gym.spaces.Discrete):
            actions = torch.randint(int(space.n), (n,))
            logp = torch.full((n,), -math.log(int(space.n)))
        elif isinstance(space, gym.spaces.MultiDiscrete):
            nvec = torch.as_tensor(space.nvec.flatten())
            actions = (torch.rand(n, len(nvec)) * nvec).long()
            logp = torch.full((n,), -float(torch.log(nvec.double()).sum()))
        else:
            uniform = self.low + torch.rand(n, len(self.low)) * self.width
            actions = torch.where(self.bounded, uniform, torch.randn(n, len(self.low)))
            logp = torch.full((n,), -float(torch.log(self.width[self.bounded]).sum()))
        return actions, logp, state
