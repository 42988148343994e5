"""V-trace against values worked out by hand from the definitions in Espeholt et al. (2018)."""

import math

import pytest
import torch

from maze_cli.algorithms.returns import vtrace


def col(*xs):
    """A [T, 1] column."""
    return torch.tensor(xs, dtype=torch.float64).unsqueeze(1)


def run(rewards, values, bootstrap, discounts, log_ratio=None, **clips):
    T = len(rewards)
    behaviour = torch.zeros(T, 1, dtype=torch.float64)
    target = behaviour if log_ratio is None else col(*log_ratio)
    return vtrace(behaviour, target, col(*rewards), col(*values), torch.tensor([bootstrap], dtype=torch.float64), col(*discounts), **clips)


def test_on_policy_reduces_to_n_step_returns():
    # v_s = sum_k gamma^k r_{s+k} + gamma^(T-s) V(x_T); gamma = 0.9, V(x_3) = 2.
    out = run([1, 2, 3], [0.5, 1.0, 1.5], 2.0, [0.9, 0.9, 0.9])
    assert out.vs.squeeze(1).tolist() == pytest.approx([1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 2, 2 + 0.9 * 3 + 0.81 * 2, 3 + 0.9 * 2])
    # A_s = r_s + gamma v_{s+1} - V(x_s)
    assert out.pg_advantages[0, 0].item() == pytest.approx(1 + 0.9 * 6.32 - 0.5)
    assert out.pg_advantages[2, 0].item() == pytest.approx(3 + 0.9 * 2 - 1.5)


def test_episode_end_cuts_the_return():
    # The episode ends after step 1 (discount 0): v_1 = r_1, and v_0 does not see r_2.
    out = run([1, 2, 3], [0.5, 1.0, 1.5], 2.0, [0.9, 0.0, 0.9])
    assert out.vs.squeeze(1).tolist() == pytest.approx([1 + 0.9 * 2, 2, 3 + 0.9 * 2])


def test_rho_is_clipped_at_rho_bar():
    # pi/mu = 2 on one step: rho = min(rho_bar, 2); v_0 = V + rho (r + gamma V' - V) = 1 + rho * 1.8
    ratio = [math.log(2.0)]
    assert run([1], [1], 2.0, [0.9], ratio).vs.item() == pytest.approx(1 + 1.0 * 1.8)
    assert run([1], [1], 2.0, [0.9], ratio, rho_bar=0.5).vs.item() == pytest.approx(1 + 0.5 * 1.8)
    assert run([1], [1], 2.0, [0.9], ratio, rho_bar=5.0).vs.item() == pytest.approx(1 + 2.0 * 1.8)


def test_traces_are_cut_by_c_bar():
    # pi/mu = 0.5 on both steps: rho = 0.5, delta_t = 0.5 (1 + 0.9 - 1) = 0.45,
    # v_0 - V = delta_0 + gamma c_0 delta_1 with c_0 = min(c_bar, 0.5).
    ratio = [math.log(0.5)] * 2
    assert run([1, 1], [1, 1], 1.0, [0.9, 0.9], ratio).vs[0, 0].item() == pytest.approx(1 + 0.45 + 0.9 * 0.5 * 0.45)
    assert run([1, 1], [1, 1], 1.0, [0.9, 0.9], ratio, c_bar=0.2).vs[0, 0].item() == pytest.approx(1 + 0.45 + 0.9 * 0.2 * 0.45)


def test_recursion_matches_the_sum_definition_off_policy():
    # Eq. (1) summed directly, O(T^2), on random off-policy data with episode ends.
    g = torch.Generator().manual_seed(0)
    T, B, rho_bar, c_bar = 7, 3, 1.2, 0.9
    log_ratio = torch.randn(T, B, generator=g, dtype=torch.float64)
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    discounts = 0.95 * (torch.rand(T, B, generator=g) > 0.2).double()
    out = vtrace(torch.zeros(T, B, dtype=torch.float64), log_ratio, rewards, values, bootstrap, discounts, rho_bar, c_bar)

    rho = log_ratio.exp().clamp(max=rho_bar)
    c = log_ratio.exp().clamp(max=c_bar)
    v_next = torch.cat([values[1:], bootstrap[None]])
    delta = rho * (rewards + discounts * v_next - values)
    expected = values.clone()
    for s in range(T):
        weight = torch.ones(B, dtype=torch.float64)
        for t in range(s, T):
            expected[s] += weight * delta[t]
            weight = weight * discounts[t] * c[t]
    torch.testing.assert_close(out.vs, expected)


