"""Workers with a replay buffer around any actors: counts and shapes, split or whole rollouts,
broadcasts, the guard against vectorized envs, clean stops."""

import time
from functools import partial

import pytest
import torch

from maze_cli.buffers import PrioritizedReplayBuffer, UniformReplayBuffer
from maze_cli.envs import EnvFactory
from maze_cli.parallel import (
    BaseDistributedWorkersWithBuffer,
    SequentialDistributedActors,
    SubprocDistributedActors,
    initial_sampling_policy_or_random,
)
from maze_cli.policies import RandomPolicy
from tests.envs import CountingEnv
from tests.helpers import pid_alive
from tests.test_actors import force_action, make_policy


def make_actors(cls=SequentialDistributedActors, truncate=True, env_fn=None, **kwargs):
    """Actors built for the workers' role: the initial sampling policy, `rollouts_per_iteration` (2)
    as their batch size, and an env factory without vectorization."""
    env_fn = env_fn or partial(CountingEnv, length=5, truncate=truncate)
    policy = make_policy(env_fn())
    args = dict(n_rollout_steps=4, n_actors=2, batch_size=2, envs_per_actor=3, actor_env_seeds=[1, 2],
                initial_policy=initial_sampling_policy_or_random(policy))
    return cls(env_fn, policy, **(args | kwargs))


def make_workers(cls=SequentialDistributedActors, split=True, truncate=True, replay_buffer=None, actor_options=None):
    return BaseDistributedWorkersWithBuffer(
        make_actors(cls, truncate, **(actor_options or {})),
        replay_buffer or partial(UniformReplayBuffer, capacity=1000, seed=3),
        batch_size=16, initial_buffer_size=50, split_rollouts_into_transitions=split,
    )


def test_the_buffer_fills_with_the_expected_counts_and_shapes_when_splitting():
    with make_workers() as workers:
        workers.collect_rollouts()
        assert len(workers.replay_buffer) == 2 * 4 * 3
        workers.init_replay_buffer()
        assert workers.env_steps >= 50 and len(workers.replay_buffer) == workers.env_steps
        batch = workers.sample_batch("cpu")
    t = batch.transitions
    assert len(t) == 16 and t.observations["obs"].shape == (16, 1) and t.actions.shape == (16,)
    # Truncated episodes keep their real last observation: the successor is always count + 1.
    torch.testing.assert_close(t.next_observations["obs"], t.observations["obs"] + 1)
    assert batch.weights.shape == (16,) and (batch.weights == 1).all()


def test_whole_rollouts_are_stored_without_splitting():
    with make_workers(split=False) as workers:
        workers.collect_rollouts()
        assert len(workers.replay_buffer) == 2 * 3  # one item per env column of each rollout
        assert workers.replay_buffer.storage["obs/obs"].shape[1:] == (5, 1)  # T + 1 observations
        batch = workers.sample_batch("cpu")
    assert batch.steps_per_item == 4 and len(batch.transitions) == 16 * 4
    torch.testing.assert_close(batch.transitions.next_observations["obs"], batch.transitions.observations["obs"] + 1)


def test_terminal_transitions_are_marked():
    with make_workers(truncate=False) as workers:
        workers.init_replay_buffer()
        stored = workers.replay_buffer.storage
        n = len(workers.replay_buffer)
        ends = stored["obs/obs"][:n, 0] == 4  # the 5th step ends the episode
        assert torch.equal(stored["terminated"][:n], ends)


def test_the_replay_buffer_is_built_for_the_actors_rollouts_by_the_callers_factory():
    prioritized = partial(PrioritizedReplayBuffer, capacity=64, seed=5, alpha=0.7)
    with make_workers(replay_buffer=prioritized) as workers:
        assert isinstance(workers.replay_buffer, PrioritizedReplayBuffer) and workers.replay_buffer.capacity == 64
        assert set(workers.replay_buffer.storage) == {"obs/obs", "next_obs/obs", "action", "reward", "terminated"}
        workers.init_replay_buffer()
        batch = workers.sample_batch("cpu")
        workers.update_priorities(batch, torch.linspace(0.0, 5.0, len(batch.transitions)))
        assert not (workers.sample_batch("cpu").weights == 1).all()  # the priorities took effect


@pytest.mark.parametrize("cls", [SequentialDistributedActors, SubprocDistributedActors])
def test_the_initial_policy_acts_until_a_broadcast_reaches_the_workers(cls):
    with make_workers(cls) as workers:
        workers.init_replay_buffer()
        actions = workers.replay_buffer.storage["action"][: len(workers.replay_buffer)]
        assert 0.3 < actions.float().mean() < 0.7  # uniform random
        workers.broadcast_updated_policy(force_action(workers.actors.policy, 1))
        for _ in range(10):
            before = workers.replay_buffer.added
            workers.collect_rollouts()
            if workers.get_stats_value("policy_lag", name="max") == 0:
                break
            workers.get_epoch_stats_aggregator().clear()
        newest = workers.replay_buffer.storage["action"][before:workers.replay_buffer.added]
        assert (newest == 1).all()


def test_the_initial_sampling_policy_is_uniform_random_unless_given():
    policy = make_policy(CountingEnv())
    assert isinstance(initial_sampling_policy_or_random(policy), RandomPolicy)
    assert initial_sampling_policy_or_random(policy, policy) is policy


def test_actors_whose_envs_may_be_vectorized_are_refused():
    vectorized = EnvFactory({"id": "CartPole-v1"})
    with pytest.raises(ValueError, match=r"env_factory\.without_vectorization\(\)"):
        BaseDistributedWorkersWithBuffer(make_actors(env_fn=vectorized), partial(UniformReplayBuffer, capacity=100, seed=0),
                                         batch_size=4, initial_buffer_size=8, split_rollouts_into_transitions=True)
    workers = BaseDistributedWorkersWithBuffer(make_actors(env_fn=vectorized.without_vectorization()),
                                               partial(UniformReplayBuffer, capacity=100, seed=0), batch_size=4,
                                               initial_buffer_size=8, split_rollouts_into_transitions=True)
    with workers:
        workers.init_replay_buffer()
    assert len(workers.replay_buffer) == workers.env_steps >= 8


def test_subprocess_workers_keep_collecting_while_the_learner_is_busy_and_stop_cleanly():
    workers = make_workers(SubprocDistributedActors, actor_options={"queue_out_of_sync_factor": 2.0})
    with workers:
        workers.collect_rollouts()
        time.sleep(2.0)  # the learner "updates"; workers fill the queue meanwhile
        queue_before, _, dequeue_s = workers.collect_rollouts()
        assert workers.actors.queue_size == 4
        assert queue_before == workers.actors.queue_size + workers.actors.n_actors  # every slot of the pool filled
        assert dequeue_s < 0.5
        pids = workers.alive_pids()
        assert len(pids) == 2
    assert not any(pid_alive(pid) for pid in pids)


def test_alive_pids_is_there_only_for_actors_with_processes():
    with make_workers() as workers, pytest.raises(AttributeError, match="SequentialDistributedActors"):
        workers.alive_pids()
