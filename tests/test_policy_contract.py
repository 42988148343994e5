"""The policy contract: recurrent state carried by actors across steps and rollouts, reset at episode
starts, stored at each rollout's start, and unrolled by the learner exactly as the actors stepped it."""

from __future__ import annotations

import math
from functools import partial

import gymnasium as gym
import numpy as np
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


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("starts", ["inside", "none inside"])
def test_a_recurrent_core_unrolls_its_episodes_side_by_side_as_it_steps(kind, starts):
    """The learner's unroll (each env's column cut at its own episode starts, the pieces unrolled as one
    packed sequence; one fused call where no episode starts inside) gives the outputs, final state and
    gradients of stepping the cell one step at a time, resets at the first step included; under bf16
    autocast it keeps the state in fp32, as the actors carry it."""
    from maze_cli.policies.cores import RecurrentCore

    torch.manual_seed(0)
    core = RecurrentCore(6, 8, kind)
    x = torch.randn(12, 5, 6, requires_grad=True)
    episode_start = torch.zeros(12, 5, dtype=torch.bool)
    episode_start[0, 1] = True  # column 1 starts an episode at step 0: its stored state is not used
    if starts == "inside":
        # pieces of 1 to 12 steps: column 0 cut at 4 and 5, column 3 at 4, column 2 at 9 and 11; column 4 whole
        episode_start[4, 0] = episode_start[5, 0] = episode_start[4, 3] = episode_start[9, 2] = episode_start[11, 2] = True
    state = tuple(torch.randn(5, 8) for _ in range(2 if kind == "lstm" else 1))
    results = []
    for unroll in (core.forward, core._forward_stepwise):
        out, final = unroll(x, state, episode_start)
        grads = torch.autograd.grad(out.square().sum() + sum(s.sum() for s in final), [x, *core.parameters()])
        results.append((out, final, grads))
    (out, final, grads), (out_steps, final_steps, grads_steps) = results
    torch.testing.assert_close(out, out_steps, atol=1e-6, rtol=1e-5)
    for a, b in zip((*final, *grads), (*final_steps, *grads_steps)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_bf16, final_bf16 = core(x.to(torch.bfloat16), state, episode_start)
    assert out_bf16.dtype == torch.float32 and all(s.dtype == torch.float32 for s in final_bf16)


@pytest.mark.parametrize("core, shared_network, shared", [("lstm", None, True), ("gru", None, True), ("identity", None, False),
                                                           ("lstm", False, False), ("identity", True, True)])
def test_a_recurrent_core_serves_both_heads_unless_the_config_says_otherwise(core, shared_network, shared):
    """PPO's and APPO's `shared_network: null`: one network where it has a memory, so that the value loss
    trains the memory too; one each for a feed-forward network; a value set in the config wins."""
    from maze_cli.algorithms.ppo import AppoConfig, PpoConfig

    assert PpoConfig.shared_network is None and AppoConfig.shared_network is None
    env = CountingEnv()
    policy = ActorCritic(env.observation_space, env.action_space, {**mlp_network((8,)), "core": core, "core_size": 8},
                         shared_network=shared_network)
    assert (policy.value_network is None) == shared
    assert len(policy.initial_state(3)) == {"lstm": 2, "gru": 1, "identity": 0}[core] * (1 if shared else 2)


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
    result = run_train("--config-dir", str(config_dir), "+env=cue", "algorithm=impala", f"policy.core={core}", "runner.envs_per_actor=16",
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
    windows = [row["train/return_window_mean"] for row in without if "train/return_window_mean" in row]
    # one 100-episode window of a coin's 0.5 strays past 0.65 now and then; the later half's mean does not
    later_half = windows[len(windows) // 2:]
    assert sum(later_half) / len(later_half) < 0.6


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



# -- acting's one-step path (`PolicyNetwork.step`, `Policy.act`) computes what the learner's forward does

STEP_CASES = {
    "mlp": ({"obs": "box"}, mlp_network((8, 8))),
    "mlp-relu-dict": ({"count": "box", "parity": "discrete", "grid": "grid"}, mlp_network((8,), "relu")),
    "mlp-elu": ({"obs": "box"}, mlp_network((8,), "elu")),
    "mlp-no-hidden": ({"obs": "box"}, mlp_network(())),
    **{name: ({"obs": "box"}, network) for name, network in NETWORKS.items()},
    "cnn": ({"image": "image", "pos": "box"}, {"_target_": "maze_cli.policies.cnn.CnnNetwork", "encoder": "small", "hidden_sizes": [8]}),
    "user-plain-module": ({"obs": "box"}, {"_target_": "tests.user_components.ResidualMlp"}),
}


def observation_space(kinds: dict):
    import gymnasium as gym
    import numpy as np

    make = {"box": lambda: gym.spaces.Box(-2.0, 2.0, (3,), np.float32), "discrete": lambda: gym.spaces.Discrete(4, start=1),
            "grid": lambda: gym.spaces.Box(0.0, 1.0, (2, 2), np.float32), "image": lambda: gym.spaces.Box(0, 255, (8, 8, 2), np.uint8)}
    spaces = {key: make[kind]() for key, kind in kinds.items()}
    return spaces["obs"] if list(spaces) == ["obs"] else gym.spaces.Dict(spaces)


def random_observations(space, batch: int) -> dict:
    from maze_cli.envs.spaces import observation_specs

    g = torch.Generator().manual_seed(3)
    out = {}
    for key, spec in observation_specs(space).items():
        if spec.dtype == torch.uint8:
            out[key] = torch.randint(0, 256, (batch, *spec.shape), generator=g, dtype=torch.uint8)
        elif spec.dtype == torch.int64:
            out[key] = torch.randint(0, 4, (batch, *spec.shape), generator=g)
        else:
            out[key] = torch.randn(batch, *spec.shape, generator=g)
    return out


@pytest.mark.parametrize("case", STEP_CASES)
def test_acting_steps_as_the_learner_unrolls_a_rollout_of_one_step(case):
    import gymnasium as gym

    from maze_cli.policies.base import one_step

    kinds, network = STEP_CASES[case]
    space = observation_space(kinds)
    torch.manual_seed(0)
    policy = ActorCritic(space, gym.spaces.Discrete(3), network, normalize_obs=True)
    policy.obs_normalizer.update(random_observations(space, 64))  # statistics other than the initial ones
    obs = random_observations(space, 5)
    state = tuple(torch.randn_like(s) for s in policy.initial_state(5))  # the policy's and the value network's
    starts = torch.tensor([True, False, False, True, False])
    k = len(policy.network.initial_state(1))
    with torch.inference_mode():
        # The network alone: `step` against `forward` on [1, B].
        net_obs = policy.obs_normalizer(obs)
        stepped, stepped_state = policy.network.step(net_obs, state[:k], starts)
        unrolled, unrolled_state = policy.network(*one_step(net_obs, starts)[:1], state[:k], starts.unsqueeze(0))
        torch.testing.assert_close(stepped, unrolled[0], atol=1e-6, rtol=1e-6)
        # The policy: acting's params and next state are the learner forward's for a rollout of length 1.
        params, next_state = policy.action_params(obs, state, starts)
        full = policy(*one_step(obs, starts)[:1], state, starts.unsqueeze(0))
    torch.testing.assert_close(params, full.params[0], atol=1e-6, rtol=1e-6)
    assert len(next_state) == len(full.state) == len(state)
    for a, b in zip(next_state, full.state):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    for a, b in zip(stepped_state, unrolled_state):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_acting_follows_the_weights_loaded_in_place_assigned_anew_or_copied():
    import copy
    import pickle

    env = CountingEnv(length=5)

    def make(seed: int) -> ActorCritic:
        torch.manual_seed(seed)
        policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)), normalize_obs=True)
        policy.obs_normalizer.update({"obs": torch.rand(100, 1) * 5 * (seed + 1)})
        return policy

    obs = {"obs": torch.rand(4, 1) * 5}

    def acting_params(policy: ActorCritic) -> torch.Tensor:
        with torch.inference_mode():
            return policy.action_params(obs, (), None)[0]

    source = make(1)
    expected = source({"obs": obs["obs"].unsqueeze(0)}).params[0].detach()
    for assign in (False, True):  # in place (as actors pull weights), or new tensors in place of the old
        policy = make(0)
        before = acting_params(policy)  # whatever acting prepares, prepared for the old weights
        policy.load_state_dict(source.state_dict(), assign=assign)
        torch.testing.assert_close(acting_params(policy), expected)
        assert not torch.allclose(before, expected)
    for copied in (copy.deepcopy(policy), pickle.loads(pickle.dumps(policy))):
        torch.testing.assert_close(acting_params(copied), expected)
        copied.load_state_dict(make(2).state_dict())
        assert not torch.allclose(acting_params(copied), expected)
    torch.testing.assert_close(acting_params(policy), expected)  # the copies own their weights


