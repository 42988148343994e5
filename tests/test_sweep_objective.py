"""`train` returns its objective (sweep.objective), so Hydra's Optuna sweeper runs trials, finds the best
and the sweep dir gets summary.csv and summary.png."""

import csv
import json
import math
import subprocess
from types import SimpleNamespace

import pytest
import yaml

from maze_cli.cli.sweep import objective
from maze_cli.config.schema import EvalConfig, SweepConfig
from tests.cli import TRAIN

ROWS = [{"epoch": 1, "eval/return_mean": 10.0, "train/return_mean": 5.0},
        {"epoch": 2, "train/return_mean": 7.0, "train/return_window_mean": 6.0},
        {"epoch": 3, "eval/return_mean": 30.0, "train/return_mean": 9.0, "train/return_window_mean": 8.0},
        {"epoch": 4, "eval/return_mean": 20.0, "train/return_mean": 4.0, "train/return_window_mean": 7.5}]


def settings(key=None, reduce="max", interval=1):
    return SimpleNamespace(sweep=SweepConfig(objective=key, reduce=reduce), eval=EvalConfig(interval=interval))


def test_the_objective_is_the_best_eval_return_or_the_chosen_key_reduced(tmp_path):
    (tmp_path / "stats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert objective(tmp_path, settings()) == 30.0
    assert objective(tmp_path, settings(interval=0)) == 7.5  # the last training window mean
    assert objective(tmp_path, settings("train/return_mean", "last")) == 4.0
    assert objective(tmp_path, settings("train/return_mean", "min")) == 4.0
    assert objective(tmp_path, settings("train/return_mean", "mean")) == 6.25
    assert math.isnan(objective(tmp_path, settings("eval/success_rate")))


def test_an_optuna_sweep_completes_its_trials_and_writes_the_summary(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run([str(TRAIN), "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.direction=maximize",
                             "hydra.sweeper.sampler.seed=1", "+env=cartpole", "runner=sequential", "max_env_steps=1000",
                             "eval.episodes=2", "algorithm.lr=interval(1e-4,3e-3)", f"hydra.sweep.dir={sweep_dir}"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((sweep_dir / "summary.csv").open()))
    assert len(rows) == 3 and (sweep_dir / "summary.png").is_file()
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(float(row["best_return"]) for row in rows)
    assert all(row["objective_key"] == "eval/return_mean" and float(row["objective"]) == float(row["best_return"]) for row in rows)


def test_a_chosen_objective_is_what_the_summary_reports(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run([str(TRAIN), "-m", "+env=cartpole", "runner=sequential", "max_env_steps=2000", "epoch_length=1", "eval.interval=0",
                             "sweep.objective=train/return_mean", "sweep.reduce=min", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for row in csv.DictReader((sweep_dir / "summary.csv").open()):
        returns = [json.loads(line)["train/return_mean"] for line in (sweep_dir / row["job"] / "stats.jsonl").read_text().splitlines()]
        assert row["objective_key"] == "train/return_mean" and float(row["objective"]) == min(returns)
