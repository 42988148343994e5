"""runner.reproducible=true: a run is a function of its seed on every runner.

The schedule's order is checked with one actor made slow, so that its rollouts always arrive last: a
backend that took rollouts as they came would put them in the wrong columns. Whole runs are compared
row by row (timings aside) and weight by weight."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from maze_cli.envs import EnvFactory
from maze_cli.parallel import SequentialDistributedActors, SubprocDistributedActors
from maze_cli.parallel.actor_loop import Actor
from maze_cli.seeding import derive_seeds
from tests.cli import run_train
from tests.envs import CountingEnv, SlowEnv, UnpicklableEnv
from tests.test_actors import force_action, make_actors, make_policy
from maze_cli.stats.same_run import learner_state, without_timings
from tests.test_train import read_stats

ENV_SEEDS = [11, 22, 33]


def slow_first_actor(envs_per_actor: int):
    """Envs that are slow in actor 0 only (its envs are reset with seeds derived from its env seed)."""
    return partial(SlowEnv, slow_seeds=frozenset(derive_seeds(ENV_SEEDS[0], "env", envs_per_actor)), length=50)


def check_schedule(actors, n_batches: int = 5) -> None:
    """Batch b holds rollouts g = b*B ... of actors g % n, in that order, with policy version b - 1 (0 for the
    first two): what the schedule says, however the rollouts arrived."""
    n, B, E = actors.n_actors, actors.batch_size, actors.envs_per_actor
    for b in range(n_batches):
        batch, *_ = actors.collect_outputs("cpu")
        expected = torch.tensor([(b * B + j) % n for j in range(B)]).repeat_interleave(E)
        assert torch.equal(batch.env_id // E, expected), f"batch {b}: columns from actors {(batch.env_id // E).tolist()}"
        assert (batch.policy_version == max(0, b - 1)).all(), f"batch {b}: versions {batch.policy_version.tolist()}"
        actors.broadcast_updated_policy(force_action(actors.policy, b % 2))


@pytest.mark.parametrize("cls", [SequentialDistributedActors, SubprocDistributedActors])
def test_each_batch_follows_the_schedule_whatever_the_arrival_order(cls):
    with make_actors(cls, slow_first_actor(2), n_actors=3, batch_size=2, envs_per_actor=2, actor_env_seeds=ENV_SEEDS,
                     reproducible=True) as actors:
        check_schedule(actors)


def test_the_schedule_acts_with_the_version_it_named(cls=SubprocDistributedActors):
    """The rollouts of batch 2 are collected after the first broadcast but with its policy: every action
    is the one that version forces (while version 2, forcing the other action, is published meanwhile)."""
    with make_actors(cls, partial(CountingEnv, length=50), n_actors=2, batch_size=2, reproducible=True) as actors:
        actors.collect_outputs("cpu")
        actors.broadcast_updated_policy(force_action(actors.policy, 1))  # version 1
        actors.collect_outputs("cpu")  # batch 1 (version 0); batch 2 is requested now with version 1
        actors.broadcast_updated_policy(force_action(actors.policy, 0))  # version 2
        batch, *_ = actors.collect_outputs("cpu")
        assert (batch.policy_version == 1).all() and (batch.actions == 1).all()


def test_an_algorithm_that_drops_stale_rollouts_is_told_why_it_cannot_be_reproducible():
    with pytest.raises(ValueError, match="max_policy_lag=0 would drop them all"):
        make_actors(SequentialDistributedActors, partial(CountingEnv), reproducible=True, max_policy_lag=0)


# -- whole runs -----------------------------------------------------------------------------------------------------
CARTPOLE = ["+env=cartpole", "runner.reproducible=true", "seed=3", "epoch_length=4", "max_env_steps=20000",
            "eval.interval=2", "eval.episodes=3", "target_return=null"]


def same_run(a, b) -> None:
    """The same rows (timings aside) and the same learner state in last.pt: weights, optimizer moments, counters."""
    assert without_timings(read_stats(a)) == without_timings(read_stats(b))
    assert torch.equal(learner_state(a), learner_state(b))


def test_two_subprocess_runs_of_one_seed_are_one_run(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        result = run_train(*CARTPOLE, "runner=subproc", "runner.n_actors=3", run_dir=run)
        assert result.returncode == 0, result.stderr
    assert len(read_stats(runs[0])) >= 4
    same_run(*runs)


def test_two_learners_give_one_run(tmp_path):
    """learner.num_learners=2: each learner's actors on the schedule, gradients averaged in a fixed order."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        result = run_train(*CARTPOLE, "runner=subproc", "learner.num_learners=2", "max_env_steps=12000", run_dir=run)
        assert result.returncode == 0, result.stderr
    same_run(*runs)


