"""The policy contract: recurrent state carried by actors across steps and rollouts, reset at episode
starts, stored at each rollout's start, and unrolled by the learner exactly as the actors stepped it."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from maze_cli.parallel import SequentialDistributedActors, SubprocDistributedActors
from maze_cli.policies import ActorCritic, mlp_network
from tests.envs import CountingEnv

GRU = {"_target_": "tests.recurrent.TinyGru", "size": 8}  # a user's recurrent network
NETWORKS = {
    "user-gru": GRU,
    "mlp-lstm": {**mlp_network((8,)), "core": "lstm", "core_size": 8},
    "mlp-gru": {**mlp_network((8,)), "core": "gru", "core_size": 8},
}


def gru_policy(env, network: dict = GRU) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(env.observation_space, env.action_space, network)


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("cls", [SequentialDistributedActors, SubprocDistributedActors])
def test_the_learner_unrolls_a_recurrent_policy_exactly_as_the_actors_stepped_it(cls, network):
    env_fn = partial(CountingEnv, length=7)  # episodes end inside and across rollouts of 5 steps
    policy = gru_policy(env_fn(), NETWORKS[network])
    with cls(env_fn, policy, n_rollout_steps=5, n_actors=1, batch_size=1, envs_per_actor=3, actor_env_seeds=[1]) as actors:
        batches = [actors.collect_outputs("cpu")[0] for _ in range(3)]
    for batch in batches:
        out = policy(batch.observations, batch.initial_state, batch.episode_start)
        logp = policy.distribution.log_prob(out.params[:5], batch.actions)
        torch.testing.assert_close(logp, batch.behaviour_logp, atol=1e-5, rtol=0)
    # The state was carried across rollouts: later rollouts start from a non-zero state.
    assert batches[1].initial_state[0].abs().sum() > 0
    # ... and an episode start resets it: starting every step afresh gives other log-probs.
    fresh = policy(batches[1].observations, policy.initial_state(3), torch.ones_like(batches[1].episode_start))
    assert not torch.allclose(policy.distribution.log_prob(fresh.params[:5], batches[1].actions), batches[1].behaviour_logp, atol=1e-4)


def test_episode_starts_mark_the_first_observation_of_each_episode():
    env_fn = partial(CountingEnv, length=4)
    policy = ActorCritic(env_fn().observation_space, env_fn().action_space, mlp_network((8,)))
    with SequentialDistributedActors(env_fn, policy, n_rollout_steps=6, n_actors=1, batch_size=1, envs_per_actor=2) as actors:
        batch = actors.collect_outputs("cpu")[0]
    counts = batch.observations["obs"][..., 0]
    assert torch.equal(batch.episode_start, counts == 0)
    assert batch.episode_start.shape == (7, 2) and batch.initial_state == ()


def test_fresh_records_are_poisoned_until_written():
    from maze_cli.records import RolloutSpec, TensorSpec

    record = RolloutSpec({"obs": TensorSpec((2,), torch.float32), "n": TensorSpec((), torch.int64)},
                         TensorSpec((), torch.int64), n_steps=3, n_envs=2).allocate()
    assert torch.isnan(record.observations["obs"]).all() and torch.isnan(record.rewards).all()
    assert (record.observations["n"] == torch.iinfo(torch.int64).min).all() and (record.actions == torch.iinfo(torch.int64).min).all()


def test_every_field_of_a_collected_record_is_written():
    env_fn = partial(CountingEnv, length=3, truncate=True)
    policy = gru_policy(env_fn())
    with SequentialDistributedActors(env_fn, policy, n_rollout_steps=4, n_actors=1, batch_size=1, envs_per_actor=2) as actors:
        batch = actors.collect_outputs("cpu")[0]
    for name, tensor in [("obs", batch.observations["obs"]), ("final", batch.final_observations["obs"]),
                         ("logp", batch.behaviour_logp), ("rewards", batch.rewards), ("state", batch.initial_state[0])]:
        assert torch.isfinite(tensor).all(), name
    assert (batch.actions >= 0).all() and (batch.policy_version >= 0).all()


def memory_run(tmp_path, core: str):
    from tests.cli import run_train
    from tests.test_train import read_stats

    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True, exist_ok=True)
    (config_dir / "env" / "cue.yaml").write_text("_target_: tests.envs.CueRecallEnv\ndelay: 4\n")
    run_dir = tmp_path / core
    result = run_train("--config-dir", str(config_dir), "+env=cue", f"policy.core={core}", "runner.envs_per_actor=16",
                       "target_return=0.95", "eval.episodes=20", "max_env_steps=250000", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir, read_stats(run_dir)


@pytest.mark.slow
def test_a_memory_task_is_learned_with_the_lstm_core_and_not_without(tmp_path):
    """Recall a cue shown 5 steps earlier: chance (0.5) is the best a memoryless policy can do."""
    _, with_memory = memory_run(tmp_path, "lstm")
    assert with_memory[-1]["eval/return_mean"] >= 0.95 and with_memory[-1]["env_steps"] < 250000
    _, without = memory_run(tmp_path, "identity")
    assert without[-1]["env_steps"] >= 250000
    assert max(row["train/return_window_mean"] for row in without if "train/return_window_mean" in row) < 0.65


def test_a_recurrent_run_resumes_from_its_checkpoint(tmp_path):
    from tests.cli import run_train
    from tests.test_train import read_stats

    run_dir = tmp_path / "run"
    # No target: a lucky 2-episode evaluation at 475 would end the run before its step budget.
    first = run_train("+env=cartpole", "policy.core=lstm", "policy.core_size=16", "runner.envs_per_actor=8", "max_env_steps=20000",
                      "target_return=null", "epoch_length=5", "eval.episodes=2", run_dir=run_dir)
    assert first.returncode == 0, first.stderr
    resumed = run_train(f"resume={run_dir}", "max_env_steps=40000")
    assert resumed.returncode == 0, resumed.stderr
    rows = read_stats(run_dir)
    assert rows[-1]["env_steps"] >= 40000, rows[-1]
    assert [row["epoch"] for row in rows] == list(range(1, len(rows) + 1))
