"""Trackers (`+logger=...`): MLflow's file store and wandb offline read back equal to stats.jsonl; a
user's own writer; a missing package in one line."""

from __future__ import annotations

import math

import pytest
import yaml

from maze_cli.stats.trackers import flatten
from tests.cli import run_train
from tests.test_train import read_stats

SHORT = ["+env=cartpole", "runner=sequential", "epoch_length=2", "eval.episodes=2", "max_env_steps=12000"]


def write_logger(tmp_path, name: str, body: str) -> list[str]:
    config_dir = tmp_path / "configs"
    (config_dir / "logger").mkdir(parents=True, exist_ok=True)
    (config_dir / "logger" / f"{name}.yaml").write_text(body)
    return ["--config-dir", str(config_dir), f"+logger={name}"]


def test_mlflow_holds_the_config_and_every_stat_of_every_epoch(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    result = run_train(*SHORT, "+logger=mlflow", run_dir=run_dir)  # cwd: tmp_path, so the store is tmp_path/mlruns
    assert result.returncode == 0, result.stderr
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("maze_cli")
    (run,) = client.search_runs([experiment.experiment_id])
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert run.data.params == {k: str(v) for k, v in flatten(config).items()}
    rows = read_stats(run_dir)
    for key in ("train/return_mean", "eval/return_mean", "learner/loss", "epoch"):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        expected = [row for row in rows if key in row and math.isfinite(row[key])]
        assert [m.step for m in history] == [row["env_steps"] for row in expected], key
        assert [m.value for m in history] == pytest.approx([row[key] for row in expected]), key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"best.pt", "learning_curve.png"} <= artifacts


def test_wandb_offline_writes_the_run_under_the_run_dir_and_names_the_stats(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    result = run_train(*SHORT, "+logger=wandb", "logger.wandb.tags=[smoke]", run_dir=run_dir,
                       env={"WANDB_API_KEY": "", "WANDB_SILENT": "true", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    (log_file,) = offline.glob("run-*.wandb")
    data = log_file.read_bytes()
    for key in ("train/return_mean", "eval/return_mean", "learner/loss", "algorithm.lr", "smoke"):
        assert key.encode() in data, key


def test_several_trackers_and_a_users_own(tmp_path):
    pytest.importorskip("mlflow")
    overrides = write_logger(tmp_path, "csv", "csv:\n  _target_: tests.user_components.CsvWriter\n  filename: returns.csv\n")
    overrides[-1] = "+logger=[csv,mlflow]"
    run_dir = tmp_path / "run"
    result = run_train(*overrides, *SHORT, "seed=7", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    lines = (run_dir / "returns.csv").read_text().splitlines()
    assert lines[0] == "# seed 7" and [int(line.split(",")[0]) for line in lines[2:]] == [r["epoch"] for r in read_stats(run_dir)]
    assert (tmp_path / "mlruns").is_dir()


def test_a_tracker_whose_package_is_missing_is_one_line_naming_the_extra(tmp_path):
    overrides = write_logger(tmp_path, "missing", "missing:\n  _target_: tests.user_components.NeedsMissingPackageWriter\n")
    run_dir = tmp_path / "run"
    result = run_train(*overrides, *SHORT, run_dir=run_dir)
    assert result.returncode == 2
    assert result.stderr.strip() == ("train: error: logger.missing: the no_such_tracker_package package is not installed; "
                                     "pip install 'maze_cli[nosuch]' (or drop +logger=missing)")
    assert not run_dir.exists()


def test_a_misspelt_tracker_key_names_the_key(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(*SHORT, "+logger=mlflow", "+logger.mlflow.experimnt=x", run_dir=run_dir)
    assert result.returncode == 2 and "logger.mlflow.experimnt" in result.stderr and "experiment" in result.stderr


def test_the_jobs_of_a_multirun_share_a_wandb_group(tmp_path):
    pytest.importorskip("wandb")
    sweep_dir = tmp_path / "sweep"
    result = run_train("-m", *SHORT, "max_env_steps=1", "eval.interval=0", "+logger=wandb", "seed=1,2", f"hydra.sweep.dir={sweep_dir}",
                       env={"WANDB_API_KEY": "", "WANDB_SILENT": "true", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    logs = sorted(sweep_dir.glob("*/wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 2
    assert all(str(sweep_dir).encode() in path.read_bytes() for path in logs)
