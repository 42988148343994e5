"""Actors on gymnasium's vectorized envs: autoreset steps are marked, counted right, and never learned from."""

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch

from maze_cli.algorithms.impala import Impala, ImpalaObjective
from maze_cli.learner import Learner
from maze_cli.envs import EnvFactory
from maze_cli.envs.batch import EnvList, VectorEnvBatch, make_env_batch
from maze_cli.buffers import UniformReplayBuffer
from maze_cli.parallel import BaseDistributedWorkersWithBuffer, SequentialDistributedActors
from maze_cli.policies import ActorCritic, RandomPolicy, mlp_network
from tests.envs import CountingEnv

SHORT_CARTPOLE = {"id": "CartPole-v1", "max_episode_steps": 5}  # every random episode is truncated at 5 steps


def collect(config: dict, n_steps: int = 24, envs: int = 4):
    env_fn = EnvFactory(config)
    env = env_fn()
    policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)))
    with SequentialDistributedActors(env_fn, policy, n_steps, 1, 1, envs_per_actor=envs) as actors:
        return actors.collect_outputs("cpu")[0], actors


def test_an_env_with_a_vector_entry_point_is_stepped_vectorized_unless_told_not_to():
    assert isinstance(make_env_batch(EnvFactory({"id": "CartPole-v1"}), 4), VectorEnvBatch)
    assert isinstance(make_env_batch(EnvFactory({"id": "CartPole-v1", "vectorize": False}), 4), EnvList)
    assert isinstance(make_env_batch(EnvFactory({"id": "Pendulum-v1"}), 4), EnvList)  # none registered
    assert isinstance(make_env_batch(CountingEnv, 4), EnvList)  # any callable


def test_the_step_after_each_episode_end_is_an_autoreset_step():
    batch, actors = collect(SHORT_CARTPOLE)
    # Per column: 5 real steps (the 5th truncated), then one autoreset step, repeating.
    expected_autoreset = torch.tensor([t % 6 == 5 for t in range(24)]).unsqueeze(1).expand(24, 4)
    assert torch.equal(batch.autoreset, expected_autoreset)
    assert torch.equal(batch.truncated, torch.tensor([t % 6 == 4 for t in range(24)]).unsqueeze(1).expand(24, 4))
    assert not batch.terminated.any()
    assert (batch.rewards[batch.autoreset] == 0).all() and (batch.rewards[~batch.autoreset] == 1).all()
    # The truncated episode's last observation is kept to bootstrap from; the autoreset step then
    # leads to a fresh episode's first observation (CartPole starts within +-0.05).
    t = 4
    assert torch.equal(batch.final_observations["obs"][t], batch.observations["obs"][t + 1])
    assert batch.observations["obs"][t + 2].abs().max() <= 0.05
    # Episodes count real steps only: every one is 5 long with return 5.
    assert actors.get_stats_value("episode_length", name="min") == actors.get_stats_value("episode_length", name="max") == 5
    assert actors.get_stats_value("episode_return", name="mean") == 5


def test_single_envs_have_no_autoreset_steps():
    batch, _ = collect({**SHORT_CARTPOLE, "vectorize": False})
    assert not batch.autoreset.any()
    assert torch.equal(batch.truncated, torch.tensor([t % 5 == 4 for t in range(24)]).unsqueeze(1).expand(24, 4))


def test_the_learner_ignores_what_happens_in_autoreset_steps():
    batch, _ = collect(SHORT_CARTPOLE)
    env = gym.make("CartPole-v1")

    def loss_with(garbage: float) -> float:
        torch.manual_seed(0)
        policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)))
        learner = Learner(ImpalaObjective(policy, Impala(lr=0.0)))
        altered = batch.map(lambda t: t.clone())
        altered.actions[batch.autoreset] = int(garbage) % 2
        altered.rewards[batch.autoreset] = garbage
        altered.behaviour_logp[batch.autoreset] = -garbage
        return float(learner.update(altered)["loss"])

    assert loss_with(7.0) == pytest.approx(loss_with(-300.0), abs=1e-6)


def test_replay_workers_step_single_envs_so_every_step_is_a_transition():
    env_fn = EnvFactory(SHORT_CARTPOLE)
    env = env_fn()
    policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)))
    actors = SequentialDistributedActors(
        env_fn.without_vectorization(), policy, n_rollout_steps=8, n_actors=1, batch_size=1, envs_per_actor=4, actor_env_seeds=[1],
        initial_policy=RandomPolicy(env.observation_space, env.action_space),
    )
    workers = BaseDistributedWorkersWithBuffer(actors, partial(UniformReplayBuffer, capacity=1000, seed=2), batch_size=4,
                                               initial_buffer_size=64, split_rollouts_into_transitions=True)
    with workers:
        workers.init_replay_buffer()
        sampled = workers.sample_batch("cpu")
    assert len(workers.replay_buffer) >= 64
    assert np.isin(sampled.transitions.rewards.numpy(), [1.0]).all()  # no zero-reward autoreset step got in


def test_gymnasium_warnings_are_shown_without_ansi_colour_codes():
    import warnings

    from gymnasium.utils import colorize

    import maze_cli.envs.factory  # noqa: F401 - installs the plain formatting, as in every process that builds envs

    shown = warnings.formatwarning(colorize("WARN: an env warning", "yellow"), UserWarning, "env.py", 1)
    assert "\x1b" not in shown and "WARN: an env warning" in shown
