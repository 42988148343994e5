"""Workers with a replay buffer: counts and shapes, split or whole rollouts, broadcasts, clean stops."""

import time
from functools import partial

import pytest
import torch

from maze_cli.parallel import SequentialDistributedWorkersWithBuffer, SubprocDistributedWorkersWithBuffer
from maze_cli.policies import ActorCritic
from tests.envs import CountingEnv
from tests.helpers import pid_alive
from tests.test_actors import force_action


def make_workers(cls=SequentialDistributedWorkersWithBuffer, split=True, truncate=True, **kwargs):
    env_fn = partial(CountingEnv, length=5, truncate=truncate)
    env = env_fn()
    torch.manual_seed(0)
    policy = ActorCritic(env.observation_space, env.action_space, hidden_sizes=(16,))
    args = dict(
        env_factory=env_fn, worker_policy=policy, n_rollout_steps=4, n_workers=2, batch_size=16, rollouts_per_iteration=2,
        initial_sampling_policy=None, replay_buffer_size=1000, initial_buffer_size=50, split_rollouts_into_transitions=split,
        env_instance_seeds=[1, 2], replay_buffer_seed=3, envs_per_worker=3,
    )
    return cls(**(args | kwargs))


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


@pytest.mark.parametrize("cls", [SequentialDistributedWorkersWithBuffer, SubprocDistributedWorkersWithBuffer])
def test_the_initial_policy_acts_until_a_broadcast_reaches_the_workers(cls):
    with make_workers(cls) as workers:
        workers.init_replay_buffer()
        actions = workers.replay_buffer.storage["action"][: len(workers.replay_buffer)]
        assert 0.3 < actions.float().mean() < 0.7  # uniform random
        workers.broadcast_updated_policy(force_action(workers.workers.policy, 1))
        for _ in range(10):
            before = workers.replay_buffer.added
            workers.collect_rollouts()
            if workers.get_stats_value("policy_lag", name="max") == 0:
                break
            workers.get_epoch_stats_aggregator().clear()
        newest = workers.replay_buffer.storage["action"][before:workers.replay_buffer.added]
        assert (newest == 1).all()


def test_subprocess_workers_keep_collecting_while_the_learner_is_busy_and_stop_cleanly():
    workers = make_workers(SubprocDistributedWorkersWithBuffer, backend_options={"queue_out_of_sync_factor": 2.0})
    with workers:
        workers.collect_rollouts()
        time.sleep(2.0)  # the learner "updates"; workers fill the queue meanwhile
        queue_before, _, dequeue_s = workers.collect_rollouts()
        assert queue_before == workers.workers.queue_size == 4
        assert dequeue_s < 0.5
        pids = workers.alive_pids()
        assert len(pids) == 2
    assert not any(pid_alive(pid) for pid in pids)
