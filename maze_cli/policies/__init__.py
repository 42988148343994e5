"""Torch policies: a state_dict in, actions out."""

from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.policies.distributions import ActionDistribution, make_distribution

__all__ = ["ActorCritic", "ActionDistribution", "make_distribution"]
