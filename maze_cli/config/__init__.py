"""The run's configuration: schemas (the defaults), their registration with Hydra, validation."""

from maze_cli.config.schema import SCHEMAS, Settings, TrainConfig, register_configs, validate

__all__ = ["SCHEMAS", "Settings", "TrainConfig", "register_configs", "validate"]
