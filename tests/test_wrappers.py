"""Env wrappers from config (`env.wrappers`): applied in order to every env, recorded in checkpoints
as data and rebuilt by `rollout` under the allow-list rule, and the wrapper that fixes an env named."""

import subprocess
import sys

import pytest

from maze_cli.envs import EnvFactory
from maze_cli.errors import ConfigError, UnsupportedSpaceError
from maze_cli.parallel import SequentialDistributedActors
from maze_cli.policies import ActorCritic, mlp_network
from tests.cli import REPO, run_train

COUNTING = {"_target_": "tests.envs.CountingEnv", "length": 10}


def test_wrappers_apply_in_order_with_their_arguments():
    factory = EnvFactory({**COUNTING, "wrappers": [
        {"_target_": "gymnasium.wrappers.TimeLimit", "max_episode_steps": 3},
        {"_target_": "tests.envs.ScaledReward", "scale": 0.5}]})
    env = factory()
    assert [type(w).__name__ for w in _chain(env)][:2] == ["ScaledReward", "TimeLimit"]
    policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)))
    with SequentialDistributedActors(factory, policy, 12, 1, 1, envs_per_actor=2) as actors:
        actors.collect_outputs("cpu")
        assert actors.get_stats_value("episode_length", name="max") == 3  # the time limit
        assert actors.get_stats_value("episode_return") == 1.5  # 3 steps of reward 1, scaled


def _chain(env):
    while env is not None:
        yield env
        env = getattr(env, "env", None)


def test_a_dotted_name_alone_is_called_with_the_env():
    env = EnvFactory({"id": "CartPole-v1", "wrappers": ["gymnasium.wrappers.FlattenObservation"]})()
    assert type(env).__name__ == "FlattenObservation"


@pytest.mark.parametrize("wrappers, message", [
    ("gymnasium.wrappers.TimeLimit", r"^env.wrappers: expected a list"),
    ([3], r"^env.wrappers\[0\]: expected a dotted name or"),
    (["no_such_pkg.Wrapper"], r"^env.wrappers\[0\]=no_such_pkg.Wrapper: cannot import it"),
    ([{"_target_": "tests.envs.ScaledReward", "scael": 2}], r"^env.wrappers\[0\]=tests.envs.ScaledReward: TypeError: .*scael"),
])
def test_bad_wrappers_are_one_line_naming_the_entry(wrappers, message):
    with pytest.raises(ConfigError, match=message):
        EnvFactory({**COUNTING, "wrappers": wrappers}).check()


def test_a_text_mission_names_the_wrapper_that_fixes_it():
    with pytest.raises(UnsupportedSpaceError, match=r"wrap the env with the wrapper made for it: "
                                                    r"env.wrappers=\[minigrid.wrappers.ImgObsWrapper\]"):
        EnvFactory({"_target_": "tests.envs.MissionEnv"}).check()


def test_train_without_plus_on_packaged_env_keys(tmp_path):
    """The packaged env configs carry maze_cli's own keys: set without a +."""
    result = run_train("+env=cartpole", "runner=sequential", "max_env_steps=1", "env.check=false",
                       "env.wrappers=[gymnasium.wrappers.FlattenObservation]", "env.register=gymnasium", "env.info_stats={x: sum}",
                       run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    result = run_train("+env=gym", "env.id=Nope-v0", "env.register=no_such_module", run_dir=tmp_path / "gym")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("train: error: env.register=no_such_module: cannot import it")


def rollout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "maze_cli.cli.rollout", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_rollout_rebuilds_wrappers_and_refuses_the_users_own_unless_allowed(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "runner=sequential", "max_env_steps=1", "eval.interval=0",
                       "env.wrappers=[gymnasium.wrappers.FlattenObservation,{_target_: tests.envs.ScaledReward, scale: 2.0}]",
                       run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    checkpoint = f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}"
    refused = rollout(checkpoint, "episodes=2")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("rollout: error: " f"{checkpoint}: its env is wrapped by 'tests.envs.ScaledReward'")
    allowed = rollout(checkpoint, "episodes=2", "allow=[tests.envs.ScaledReward]")
    assert allowed.returncode == 0, allowed.stderr
    # Rewards scaled by 2 (CartPole pays 1 a step): the returns are twice the episodes' lengths.
    words = allowed.stdout.split()
    assert float(words[words.index("return") + 1]) == 2 * float(words[words.index("length") + 1])


def test_minigrid_trains_with_its_image_wrapper(tmp_path):
    pytest.importorskip("minigrid")
    result = run_train("+env=gym", "env.id=MiniGrid-Empty-5x5-v0", "env.wrappers=[minigrid.wrappers.ImgObsWrapper]",
                       "runner=sequential", "max_env_steps=3000", "target_return=null", "eval.episodes=2", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "observations Box(0, 255, (7, 7, 3)" in result.stdout or "7x7x3" in result.stdout or "(7, 7, 3)" in result.stdout, result.stdout
