"""Build a policy network from its config (`_target_` and arguments) with the observation space it sees."""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import torch
from torch import nn

from maze_cli.errors import ConfigError
from maze_cli.policies.base import FeedForwardNetwork, Observations, PolicyNetwork


class _PlainModule(FeedForwardNetwork):
    """A user's plain `nn.Module` (`forward(observations) -> features`, an `out_dim`) as a feed-forward network."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.out_dim = int(module.out_dim)

    def features(self, observations: Observations) -> torch.Tensor:
        return self.module(observations)


def build_network(config: Mapping[str, Any], observation_space: gym.Space) -> PolicyNetwork:
    """`config['_target_'](observation_space, **other keys)`, checked to be a network.

    A `PolicyNetwork` is used as it is; any other `nn.Module` with an `out_dim` is taken to be
    feed-forward (`forward(observations) -> features [..., out_dim]`)."""
    from hydra.utils import instantiate

    target = config.get("_target_")
    network = instantiate(dict(config), observation_space=observation_space, _convert_="all")
    if isinstance(network, PolicyNetwork):
        return network
    if isinstance(network, nn.Module) and isinstance(getattr(network, "out_dim", None), int):
        return _PlainModule(network)
    raise ConfigError(
        f"policy._target_={target}: built a {type(network).__name__}, not a policy network; it must be a torch "
        f"nn.Module with an int `out_dim` whose forward maps the observation dict to features (see maze_cli.policies.PolicyNetwork)"
    )
