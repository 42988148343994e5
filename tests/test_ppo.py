"""PPO and APPO: GAE and the losses against their formulas, the actors' on-policy and max-lag modes,
observation and reward normalization, and whole runs."""

import os
import signal
import time
from functools import partial

import gymnasium as gym
import pytest
import torch

from maze_cli.algorithms.returns import gae
from maze_cli.algorithms.ppo import clipped_surrogate, value_loss
from maze_cli.checkpoint import load_policy
from maze_cli.envs import EnvFactory
from maze_cli.normalization import ObservationNormalizer, RewardScaler, RunningMeanStd
from maze_cli.parallel import SequentialDistributedActors, SubprocDistributedActors
from tests.cli import REPO, run_train
from tests.envs import CountingEnv
from tests.helpers import wait_until
from tests.test_actors import make_actors
from maze_cli.stats.same_run import without_timings
from tests.test_train import read_stats


# -- GAE ------------------------------------------------------------------------------------------
def test_gae_matches_a_hand_computation_across_an_episode_end():
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    bootstrap = torch.tensor([2.0])
    discounts = torch.tensor([[gamma], [0.0], [gamma]])  # the episode ended after step 1
    # deltas: 1 + .9*1 - .5 = 1.4;  2 + 0 - 1 = 1.0;  3 + .9*2 - 1.5 = 3.3
    a2 = 3.3
    a1 = 1.0  # nothing flows back across the episode end
    a0 = 1.4 + gamma * lam * a1
    assert gae(rewards, values, bootstrap, discounts, lam).squeeze(1).tolist() == pytest.approx([a0, a1, a2])


def test_gae_lambda_one_is_the_discounted_return_minus_v_and_lambda_zero_the_td_error():
    gamma = 0.9
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.3], [0.2], [0.1]])
    bootstrap = torch.tensor([5.0])
    discounts = torch.full((3, 1), gamma)
    monte_carlo = [1 + gamma * 0 + gamma**2 * 2 + gamma**3 * 5, 0 + gamma * 2 + gamma**2 * 5, 2 + gamma * 5]
    expected = [g - v for g, v in zip(monte_carlo, [0.3, 0.2, 0.1])]
    assert gae(rewards, values, bootstrap, discounts, 1.0).squeeze(1).tolist() == pytest.approx(expected)
    td = [1 + gamma * 0.2 - 0.3, 0 + gamma * 0.1 - 0.2, 2 + gamma * 5 - 0.1]
    assert gae(rewards, values, bootstrap, discounts, 0.0).squeeze(1).tolist() == pytest.approx(td)


def test_a_truncated_episode_is_bootstrapped_from_its_final_observation_not_the_next_episode():
    """The learner adds gamma * V(final observation) to the reward of a truncated step and cuts the
    discount there; GAE then sees r + gamma V(final) - V(x_t), whatever follows in the batch."""
    from maze_cli.algorithms.returns import bootstrap_truncated
    from maze_cli.policies import ActorCritic, mlp_network
    from maze_cli.records import RolloutSpec
    from maze_cli.envs.spaces import action_spec, observation_specs

    env = gym.make("CartPole-v1")
    policy = ActorCritic(env.observation_space, env.action_space, mlp_network((8,)))
    spec = RolloutSpec(observation_specs(env.observation_space), action_spec(env.action_space), n_steps=2, n_envs=1)
    batch = spec.allocate()
    batch.rewards.fill_(1.0)
    batch.terminated.fill_(False)
    batch.truncated.copy_(torch.tensor([[True], [False]]))
    final = torch.tensor([0.1, 0.2, 0.3, 0.4])
    batch.final_observations["obs"][0, 0] = final
    v_final = policy.value({"obs": final.view(1, 1, 4)})[0, 0]
    for dense in (False, True):  # picking the truncated steps (CPU) and valuing all, then masking (accelerators)
        rewards = bootstrap_truncated(policy, batch.rewards, batch, 0.9, dense=dense)
        assert rewards[:, 0].tolist() == pytest.approx([1.0 + 0.9 * float(v_final), 1.0])


# -- losses ---------------------------------------------------------------------------------------
def test_the_clipped_surrogate_takes_the_pessimistic_term():
    behaviour = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5]))  # ratios 1.5, 0.5, 1.5, 0.5
    advantages = torch.tensor([2.0, 2.0, -2.0, -2.0])
    surrogate, ratio = clipped_surrogate(logp, behaviour, advantages, clip=0.2)
    assert ratio.tolist() == pytest.approx([1.5, 0.5, 1.5, 0.5])
    # A > 0: min(1.5*2, 1.2*2) = 2.4; min(0.5*2, 0.8*2) = 1.0. A < 0: min(-3, -2.4) = -3; min(-1, -1.6) = -1.6
    assert surrogate.tolist() == pytest.approx([2.4, 1.0, -3.0, -1.6])


