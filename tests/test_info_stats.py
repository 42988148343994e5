"""Env statistics (`env.info_stats`, `is_success`): reduced per episode in the actors, per epoch by the
trainer, on single and vectorized envs, through the real `train` command and its evaluation."""

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from maze_cli.envs import EnvFactory, EnvSource
from maze_cli.envs.info_stats import REDUCTIONS, EpisodeInfoStats, vector_infos
from maze_cli.errors import ConfigError
from maze_cli.parallel import SequentialDistributedActors
from maze_cli.policies import ActorCritic, mlp_network
from tests.cli import run_train
from tests.envs import InfoEnv

LENGTH = 5
# What InfoEnv's `distance` (1, 2, ..., 5 over an episode) reduces to, per reduction.
EXPECTED = {"last": 5.0, "sum": 15.0, "mean": 3.0, "max": 5.0, "min": 1.0}
ALL = {f"d_{r}": r for r in REDUCTIONS}


class InfoEnvFactory(EnvSource):
    """InfoEnv with the keys of ALL renamed per reduction, built one by one or as gymnasium's
    SyncVectorEnv in the autoreset mode given (`vector_mode` None: single envs); an `EnvSource`, so
    the actors follow its `info_stats` and step its `vector_env`."""

    def __init__(self, vector_mode=None, truncate: bool = False):
        self.vector_mode, self.truncate = vector_mode, truncate
        self.info_stats = {"distance": "mean", **{f"d_{r}": r for r in REDUCTIONS}}

    def __call__(self) -> gym.Env:
        return _Renamed(InfoEnv(LENGTH, truncate=self.truncate))

    def vector_env(self, n_envs: int):
        if self.vector_mode is None:
            return None
        return gym.vector.SyncVectorEnv([self for _ in range(n_envs)], autoreset_mode=self.vector_mode)


class _Renamed(gym.Wrapper):
    """InfoEnv's `distance` also under d_<reduction> for each reduction."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, **{key: info["distance"] for key in ALL}}


@pytest.mark.parametrize("vector_mode", [None, gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP],
                         ids=["single", "next_step", "same_step"])
@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
def test_each_reduction_gives_what_the_env_reported(vector_mode, truncate):
    factory = InfoEnvFactory(vector_mode, truncate)
    env = factory()
    policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)))
    # 4 envs x 48 steps: every env ends at least 8 episodes (an even number of them in each column
    # for single envs and same-step mode: 48 / 5 -> 9 ended, so the rate is judged on the values).
    with SequentialDistributedActors(factory, policy, 48, 1, 1, envs_per_actor=4) as actors:
        actors.collect_outputs("cpu")
        for reduction, value in EXPECTED.items():
            assert actors.get_stats_value(f"env/d_{reduction}") == value, reduction
        assert actors.get_stats_value("env/distance") == 3.0
        n = actors.get_stats_value("episode_return", name="count")
        successes = actors.epoch_stats.values("is_success")
        assert len(successes) == len(actors.epoch_stats.values("env/distance")) == n > 0
        # Per env the episodes alternate success, failure, ...: ceil(k / 2) successes of k episodes.
        assert sum(successes) == sum((k + 1) // 2 for k in _episodes_per_env(n, 4))


def _episodes_per_env(n: int, envs: int) -> list[int]:
    """Every env ends the same number of episodes in these runs (equal lengths, same start)."""
    assert n % envs == 0
    return [n // envs] * envs


def test_vector_infos_use_the_masks_and_the_final_info_of_same_step_resets():
    info = {"d": np.array([1.0, 2.0, 0.0]), "_d": np.array([True, True, False]),
            "final_info": {"d": np.array([0.0, 9.0, 0.0]), "_d": np.array([False, True, False])}}
    ended = np.array([False, True, False])
    assert vector_infos(info, ("d",), ended, same_step=False) == {0: {"d": 1.0}, 1: {"d": 2.0}}
    assert vector_infos(info, ("d",), ended, same_step=True) == {0: {"d": 1.0}, 1: {"d": 9.0}}


def test_episodes_that_report_nothing_add_nothing():
    stats = EpisodeInfoStats({"d": "sum"}, 2)
    stats.observe({0: {"d": 2}}, np.array([False, False]))
    stats.observe({}, np.array([True, True]))
    assert stats.take() == {"env/d": [2.0]}


def test_an_is_success_that_is_no_number_is_no_success_flag_unless_listed():
    stats = EpisodeInfoStats({}, 1)
    stats.observe({0: {"is_success": None}}, np.array([True]))
    assert stats.take() == {} and stats.error is None
    listed = EpisodeInfoStats({"is_success": "last"}, 1)
    listed.observe({0: {"is_success": None}}, np.array([True]))
    assert listed.error.startswith("env.info_stats.is_success: the env reported None")


def test_bad_reductions_and_non_numeric_values_are_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^env.info_stats.distance=median: unknown reduction; use one of last, sum"):
        EnvFactory({"id": "CartPole-v1", "info_stats": {"distance": "median"}})
    factory = EnvFactory({"_target_": "tests.envs.InfoEnv", "length": 2, "info_stats": {"label": "last"}})
    with pytest.raises(ConfigError, match=r"^env.info_stats.label: the env reported 'far' \(str\)"):
        factory.check()


def info_env_config(tmp_path: Path, info_stats: str, action_kind: str = "discrete") -> list[str]:
    """A user's env config in --config-dir: InfoEnv with its env statistics."""
    config_dir = tmp_path / "conf"
    (config_dir / "env").mkdir(parents=True, exist_ok=True)
    (config_dir / "env" / "info.yaml").write_text(
        f"_target_: tests.envs.InfoEnv\nlength: 5\naction_kind: {action_kind}\ninfo_stats: {info_stats}\n")
    return ["--config-dir", str(config_dir), "+env=info"]


