"""Sequential and subprocess actors: shapes, time order, broadcasts, the queue and lag bounds,
failures and restarts, clean stops."""

import math
import multiprocessing.synchronize
import time
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch

from maze_cli.envs import EnvFactory
from maze_cli.parallel import ActorFailure, SequentialDistributedActors, SubprocDistributedActors
from maze_cli.policies import ActorCritic, mlp_network
from maze_cli.seeding import derive_seed, derive_seeds
from tests.envs import CountingEnv, StepRaisingEnv
from tests.helpers import pid_alive, wait_until

BACKENDS = [SequentialDistributedActors, SubprocDistributedActors]


class StepHangingEnv(CountingEnv):
    """Fault injection: hangs in `step` after `hang_after` steps of this instance (so a restarted
    actor, with fresh envs, hangs again)."""

    def __init__(self, hang_after: int = 10, **kwargs):
        super().__init__(**kwargs)
        self.hang_after = hang_after
        self.total_steps = 0

    def step(self, action):
        self.total_steps += 1
        if self.total_steps > self.hang_after:
            time.sleep(3600)
        return super().step(action)


def make_policy(env: gym.Env) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(env.observation_space, env.action_space, network=mlp_network(hidden_sizes=(16,)))


def make_actors(cls, env_fn, n_steps=6, n_actors=2, batch_size=2, envs_per_actor=3, **kwargs):
    return cls(env_fn, make_policy(env_fn()), n_steps, n_actors, batch_size, envs_per_actor=envs_per_actor, **kwargs)


def force_action(policy: ActorCritic, action: int) -> dict:
    """A state_dict whose policy always picks `action` (huge bias on its logit)."""
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    last_bias = [k for k in state if k.startswith("policy_head") and k.endswith("bias")][-1]
    state[last_bias].zero_()
    state[last_bias][action] = 1e4
    return state


@pytest.mark.parametrize("cls", BACKENDS)
def test_batches_are_time_major_with_the_expected_shapes(cls):
    with make_actors(cls, partial(CountingEnv, length=4)) as actors:
        batch, *_ = actors.collect_outputs("cpu")
    T, B = 6, 2 * 3
    assert batch.observations["obs"].shape == (T + 1, B, 1)
    assert batch.actions.shape == (T, B)
    assert batch.rewards.shape == batch.dones.shape == batch.behaviour_logp.shape == (T, B)
    assert batch.policy_version.shape == (B,)
    count = batch.observations["obs"][..., 0]
    # Along time, the count rises by one per step and falls to 0 exactly where an episode ended.
    for t in range(T):
        expected = torch.where(batch.dones[t], torch.zeros(B), count[t] + 1)
        assert torch.equal(count[t + 1], expected)
    assert batch.dones.any()


@pytest.mark.parametrize("cls", BACKENDS)
def test_a_broadcast_reaches_the_actors(cls):
    with make_actors(cls, partial(CountingEnv, length=50)) as actors:
        first, *_ = actors.collect_outputs("cpu")
        assert (first.policy_version == 0).all()
        actors.broadcast_updated_policy(force_action(actors.policy, 1))
        # Within the queue bound plus one rollout per actor, rollouts carry the new version and its actions.
        for _ in range(10):
            batch, *_ = actors.collect_outputs("cpu")
            if (batch.policy_version == 1).all():
                break
        assert (batch.policy_version == 1).all()
        assert (batch.actions == 1).all()


def rollout_versions(batch, envs_per_actor: int) -> list[int]:
    """The policy version of each rollout in a batch (its columns come in blocks of one rollout each)."""
    return batch.policy_version[::envs_per_actor].tolist()


