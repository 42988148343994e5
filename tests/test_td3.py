"""TD3 (maze_cli/algorithms/td3.py): its update on the shared learner, its runs, its refusals."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from maze_cli.algorithms.td3 import Td3, Td3Objective, Td3Policy
from maze_cli.learner import Learner
from tests.cli import run_train
from tests.learner_cases import PENDULUM, transitions
from tests.test_cli_errors import assert_one_line_error
from tests.test_train import read_stats


def _learner(**hp) -> Learner:
    torch.manual_seed(3)
    network = {"_target_": "maze_cli.policies.mlp.MlpNetwork", "hidden_sizes": [16, 16], "activation": "relu"}
    return Learner(Td3Objective(Td3Policy(*PENDULUM, network), Td3(**hp), network))


def test_the_actor_and_the_targets_move_every_policy_delay_updates_and_the_critics_every_update():
    learner = _learner(policy_delay=3)
    objective, batch = learner.objective, transitions(PENDULUM)

    def snapshot(module):
        return [p.detach().clone() for p in module.parameters()]

    moved = []
    for _ in range(6):
        before = {name: snapshot(getattr(objective, name)) for name in ("policy", "critic", "policy_target", "critic_target")}
        metrics = learner.update(batch)
        moved.append({name: any(not torch.equal(a, b) for a, b in zip(old, getattr(objective, name).parameters()))
                      for name, old in before.items()})
        assert ("policy_loss" in metrics) == moved[-1]["policy"]
    assert [m["critic"] for m in moved] == [True] * 6
    assert [m["policy"] for m in moved] == [False, False, True, False, False, True]
    assert [m["policy_target"] for m in moved] == [m["critic_target"] for m in moved] == [False, False, True, False, False, True]
    assert learner.updates == 6 and learner.objective.priorities().shape == (32,)


def test_acting_adds_clipped_exploration_noise_and_evaluation_takes_the_actors_action():
    policy = Td3Policy(gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Box(-2.0, 2.0, (2,)), exploration_noise=5.0)
    obs = {"obs": torch.zeros(64, 3)}
    noisy, logp, _ = policy.act(obs)
    greedy, _, _ = policy.act(obs, deterministic=True)
    assert noisy.abs().max() <= 2.0 and (noisy - greedy).abs().max() > 0.5  # noise, clipped to the bounds
    assert torch.equal(greedy, policy.act(obs, deterministic=True)[0]) and torch.equal(logp, torch.zeros(64))


def test_a_resumed_learner_goes_on_with_its_targets_optimizers_and_update_count():
    learner, batch = _learner(), transitions(PENDULUM)
    for _ in range(3):
        learner.update(batch)
    restored = _learner()
    restored.load_state_dict(learner.state_dict())
    torch.manual_seed(9)
    learner.update(batch)
    torch.manual_seed(9)
    restored.update(batch)
    for name, module in learner.objective.modules().items():
        for a, b in zip(module.parameters(), restored.objective.modules()[name].parameters()):
            assert torch.equal(a, b), name


@pytest.mark.slow
def test_td3_learns_pendulum(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=pendulum", "algorithm=td3", "runner=subproc", "runner.reproducible=true", "max_env_steps=12000",
                       "algorithm.initial_buffer_size=2000", "target_return=null", "eval.interval=0", run_dir=run_dir, timeout=400)
    assert result.returncode == 0, result.stderr
    returns = [row["train/return_mean"] for row in read_stats(run_dir) if "train/return_mean" in row]
    assert returns[0] < -900  # random actions score about -1200
    assert max(returns[-2:]) > -500, returns


@pytest.mark.parametrize("env, expected", [
    ("+env=cartpole", "algorithm=td3 takes Box (continuous) actions"),
    ("+env=simple_spread", "algorithm=td3: a multi-agent (PettingZoo) env"),
])
def test_what_td3_cannot_train_is_refused_in_one_line(tmp_path, env, expected):
    result = run_train(env, "algorithm=td3", "runner=sequential", "max_env_steps=100", run_dir=tmp_path / "run")
    assert_one_line_error(result, expected)
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_td3s_losses_equal_the_papers_formulas_computed_by_hand():
    """The critics' and the actor's losses against Fujimoto et al. (2018, eqs. 10 and 15, and the
    deterministic policy gradient's loss), from the networks' outputs alone, with a target-policy
    noise large enough that both of its clips act:
        a' = clip(mu'(s') + clip(eps, -c, c), low, high),  eps ~ N(0, sigma)
        y = r + gamma (1 - d) min_i Q'_i(s', a')
        L_Q = E[w (Q_1(s, a) - y)^2] + E[w (Q_2(s, a) - y)^2],  L_mu = -E[Q_1(s, mu(s))]"""
    from maze_cli.contract import UpdateContext

    learner = _learner(gamma=0.9, policy_noise=1.0, noise_clip=0.4, policy_delay=1)
    objective = learner.objective
    with torch.no_grad():  # targets that are not their online twins: a loss reading the wrong one shows
        for target in (objective.policy_target, objective.critic_target):
            for p in target.parameters():
                p.add_(torch.randn_like(p) * 0.3)
    batch = transitions(PENDULUM)
    tr, w = batch.transitions, batch.weights
    torch.manual_seed(1)
    critic_step, actor_step = objective.steps(batch, UpdateContext(torch.device("cpu"), 0, 0, 1.0, {}))

    def mu(policy, observations):
        return 2.0 * torch.tanh(policy.head(policy.network(observations, (), None)[0]))  # Pendulum's bounds: [-2, 2]

    torch.manual_seed(1)
    with torch.no_grad():
        mu_next = mu(objective.policy_target, tr.next_observations)
        eps = torch.randn(mu_next.shape) * (1.0 * 2.0)  # sigma, in env units
        a_next = (mu_next + eps.clamp(-0.4 * 2.0, 0.4 * 2.0)).clamp(-2.0, 2.0)
        assert (eps.abs() > 0.8).any() and ((mu_next + eps.clamp(-0.8, 0.8)).abs() > 2.0).any()  # both clips act
        y = tr.rewards + 0.9 * (~tr.terminated).float() * torch.min(*objective.critic_target(tr.next_observations, a_next))
    q1, q2 = objective.critic(tr.observations, tr.actions)
    critic_loss = (w * (q1 - y) ** 2).mean() + (w * (q2 - y) ** 2).mean()
    actor_loss = -objective.critic(tr.observations, mu(objective.policy, tr.observations))[0].mean()

    torch.testing.assert_close(critic_step.losses["critic"], critic_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(actor_step.losses["policy"], actor_loss, rtol=1e-5, atol=1e-6)
