"""Components from config: every group built from `_target_`, a user's own policy network and
algorithm from --config-dir, and nothing unknown silently replaced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli import TRAIN, run_train
from tests.test_train import read_stats


def write(config_dir, group: str, name: str, text: str) -> None:
    (config_dir / group).mkdir(parents=True, exist_ok=True)
    (config_dir / group / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize("group,target", [
    ("policy", "maze_cli.policies.mlp.MlpNetwork"),
    ("algorithm", "maze_cli.algorithms.impala.Impala"),
    ("runner", "maze_cli.parallel.SubprocDistributedActors"),
    ("replay_buffer", "maze_cli.buffers.UniformReplayBuffer"),
])
def test_each_group_carries_its_target_at_the_top(group, target):
    out = subprocess.run([str(TRAIN), "+env=cartpole", "--cfg", "job", "-p", group], capture_output=True, text=True, check=True)
    lines = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert lines[0] == f"_target_: {target}"


def test_a_users_policy_network_and_algorithm_from_a_config_dir_train(tmp_path):
    config_dir = tmp_path / "my_configs"
    write(config_dir, "policy", "residual", "_target_: tests.user_components.ResidualMlp\nwidth: 24\n")
    marker = tmp_path / "used"
    write(config_dir, "algorithm", "loud", f"_target_: tests.user_components.LoudImpala\nmarker: {marker}\nlr: 0.002\n")
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", str(config_dir), "+env=cartpole", "policy=residual", "algorithm=loud",
                       "max_env_steps=60000", "epoch_length=10", "runner.envs_per_actor=16", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "lr=0.002 network=tests.user_components.ResidualMlp"
    stats = read_stats(run_dir)
    assert stats[-1]["eval/best_return_mean"] > 100  # random play scores about 20: the user's network learned
    from maze_cli.checkpoint import load_checkpoint

    blueprint = load_checkpoint(run_dir / "checkpoints" / "last.pt")["policy_blueprint"]
    assert blueprint["kwargs"]["network"] == {"_target_": "tests.user_components.ResidualMlp", "width": 24}


@pytest.mark.parametrize("override,needles", [
    (["algorithm=nope"], ["algorithm=nope", "impala", "sac"]),
    (["runner=nope"], ["runner=nope", "subproc", "ray", "sequential"]),
    (["policy=nope"], ["policy=nope", "mlp"]),
    (["replay_buffer=nope"], ["replay_buffer=nope", "uniform", "prioritized"]),
])
def test_an_unknown_option_is_named_with_the_choices(tmp_path, override, needles):
    result = run_train("+env=cartpole", *override, run_dir=tmp_path / "run")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and all(n in line for n in needles), line


def test_a_users_config_with_a_key_its_class_does_not_take_is_named(tmp_path):
    config_dir = tmp_path / "c"
    write(config_dir, "policy", "residual", "_target_: tests.user_components.ResidualMlp\nwidht: 24\n")
    result = run_train("--config-dir", str(config_dir), "+env=cartpole", "policy=residual", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert "policy.widht: unknown key (did you mean 'width'?)" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_target_that_cannot_be_imported_is_named(tmp_path):
    config_dir = tmp_path / "c"
    write(config_dir, "runner", "mine", "_target_: my_pkg.NoSuchRunner\nn_actors: 2\n")
    result = run_train("--config-dir", str(config_dir), "+env=cartpole", "runner=mine", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert "runner._target_=my_pkg.NoSuchRunner: cannot import it" in result.stderr


def test_a_class_that_is_not_an_algorithm_is_refused(tmp_path):
    config_dir = tmp_path / "c"
    write(config_dir, "algorithm", "odd", "_target_: collections.OrderedDict\n")
    result = run_train("--config-dir", str(config_dir), "+env=cartpole", "algorithm=odd", run_dir=tmp_path / "run")
    assert result.returncode == 2 and "not an algorithm class" in result.stderr, result.stderr


def test_sac_refuses_infinite_action_bounds_in_one_line(tmp_path):
    config_dir = tmp_path / "c"
    write(config_dir, "env", "unbounded", "_target_: tests.envs.UnboundedActionEnv\n")
    result = run_train("--config-dir", str(config_dir), "+env=unbounded", "algorithm=sac", run_dir=tmp_path / "run")
    assert result.returncode == 2, result.stderr
    assert "algorithm=sac needs finite action bounds" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_rollout_builds_a_users_network_only_when_allowed_by_name(tmp_path):
    from maze_cli.cli.rollout import RolloutConfig, run_rollout
    from maze_cli.errors import CheckpointError

    config_dir = tmp_path / "c"
    write(config_dir, "policy", "residual", "_target_: tests.user_components.ResidualMlp\n")
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", str(config_dir), "+env=cartpole", "policy=residual", "max_env_steps=1", "epoch_length=1",
                       "eval.episodes=1", "runner=sequential", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    checkpoint = str(run_dir / "checkpoints" / "last.pt")
    with pytest.raises(CheckpointError, match="asks to build 'tests.user_components.ResidualMlp'"):
        run_rollout(RolloutConfig(checkpoint=checkpoint, episodes=1))
    assert run_rollout(RolloutConfig(checkpoint=checkpoint, episodes=1, allow=["tests.user_components.ResidualMlp"]))["return_mean"] > 0


def composed(*overrides: str) -> str:
    return subprocess.run([str(TRAIN), *overrides, "--cfg", "job"], capture_output=True, text=True, check=True).stdout


def test_tuned_settings_of_an_env_and_algorithm_apply_to_that_pair_only(tmp_path):
    import yaml

    impala = yaml.safe_load(composed("+env=minatar"))
    assert impala["algorithm"]["_target_"].endswith(".Impala") and impala["algorithm"]["entropy_coef"] == 0.02
    assert impala["algorithm"]["normalize_advantage"] is False and impala["policy"]["hidden_sizes"] == [128]
    assert impala["runner"]["envs_per_actor"] == 8
    assert yaml.safe_load(composed("+env=pendulum"))["algorithm"]["normalize_advantage"] is True  # no tuning file
    # CartPole's actors step 32 envs a forward pass, an update takes one rollout: still 1,024 samples an update
    for runner in ("subproc", "ray"):
        cartpole = yaml.safe_load(composed("+env=cartpole", f"runner={runner}"))["runner"]
        assert (cartpole["envs_per_actor"], cartpole["batch_size"]) == (32, 1), runner
    assert yaml.safe_load(composed("+env=cartpole", "runner.batch_size=2"))["runner"]["batch_size"] == 2
    ppo = yaml.safe_load(composed("+env=cartpole", "algorithm=ppo"))["runner"]
    assert (ppo["envs_per_actor"], ppo["batch_size"]) == (None, 2)
    sac = yaml.safe_load(composed("+env=minatar", "algorithm=sac"))
    assert "entropy_coef" not in sac["algorithm"] and sac["policy"]["hidden_sizes"] == [256]
    overridden = yaml.safe_load(composed("+env=minatar", "algorithm.entropy_coef=0.03"))
    assert overridden["algorithm"]["entropy_coef"] == 0.03  # the command line wins
    # A user's own env config may bring its own tuning file.
    config_dir = tmp_path / "configs"
    write(config_dir, "env", "mine", "id: CartPole-v1\n")
    write(config_dir, "tuning", "mine_appo", "# @package _global_\nalgorithm:\n  lr: 0.0042\n")
    mine = yaml.safe_load(composed("--config-dir", str(config_dir), "+env=mine"))
    assert mine["algorithm"]["lr"] == 0.0042


def test_the_default_algorithm_is_appo_where_an_env_config_names_none_and_the_families_keep_theirs():
    import yaml

    def algorithm(*overrides: str) -> str:
        return yaml.safe_load(composed(*overrides))["algorithm"]["_target_"].rsplit(".", 1)[-1]

    assert algorithm("+env=gym", "env.id=CartPole-v1") == "Appo"  # +env=gym applies no family's choice
    assert algorithm("+env=pendulum") == "Appo"
    assert (algorithm("+env=cartpole"), algorithm("+env=acrobot"), algorithm("+env=minatar")) == ("Impala",) * 3
    assert algorithm("+env=mujoco") == "Ppo" and algorithm("+env=atari") == "Ppo"
    assert algorithm("+env=cartpole", "algorithm=dqn") == "Dqn"  # the command line wins


def test_a_run_that_names_only_its_env_says_which_algorithm_it_got_and_records_what_it_chose(tmp_path):
    import yaml

    config_dir = tmp_path / "configs"
    write(config_dir, "env", "mine", "_target_: tests.envs.OffsetSteerEnv\n")  # Box actions
    short = ["--config-dir", str(config_dir), "+env=mine", "runner=sequential", "max_env_steps=2048", "eval.episodes=1"]
    result = run_train(*short, run_dir=tmp_path / "default")
    assert result.returncode == 0, result.stderr
    assert ("algorithm: Appo, the default for this env (algorithm=impala|ppo|appo|sac|td3|dqn chooses another); chosen for "
            "this env: algorithm.normalize_obs=true, algorithm.normalize_reward=true") in result.stdout
    written = yaml.safe_load((tmp_path / "default" / "config.yaml").read_text())["algorithm"]
    assert (written["normalize_obs"], written["normalize_reward"]) == (True, True)  # what ran, not null
    named = run_train(*short, "algorithm=impala", "algorithm.normalize_reward=false", run_dir=tmp_path / "named")
    assert named.returncode == 0, named.stderr
    assert "the default for this env" not in named.stdout
    assert "chosen for this env: algorithm.normalize_obs=true\n" in named.stdout  # the key set on the command line is not "chosen"


def composed_here(*overrides: str) -> dict:
    """The config `train <overrides> --cfg job` prints, composed in this process (no interpreter to start)."""
    from omegaconf import OmegaConf

    from maze_cli.cli.paths import compose_train

    return OmegaConf.to_container(compose_train(overrides))


def test_in_process_composition_is_the_clis():
    """The tuning test below composes in-process; this keeps it honest against `train --cfg job`."""
    import yaml

    assert composed_here("+env=minatar", "algorithm=ppo") == yaml.safe_load(composed("+env=minatar", "algorithm=ppo"))


def test_every_shipped_tuning_file_composes_and_appo_takes_ppos_tuning():
    """A tuning file that does not compose would break `train` for its pair only: compose each one."""
    for path in sorted((Path(__file__).parents[1] / "conf" / "tuning").glob("*.yaml")):
        env, algorithm = path.stem.rsplit("_", 1)
        tuned = composed_here(f"+env={env}", f"algorithm={algorithm}")["algorithm"]
        assert tuned["_target_"].lower().endswith(f".{algorithm}"), path.name
        if algorithm == "appo":
            ppo = composed_here(f"+env={env}", "algorithm=ppo")["algorithm"]
            own = ("_target_", "returns")  # what makes APPO itself: its class and its V-trace targets
            assert {k: tuned[k] for k in ppo if k not in own} == {k: v for k, v in ppo.items() if k not in own}, path.name
