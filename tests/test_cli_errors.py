"""Bad input to `train`: one line naming the key and what is allowed, exit code 2, no traceback."""

import os
import subprocess
import uuid

import pytest
import yaml
from omegaconf import OmegaConf

from tests.cli import REPO, TRAIN, Result, run_train
from tests.helpers import processes_with_env_tag


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("train: error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert processes_with_env_tag(result.tag) == []


def test_no_env_lists_the_env_configs(tmp_path):
    result = run_train(run_dir=tmp_path / "run")
    assert_one_line_error(result, "+env=", "cartpole", "acrobot", "pendulum", "gym")


@pytest.mark.parametrize(
    "override,needles",
    [
        ("runner.n_actors=0", ["runner.n_actors=0", ">= 1"]),
        ("algorithm.lr=-1", ["algorithm.lr=-1", "> 0"]),
        ("runner.batch_size=many", ["runner.batch_size=many", "integer"]),
        ("algorithm.lrr=0.1", ["algorithm.lrr", "did you mean 'lr'"]),
        ("max_env_step=5", ["max_env_step", "did you mean 'max_env_steps'"]),
        ("+runner.n_actor=3", ["runner.n_actor", "did you mean 'n_actors'"]),
        ("runner=nonsense", ["runner=nonsense", "sequential", "subproc"]),
        ("policy.activation=sigmoid", ["policy.activation=sigmoid", "tanh"]),
        ("runner.actor_env_seeds=[1,2,3]", ["runner.actor_env_seeds", "one per actor"]),
        ("device=gpu9", ["device=gpu9"]),
        ("seed=[1,", ["seed=[1,"]),
    ],
)
def test_a_bad_value_names_its_key(tmp_path, override, needles):
    assert_one_line_error(run_train("+env=cartpole", override, run_dir=tmp_path / "run"), *needles)


@pytest.mark.parametrize(
    "override,needles",
    [
        ("runner.resources={big_mem:lots}", ["runner.resources.big_mem=lots", "a number"]),
        ("runner.resources=3", ["runner.resources=3", "a mapping of names to numbers"]),
    ],
)
def test_a_bad_ray_resource_names_its_key(tmp_path, override, needles):
    assert_one_line_error(run_train("+env=cartpole", "runner=ray", override, run_dir=tmp_path / "run"), *needles)


def test_an_unknown_env_id_is_named(tmp_path):
    result = run_train("+env=gym", "env.id=NoSuchEnv-v0", run_dir=tmp_path / "run")
    assert_one_line_error(result, "env.id=NoSuchEnv-v0")


def test_the_gym_config_requires_an_id(tmp_path):
    assert_one_line_error(run_train("+env=gym", run_dir=tmp_path / "run"), "env.id", "required")


def test_a_bad_env_kwarg_is_reported_before_actors_start(tmp_path):
    result = run_train("+env=gym", "env.id=CartPole-v1", "+env.kwargs.no_such_arg=1", run_dir=tmp_path / "run")
    assert_one_line_error(result, "no_such_arg")


def _mission_env_dir(tmp_path):
    config_dir = tmp_path / "my_configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "mission.yaml").write_text("_target_: tests.envs.MissionEnv\nlength: 7\n")
    return ["--config-dir", str(config_dir), "+env=mission"]


def test_obs_keys_that_the_observation_lacks_are_named_with_the_keys_it_has(tmp_path):
    result = run_train(*_mission_env_dir(tmp_path), "+env.obs_keys=[count,colour]", run_dir=tmp_path / "run")
    assert_one_line_error(result, "env.obs_keys", "colour", "count, mission, parity")


QUICK = ("max_env_steps=1", "eval.interval=0", "runner=sequential")


@pytest.mark.parametrize("env_args,key", [
    (["+env=cartpole"], "env.vectorize=false"),                                 # packaged, a key its file leaves out
    (["+env=cartpole"], "+env.check=false"),                                    # packaged, a key its file has, with a +
    (["+env=gym", "env.id=FrozenLake-v1"], "env.kwargs.is_slippery=false"),   # an argument of the env by id
    ("mission", "env.obs_keys=[count,parity]"),                                 # the user's own config
    ("mission", "env.length=3"),                                                # an argument of the user's _target_
])
def test_every_env_key_is_set_as_key_value_on_any_env_config(tmp_path, env_args, key):
    """One rule for env keys (docs/envs.md): `env.<key>=<value>` whether or not the env config has it."""
    if env_args == "mission":  # with the keys a network reads
        env_args = [*_mission_env_dir(tmp_path), "env.obs_keys=[count,parity]"]
    result = run_train(*env_args, key, *QUICK, run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    name, value = key.lstrip("+").split("=", 1)
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert OmegaConf.select(saved, name) == yaml.safe_load(value), OmegaConf.to_yaml(saved.env)


def test_a_misspelt_env_key_is_named_with_the_keys_the_env_takes(tmp_path):
    assert_one_line_error(run_train("+env=cartpole", "env.vectorise=false", run_dir=tmp_path / "a"),
                          "env.vectorise", "vectorize")
    assert_one_line_error(run_train("+env=masked_choice", "env.n_action=3", run_dir=tmp_path / "b"),
                          "env.n_action", "did you mean 'n_actions'", "MaskedChoice takes: n_actions")


def test_train_help_is_written_for_people_and_names_every_option():
    """`train --help`: what train does, +env, resume, rollout, the groups with every packaged option."""
    result = subprocess.run([str(TRAIN), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    page = result.stdout
    for needle in ("+env=", "resume=", "init_from=", "rollout", "Examples:", "docs/reference/config.md"):
        assert needle in page, needle
    for group in ("env", "algorithm", "policy", "runner", "replay_buffer", "logger"):
        line = next(line for line in page.splitlines() if line.strip().startswith((f"{group}=", f"+{group}=")))
        for option in (REPO / "conf" / group).glob("*.yaml"):
            assert option.stem in line, (group, option.stem)
    assert "_schema" not in page and "$" not in page
    # A bare `train --help` is written without Hydra or torch (seconds saved): the same page as Hydra renders.
    through_hydra = subprocess.run([str(TRAIN), "--help", "seed=1"], capture_output=True, text=True, timeout=120)
    assert through_hydra.returncode == 0 and through_hydra.stdout == page
    imported = subprocess.run([str(TRAIN.with_name("python")), "-c", "import sys; sys.argv = ['train', '--help']; "
                               "from maze_cli.cli import train_main; train_main(); "
                               "print(sorted({'torch', 'hydra'} & set(sys.modules)))"], capture_output=True, text=True, timeout=60)
    assert imported.stdout.splitlines()[-1] == "[]", imported.stderr
    rollout = subprocess.run([str(TRAIN.with_name("rollout")), "--help"], capture_output=True, text=True, timeout=60)
    assert rollout.returncode == 0 and "checkpoint=" in rollout.stdout and "video=" in rollout.stdout


def test_an_env_id_whose_package_is_missing_names_the_package_to_install(tmp_path):
    """Ids of packages that register on import (ALE/, MinAtar/, MiniGrid-) are imported by their prefix;
    a missing package is one line naming the extra."""
    import importlib.util

    result = run_train("+env=gym", "env.id=MiniGrid-Empty-5x5-v0", "+env.obs_keys=[direction,image]", "max_env_steps=1",
                       "eval.interval=0", "runner=sequential", run_dir=tmp_path / "run")
    if importlib.util.find_spec("minigrid") is None:
        assert result.returncode == 2
        assert result.stderr.strip() == ("train: error: env.id=MiniGrid-Empty-5x5-v0: its package minigrid is not installed; "
                                         "pip install 'maze_cli[minigrid]' (or pip install minigrid)")
    else:
        assert result.returncode == 0, result.stderr
        assert "MiniGrid-Empty-5x5-v0" in result.stdout  # built: the prefix imported the package


def test_a_box2d_id_without_box2d_names_the_extra_in_one_line(tmp_path):
    """gymnasium's own message names gymnasium's extra; ours names maze_cli's."""
    blocker = tmp_path / "no_box2d" / "Box2D"  # a fake Box2D package that fails to import, as a missing one does
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named Box2D')\n")
    result = run_train("+env=gym", "env.id=LunarLander-v3", "max_env_steps=1", "eval.interval=0", "runner=sequential",
                       run_dir=tmp_path / "run", env={"PYTHONPATH": f"{blocker.parent}{os.pathsep}{REPO}"})
    assert result.returncode == 2
    assert result.stderr.strip() == ("train: error: env.id=LunarLander-v3: a Box2D env, and Box2D is not installed; "
                                     "pip install 'maze_cli[box2d]' (or pip install box2d)")
    assert not (tmp_path / "run" / "stats.jsonl").exists()


def test_an_ale_id_works_through_the_generic_gym_config(tmp_path):
    """ALE's own vector env preprocesses frames (84x84); the actors must build the env the check saw. (policy=mlp
    keeps the test quick: the CNN chosen for frames is tested in test_cnn.py.)"""
    import importlib.util

    if importlib.util.find_spec("ale_py") is None:
        pytest.skip("the optional extra atari is not installed")
    result = run_train("+env=gym", "env.id=ALE/Pong-v5", "runner.envs_per_actor=2", "max_env_steps=1", "eval.interval=0",
                       "runner=sequential", "policy=mlp", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "Box(210, 160, 3) uint8" in result.stdout and "policy=cnn is made for images" in result.stdout


def test_a_precision_the_device_cannot_do_is_one_line_before_anything_starts(tmp_path):
    result = run_train("+env=cartpole", "learner.precision=fp16", run_dir=tmp_path / "run")
    assert_one_line_error(result, "learner.precision=fp16", "CUDA", "bf16")
    assert not (tmp_path / "run").exists()


def test_compile_without_a_cxx_compiler_is_one_line_before_anything_starts(tmp_path):
    result = run_train("+env=cartpole", "learner.compile=true", run_dir=tmp_path / "run", env={"CXX": "/nonexistent/g++"})
    assert_one_line_error(result, "learner.compile=true", "C++ compiler", "learner.compile=false")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text,needles", [
    ("env:\n  id: CartPole-v1\n  kwargs: [1\n", ["broken.yaml, line", "not valid YAML", "fix the file"]),
    ("env:\n  id: CartPole-v1\ntarget_return: ${no_such_key}\n", ["target_return", "no_such_key", "not found"]),
])
def test_a_broken_config_file_is_one_line_and_leaves_no_run_dir(tmp_path, text, needles):
    """A user's env config that is no YAML, or interpolates a key that does not exist: one line naming
    the file or the key, exit 2, and nothing left behind in the dir the command ran in (no outputs/<date>/)."""
    (tmp_path / "conf" / "env").mkdir(parents=True)
    (tmp_path / "conf" / "env" / "broken.yaml").write_text("# @package _global_\n" + text)
    tag = uuid.uuid4().hex
    env = {**os.environ, "MAZE_TEST_TAG": tag, "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([str(TRAIN), "--config-dir", "conf", "+env=broken"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert_one_line_error(Result(proc.returncode, proc.stdout, proc.stderr, tag), *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]


@pytest.mark.parametrize("command", [["train", "--help"], ["train", "+env=cartpole", "--help"], ["export-policy", "--help"]])
def test_a_help_page_whose_reader_has_gone_ends_quietly(command):
    """`train --help | head`: the reader closes the pipe before the page is written. The command ends
    with the shell's SIGPIPE code and not a BrokenPipeError traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        result = subprocess.run([str(TRAIN.with_name(command[0])), *command[1:]], stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 141, result.stderr