@pytest.mark.slow
def test_sequential_subprocess_and_ray_runners_give_the_same_run(tmp_path):
    runs = {runner: tmp_path / runner for runner in ("sequential", "subproc", "ray")}
    for runner, run in runs.items():
        result = run_train(*CARTPOLE, f"runner={runner}", run_dir=run, env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
        assert result.returncode == 0, result.stderr
    same_run(runs["sequential"], runs["subproc"])
    same_run(runs["subproc"], runs["ray"])


def test_sac_with_its_replay_buffer_and_ppo_are_reproducible_across_runners(tmp_path):
    sac = ["+env=pendulum", "algorithm=sac", "runner.reproducible=true", "seed=5", "max_env_steps=1200", "epoch_length=8",
           "algorithm.initial_buffer_size=400", "algorithm.batch_size=64", "policy.hidden_sizes=[32,32]", "eval.interval=0"]
    ppo = [*CARTPOLE, "algorithm=ppo"]
    for name, overrides in (("sac", sac), ("ppo", ppo)):
        runs = [tmp_path / f"{name}-sequential", tmp_path / f"{name}-subproc"]
        for run, runner in zip(runs, ("sequential", "subproc")):
            result = run_train(*overrides, f"runner={runner}", run_dir=run)
            assert result.returncode == 0, result.stderr
        same_run(*runs)


def test_a_restarted_actor_says_the_run_is_no_longer_reproducible(tmp_path):
    from tests.cli import fault_env

    result = run_train(*fault_env(tmp_path, "raise_step"), "runner=subproc", "runner.reproducible=true", "max_env_steps=20000",
                       run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "restarts with new seeds, so from this epoch on the run is no longer the one its seed alone gives" in result.stdout + result.stderr


def test_background_evaluation_is_refused_in_reproducible_mode(tmp_path):
    result = run_train("+env=cartpole", "runner.reproducible=true", "eval.background=true", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert "eval.background=true with runner.reproducible=true" in result.stderr and "eval.background=false" in result.stderr


# -- resume ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", [{"id": "CartPole-v1"}, {"id": "Hopper-v5"},
                                 {"_target_": "maze_cli.envs.atari.make_atari", "id": "ALE/Pong-v5", "frame_skip": 4,
                                  "frame_stack": 4, "noop_max": 30, "screen_size": 84, "episodic_life": False,
                                  "repeat_action_probability": 0.25, "max_episode_steps": 108000}],
                         ids=["cartpole", "mujoco", "atari"])
def test_a_restored_actor_collects_what_the_saved_one_collects_next(env):
    """Its envs come back in the middle of their episodes (Hopper, Pong: envs that gymnasium would pickle
    as the arguments to build a new one; Pong with its emulator's state and sticky-action RNG), with the
    actor's random state and recurrent state."""
    factory = EnvFactory(env)
    spec = make_actors(SequentialDistributedActors, factory, n_steps=7, n_actors=1, batch_size=1).rollout_spec
    policy = make_policy(factory())
    saved = Actor(0, factory, policy, spec.n_envs, spec.n_steps, env_seed=5, agent_seed=6)
    first = spec.allocate()
    saved.collect(first)
    restored = Actor(0, factory, policy, spec.n_envs, spec.n_steps, env_seed=99, agent_seed=98)
    restored.restore(saved.snapshot())
    restored.load_policy(policy.state_dict(), saved.policy_version)  # (weights come from the learner)
    a, b = spec.allocate(), spec.allocate()
    info_a, info_b = saved.collect(a), restored.collect(b)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors()))
    assert (info_a.episode_returns, info_a.episode_lengths) == (info_b.episode_returns, info_b.episode_lengths)
    assert not torch.equal(first.observations["obs"], a.observations["obs"])  # (a rollout later, not the same one)