def test_acting_normalizes_observations_with_the_statistics_of_the_moment():
    import gymnasium as gym
    import numpy as np

    from maze_cli.normalization import ObservationNormalizer

    space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    normalizer = ObservationNormalizer(space)
    obs = {"obs": torch.randn(4, 3) * 3 + 1}
    for batch in (torch.randn(50, 3) * 2 + 4, torch.randn(10, 3) - 3):
        with torch.inference_mode():
            stepped = normalizer.step(obs)["obs"]
        assert torch.equal(stepped, normalizer(obs)["obs"])
        normalizer.update({"obs": batch})  # the learner's update
        with torch.inference_mode():
            assert not torch.equal(normalizer.step(obs)["obs"], stepped)
    loaded = ObservationNormalizer(space)
    with torch.inference_mode():
        loaded.step(obs)
    loaded.load_state_dict(normalizer.state_dict())
    with torch.inference_mode():
        assert torch.equal(loaded.step(obs)["obs"], normalizer(obs)["obs"])
    # What acting prepared under inference_mode can be saved for a backward pass afterwards.
    x = obs["obs"].clone().requires_grad_()
    normalizer.step({"obs": x})["obs"].sum().backward()
    assert x.grad is not None


# -- Box actions: the Gaussian in the space's bounds --------------------------------------------------


