"""Warm start (`init_from=`): a new run from a checkpoint's policy, refused in one line when it cannot fit."""

from __future__ import annotations

import pytest
import torch

from maze_cli.checkpoint import load_checkpoint
from tests.cli import run_train
from tests.test_train import read_stats

SHORT = ["runner=sequential", "epoch_length=2", "eval.episodes=3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A CartPole policy trained briefly; its best.pt is what the tests start from."""
    run_dir = tmp_path_factory.mktemp("source") / "run"
    result = run_train("+env=cartpole", *SHORT, "max_env_steps=12000", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir


def test_a_warm_start_begins_where_the_checkpoint_ended_with_fresh_counters(trained, tmp_path):
    best = trained / "checkpoints" / "best.pt"
    checkpoint_eval = load_checkpoint(best)["trainer"]["best_eval"]
    run_dir = tmp_path / "warm"
    result = run_train("+env=cartpole", *SHORT, "max_env_steps=1000", f"init_from={best}", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    # Epoch 0 evaluates the policy as loaded, on the same eval seeds (same `seed`): the checkpoint's own figure.
    assert rows[0]["epoch"] == 0 and rows[0]["env_steps"] == 0
    assert rows[0]["eval/return_mean"] == pytest.approx(checkpoint_eval)
    assert [r["epoch"] for r in rows[1:]] == list(range(1, len(rows)))
    assert rows[-1]["env_steps"] < read_stats(trained)[-1]["env_steps"]  # counters start at 0, not at the source run's
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["learner"]["updates"] < 10
    assert "done: max_env_steps" in result.stdout and str(run_dir / "checkpoints" / "best.pt") in result.stdout


def test_a_cold_start_differs_from_the_warm_one(trained, tmp_path):
    """The test above could pass by accident if a fresh policy scored like the trained one."""
    warm = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)["learner"]["policy"]
    run_dir = tmp_path / "cold"
    assert run_train("+env=cartpole", *SHORT, "max_env_steps=1", "eval.interval=0", run_dir=run_dir).returncode == 0
    cold = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["learner"]["policy"]
    assert any(not torch.equal(warm[k], cold[k]) for k in warm)


def test_optimizer_state_comes_along_only_when_asked(trained, tmp_path):
    source = load_checkpoint(trained / "checkpoints" / "last.pt")["learner"]["optimizers"]["policy"]
    run_dir = tmp_path / "with-optimizer"
    # max_env_steps=1: one update happens, so compare the step counter, which that update moves by one.
    result = run_train("+env=cartpole", *SHORT, "max_env_steps=1", "eval.interval=0",
                       f"init_from={trained / 'checkpoints' / 'last.pt'}", "init_from.optimizer=true", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    after = load_checkpoint(run_dir / "checkpoints" / "last.pt")["learner"]["optimizers"]["policy"]
    assert float(after["state"][0]["step"]) == float(source["state"][0]["step"]) + 1


def test_a_checkpoint_of_another_env_is_refused_before_any_actor_starts(trained, tmp_path):
    run_dir = tmp_path / "acrobot"
    result = run_train("+env=acrobot", *SHORT, f"init_from={trained / 'checkpoints' / 'best.pt'}", run_dir=run_dir)
    assert result.returncode == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "init_from=" in message and "Box(" in message and "(4,)" in message and "(6,)" in message
    assert not run_dir.exists()  # nothing written: the run never started


def test_a_network_of_another_shape_is_refused_naming_the_weight(trained, tmp_path):
    result = run_train("+env=cartpole", *SHORT, "policy.hidden_sizes=[32]", f"init_from={trained / 'checkpoints' / 'best.pt'}",
                       run_dir=tmp_path / "narrow")
    assert result.returncode == 2
    assert "has shape" in result.stderr and "policy.*" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_init_from_may_come_from_a_config_file(trained, tmp_path):
    """A sweep fine-tunes one checkpoint with several seeds: init_from set in an env config file."""
    config_dir = tmp_path / "configs" / "env"
    config_dir.mkdir(parents=True)
    (config_dir / "finetune.yaml").write_text(
        f"# @package _global_\nenv:\n  id: CartPole-v1\ninit_from:\n  path: {trained / 'checkpoints' / 'best.pt'}\n")
    run_dir = tmp_path / "from-file"
    result = run_train("--config-dir", str(tmp_path / "configs"), "+env=finetune", *SHORT, "max_env_steps=1000", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert read_stats(run_dir)[0]["epoch"] == 0
