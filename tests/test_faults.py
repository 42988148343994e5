"""Runs that must stop clearly: a diverging loss, a wrong env."""

from tests.cli import run_train
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