def test_an_env_that_cannot_be_pickled_is_refused_not_rebuilt():
    actor = Actor(0, partial(UnpicklableEnv), make_policy(UnpicklableEnv()), 2, 4, env_seed=1, agent_seed=2)
    with pytest.raises(TypeError, match="lock"):
        actor.snapshot()


RESUMED = [*CARTPOLE, "epoch_length=2", "eval.interval=0", "checkpoint.interval=2"]


@pytest.mark.parametrize("runner", ["sequential", "subproc", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_resumed_run_is_the_run_that_never_stopped(tmp_path, runner):
    """Stopped at an epoch's end and resumed, a reproducible run gives the rows and weights of the run
    that went straight through. On sequential, the same resume without the actors' saved state (deleted)
    is shown to differ, so that the comparison can fail."""
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    runs = [tmp_path / "straight", tmp_path / "stopped"] + ([tmp_path / "cold"] if runner == "sequential" else [])
    for run, steps in zip(runs, (10240, 6144, 6144)):
        assert run_train(*RESUMED, f"runner={runner}", f"max_env_steps={steps}", run_dir=run, env=env).returncode == 0
    resumed = run_train(f"resume={runs[1]}", "max_env_steps=10240", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "the actors go on from their saved state" in resumed.stdout + resumed.stderr
    same_run(runs[0], runs[1])
    if runner == "sequential":
        (runs[2] / "checkpoints" / "actors.pkl").unlink()
        cold = run_train(f"resume={runs[2]}", "max_env_steps=10240")
        assert "the actors' envs start anew (the checkpoint holds no state of the actors" in cold.stdout + cold.stderr
        assert without_timings(read_stats(runs[2])) != without_timings(read_stats(runs[0]))


def test_a_resumed_run_of_two_learners_is_the_run_that_never_stopped(tmp_path):
    """learner.num_learners=2: learner 1's actors and RNG are saved with learner 0's and go on from there."""
    two = [*RESUMED, "runner=subproc", "learner.num_learners=2"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run_train(*two, "max_env_steps=12288", run_dir=straight).returncode == 0
    assert run_train(*two, "max_env_steps=8192", run_dir=stopped).returncode == 0
    resumed = run_train(f"resume={stopped}", "max_env_steps=12288")
    assert resumed.returncode == 0, resumed.stderr
    assert "the actors go on from their saved state" in resumed.stdout + resumed.stderr
    same_run(straight, stopped)


def test_sac_resumes_as_the_run_that_never_stopped_with_its_buffer_and_replay_ratio(tmp_path):
    sac = ["+env=pendulum", "algorithm=sac", "runner.reproducible=true", "seed=5", "epoch_length=8",
           "algorithm.initial_buffer_size=400", "algorithm.batch_size=64", "algorithm.replay_ratio=0.7",
           "policy.hidden_sizes=[32,32]", "eval.interval=0", "checkpoint.replay_buffer=true", "runner=subproc"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run_train(*sac, "max_env_steps=1664", run_dir=straight).returncode == 0
    assert run_train(*sac, "max_env_steps=1152", run_dir=stopped).returncode == 0
    assert run_train(f"resume={stopped}", "max_env_steps=1664").returncode == 0
    same_run(straight, stopped)


def test_an_env_that_cannot_be_pickled_says_so_once_and_the_run_goes_on(tmp_path):
    run_dir, config_dir = tmp_path / "run", tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "locked.yaml").write_text("_target_: tests.envs.UnpicklableEnv\nlength: 20\n")
    env = ["--config-dir", str(config_dir), "+env=locked"]
    result = run_train(*env, "runner=subproc", "runner.reproducible=true", "checkpoint.interval=1", "max_env_steps=8000",
                       "eval.interval=0", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert output.count("the actors' envs cannot be saved") == 1 and "lock" in output
    resumed = run_train(f"resume={run_dir}", "max_env_steps=12000")
    assert resumed.returncode == 0 and "from here on the run is not the one that never stopped" in resumed.stdout + resumed.stderr
