"""The run's configuration: schemas (the defaults), their registration with Hydra, validation."""

from maze_cli.config.schema import SCHEMAS, TrainConfig, register_configs
from maze_cli.config.settings import Settings, validate

__all__ = ["SCHEMAS", "Settings", "TrainConfig", "register_configs", "validate"]
