"""Torch policies: a state_dict in, actions out."""

from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.policies.distributions import ActionDistribution, make_distribution
from maze_cli.policies.random_policy import RandomPolicy

__all__ = ["ActorCritic", "RandomPolicy", "ActionDistribution", "make_distribution"]
