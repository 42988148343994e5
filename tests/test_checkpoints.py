"""Checkpoints are data: reading one runs no code from it, builds only allowed classes, refuses
broken or foreign files in one line, and restores a run bit for bit."""

from __future__ import annotations

import os
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from maze_cli.checkpoint import FORMAT, VERSION, load_checkpoint, load_policy, rng_states, set_rng_states
from maze_cli.errors import CheckpointError
from tests.cli import REPO, run_train

ROLLOUT = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "rollout"
FORMAT_1 = REPO / "tests" / "data" / "format1_impala_cartpole.pt"  # written by maze_cli 0.1 (commit 8cd7c84)
TINY = ["+env=cartpole", "runner=sequential", "max_env_steps=1", "epoch_length=1", "eval.episodes=1", "policy.hidden_sizes=[8]"]


class CreatesFileWhenUnpickled:
    """A crafted payload object: unpickling it would call Path.touch(marker) (a stand-in for os.system)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    result = run_train(*TINY, run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir


def crafted(real_run: Path, tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """A copy of a real last.pt with one malicious change; returns (its path, the marker file the attack would create)."""
    marker = tmp_path / f"pwned-{kind}"
    payload = torch.load(real_run / "checkpoints" / "last.pt", weights_only=True)
    if kind == "pickle":
        payload["extra"] = CreatesFileWhenUnpickled(marker)
    elif kind == "blueprint":
        payload["policy_blueprint"] = {"_target_": "os.system", "observation_space": {}, "action_space": {}, "kwargs": {"command": f"touch {marker}"}}
    elif kind == "blueprint_via_own_module":
        payload["policy_blueprint"]["kwargs"]["network"] = {"_target_": "maze_cli.checkpoint.os.system", "command": f"touch {marker}"}
    path = tmp_path / f"{kind}.pt"
    torch.save(payload, path)
    return path, marker


def rollout(*args: str):
    import subprocess

    return subprocess.run([str(ROLLOUT), *args], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("kind", ["pickle", "blueprint", "blueprint_via_own_module"])
def test_crafted_checkpoints_are_refused_by_every_command_and_run_nothing(real_run, tmp_path, kind):
    path, marker = crafted(real_run, tmp_path, kind)
    out = rollout(f"checkpoint={path}", "episodes=1")
    assert out.returncode == 2 and "refused" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    sac = run_train("+env=cartpole", "algorithm=sac", "runner=sequential", "max_env_steps=50",
                    f"algorithm.initial_sampling_policy={path}", run_dir=tmp_path / "sac")
    assert sac.returncode == 2 and "refused" in sac.stderr, sac.stderr
    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    (resumed_dir / "config.yaml").write_bytes((real_run / "config.yaml").read_bytes())
    (resumed_dir / "checkpoints" / "last.pt").write_bytes(path.read_bytes())
    resumed = run_train(f"resume={resumed_dir}", "max_env_steps=5000")
    if kind == "pickle":
        assert resumed.returncode == 2 and "refused" in resumed.stderr, resumed.stderr
    else:  # resume rebuilds its policy from the run's own config; the file's blueprint is never built
        assert resumed.returncode == 0, resumed.stderr
    assert not marker.exists()


def test_a_class_outside_the_allow_list_is_named_with_the_way_to_allow_it(real_run, tmp_path):
    path, _ = crafted(real_run, tmp_path, "blueprint")
    with pytest.raises(CheckpointError, match=r"'os.system'.*trust_checkpoint=true"):
        load_policy(path)


def test_a_checkpoints_env_maker_is_called_only_if_it_is_maze_clis_a_known_game_packages_or_allowed():
    """PettingZoo's own env makers (+env=connect_four's) pass; anything else the file names needs allow=."""
    pytest.importorskip("pettingzoo")
    from maze_cli.policies.blueprint import refused_env_callables

    for target in ("pettingzoo.classic.connect_four_v3.env", "pettingzoo.classic.tictactoe_v3.raw_env"):
        assert refused_env_callables({"_target_": target}, [], False) == []
    for target in ("os.system", "tests.envs.signal_team_env", "pettingzoo.classic.connect_four_v3.os.system",
                   "pettingzoo.utils.env_logger.EnvLogger"):
        assert refused_env_callables({"_target_": target}, [], False) == [target]
        assert refused_env_callables({"_target_": target}, [target], False) == []


@pytest.mark.parametrize("damage,message", [
    ("truncate", "truncated or corrupt"),
    ("text", "not a maze_cli checkpoint"),
    ("foreign", "not a maze_cli checkpoint"),
    ("future", "format 99"),
    ("format1", "maze_cli 0.1 (checkpoint format 1"),
])
def test_unusable_files_get_one_line_each(real_run, tmp_path, damage, message):
    path = tmp_path / "bad.pt"
    good = (real_run / "checkpoints" / "last.pt").read_bytes()
    if damage == "truncate":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "text":
        path.write_text("hello\n")
    elif damage == "foreign":
        torch.save({"model": torch.zeros(2)}, path)
    elif damage == "future":
        torch.save({**torch.load(real_run / "checkpoints" / "last.pt", weights_only=True), "version": 99}, path)
    else:
        path = FORMAT_1
    out = rollout(f"checkpoint={path}")
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_format_1_fixture_really_is_the_old_pickled_format():
    with zipfile.ZipFile(FORMAT_1) as archive:
        data = next(archive.read(n) for n in archive.namelist() if n.endswith("data.pkl"))
    assert b"policy_blueprint" in data and FORMAT.encode() not in data


def test_a_checkpoint_is_plain_data(real_run):
    payload = load_checkpoint(real_run / "checkpoints" / "last.pt")  # weights_only=True inside
    assert payload["format"] == FORMAT and payload["version"] == VERSION
    assert payload["policy_blueprint"]["_target_"] == "maze_cli.policies.actor_critic.ActorCritic"


def test_restored_weights_are_bit_identical(real_run):
    payload = load_checkpoint(real_run / "checkpoints" / "last.pt")
    policy = load_policy(real_run / "checkpoints" / "last.pt")
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, payload["learner"]["policy"][name])


def test_rng_streams_continue_identically_after_a_round_trip_through_a_file(tmp_path):
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    np.random.normal()  # leaves a cached gaussian in numpy's state
    path = tmp_path / "rng.pt"
    torch.save(rng_states(), path)
    expected = (torch.rand(3), np.random.rand(3), np.random.normal(), random.random())
    set_rng_states(torch.load(path, weights_only=True))
    again = (torch.rand(3), np.random.rand(3), np.random.normal(), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2:] == again[2:]


def build(overrides: list[str]):
    from maze_cli.cli.build import build_run, check_env
    from maze_cli.cli.paths import compose_train
    from maze_cli.cli.settings import validate

    settings = validate(compose_train(overrides), [])
    return build_run(settings, *check_env(settings))


def test_a_restored_run_has_bit_identical_learner_state_and_continues_its_rng_streams(tmp_path):
    from maze_cli.checkpoint import Checkpointer
    from maze_cli.budget import Budget
    from maze_cli.training import Trainer

    overrides = ["+env=cartpole", "runner=sequential", "policy.hidden_sizes=[8]", "runner.envs_per_actor=4"]
    run = build(overrides)
    trainer = Trainer(run.loop, Budget(max_env_steps=2000, epoch_length=3), [], progress=False)
    with run.runner:
        trainer.run()
    saver = Checkpointer(tmp_path, run, {}, interval=1, with_replay_buffer=False)
    saver.save_last(trainer, "test")
    expected_draws = torch.rand(4)  # what the learner's stream gives next

    fresh = build(overrides)
    fresh_trainer = Trainer(fresh.loop, Budget(max_env_steps=2000, epoch_length=3), [], progress=False)
    Checkpointer(tmp_path, fresh, {}, interval=1, with_replay_buffer=False).restore(fresh_trainer, load_checkpoint(tmp_path / "last.pt"))
    assert torch.equal(torch.rand(4), expected_draws)
    for name, tensor in run.learner.policy.state_dict().items():
        assert torch.equal(fresh.learner.policy.state_dict()[name], tensor)
    saved_opt, restored_opt = run.learner.optimizer_state()["policy"], fresh.learner.optimizer_state()["policy"]
    for key, state in saved_opt["state"].items():
        assert all(torch.equal(state[k], restored_opt["state"][key][k]) for k in state)
    assert (fresh_trainer.epoch, fresh_trainer.env_steps, fresh.learner.updates) == (trainer.epoch, trainer.env_steps, run.learner.updates)


def test_a_checkpoint_of_another_env_is_refused_as_the_initial_sampling_policy(tmp_path):
    first = run_train("+env=pendulum", "algorithm=sac", "runner=sequential", "max_env_steps=300", "epoch_length=50",
                      "algorithm.initial_buffer_size=100", "eval.episodes=1", run_dir=tmp_path / "a")
    assert first.returncode == 0, first.stderr
    second = run_train("+env=gym", "env.id=MountainCarContinuous-v0", "algorithm=sac", "runner=sequential", "max_env_steps=300",
                       f"algorithm.initial_sampling_policy={tmp_path / 'a' / 'checkpoints' / 'last.pt'}", run_dir=tmp_path / "b")
    assert second.returncode == 2
    line = second.stderr.strip()
    assert len(line.splitlines()) == 1 and "observation space Box(" in line and "(3,)" in line and "(2,)" in line, line


def test_the_initial_sampling_policy_is_the_checkpoints_policy(tmp_path):
    """The workers act with exactly the checkpoint's weights until the first broadcast."""
    first = run_train("+env=pendulum", "algorithm=sac", "runner=sequential", "max_env_steps=300", "epoch_length=50",
                      "algorithm.initial_buffer_size=100", "eval.episodes=1", run_dir=tmp_path / "a")
    assert first.returncode == 0, first.stderr
    checkpoint = tmp_path / "a" / "checkpoints" / "last.pt"
    run = build(["+env=pendulum", "algorithm=sac", "runner=sequential", f"algorithm.initial_sampling_policy={checkpoint}"])
    initial = run.runner.actors.initial_policy
    saved = load_checkpoint(checkpoint)["learner"]["policy"]
    assert type(initial).__name__ == "SacPolicy"
    assert all(torch.equal(v, saved[k]) for k, v in initial.state_dict().items())
    assert not all(torch.equal(v, saved[k]) for k, v in run.learner.policy.state_dict().items())