def read_stats(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("runner, algorithm", [("sequential", "impala"), ("subproc", "impala"), ("subproc", "sac"), ("ray", "ppo")])
def test_train_logs_env_stats_and_success_rates_for_training_and_evaluation(tmp_path, runner, algorithm):
    if runner == "ray":
        pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    args = [*info_env_config(tmp_path, "{distance: max, missing: sum}", "box" if algorithm == "sac" else "discrete"),
            f"runner={runner}", f"algorithm={algorithm}", "max_env_steps=2000", "target_return=null", "eval.episodes=4"]
    # SAC: an epoch of 50 iterations (a rollout's gradient steps each) after 200 random transitions
    args += ["algorithm.initial_buffer_size=200", "epoch_length=50"] if algorithm == "sac" else ["epoch_length=2"]
    result = run_train(*args, run_dir=run_dir, env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert result.returncode == 0, result.stderr
    rows = [row for row in read_stats(run_dir) if row.get("train/episodes")]
    assert rows and all(row["env/distance"] == 5.0 for row in rows)
    assert all(0.0 <= row["train/success_rate"] <= 1.0 for row in rows)
    assert all("env/missing" not in row for row in rows)
    last = read_stats(run_dir)[-1]
    # Each eval env plays its first episode, which InfoEnv counts a success.
    assert last["eval/env/distance"] == 5.0 and last["eval/success_rate"] == 1.0
    assert result.stdout.count("env.info_stats.missing: none of the first") + result.stderr.count("env.info_stats.missing: none of") == 1
    assert (run_dir / "tensorboard").is_dir()


def test_env_stats_go_on_after_resume(tmp_path):
    run_dir = tmp_path / "run"
    # IMPALA's batches of 512 samples here: several epochs within 1,000 env steps (APPO's first batch holds 2,048)
    args = [*info_env_config(tmp_path, "{distance: sum}"), "algorithm=impala", "runner=sequential", "epoch_length=2", "target_return=null",
            "eval.interval=0"]
    assert run_train(*args, "max_env_steps=1000", run_dir=run_dir).returncode == 0
    n_before = len(read_stats(run_dir))
    resumed = run_train(f"resume={run_dir}", "max_env_steps=2000", run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr
    after = [row for row in read_stats(run_dir)[n_before:] if row.get("train/episodes")]
    assert after and all(row["env/distance"] == 15.0 for row in after)


def test_a_non_numeric_value_stops_the_run_with_one_line(tmp_path):
    result = run_train(*info_env_config(tmp_path, "{label: last}"), "runner=sequential", "max_env_steps=500", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "train: error: env.info_stats.label: the env reported 'far' (str) for info['label'], not a number; "
        "follow only numeric info keys (bools count as 0 and 1)"]
