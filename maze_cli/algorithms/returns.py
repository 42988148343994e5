"""Return estimators of the actor-critic objectives, each a function of a batch's tensors: GAE, V-trace,
truncated episodes bootstrapped, and the values of forced steps. PPO takes GAE (`returns=gae`),
IMPALA and APPO V-trace (`returns=vtrace`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.records import Rollout


@torch.no_grad()
def bootstrap_truncated(policy: ActorCritic, rewards: torch.Tensor, batch: Rollout, gamma: float,
                        dense: bool | None = None) -> torch.Tensor:
    """`rewards` with gamma * V(final observation) added where an episode was truncated, not ended
    (a time limit: the state had a future). V is the policy's, in the units of `rewards`.

    `dense` (default: on an accelerator) values every step's final observation and masks, instead of
    picking the truncated steps out: picking needs their count on the host, a device sync per update,
    while on a CPU the few truncated steps are far cheaper to value alone. Both give the same rewards.
    A recurrent policy's state at the final observation is not recorded: it starts afresh there."""
    if dense if dense is not None else rewards.device.type != "cpu":
        n = rewards.numel()
        final_obs = {k: v.reshape((1, n) + v.shape[2:]) for k, v in batch.final_observations.items()}
        state = tuple(s.to(rewards.device) for s in policy.initial_state(n))
        values = policy.value(final_obs, state)[0].reshape(rewards.shape).to(rewards.dtype)
        # where, not a product: the final observations of other steps are never written (any value, NaN too)
        return torch.where(batch.truncated, rewards + gamma * values, rewards)
    rewards = rewards.clone()
    where = batch.truncated.nonzero(as_tuple=True)
    if where[0].numel():
        final_obs = {k: v[where].unsqueeze(0) for k, v in batch.final_observations.items()}
        state = tuple(s.to(rewards.device) for s in policy.initial_state(int(where[0].numel())))
        rewards[where] += gamma * policy.value(final_obs, state)[0]
    return rewards


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, bootstrap_value: torch.Tensor, discounts: torch.Tensor, lam: float) -> torch.Tensor:
    """Generalized advantage estimates (Schulman et al. 2016), `[T, B]`, computed backwards:

        delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t)
        A_t     = delta_t + gamma_t lam A_{t+1}

    `discounts[t]` is gamma_t: gamma, or 0 where the episode ended after step t (so nothing flows
    across episodes); `bootstrap_value` is V(x_T) `[B]`. lam=1 gives the discounted return minus
    V(x_t); lam=0 the one-step TD error. Returns are A_t + V(x_t).
    """
    values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rewards + discounts * values_tp1 - values
    advantages = torch.empty_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * lam * acc
        advantages[t] = acc
    return advantages


@dataclass(frozen=True)
class ForcedValues:
    """A batch's values and targets' inputs with the forced steps (one legal action) valued by their rewards."""

    values: torch.Tensor  # V(x_0..x_T), [T+1, B]
    rewards: torch.Tensor  # [T, B]
    discounts: torch.Tensor  # [T, B]
    kept: torch.Tensor  # the steps with a target, [T, B] bool


@torch.no_grad()
def value_forced_steps(values: torch.Tensor, valued: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor) -> ForcedValues:
    """The values of the steps the value network skipped (`valued` false, `[T+1, B]`), by the Bellman
    equation of a step without a choice, computed backwards:

        V(x_t) = r_t + gamma_t V(x_{t+1})

    For a forced action this is exact in expectation (the one action's reward plus the next state's
    value), so such a step's TD error is 0 and GAE and V-trace pass through it to the last choice before
    it: in a two-seat game the value network then runs on the seat to move alone, half the rows.
    A row whose last observation x_T is itself forced has no V(x_T) to start from: it ends at its last
    valued step L instead (reward V(x_L), discount 0, as if the rollout had stopped there), and the steps
    L..T-1, which have no target then, are left out of the losses (`kept` false)."""
    T = rewards.shape[0]
    values, rewards, discounts = values.clone(), rewards.clone(), discounts.clone()
    for t in range(T - 1, -1, -1):
        values[t] = torch.where(valued[t], values[t], rewards[t] + discounts[t] * values[t + 1])
    steps = torch.arange(T, device=values.device).unsqueeze(1)
    last_valued = torch.where(valued[:T], steps, -1).amax(0)  # [B], -1 where no step of the row is valued
    cut = ~valued[T]
    at_end = cut & (steps == last_valued)
    rewards = torch.where(at_end, values[:T], rewards)
    discounts = torch.where(at_end, torch.zeros_like(discounts), discounts)
    kept = ~(cut & (steps >= last_valued))
    return ForcedValues(values, rewards, discounts, kept)


@dataclass(frozen=True)
class VTraceReturns:
    vs: torch.Tensor  # value targets v_s, [T, B]
    pg_advantages: torch.Tensor  # rho_s (r_s + gamma_s v_{s+1} - V(x_s)), [T, B]
    clipped_rhos: torch.Tensor  # min(rho_bar, pi/mu), [T, B]


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
) -> VTraceReturns:
    """V-trace targets, eq. (1) of the paper, computed backwards in time.

    With rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)) and c_i = min(c_bar, pi(a_i|x_i) / mu(a_i|x_i)):

        delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
        v_s       = V(x_s) + sum_{t=s}^{s+n-1} (prod_{k=s}^{t-1} gamma_k) (prod_{i=s}^{t-1} c_i) delta_t V

    evaluated by the recursion v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1})).
    `discounts[t]` is gamma_t: gamma, or 0 where the episode ended after step t. Inputs are `[T, B]`
    except `bootstrap_value` (V(x_T), `[B]`). The policy-gradient advantage (section 4.2) uses
    v_{s+1} and its own clip `pg_rho_bar` (rho_bar by default). `lam` scales the traces,
    c_i = lam min(c_bar, pi/mu) (the paper's remark 2): on-policy, v_s - V(x_s) is then GAE(lam)'s advantage.
    """
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = rhos.clamp(max=rho_bar)
    cs = lam * rhos.clamp(max=c_bar)
    values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)

    vs = values + _discounted_backwards(deltas, discounts * cs)

    vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = rhos.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
    pg_advantages = pg_rhos * (rewards + discounts * vs_tp1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, clipped_rhos=clipped_rhos)


def _discounted_backwards(deltas: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """acc_t = deltas_t + factors_t acc_{t+1} (acc_T = 0) over the time axis of `[T, B]` tensors.

    On a CPU the T steps run on numpy views of the same memory: a torch op costs microseconds of
    dispatch, and for a batch of a few hundred envs that, not the arithmetic, was the recursion's time.
    A compiled loss keeps the torch loop, which the compiler fuses."""
    out = torch.empty_like(deltas)
    if deltas.device.type == "cpu" and deltas.dtype == torch.float32 and not torch.compiler.is_compiling():
        d, f, o = deltas.contiguous().numpy(), factors.contiguous().numpy(), out.numpy()
        acc = np.zeros_like(d[0])
        for t in range(d.shape[0] - 1, -1, -1):
            acc = d[t] + f[t] * acc
            o[t] = acc
        return out
    acc = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + factors[t] * acc
        out[t] = acc
    return out
