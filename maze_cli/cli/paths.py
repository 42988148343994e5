"""Where the packaged configs live: `conf/` beside the package in a checkout, or inside it when installed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from omegaconf import DictConfig


def config_dir() -> Path:
    source_tree = Path(__file__).resolve().parents[2] / "conf"
    if (source_tree / "train.yaml").is_file():
        return source_tree
    return Path(str(resources.files("maze_cli") / "conf"))


def compose_train(overrides: Sequence[str]) -> DictConfig:
    """The config `train <overrides>` runs with, composed in this process (not yet validated): for
    code that builds a run's parts without starting the CLI, such as the benchmarks of one learner."""
    from hydra import compose, initialize_config_dir

    from maze_cli.cli.settings import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("train", overrides=list(overrides))


RUN_DIR_FIX = "choose a writable place with hydra.run.dir=<dir> (hydra.sweep.dir=<dir> with -m) or make it writable"
