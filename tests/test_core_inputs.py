"""`policy.core_inputs`: the previous action and reward reach the policy as observation keys, in the
actors, the learner's unroll, evaluation and `rollout` alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from maze_cli.envs.factory import EnvFactory
from maze_cli.errors import ConfigError
from maze_cli.parallel import SequentialDistributedActors
from maze_cli.policies import ActorCritic, mlp_network

ALL = ["obs", "prev_action", "prev_reward"]


def counting(obs_kind: str = "box", action_kind: str = "discrete", **extra) -> EnvFactory:
    env = {"_target_": "tests.envs.CountingEnv", "length": 3, "obs_kind": obs_kind, "action_kind": action_kind, **extra}
    return EnvFactory.for_policy(env, {"core_inputs": ALL})


def test_the_previous_action_and_reward_are_zeros_at_reset_then_follow_the_steps():
    env = counting()()
    observation, _ = env.reset(seed=0)
    assert set(observation) == {"obs", "prev_action", "prev_reward"}
    assert not observation["prev_action"].any() and observation["prev_reward"][0] == 0.0
    observation, *_ = env.step(1)
    assert observation["prev_action"].tolist() == [0.0, 1.0] and observation["prev_reward"].tolist() == [1.0]
    assert env.observation_space.contains(observation)
    observation, _ = env.reset()
    assert not observation["prev_action"].any()


def test_a_dict_observation_keeps_its_keys_and_box_actions_pass_as_they_are():
    env = counting("dict", "box", reward_clip=0.5)()
    env.reset(seed=0)
    observation, *_ = env.step(np.array([0.25, -1.0], np.float32))
    assert set(observation) == {"count", "parity", "prev_action", "prev_reward"}
    assert observation["prev_action"].tolist() == [0.25, -1.0]
    assert observation["prev_reward"].tolist() == [0.5]  # clipped as the learner sees rewards


def test_without_extra_inputs_the_env_is_unchanged():
    env = EnvFactory.for_policy({"id": "CartPole-v1"}, {"core_inputs": ["obs"]})
    assert "core_inputs" not in env.config and env.vector_env(2) is not None


@pytest.mark.parametrize("inputs, word", [(["obs", "prev_actoin"], "prev_actoin"), (["prev_action"], "observation")])
def test_a_bad_list_is_refused_naming_the_problem(inputs, word):
    with pytest.raises(ConfigError, match=word):
        EnvFactory.for_policy({"id": "CartPole-v1"}, {"core_inputs": inputs})


def test_the_learner_replays_the_inputs_the_actors_saw():
    factory = counting()
    env = factory()
    torch.manual_seed(0)
    policy = ActorCritic(env.observation_space, env.action_space, {**mlp_network((8,)), "core": "lstm", "core_size": 8})
    with SequentialDistributedActors(factory, policy, n_rollout_steps=5, n_actors=1, batch_size=1, envs_per_actor=2) as actors:
        batch = actors.collect_outputs("cpu")[0]
    prev = batch.observations["prev_action"][1:5].argmax(-1)
    stepped = ~batch.episode_start[1:5]
    assert torch.equal(prev[stepped], batch.actions[:4][stepped])  # the one-hot of the action before
    out = policy(batch.observations, batch.initial_state, batch.episode_start)
    torch.testing.assert_close(policy.distribution.log_prob(out.params[:5], batch.actions), batch.behaviour_logp, atol=1e-5, rtol=0)


def test_a_run_with_core_inputs_trains_and_its_checkpoint_rolls_out(tmp_path):
    from tests.cli import run_train
    from tests.test_checkpoints import rollout

    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "policy.core=lstm", "policy.core_size=16", "policy.core_inputs=[obs,prev_action,prev_reward]",
                       "runner.envs_per_actor=8", "max_env_steps=10000", "epoch_length=5", "eval.episodes=2", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    out = rollout(f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=2")
    assert out.returncode == 0, out.stderr
    assert "2 episodes: return" in out.stdout