@pytest.mark.parametrize("algorithm", ["ppo", "appo", "appo-decoupled", "appo-behaviour"])
def test_what_a_masked_step_holds_never_reaches_the_update(algorithm):
    """An autoreset step (or a finished agent's row) whose behaviour log-prob is -inf: the ratio there
    is infinite, yet the update's losses and every weight stay finite and equal those of the same
    batch with an ordinary log-prob at that step."""
    from maze_cli.algorithms.ppo import Appo, Ppo, PpoObjective
    from maze_cli.learner import Learner
    from maze_cli.policies import ActorCritic, mlp_network
    from tests import learner_cases

    def update(poison: bool):
        torch.manual_seed(0)
        batch = learner_cases.rollout(learner_cases.CARTPOLE)
        assert batch.autoreset.any()
        if poison:
            batch.behaviour_logp[batch.autoreset] = -float("inf")
        policy = ActorCritic(*learner_cases.CARTPOLE, mlp_network((8,)))
        hp = Ppo(n_epochs=1, n_minibatches=1) if algorithm == "ppo" else Appo(n_epochs=1, n_minibatches=1)
        learner = Learner(PpoObjective(policy, hp, decoupled=algorithm.endswith("-decoupled")))
        metrics = learner.update(batch)
        return metrics, policy.state_dict()

    (clean, clean_weights), (poisoned, poisoned_weights) = update(False), update(True)
    assert torch.isfinite(poisoned["loss"]) and all(torch.isfinite(w).all() for w in poisoned_weights.values())
    torch.testing.assert_close(poisoned["loss"], clean["loss"])
    for name, weight in clean_weights.items():
        torch.testing.assert_close(poisoned_weights[name], weight, msg=name)


def _appo_learner(**hp):
    from maze_cli.algorithms.ppo import Appo, PpoObjective
    from maze_cli.learner import Learner
    from maze_cli.policies import ActorCritic, mlp_network
    from tests import learner_cases

    torch.manual_seed(0)
    policy = ActorCritic(*learner_cases.CARTPOLE, mlp_network((8,)))
    decoupled = hp.pop("decoupled", False)
    return Learner(PpoObjective(policy, Appo(**hp), decoupled=decoupled)), learner_cases.rollout(learner_cases.CARTPOLE)


def test_the_decoupled_surrogate_clips_the_update_not_the_lag_and_weighs_the_lag_by_clipped_rho():
    """Rollouts from an older policy: against the behaviour policy the first step's ratios are already
    far from 1; against the policy as the update began they are exactly 1, and each step's weight is
    V-trace's min(rho_bar, pi/mu)."""
    stats = {}
    for decoupled in (False, True):
        learner, batch = _appo_learner(n_epochs=1, n_minibatches=1, decoupled=decoupled, rho_bar=0.9)
        targets = learner.objective.targets(batch, learner.context())
        stats[decoupled] = learner.update(batch)
    assert float(stats[False]["approx_kl"]) > 0.01 and float(stats[False]["clip_fraction"]) > 0.1
    assert float(stats[True]["approx_kl"]) == pytest.approx(0.0, abs=1e-7) and float(stats[True]["clip_fraction"]) == 0.0
    rho = (targets.base_logp - batch.behaviour_logp).exp()
    assert (rho > 0.9).any() and (rho < 0.9).any()
    trained = targets.trained
    assert not trained.all()  # (autoreset steps: theirs is a placeholder the loss never averages)
    torch.testing.assert_close(targets.weights[trained], rho.clamp(max=0.9)[trained])


def test_adaptive_lr_falls_after_a_batch_above_twice_the_target_kl_rises_back_to_lr_and_is_checkpointed():
    learner, batch = _appo_learner(lr=1e-3, n_epochs=2, n_minibatches=2, adaptive_lr_kl=1e-9)
    lrs = [float(learner.update(batch)["lr"]) for _ in range(3)]
    assert lrs == pytest.approx([1e-3, 1e-3 / 1.5, 1e-3 / 1.5**2])
    state = learner.state_dict()
    resumed, _ = _appo_learner(lr=1e-3, n_epochs=2, n_minibatches=2, adaptive_lr_kl=1e3)
    resumed.load_state_dict(state)
    lrs = [float(resumed.update(batch)["lr"]) for _ in range(4)]
    assert lrs == pytest.approx([1e-3 / 1.5**3, 1e-3 / 1.5**2, 1e-3 / 1.5, 1e-3])  # ... and no further than lr
    assert float(resumed.update(batch)["lr"]) == pytest.approx(1e-3)


