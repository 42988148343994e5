"""Experiment trackers: the `logger` group, chosen with `+logger=mlflow`, `+logger=[mlflow,wandb]`.

TensorBoard and stats.jsonl are always written; a tracker is one more writer of the same epoch
stats. Each option of the group is a node `logger.<name>` with a `_target_`: a class built as
`cls(run_dir=..., config=..., **its other keys)` that has `write(stats)` and `close()` (and may
name the package it needs in `requires = (module, extra)`, checked before anything runs). The
packaged YAML files (conf/logger/) hold every key's default. A tracker's package is imported only
when chosen; a missing one is a one-line error naming the extra to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
from pathlib import Path
from typing import Any

from maze_cli.errors import ConfigError

log = logging.getLogger("maze_cli")


def check_installed(name: str, cls: type) -> None:
    """Before anything runs: the package a tracker class `requires` (module, extra) is installed."""
    module, extra = getattr(cls, "requires", (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(f"logger.{name}: the {module} package is not installed; pip install 'maze_cli[{extra}]' "
                          f"(or drop +logger={name})")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'algorithm': {'lr': 1e-3}} -> {'algorithm.lr': 1e-3}; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def numeric(stats: dict[str, Any]) -> dict[str, float]:
    """The stats a tracker can plot: finite numbers (booleans as 0/1)."""
    return {k: float(v) for k, v in stats.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class MlflowWriter:
    """An MLflow run: params = the resolved config flattened, metrics = every epoch stat under its
    stats.jsonl name (step: env steps), artifacts = checkpoints/best.pt and learning_curve.png at
    the end. `tracking_uri` null: a local store in ./mlruns of the directory train runs in (an SQLite
    database, mlruns/mlflow.db, and the artifacts beside it: MLflow 3 refuses its plain-file store
    unless MLFLOW_ALLOW_FILE_STORE=true); `mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db` shows it."""

    requires = ("mlflow", "mlflow")  # (module, maze_cli extra)

    def __init__(self, run_dir: Path, config: dict[str, Any], tracking_uri: str | None, experiment: str, run_name: str | None):
        for noisy in ("mlflow", "alembic"):  # their INFO lines (creating tables, ...) are not the run's news
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self.mlflow = importlib.import_module("mlflow")
        self.run_dir = Path(run_dir)
        store = (Path.cwd() / "mlruns").resolve()
        if tracking_uri is None:
            store.mkdir(exist_ok=True)
        uri = tracking_uri or f"sqlite:///{store / 'mlflow.db'}"
        self.mlflow.set_tracking_uri(uri)
        if self.mlflow.get_experiment_by_name(experiment) is None:
            self.mlflow.create_experiment(experiment, artifact_location=None if tracking_uri else (store / "artifacts").as_uri())
        self.mlflow.set_experiment(experiment)
        self.run = self.mlflow.start_run(run_name=run_name or self.run_dir.name)
        params = {k: str(v)[:500] for k, v in flatten(config).items()}
        items = list(params.items())
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            self.mlflow.log_params(dict(items[i:i + 100]))
        self.mlflow.set_tag("run_dir", str(self.run_dir))
        log.info(f"mlflow: run {self.run.info.run_id} in experiment '{experiment}' at {uri}")

    def write(self, stats: dict[str, Any]) -> None:
        self.mlflow.log_metrics(numeric(stats), step=int(stats["env_steps"]))

    def close(self) -> None:
        for artifact in (self.run_dir / "checkpoints" / "best.pt", self.run_dir / "learning_curve.png"):
            if artifact.is_file():
                self.mlflow.log_artifact(str(artifact))
        self.mlflow.end_run()


class WandbWriter:
    """A Weights & Biases run, offline (files under the run dir, no network) unless an API key is
    configured or `mode` says otherwise. The jobs of a multirun share a group: the sweep's dir."""

    requires = ("wandb", "wandb")

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str, entity: str | None, group: str | None,
                 tags: list[str] | None, mode: str | None):
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner and summary would bury the table; our line says where the run is
        self.wandb = importlib.import_module("wandb")
        run_dir = Path(run_dir)
        mode = mode or ("online" if _wandb_key_configured() else "offline")
        group = group or _sweep_name()
        self.run = self.wandb.init(project=project, entity=entity, group=group, tags=list(tags or []), mode=mode,
                                   config=flatten(config), dir=str(run_dir), name=run_dir.name)
        log.info(f"wandb: run {self.run.id} ({mode}{f', group {group}' if group else ''}) in {run_dir / 'wandb'}")

    def write(self, stats: dict[str, Any]) -> None:
        self.run.log(numeric(stats), step=int(stats["epoch"]))

    def close(self) -> None:
        self.run.finish()


def _wandb_key_configured() -> bool:
    """An API key in the environment or in ~/.netrc (where `wandb login` puts it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def _sweep_name() -> str | None:
    """In a Hydra multirun, the sweep dir's path (the same for all its jobs); else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra = HydraConfig.get()
        return str(hydra.sweep.dir) if hydra.mode == RunMode.MULTIRUN else None
    except Exception:  # noqa: BLE001 - outside Hydra: no sweep
        return None

