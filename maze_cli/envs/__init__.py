"""Envs from config: the factory, seeding and the mapping of spaces to tensors."""

from maze_cli.envs.factory import EnvFactory
from maze_cli.envs.spaces import ObservationWriter, action_spec, action_to_env, observation_specs
from maze_cli.errors import EnvConfigError, UnsupportedSpaceError

__all__ = [
    "EnvConfigError",
    "EnvFactory",
    "UnsupportedSpaceError",
    "ObservationWriter",
    "action_spec",
    "action_to_env",
    "observation_specs",
]