def test_value_clipping_is_the_pessimistic_max_of_clipped_and_unclipped_errors():
    old = torch.tensor([0.0, 0.0, 0.0])
    values = torch.tensor([1.0, 0.1, -1.0])
    returns = torch.tensor([2.0, 2.0, 0.5])
    assert value_loss(values, old, returns, None).tolist() == pytest.approx([0.5, 0.5 * 1.9**2, 0.5 * 1.5**2])
    # clip 0.2: clipped values 0.2, 0.1, -0.2 -> errors 1.8, 1.9, 0.7; max with 1.0, 1.9, 1.5
    assert value_loss(values, old, returns, 0.2).tolist() == pytest.approx([0.5 * 1.8**2, 0.5 * 1.9**2, 0.5 * 1.5**2])


# -- actors: on-policy batches and the lag limit ---------------------------------------------------
def test_on_policy_batches_hold_only_the_current_version_although_the_learner_is_slow():
    with make_actors(SubprocDistributedActors, partial(CountingEnv, length=4), n_actors=3, batch_size=4, on_policy=True) as actors:
        for _ in range(5):
            batch, *_ = actors.collect_outputs("cpu")
            assert (batch.policy_version == actors.policy_version).all()
            time.sleep(0.3)  # an asynchronous actor would have filled the queue with this version's rollouts meanwhile
            actors.broadcast_updated_policy(actors.policy.state_dict())
        stats = actors.get_epoch_stats_aggregator()
        assert stats.get("policy_lag", "max") == 0
        assert not stats.values("dropped_rollouts")  # none was collected to be thrown away
        assert stats.get("actor_idle_frac", "mean") > 0.3  # they waited for the learner


def test_on_policy_collection_goes_on_after_an_actor_is_killed_holding_a_request():
    with make_actors(SubprocDistributedActors, partial(CountingEnv, length=4), n_actors=2, batch_size=2, on_policy=True,
                     max_restarts=3, rollout_timeout_s=30) as actors:
        actors.collect_outputs("cpu")
        os.kill(actors.processes[0].pid, signal.SIGKILL)
        for _ in range(4):
            actors.broadcast_updated_policy(actors.policy.state_dict())
            start = time.monotonic()
            batch, *_ = actors.collect_outputs("cpu")
            assert time.monotonic() - start < 10
            assert (batch.policy_version == actors.policy_version).all()
        assert actors.supervisor.restarts == 1


def test_rollouts_older_than_max_policy_lag_are_dropped_and_counted():
    with make_actors(SubprocDistributedActors, partial(CountingEnv, length=4), n_actors=2, batch_size=2, max_policy_lag=1) as actors:
        actors.collect_outputs("cpu")
        assert wait_until(lambda: actors._queue_size() >= 2)  # the queue fills with rollouts of version 0
        for _ in range(3):
            actors.broadcast_updated_policy(actors.policy.state_dict())
        for _ in range(3):
            batch, *_ = actors.collect_outputs("cpu")
            assert (actors.policy_version - batch.policy_version <= 1).all()
        stats = actors.get_epoch_stats_aggregator()
        assert stats.get("dropped_rollouts", "sum") >= 2
        assert stats.get("policy_lag", "max") <= 1


def test_the_sequential_backend_is_on_policy_by_construction():
    with make_actors(SequentialDistributedActors, partial(CountingEnv, length=4), on_policy=True) as actors:
        for _ in range(3):
            batch, *_ = actors.collect_outputs("cpu")
            assert (batch.policy_version == actors.policy_version).all()
            actors.broadcast_updated_policy(actors.policy.state_dict())


# -- normalization --------------------------------------------------------------------------------
def test_statistics_merged_from_several_actors_equal_those_of_the_pooled_data():
    torch.manual_seed(0)
    chunks = [torch.randn(n, 3) * s + m for n, s, m in [(50, 1.0, 0.0), (7, 3.0, 5.0), (200, 0.5, -2.0)]]
    merged = RunningMeanStd((3,))
    for chunk in chunks:
        merged.update(chunk)
    pooled = torch.cat(chunks).double()
    assert merged.count.item() == 257
    assert torch.allclose(merged.mean, pooled.mean(0))
    assert torch.allclose(merged.var, pooled.var(0, unbiased=False))


