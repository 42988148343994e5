"""The policy contract: recurrent state carried by actors across steps and rollouts, reset at episode
starts, stored at each rollout's start, and unrolled by the learner exactly as the actors stepped it."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from maze_cli.parallel import SequentialDistributedActors, SubprocDistributedActors
from maze_cli.policies import ActorCritic, mlp_network
from tests.envs import CountingEnv

GRU = {"_target_": "tests.recurrent.TinyGru", "size": 8}


def gru_policy(env) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(env.observation_space, env.action_space, GRU)


@pytest.mark.parametrize("cls", [SequentialDistributedActors, SubprocDistributedActors])
def test_the_learner_unrolls_a_recurrent_policy_exactly_as_the_actors_stepped_it(cls):
    env_fn = partial(CountingEnv, length=7)  # episodes end inside and across rollouts of 5 steps
    policy = gru_policy(env_fn())
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
