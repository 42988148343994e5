"""runner.reproducible=true: a run is a function of its seed on every runner.

The schedule's order is checked with one actor made slow, so that its rollouts always arrive last: a
backend that took rollouts as they came would put them in the wrong columns. Whole runs are compared
row by row (timings aside) and weight by weight."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from maze_cli.parallel import SequentialDistributedActors, SubprocDistributedActors
from maze_cli.seeding import derive_seeds
from tests.cli import run_train
from tests.envs import CountingEnv, SlowEnv
from tests.test_actors import force_action, make_actors
from tests.test_train import read_stats, without_timings

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
    saved = [torch.load(run / "checkpoints" / "last.pt", weights_only=False)["learner"] for run in (a, b)]
    assert torch.equal(*[torch.cat(list(_tensors(state))) for state in saved])


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree.double().flatten()
    elif isinstance(tree, (int, float)):
        yield torch.tensor([float(tree)], dtype=torch.float64)
    elif isinstance(tree, dict):
        for key in sorted(tree, key=str):
            yield from _tensors(tree[key])
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)


def test_two_subprocess_runs_of_one_seed_are_one_run(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        result = run_train(*CARTPOLE, "runner=subproc", "runner.n_actors=3", run_dir=run)
        assert result.returncode == 0, result.stderr
    assert len(read_stats(runs[0])) >= 4
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