def test_the_observation_normalizer_scales_vector_keys_and_leaves_images_and_ints_alone():
    space = gym.spaces.Dict({
        "pos": gym.spaces.Box(-5, 5, (2,)), "frame": gym.spaces.Box(0, 255, (8, 8, 3), dtype="uint8"), "goal": gym.spaces.Discrete(4)})
    normalizer = ObservationNormalizer(space)
    assert normalizer.keys == ["pos"]
    normalizer.update({"pos": torch.tensor([[1.0, 10.0], [3.0, 30.0]])})
    out = normalizer({"pos": torch.tensor([[2.0, 20.0]]), "frame": torch.zeros(1, 8, 8, 3, dtype=torch.uint8), "goal": torch.tensor([2])})
    assert out["pos"][0].tolist() == pytest.approx([0.0, 0.0], abs=1e-4)
    assert out["frame"].dtype == torch.uint8 and out["goal"].tolist() == [2]


def test_normalize_images_scales_each_pixel_by_its_own_statistics_and_leaves_vectors_to_normalize_obs():
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-5, 5, (2,)), "frame": gym.spaces.Box(0, 255, (2, 3, 3), dtype="uint8")})
    normalizer = ObservationNormalizer(space, vectors=False, images=True)
    assert normalizer.keys == ["frame"]
    frames = torch.zeros(4, 2, 3, 3, dtype=torch.uint8)
    frames[:, 0, 0, 0] = torch.tensor([10, 20, 30, 40], dtype=torch.uint8)  # one pixel moves, the background stays
    frames[:, 1] = 87
    normalizer.update({"frame": frames})
    out = normalizer({"pos": torch.tensor([[4.0, -4.0]]), "frame": frames[:1]})
    assert out["frame"].dtype == torch.float32
    assert out["frame"][0, 0, 0, 0].item() == pytest.approx(-15 / 125 ** 0.5, rel=1e-4)  # (10 - 25) / std of 10..40
    assert out["frame"][0, 1].abs().max().item() == 0.0  # a pixel that never changes is 0, not a division by 0
    assert out["pos"].tolist() == [[4.0, -4.0]]
    assert torch.equal(normalizer.step({"frame": frames[:1]})["frame"], out["frame"])


def test_rewards_are_scaled_by_the_std_of_the_discounted_return_followed_per_env():
    from maze_cli.records import RolloutSpec, TensorSpec

    spec = RolloutSpec({"obs": TensorSpec((1,), torch.float32)}, TensorSpec((), torch.int64), n_steps=2, n_envs=2)
    scaler = RewardScaler(gamma=0.5)
    first, second = spec.allocate(), spec.allocate()
    for batch, rewards, ids in [(first, [[1.0, 2.0], [1.0, 2.0]], [0, 1]), (second, [[4.0, 0.0], [0.0, 0.0]], [1, 0])]:
        batch.rewards.copy_(torch.tensor(rewards))
        batch.terminated.fill_(False)
        batch.truncated.fill_(False)
        batch.autoreset.fill_(False)
        batch.env_id.copy_(torch.tensor(ids))
    scaler(first)
    scaled = scaler(second)
    # env 0: returns 1, 1.5, then (second batch, column 1) 0.75, 0.375; env 1: 2, 3, then 5.5, 2.75
    returns = torch.tensor([1.0, 1.5, 0.75, 0.375, 2.0, 3.0, 5.5, 2.75], dtype=torch.float64)
    std = returns.var(unbiased=False).sqrt()
    assert scaler.stats.count.item() == 8
    assert scaled.flatten().tolist() == pytest.approx((second.rewards / std).flatten().tolist(), rel=1e-5)


