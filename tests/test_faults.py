"""Runs that must stop clearly: a diverging loss, a wrong env."""

import json
import time

import pytest

from tests.cli import SAC_CHEAP, fault_env, restart_budget, run_train, stopped_by
from tests.helpers import processes_with_env_tag
from tests.test_cli_errors import assert_one_line_error


def test_a_non_finite_loss_stops_the_run_naming_the_epoch_and_the_last_good_checkpoint(tmp_path):
    result = run_train("+env=cartpole", "runner=subproc", "algorithm.lr=1e30", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert "learner/loss became" in line and "in epoch 1" in line and "no checkpoint was written" in line
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()  # diverged weights are never saved
    assert processes_with_env_tag(result.tag) == []


def test_a_non_finite_loss_after_a_checkpoint_names_it(tmp_path):
    # SAC with an absurd learning rate diverges a few epochs in, after last.pt was written at epoch 1.
    result = run_train("+env=pendulum", "algorithm=sac", "runner=sequential", "algorithm.lr=1e12", "checkpoint.interval=1",
                       "epoch_length=1", "algorithm.initial_buffer_size=64", "algorithm.batch_size=16", "eval.interval=0",
                       run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "became" in line and f"the last good checkpoint is {tmp_path / 'run' / 'checkpoints' / 'last.pt'}" in line


def test_a_wrong_env_is_caught_by_the_env_checker_before_any_actor_starts(tmp_path):
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "wrong.yaml").write_text("_target_: tests.envs.OutOfSpaceEnv\n")
    result = run_train("--config-dir", str(config_dir), "+env=wrong", run_dir=tmp_path / "run")
    assert_one_line_error(result, "tests.envs.OutOfSpaceEnv", "env checker", "observation")


FAULTS = [("sequential", "raise_step"), ("sequential", "raise_reset"), ("sequential", "hang"), ("subproc", "raise_step"),
          ("subproc", "raise_reset"), ("subproc", "sigkill"), ("subproc", "hang")]
EXPECTED_ERROR = {"raise_step": "injected failure in step", "raise_reset": "injected failure in reset",
                  "sigkill": "exited with code -9", "hang": "silent: no rollout"}


def read_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("runner,fault", FAULTS)
def test_with_restarts_the_run_completes_its_budget(tmp_path, runner, fault):
    budget = restart_budget(fault, seconds=10)  # outlasts rollout_timeout_s=3
    result = run_train(*fault_env(tmp_path, fault), f"runner={runner}", "runner.rollout_timeout_s=3", *budget,
                       "epoch_length=5", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fault").exists()  # the fault really happened
    log = (tmp_path / "run" / "train.log").read_text()
    assert "restarting it: restart 1 of 3" in log and EXPECTED_ERROR[fault].split(":")[0] in log
    assert stopped_by(budget) in log  # the budget ran out: the restart kept the run going
    stats = read_rows(tmp_path / "run")
    assert sum(row.get("actor_restarts", 0) for row in stats) == 1
    assert processes_with_env_tag(result.tag) == []


@pytest.mark.parametrize("runner,fault", FAULTS)
def test_without_restarts_the_run_fails_fast_with_the_error(tmp_path, runner, fault):
    start = time.monotonic()
    result = run_train(*fault_env(tmp_path, fault), f"runner={runner}", "runner.rollout_timeout_s=3", "runner.max_restarts=0",
                       "max_env_steps=10000000", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - start < 30
    assert "train: error: actor" in result.stderr and EXPECTED_ERROR[fault] in result.stderr
    assert "runner.max_restarts=0" in result.stderr
    assert processes_with_env_tag(result.tag) == []


@pytest.mark.parametrize("runner", ["sequential", "subproc"])
def test_workers_with_buffer_restart_a_failed_worker(tmp_path, runner):
    result = run_train(*fault_env(tmp_path, "raise_step", action_kind="box"), "algorithm=sac", f"runner={runner}",
                       "max_env_steps=6000", "epoch_length=2", *SAC_CHEAP, run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fault").exists()
    assert "restarting it: restart 1 of 3" in (tmp_path / "run" / "train.log").read_text()
    assert sum(row.get("actor_restarts", 0) for row in read_rows(tmp_path / "run")) == 1
    assert processes_with_env_tag(result.tag) == []


def test_an_env_failing_in_evaluation_skips_that_evaluation_and_training_goes_on(tmp_path):
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "evalfault.yaml").write_text("_target_: tests.envs.LearnerSideFaultEnv\nafter: 100\n")
    result = run_train("--config-dir", str(config_dir), "+env=evalfault", "runner=subproc", "max_env_steps=20000",
                       "epoch_length=2", "eval.interval=1", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "failed (RuntimeError: injected failure in evaluation); skipped, training goes on" in (tmp_path / "run" / "train.log").read_text()
    rows = read_rows(tmp_path / "run")
    assert rows[-1]["env_steps"] >= 20000
    assert sum(row.get("eval/failures", 0) for row in rows) >= len(rows) - 2  # the first evaluations may pass
    assert processes_with_env_tag(result.tag) == []
