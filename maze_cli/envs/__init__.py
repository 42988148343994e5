"""Envs from config: the factory, seeding and the mapping of spaces to tensors."""

from maze_cli.envs.factory import EnvConfigError, EnvFactory, UnsupportedSpaceError
from maze_cli.envs.spaces import ObservationWriter, action_spec, action_to_env, observation_specs

__all__ = [
    "EnvConfigError",
    "EnvFactory",
    "UnsupportedSpaceError",
    "ObservationWriter",
    "action_spec",
    "action_to_env",
    "observation_specs",
]
