"""Where the packaged configs live: `conf/` beside the package in a checkout, or inside it when installed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def config_dir() -> Path:
    source_tree = Path(__file__).resolve().parents[2] / "conf"
    if (source_tree / "train.yaml").is_file():
        return source_tree
    return Path(str(resources.files("maze_cli") / "conf"))


RUN_DIR_FIX = "choose a writable place with hydra.run.dir=<dir> (hydra.sweep.dir=<dir> with -m) or make it writable"