def test_on_policy_with_lambda_the_targets_are_gae():
    """c_i = lambda min(c_bar, rho): on-policy, v_s - V(x_s) is GAE(lambda)'s advantage (and lambda 1, the n-step return)."""
    from maze_cli.algorithms.returns import gae

    torch.manual_seed(0)
    rewards, values, discounts = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64), torch.full((6, 3), 0.9, dtype=torch.float64)
    discounts[2, 1] = 0.0  # an episode ends there
    bootstrap = torch.randn(3, dtype=torch.float64)
    logp = torch.zeros(6, 3, dtype=torch.float64)
    for lam in (0.0, 0.8, 1.0):
        out = vtrace(logp, logp, rewards, values, bootstrap, discounts, lam=lam)
        assert torch.allclose(out.vs - values, gae(rewards, values, bootstrap, discounts, lam))
    assert not torch.allclose(vtrace(logp, logp, rewards, values, bootstrap, discounts, lam=0.8).vs,
                              vtrace(logp, logp, rewards, values, bootstrap, discounts).vs)


def test_impalas_loss_equals_the_papers_actor_critic_loss_computed_by_hand():
    """IMPALA's loss (section 4 of the paper) from the policy's logits and values and V-trace's recursion,
    each written here: v_s - V(x_s) = d_s + gamma_s c_s (v_{s+1} - V(x_{s+1})), d_s = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s)),
    A_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s)); L = -E[A log pi] + c_v E[(v - V)^2 / 2] - c_e E[H]."""
    from maze_cli.algorithms.impala import Impala, ImpalaObjective
    from maze_cli.policies import ActorCritic, mlp_network
    from tests import learner_cases

    torch.manual_seed(0)
    policy = ActorCritic(*learner_cases.CARTPOLE, mlp_network((8,)))
    hp = Impala(normalize_advantage=False, rho_bar=1.0, c_bar=0.9, entropy_coef=0.01, value_coef=0.5)
    T, B = 4, 3
    obs = torch.randn(T + 1, B, 4)
    starts = torch.zeros(T + 1, B, dtype=torch.bool)
    actions = torch.randint(0, 2, (T, B))
    behaviour_logp = -torch.rand(T, B) - 0.3
    rewards, discounts = torch.randn(T, B), torch.full((T, B), 0.9)
    discounts[1, 0] = 0.0  # an episode ends after step 1 of env 0
    real = torch.ones(T, B)
    _, metrics = ImpalaObjective(policy, hp).loss({"obs": obs}, (), starts, actions, behaviour_logp, rewards, discounts, real)

    out = policy({"obs": obs}, (), starts)
    log_probs = torch.log_softmax(out.params[:T].float(), -1)
    logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    values = out.values.float().detach()  # V(x_0..x_T)
    rho = (logp.detach() - behaviour_logp).exp()
    vs = torch.zeros(T + 1, B)
    vs[T] = values[T]
    for s in reversed(range(T)):
        delta = rho[s].clamp(max=1.0) * (rewards[s] + discounts[s] * values[s + 1] - values[s])
        vs[s] = values[s] + delta + discounts[s] * rho[s].clamp(max=0.9) * (vs[s + 1] - values[s + 1])
    advantages = rho.clamp(max=1.0) * (rewards + discounts * vs[1:] - values[:T])
    policy_loss = -(advantages * logp).mean()
    value_loss = 0.5 * ((vs[:T] - out.values.float()[:T]) ** 2).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    expected = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
                "loss": policy_loss + 0.5 * value_loss - 0.01 * entropy}
    for key, value in expected.items():
        torch.testing.assert_close(metrics[key], value.detach().float(), rtol=1e-5, atol=1e-6, msg=key)