def test_a_slow_learner_sees_policy_lag_up_to_the_documented_bound_and_never_more():
    # The learner sleeps between collects, so the actor runs ahead until the queue is full: the
    # rollouts the learner takes were collected with older weights (lag > 0), but never more than
    # SubprocDistributedActors promises from the queue size, the number of actors and the batch size.
    # One actor: with several, one descheduled on a busy machine may be overtaken by the others and
    # lag more, which the bound leaves out (see its docstring); a single actor cannot be overtaken.
    actors = make_actors(SubprocDistributedActors, partial(CountingEnv, length=5), n_actors=1, batch_size=2,
                         queue_out_of_sync_factor=1)
    bound = math.ceil((actors.queue_size + actors.n_actors) / actors.batch_size)
    assert actors.queue_size == 2 and bound == 2
    lags = []
    with actors:
        for _ in range(40):
            actors.get_epoch_stats_aggregator().clear()
            batch, *_ = actors.collect_outputs("cpu")
            reported = actors.get_epoch_stats_aggregator().values("policy_lag")
            # The epoch stat is the learner's version now minus the version each rollout carries.
            assert sorted(reported) == sorted(actors.policy_version - v for v in rollout_versions(batch, 3))
            lags += reported
            actors.broadcast_updated_policy(actors.policy.state_dict())
            # the learner "updates" until the actor has filled every slot of the pool
            assert wait_until(lambda: actors._queue_size() == actors.queue_size + actors.n_actors)
    assert max(lags) > 0, "a slow learner must take rollouts of older policy versions"
    assert max(lags) <= bound, f"policy lag {max(lags)} beyond the bound {bound}: {lags}"


def test_a_slow_learner_finds_the_pool_of_slots_full_never_beyond():
    # 3 actors and a pool of queue_size + 3 = 6 slots: a slow learner finds 6 finished rollouts, and
    # the actors wait rather than collect more (without the bound they would go on).
    actors = make_actors(SubprocDistributedActors, partial(CountingEnv, length=5), n_actors=3, batch_size=2,
                         queue_out_of_sync_factor=1.5)
    assert actors.queue_size == 3
    with actors:
        for _ in range(4):
            wait_until(lambda: actors._queue_size() >= 6)  # the learner "updates"; the actors fill every free slot meanwhile
            time.sleep(0.2)  # and, were the pool not bounded, would go on filling more
            _, queue_before, queue_after, _ = actors.collect_outputs("cpu")
            assert queue_before == 6  # reported as the learner found it: the whole pool, not more
            assert queue_after <= 6


@pytest.mark.parametrize("fault", ["raise", "hang"])
@pytest.mark.parametrize("cls", BACKENDS)
def test_a_restarted_actor_reports_its_derived_seeds_in_every_backend(cls, fault):
    # Every env instance fails on its 8th step (in the 2nd rollout): the first failure restarts the
    # actor, the second ends the run; its report names the seeds the restarted actor ran with.
    env_fn = partial(StepRaisingEnv, fail_after=7) if fault == "raise" else partial(StepHangingEnv, hang_after=7)
    actors = make_actors(cls, env_fn, n_actors=1, batch_size=1, actor_env_seeds=[3], actor_agent_seeds=[7],
                         max_restarts=1, rollout_timeout_s=1.0)
    with pytest.raises(ActorFailure, match="all 1 restarts of runner.max_restarts used") as info, actors:
        for _ in range(20):
            actors.collect_outputs("cpu")
    assert actors.supervisor.actor_restarts == [1]
    assert (info.value.env_seed, info.value.agent_seed) == (derive_seed(3, "restart-1"), derive_seed(7, "restart-1"))
    assert (info.value.env_seed, info.value.agent_seed) == actors.supervisor.seeds(0)
    assert ("injected failure in step" if fault == "raise" else "silent: no rollout for") in info.value.details


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_no_child_process_is_alive_after_stop(start_method):
    actors = make_actors(SubprocDistributedActors, partial(CountingEnv, length=5), n_actors=2, start_method=start_method)
    with actors:
        actors.collect_outputs("cpu")
        pids = [p.pid for p in actors.processes]
        assert all(pid_alive(pid) for pid in pids)
    assert not any(pid_alive(pid) for pid in pids)
    actors.stop()  # a second stop is harmless


