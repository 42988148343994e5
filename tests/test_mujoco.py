"""gymnasium's MuJoCo envs as a family (`+env=mujoco`, extra `mujoco`): its settings, its warnings
shown once, a clear message without MuJoCo, and PPO learning a MuJoCo task (SAC's figures: benchmarks/MUJOCO.md)."""

import sys

import pytest

from maze_cli.envs import EnvFactory
from maze_cli.errors import ConfigError
from tests.cli import run_train
from tests.test_train import read_stats

pytest.importorskip("mujoco")

SETTLED = "compiler attribute 'settotalmass' is deprecated"  # printed by MuJoCo for each HalfCheetah model it compiles


def test_without_mujoco_a_mujoco_id_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # `import mujoco` now raises ImportError
    with pytest.raises(ConfigError, match=r"^env.id=Hopper-v5: a MuJoCo env, and MuJoCo is not installed; pip install 'maze_cli\[mujoco\]'"):
        EnvFactory({"id": "Hopper-v5"})()


def test_a_ppo_run_shows_mujocos_warning_once_and_evaluates_by_env_steps(tmp_path):
    """Two actors and every evaluation build HalfCheetahs, each compile of which makes MuJoCo warn."""
    run_dir = tmp_path / "run"
    result = run_train("+env=mujoco", "env.id=HalfCheetah-v5", "algorithm=ppo", "algorithm.n_rollout_steps=32",
                       "algorithm.n_epochs=1", "runner.envs_per_actor=2", "epoch_length=5", "max_env_steps=1920", "eval.interval_env_steps=1000",
                       "eval.episodes=2", "+env.max_episode_steps=50", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert output.count(SETTLED) == 1, output
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()  # MuJoCo's own handler would also log to a file in the cwd
    rows = read_stats(run_dir)
    assert [row["env_steps"] for row in rows] == [640, 1280, 1920]  # 5 batches of 2 x 2 x 32 an epoch
    evaluated = [row for row in rows if "eval/return_mean" in row]
    assert [row["env_steps"] for row in evaluated] == [1280, 1920]  # the first past 1,000 env steps, and the last
    assert all(0 < row["time/eval_share"] < 1 for row in evaluated)


def test_the_family_settings_reach_ppo_and_sac_and_the_command_line_wins():
    import yaml

    from tests.test_components import composed

    ppo = yaml.safe_load(composed("+env=mujoco", "algorithm=ppo"))
    assert (ppo["algorithm"]["n_epochs"], ppo["algorithm"]["n_minibatches"], ppo["algorithm"]["anneal_lr"]) == (10, 32, True)
    assert ppo["eval"]["interval_env_steps"] == 10000 and ppo["env"]["id"] == "Hopper-v5"
    sac = yaml.safe_load(composed("+env=mujoco", "env.id=Walker2d-v5", "algorithm=sac", "algorithm.initial_buffer_size=7"))
    assert sac["algorithm"]["initial_buffer_size"] == 7 and sac["policy"]["hidden_sizes"] == [256, 256]
    impala = yaml.safe_load(composed("+env=mujoco", "algorithm=impala"))
    assert impala["algorithm"]["n_rollout_steps"] == 32  # IMPALA has no MuJoCo file: its own defaults


@pytest.mark.slow
def test_ppo_learns_inverted_pendulum_with_the_family_settings(tmp_path):
    """MuJoCo's InvertedPendulum: 1,000 a greedy episode once balanced; random play scores under 10."""
    run_dir = tmp_path / "run"
    result = run_train("+env=mujoco", "env.id=InvertedPendulum-v5", "algorithm=ppo", "max_env_steps=150000", "target_return=1000",
                       "eval.interval_env_steps=20000", "eval.episodes=5", run_dir=run_dir, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    assert rows[-1]["eval/return_mean"] >= 1000, [row.get("eval/return_mean") for row in rows]