def test_a_save_interrupted_inside_torch_save_leaves_the_next_save_whole(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM can land inside torch.save after it opened its zip writer and before the
    `with` that would close it: the writer stays alive in the traceback and, when collected, writes
    its closing records into its file. The checkpoint written on the way out must still read."""
    import gc

    import maze_cli.checkpoint as checkpoint
    from torch.serialization import _open_zipfile_writer

    real_save = torch.save
    left_alive = []

    def save_interrupted_after_opening(obj, f):  # fault injection: the interrupt's worst moment
        left_alive.append(_open_zipfile_writer(os.fspath(f)))
        raise KeyboardInterrupt

    path = tmp_path / "last.pt"
    monkeypatch.setattr(checkpoint.torch, "save", save_interrupted_after_opening)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(path, {"stop_reason": "running"})
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    checkpoint.save_checkpoint(path, {"stop_reason": "interrupted", "steps": torch.arange(1000)})
    left_alive.clear()  # the stale writer is collected: it writes its closing records
    gc.collect()
    saved = load_checkpoint(path)
    assert saved["stop_reason"] == "interrupted" and saved["steps"].tolist() == list(range(1000))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


FORMAT_2 = {  # written by the maze_cli before one learner layout (commit ad9dbef): each algorithm its own
    "impala": (REPO / "tests" / "data" / "format2_impala_cartpole.pt", ["+env=cartpole"]),
    "sac": (REPO / "tests" / "data" / "format2_sac_pendulum.pt", ["+env=pendulum", "algorithm=sac"]),
}


@pytest.mark.parametrize("algorithm", sorted(FORMAT_2))
def test_a_checkpoint_of_format_2_is_read_in_todays_layout_and_warm_starts_a_run(tmp_path, algorithm):
    """Checkpoint format 2 (before every algorithm's learner state had one layout) loads as format 3:
    its optimizers, other modules and statistics where today's learner keeps them, so that a new run
    takes its policy, optimizer and normalizer state (`init_from.optimizer=true`, `init_from.normalizer=true`)."""
    path, env = FORMAT_2[algorithm]
    raw = torch.load(path, weights_only=True)
    assert raw["version"] == 2
    payload = load_checkpoint(path)
    learner = payload["learner"]
    assert payload["version"] == VERSION == 3
    assert set(learner) == {"policy", "modules", "optimizers", "updates", "env_steps", "algorithm"}
    if algorithm == "impala":
        saved, moved = raw["learner"]["optimizer"]["state"][0], learner["optimizers"]["policy"]["state"][0]
        assert torch.equal(moved["exp_avg"], saved["exp_avg"])
        assert set(learner["algorithm"]) == {"reward_scaler"}
    else:
        assert set(learner["modules"]) == {"critic", "critic_target", "temperature"}
        assert torch.equal(learner["modules"]["temperature"]["log_alpha"], raw["learner"]["log_alpha"])
    run_dir = tmp_path / "run"
    result = run_train(*env, "runner=sequential", "max_env_steps=400", "eval.interval=0", "policy.hidden_sizes=[16,16]",
                       "algorithm.initial_buffer_size=100" if algorithm == "sac" else "epoch_length=2",
                       f"init_from={path}", "init_from.optimizer=true", "init_from.normalizer=true", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["learner"]["updates"] > 0
