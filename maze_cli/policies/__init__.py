"""Policies: the contract (`Policy`, `PolicyNetwork`), the MLP network, actor-critic heads, distributions."""

from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.policies.base import FeedForwardNetwork, Policy, PolicyNetwork, PolicyOutput, State
from maze_cli.policies.distributions import ActionDistribution, make_distribution
from maze_cli.policies.mlp import MlpNetwork, mlp_network
from maze_cli.policies.network import build_network
from maze_cli.policies.random_policy import RandomPolicy

__all__ = [
    "ActionDistribution", "ActorCritic", "FeedForwardNetwork", "MlpNetwork", "Policy", "PolicyNetwork", "PolicyOutput",
    "RandomPolicy", "State", "build_network", "make_distribution", "mlp_network",
]
