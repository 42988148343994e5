"""maze_cli: a command-line trainer for reinforcement learning with parallel actors."""

__version__ = "0.1.0"