def test_the_gaussian_starts_in_the_middle_of_a_box_and_spreads_over_its_half_range():
    space = gym.spaces.Box(np.array([0.0, -1.0, -np.inf]), np.array([10.0, 1.0, np.inf]), dtype=np.float32)
    policy = ActorCritic(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), space, log_std_init=-0.5)
    params, _ = policy.action_params({"obs": torch.zeros(4, 2)}, (), None)
    mean, log_std = params.chunk(2, dim=-1)
    # the head starts near 0, which is each bounded dim's middle; an unbounded dim keeps 0
    torch.testing.assert_close(mean, torch.tensor([[5.0, 0.0, 0.0]]).expand(4, 3), atol=0.1, rtol=0)
    torch.testing.assert_close(log_std.exp()[0], torch.tensor([5.0, 1.0, 1.0]) * math.exp(-0.5))


def test_a_checkpoint_from_before_the_gaussian_was_scaled_acts_as_it_did():
    space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
    trained = ActorCritic(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), space)
    older = {k: v for k, v in trained.state_dict().items() if not k.startswith("action_")}
    policy = ActorCritic(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), space)
    policy.load_state_dict(older)
    params, _ = policy.action_params({"obs": torch.zeros(1, 2)}, (), None)
    assert abs(float(params[0, 0])) < 0.1 and float(params[0, 1]) == 0.0  # mean near 0, std 1: unscaled, as then
    scaled = {k: v for k, v in trained.state_dict().items() if k != "action_log_scale"}  # before its log was kept
    policy.load_state_dict(scaled)
    params, _ = policy.action_params({"obs": torch.zeros(1, 2)}, (), None)
    assert abs(float(params[0, 0]) - 5.0) < 0.1 and abs(float(params[0, 1]) - np.log(5.0)) < 1e-6  # the middle, std 5
    policy.load_state_dict(trained.state_dict())
    assert torch.equal(params, policy.action_params({"obs": torch.zeros(1, 2)}, (), None)[0])  # a checkpoint of today


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_box_actions_whose_range_is_wide_and_off_centre_are_learned(tmp_path, algorithm):
    # A Gaussian around 0 with std 1 acts at the range's lower edge, always driving left: about -14 to -18 at this budget,
    # below random play (-12.5); the best policy scores -1.2
    from tests.cli import run_train
    from tests.test_train import read_stats

    (tmp_path / "configs" / "env").mkdir(parents=True)
    (tmp_path / "configs" / "env" / "offset.yaml").write_text("_target_: tests.envs.OffsetSteerEnv\n")
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", str(tmp_path / "configs"), "+env=offset", f"algorithm={algorithm}", "runner=sequential",
                       "max_env_steps=60000", "target_return=null", "eval.episodes=50", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert read_stats(run_dir)[-1]["eval/return_mean"] > -5.0