def test_a_subproc_actor_reproduces_the_sequential_actor_exactly():
    env_fn = EnvFactory({"id": "CartPole-v1"})
    seeds = dict(actor_env_seeds=[11], actor_agent_seeds=[12])
    collected = []
    for cls in (SequentialDistributedActors, SubprocDistributedActors, SubprocDistributedActors):
        with make_actors(cls, env_fn, n_steps=20, n_actors=1, batch_size=1, envs_per_actor=4, **seeds) as actors:
            collected.append([actors.collect_outputs("cpu")[0] for _ in range(3)])
    for other in collected[1:]:
        for a, b in zip(collected[0], other):
            assert torch.equal(a.observations["obs"], b.observations["obs"])
            assert torch.equal(a.actions, b.actions)
            assert torch.equal(a.behaviour_logp, b.behaviour_logp)


@pytest.mark.parametrize("vectorize", [False, True])
def test_explicit_actor_env_seeds_are_used(vectorize):
    env_fn = EnvFactory({"id": "CartPole-v1", "vectorize": vectorize})
    with make_actors(SequentialDistributedActors, env_fn, n_actors=2, batch_size=2, actor_env_seeds=[5, 6]) as actors:
        batch, *_ = actors.collect_outputs("cpu")
    for actor, seed in enumerate([5, 6]):
        if vectorize:  # one seed for the actor's whole vectorized batch
            vector_env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="vector_entry_point")
            first_obs = vector_env.reset(seed=derive_seed(seed, "vector_env"))[0]
        else:  # one seed per env
            first_obs = np.stack([gym.make("CartPole-v1").reset(seed=s)[0] for s in derive_seeds(seed, "env", 3)])
        assert torch.equal(batch.observations["obs"][0, actor * 3:actor * 3 + 3], torch.from_numpy(first_obs))


@pytest.mark.parametrize("obs_kind,action_kind,width", [("dict", "multidiscrete", (2,)), ("box", "box", (2,)), ("dict", "discrete", ())])
def test_every_supported_space_kind_flows_through(obs_kind, action_kind, width):
    env_fn = partial(CountingEnv, length=3, obs_kind=obs_kind, action_kind=action_kind)
    with make_actors(SequentialDistributedActors, env_fn) as actors:
        batch, *_ = actors.collect_outputs("cpu")
    assert batch.actions.shape == (6, 6) + width
    assert set(batch.observations) == ({"count", "parity"} if obs_kind == "dict" else {"obs"})


def test_truncated_episodes_keep_their_final_observation():
    env_fn = partial(CountingEnv, length=3, truncate=True)
    with make_actors(SequentialDistributedActors, env_fn) as actors:
        batch, *_ = actors.collect_outputs("cpu")
    assert batch.truncated.any() and not batch.terminated.any()
    final = batch.final_observations["obs"][..., 0]
    assert (final[batch.truncated] == 3).all()  # the count when the time limit hit
    assert (final[~batch.truncated] == 0).all()
    assert (batch.observations["obs"][1:][batch.truncated][..., 0] == 0).all()  # next row: already reset


@pytest.mark.parametrize("cls", BACKENDS)
def test_an_actor_error_reaches_the_learner_with_index_seeds_and_traceback(cls):
    env_fn = partial(StepRaisingEnv, fail_after=10)
    actors = make_actors(cls, env_fn, n_actors=2, actor_env_seeds=[3, 4], actor_agent_seeds=[7, 8])
    start = time.monotonic()
    with pytest.raises(ActorFailure) as info, actors:
        for _ in range(20):
            actors.collect_outputs("cpu")
    assert time.monotonic() - start < 30
    assert "injected failure in step" in str(info.value)
    assert info.value.actor_index in (0, 1)
    assert info.value.env_seed == [3, 4][info.value.actor_index]
    if cls is SubprocDistributedActors:
        assert wait_until(lambda: not actors.processes)


def holds_a_lock(obj: object, depth: int = 2) -> bool:
    """Whether `obj` is, or holds within `depth` attributes, a multiprocessing lock or semaphore
    (an Event, a Condition and a Queue each hold some)."""
    if isinstance(obj, multiprocessing.synchronize.SemLock):
        return True
    return depth > 0 and hasattr(obj, "__dict__") and any(holds_a_lock(v, depth - 1) for v in vars(obj).values())


