"""`train --help`, written from the packaged config alone.

The page is the template in conf/train.yaml (`hydra.help`), whose `${maze_options:<group>,<default>}`
lists a group's packaged options. Hydra renders the same template when `--help` comes with other
arguments; a bare `train --help` is rendered here, before anything heavier than OmegaConf is imported
(the schemas' modules import torch: seconds of a user's time for a page of text).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from maze_cli.cli.paths import config_dir


def group_options(group: str, default: str) -> str:
    """`${maze_options:<group>,<default>}` in the help: the group's packaged options, the default first."""
    names = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
    return ", ".join([f"{default} (default)", *(n for n in names if n != default)])


def register_help_resolver() -> None:
    """`maze_options` for OmegaConf: Hydra's rendering of the template needs it as much as ours."""
    OmegaConf.register_new_resolver("maze_options", group_options, replace=True)


def train_help() -> str:
    """The help page of `train`, as Hydra prints it for `train --help`."""
    register_help_resolver()
    return OmegaConf.load(config_dir() / "train.yaml").hydra.help.template
