"""Envs from config: the factory, the env-source contract it follows, seeding and the mapping of spaces to tensors."""

from maze_cli.envs.factory import EnvFactory
from maze_cli.envs.source import EnvSource, as_env_source
from maze_cli.envs.spaces import ObservationWriter, action_spec, action_to_env, observation_specs
from maze_cli.errors import EnvConfigError, UnsupportedSpaceError

__all__ = [
    "EnvConfigError",
    "EnvFactory",
    "EnvSource",
    "UnsupportedSpaceError",
    "ObservationWriter",
    "action_spec",
    "action_to_env",
    "as_env_source",
    "observation_specs",
]