def test_actors_share_no_lock_that_a_killed_actor_could_hold():
    """An actor SIGKILLed while it holds a lock it shares with the others (an Event's `is_set`
    takes one) would block every other actor and the learner's stop, forever."""
    actors = make_actors(SubprocDistributedActors, partial(CountingEnv, length=5), n_actors=2)
    with actors:
        actors.collect_outputs("cpu")
        shared = [arg for index in range(actors.n_actors) for arg in actors._actor_args(index, outbox=None)]
        assert len(shared) > 10 and not [arg for arg in shared if holds_a_lock(arg)]


def test_a_killed_actor_is_noticed_within_seconds():
    import os
    import signal

    actors = make_actors(SubprocDistributedActors, partial(CountingEnv, length=5), n_actors=2)
    with pytest.raises(ActorFailure, match="exited"), actors:
        actors.collect_outputs("cpu")
        os.kill(actors.processes[1].pid, signal.SIGKILL)
        start = time.monotonic()
        try:
            for _ in range(10_000):
                actors.collect_outputs("cpu")
        finally:
            assert time.monotonic() - start < 5


def test_the_tanh_of_large_batches_matches_torchs_in_value_and_gradient():
    from maze_cli.policies.mlp import Tanh

    x = torch.randn(Tanh.SIGMOID_FROM // 64 + 1, 64, dtype=torch.float32) * 3
    mine, native = x.clone().requires_grad_(), x.clone().requires_grad_()
    grad = torch.randn_like(x)
    Tanh()(mine).backward(grad)
    torch.tanh(native).backward(grad)
    assert torch.allclose(Tanh()(x), torch.tanh(x), atol=1e-6)
    assert torch.allclose(mine.grad, native.grad, atol=1e-5)


@pytest.mark.parametrize("config", [
    {"id": "CartPole-v1", "max_episode_steps": 30},  # vectorized: autoreset steps, which no episode counts
    {"id": "CartPole-v1", "max_episode_steps": 30, "vectorize": False, "reward_clip": 0.5},  # stats keep the env's rewards
])
def test_episode_returns_and_lengths_are_those_of_the_recorded_steps_across_rollouts(config):
    from maze_cli.envs.spaces import action_spec, observation_specs
    from maze_cli.parallel.actor_loop import Actor
    from maze_cli.records import RolloutSpec

    env_fn = EnvFactory(config)
    env = env_fn()
    n_envs, n_steps = 3, 7  # episodes of up to 30 steps span several rollouts
    actor = Actor(0, env_fn, make_policy(env), n_envs, n_steps, env_seed=1, agent_seed=2)
    record = RolloutSpec(observation_specs(env.observation_space), action_spec(env.action_space), n_steps, n_envs).allocate()
    returns, lengths, expected_returns, expected_lengths = [], [], [], []
    running_return, running_length = [0.0] * n_envs, [0] * n_envs
    try:
        for _ in range(25):
            info = actor.collect(record)
            returns += info.episode_returns
            lengths += info.episode_lengths
            for t in range(n_steps):  # the count a reader of the records would make, step by step
                for i in range(n_envs):
                    if not record.autoreset[t, i]:
                        running_return[i] += 1.0 if "reward_clip" in config else float(record.rewards[t, i])
                        running_length[i] += 1
                    if record.terminated[t, i] or record.truncated[t, i]:
                        expected_returns.append(running_return[i])
                        expected_lengths.append(running_length[i])
                        running_return[i], running_length[i] = 0.0, 0
    finally:
        actor.close()
    assert len(expected_lengths) > 10 and max(expected_lengths) == 30  # some episodes truncated, all counted
    assert lengths == expected_lengths
    assert returns == pytest.approx(expected_returns)
    if "reward_clip" in config:
        assert returns == [float(n) for n in lengths]  # CartPole's reward, 1 a step, not the learner's clipped 0.5
        assert set(record.rewards.flatten().tolist()) == {0.5}
