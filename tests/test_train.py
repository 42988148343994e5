"""End to end through the real `train` command: learning, outputs, seeds, user envs, clean exit."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from maze_cli.stats.same_run import without_timings
from tests.cli import run_train
from tests.helpers import processes_with_env_tag

REQUIRED_STATS = [
    "epoch", "env_steps", "time_s", "sps", "train/return_mean", "train/return_min", "train/return_max",
    "train/episode_length_mean", "learner/policy_loss", "learner/value_loss", "learner/entropy",
    "learner/grad_norm", "policy_lag_mean", "queue_size", "time/wait_actors_s", "time/learner_s",
]


def read_stats(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cartpole_on_subprocess_actors_learns_far_above_random(tmp_path):
    run_dir = tmp_path / "run"
    # Short epochs (10 updates), so the first one is near random: the default's 80 already learn.
    result = run_train("+env=cartpole", "runner=subproc", "max_env_steps=600000", "target_return=null", "epoch_length=10", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    stats = read_stats(run_dir)
    for key in REQUIRED_STATS:
        assert key in stats[-1], key
    assert stats[-1]["env_steps"] >= 600000
    # A random policy averages about 22 on CartPole-v1; learning may dip, but not back to random.
    returns = [row["train/return_mean"] for row in stats]
    assert max(returns) > 150 and max(returns[-3:]) > 60, returns
    assert stats[0]["train/return_mean"] < 60

    assert (run_dir / "config.yaml").is_file() and (run_dir / "train.log").stat().st_size > 0
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["trainer"]["env_steps"] == stats[-1]["env_steps"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    returns = events.Scalars("train/return_mean")
    assert [e.step for e in returns] == [row["env_steps"] for row in stats]
    assert returns[-1].value == pytest.approx(stats[-1]["train/return_mean"], rel=1e-5)
    assert processes_with_env_tag(result.tag) == []


def test_same_seed_gives_identical_sequential_runs_and_another_seed_differs(tmp_path):
    common = ["+env=cartpole", "runner=sequential", "runner.envs_per_actor=8", "runner.batch_size=2", "max_env_steps=6144",
              "epoch_length=2"]  # 6 epochs of 2 updates of 2 x 8 x 32 steps
    runs = {}
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        result = run_train(*common, f"seed={seed}", run_dir=tmp_path / name)
        assert result.returncode == 0, result.stderr
        runs[name] = without_timings(read_stats(tmp_path / name))
    assert len(runs["a"]) == 6
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_explicit_actor_seeds_override_the_derived_ones():
    from omegaconf import OmegaConf

    from maze_cli.cli.build import build_run, check_env
    from maze_cli.algorithms.impala import ImpalaConfig
    from maze_cli.config.schema import MlpPolicyConfig, SubprocRunnerConfig, TrainConfig, UniformReplayConfig
    from maze_cli.cli.settings import Settings
    from maze_cli.seeding import derive_seeds

    runner = SubprocRunnerConfig(n_actors=2, envs_per_actor=8, actor_env_seeds=[21, 22])
    groups = [OmegaConf.structured(c) for c in (ImpalaConfig(), MlpPolicyConfig(), runner, UniformReplayConfig())]
    settings = Settings(TrainConfig(seed=5), {"id": "CartPole-v1"}, *groups)
    factory, obs_space, act_space = check_env(settings)
    actors = build_run(settings, factory, obs_space, act_space).runner
    assert actors.actor_env_seeds == [21, 22]
    assert actors.actor_agent_seeds == derive_seeds(5, "actor_agent", 2)


@pytest.mark.parametrize("env_args", [["+env=pendulum"], ["+env=acrobot"], ["+env=gym", "env.id=MountainCar-v0", "env.max_episode_steps=50"]])
def test_the_packaged_env_configs_run(tmp_path, env_args):
    result = run_train(*env_args, "runner=sequential", "max_env_steps=3000", "epoch_length=2", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert read_stats(tmp_path / "run")[-1]["env_steps"] >= 3000


def test_a_users_own_env_from_a_config_dir(tmp_path):
    config_dir = tmp_path / "my_configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "counting.yaml").write_text(
        "_target_: tests.envs.CountingEnv\nlength: 7\nobs_kind: dict\naction_kind: multidiscrete\n"
    )
    result = run_train("--config-dir", str(config_dir), "+env=counting", "runner.n_actors=2", "max_env_steps=2000",
                       "epoch_length=1", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    stats = read_stats(tmp_path / "run")
    assert stats[-1]["train/return_mean"] == 7.0  # every episode lasts exactly 7 steps, reward 1 each
    assert processes_with_env_tag(result.tag) == []


def test_obs_keys_leave_out_a_key_no_network_reads(tmp_path):
    config_dir = tmp_path / "my_configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "mission.yaml").write_text("_target_: tests.envs.MissionEnv\nlength: 7\n")
    result = run_train("--config-dir", str(config_dir), "+env=mission", "+env.obs_keys=[count]", "runner=sequential",
                       "max_env_steps=2000", "epoch_length=1", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "observations Dict(count: Box(1,) float32)" in result.stdout  # parity left out too, as asked
    assert read_stats(tmp_path / "run")[-1]["train/return_mean"] == 7.0


def test_a_key_no_network_reads_is_left_out_by_itself_and_config_yaml_says_so(tmp_path):
    config_dir = tmp_path / "my_configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "mission.yaml").write_text("_target_: tests.envs.MissionEnv\nlength: 7\n")
    result = run_train("--config-dir", str(config_dir), "+env=mission", "runner=sequential", "max_env_steps=2000", "epoch_length=1",
                       run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "env.obs_keys=[count,parity], chosen for this env: no network reads 'mission' (Text)" in result.stdout
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["env"]["obs_keys"] == ["count", "parity"]
    assert read_stats(tmp_path / "run")[-1]["train/return_mean"] == 7.0


def test_a_tuple_observation_is_read_as_a_dict_and_learned(tmp_path):
    """gymnasium's Blackjack observes a Tuple of three Discretes (hand, dealer's card, usable ace): each entry a
    one-hot, as a Dict's entries are. Over these 500 hands random play returns -0.41, always sticking -0.20."""
    run_dir = tmp_path / "run"
    result = run_train("+env=gym", "env.id=Blackjack-v1", "runner=sequential", "max_env_steps=30000", "target_return=null",
                       "eval.episodes=500", "seed=0", run_dir=run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "observations Dict(0: Discrete(32), 1: Discrete(11), 2: Discrete(2))" in result.stdout
    assert read_stats(run_dir)[-1]["eval/return_mean"] > -0.15


def test_max_time_s_stops_the_run(tmp_path):
    result = run_train("+env=cartpole", "runner=sequential", "max_time_s=2", "max_env_steps=100000000", "target_return=null",
                       "epoch_length=5",
                       run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "stopped: max_time_s" in result.stdout
    assert 2 <= read_stats(tmp_path / "run")[-1]["time_s"] < 10


@pytest.mark.parametrize("runner", ["sequential", "subproc"])
def test_an_env_that_raises_in_an_actor_ends_the_run_with_its_error(tmp_path, runner):
    config_dir = tmp_path / "my_configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "flaky.yaml").write_text("_target_: tests.envs.StepRaisingEnv\nfail_after: 300\n")
    result = run_train("--config-dir", str(config_dir), "+env=flaky", f"runner={runner}", run_dir=tmp_path / "run", timeout=60)
    assert result.returncode == 1
    assert "train: error: actor" in result.stderr and "injected failure in step" in result.stderr
    assert processes_with_env_tag(result.tag) == []


def test_the_console_shows_a_row_at_most_every_interval_and_always_the_last(caplog):
    from maze_cli.stats.writers import ConsoleTable

    table = ConsoleTable(min_interval_s=60)
    with caplog.at_level("INFO", logger="maze_cli"):
        for epoch in range(1, 6):
            table.write({"epoch": epoch, "env_steps": epoch * 100})
        table.close()
    rows = [r.getMessage().split()[0] for r in caplog.records if not r.getMessage().lstrip().startswith("epoch")]
    assert rows == ["1", "5"]


@pytest.mark.parametrize("args,envs,evals", [
    (["+env=acrobot"], 16, 1),
    (["+env=cartpole"], 32, 1),  # its tuning file's
    (["+env=pendulum", "algorithm=sac"], 2, 1),
    (["+env=cartpole", "runner.envs_per_actor=4", "eval.interval=3"], 4, 3),
])
def test_keys_left_null_take_the_algorithms_defaults(args, envs, evals):
    from maze_cli.cli.build import build_run, check_env
    from maze_cli.cli.paths import compose_train
    from maze_cli.cli.settings import validate

    settings = validate(compose_train(args + ["runner=sequential"]), [])
    factory, obs_space, act_space = check_env(settings)
    actors = build_run(settings, factory, obs_space, act_space).runner
    actors = getattr(actors, "actors", actors)
    assert (actors.envs_per_actor, settings.train.eval.interval) == (envs, evals)
