"""The run's configuration: each key's declaration (fields.py), the schemas of the packaged options and
their defaults (schema.py), and the check of one section (validation.py). The whole run's config is
composed and checked by the command (maze_cli.cli.settings)."""

from maze_cli.config.schema import SCHEMAS, TrainConfig

__all__ = ["SCHEMAS", "TrainConfig"]