# -- whole runs -----------------------------------------------------------------------------------
def test_ppo_solves_cartpole(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "algorithm=ppo", "max_env_steps=400000", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert "stopped: target_return" in result.stdout
    stats = read_stats(run_dir)
    assert stats[-1]["eval/return_mean"] >= 475
    assert all(row["policy_lag_max"] == 0 for row in stats)
    assert all(0 < row["actor_idle_frac"] < 1 for row in stats)


def test_a_sequential_ppo_run_is_reproducible_and_another_seed_differs(tmp_path):
    common = ["+env=cartpole", "algorithm=ppo", "runner=sequential", "max_env_steps=4096", "epoch_length=2", "eval.interval=0"]
    runs = {}
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        result = run_train(*common, f"seed={seed}", run_dir=tmp_path / name)
        assert result.returncode == 0, result.stderr
        runs[name] = without_timings(read_stats(tmp_path / name))
    assert len(runs["a"]) == 2 and "learner/approx_kl" in runs["a"][0]
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_appo_drops_stale_rollouts_and_learns_acrobot(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=acrobot", "algorithm=appo", "algorithm.max_policy_lag=0", "max_env_steps=300000", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    stats = read_stats(run_dir)
    assert all(row["policy_lag_max"] == 0 for row in stats)
    assert sum(row.get("dropped_rollouts", 0) for row in stats) > 0
    assert max(row["eval/return_mean"] for row in stats) > -150  # random: -500


def test_normalization_statistics_are_saved_in_checkpoints_and_used_by_rollout(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=pendulum", "algorithm=ppo", "max_env_steps=8192", "epoch_length=2", "eval.interval=0", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    policy = load_policy(run_dir / "checkpoints" / "last.pt", frozenset(), False, "checkpoint")
    stats = policy.obs_normalizer.stats[0]
    assert stats.count.item() == 8192  # every observation the learner trained on, from both actors
    assert stats.var.min().item() > 0.01 and not torch.allclose(stats.mean, torch.zeros(3, dtype=torch.float64))
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["learner"]["algorithm"]["reward_scaler"]["stats"]["count"].item() == 8192
    # rollout rebuilds the policy from the checkpoint's blueprint, normalizer included
    from tests.cli import TRAIN
    import subprocess

    rollout = TRAIN.with_name("rollout")
    proc = subprocess.run([str(rollout), f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=2"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    normalized = policy.obs_normalizer({"obs": torch.tensor([[1.0, 0.0, 0.0]])})["obs"]
    assert not torch.allclose(normalized, torch.tensor([[1.0, 0.0, 0.0]]))


@pytest.mark.parametrize("algorithm", ["ppo", "impala"])
def test_log_std_init_sets_the_gaussians_starting_std_and_checkpoints_keep_the_learned_one(tmp_path, algorithm):
    run_dir = tmp_path / "run"
    result = run_train("+env=pendulum", f"algorithm={algorithm}", "algorithm.log_std_init=-1.5", "max_env_steps=2048",
                       "eval.interval=0", "runner.envs_per_actor=2", "algorithm.n_rollout_steps=16", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    policy = load_policy(run_dir / "checkpoints" / "last.pt", frozenset(), False, "checkpoint")
    log_std = policy.log_std.detach()
    assert torch.all((log_std + 1.5).abs() < 0.2), log_std  # a few updates from -1.5, rebuilt without the option
    assert not torch.equal(log_std, torch.full_like(log_std, -1.5))  # ... and the learned value, not the initial one


def test_the_clipped_surrogate_loss_equals_the_papers_formula_computed_by_hand():
    """PPO's minibatch loss against eq. 9 of the paper (with the value and entropy terms), written here
    from the policy's logits alone: L = -E[min(r A, clip(r, 1-eps, 1+eps) A)] + c_v E[(V - R)^2 / 2] - c_e E[H],
    A normalized to mean 0 and std 1 over the minibatch."""
    from maze_cli.algorithms.ppo import Ppo, PpoObjective
    from maze_cli.policies import ActorCritic, mlp_network
    from tests import learner_cases

    torch.manual_seed(0)
    policy = ActorCritic(*learner_cases.CARTPOLE, mlp_network((8,)))
    hp = Ppo(entropy_coef=0.01, value_coef=0.5, clip_range=0.2)
    objective = PpoObjective(policy, hp)
    n = 32
    obs = torch.randn(1, n, 4)
    actions = torch.randint(0, 2, (1, n))
    base_logp = -torch.rand(1, n) - 0.3
    advantages, returns = torch.randn(1, n), torch.randn(1, n)
    real = torch.ones(1, n, dtype=torch.bool)
    loss, metrics = objective.loss({"obs": obs}, (), torch.zeros(1, n, dtype=torch.bool), actions, base_logp,
                                   torch.ones(1, n), advantages, returns, torch.zeros(1, n), real, real, torch.tensor(0.2))

    out = policy({"obs": obs}, (), torch.zeros(1, n, dtype=torch.bool))
    log_probs = torch.log_softmax(out.params.float(), dim=-1)
    logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    ratio = (logp - base_logp).exp()
    a = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + 1e-8)
    policy_loss = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
    v_loss = (0.5 * (out.values.float() - returns) ** 2).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    expected = {"loss": policy_loss + 0.5 * v_loss - 0.01 * entropy, "policy_loss": policy_loss, "value_loss": v_loss,
                "entropy": entropy, "approx_kl": (ratio - 1 - (logp - base_logp)).mean(),
                "clip_fraction": ((ratio - 1).abs() > 0.2).float().mean()}
    for key, value in expected.items():
        torch.testing.assert_close(metrics[key], value.detach(), rtol=1e-5, atol=1e-6, msg=key)
    torch.testing.assert_close(loss.detach(), expected["loss"].detach(), rtol=1e-5, atol=1e-6)
