"""What the actor-critic algorithms (IMPALA, PPO, APPO) share: their objective's optimizer group,
reward scaling and observation statistics, averages over real steps, and the normalization options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch

from maze_cli.algorithms.contract import Objective, OptimizerGroup, UpdateContext
from maze_cli.normalization import RewardScaler
from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.records import Rollout

if TYPE_CHECKING:
    from maze_cli.algorithms.base import Components


class ActorCriticObjective(Objective):
    """What the objectives of IMPALA, PPO and APPO share: the actor-critic, its one optimizer group
    ("policy", its gradient norm clipped to `max_grad_norm`: with `clip_per_network`, that of the
    policy network and that of the value network each on its own), the reward scaler, and the update
    of the observation statistics after each batch. Subclasses write `steps(batch)`."""

    def __init__(self, policy: ActorCritic, hp: Any, normalize_reward: bool = False):
        self.policy = policy
        self.hp = hp
        self.reward_scaler = reward_scaler(normalize_reward, hp.gamma)

    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        hp = self.hp
        split = getattr(self.policy, "network_parameters", None)  # a user's policy class may not tell its networks apart
        parts = split() if hp.clip_per_network and split is not None else None
        return {"policy": OptimizerGroup(list(self.policy.parameters()), hp.lr, "loss", hp.adam_eps, hp.max_grad_norm,
                                         anneal=hp.anneal_lr, clip_parts=parts)}

    def env_steps(self, batch: Rollout) -> int:
        return batch.rewards.numel()

    def rewards(self, batch: Rollout, context: UpdateContext) -> torch.Tensor:
        """The batch's rewards, scaled when `normalize_reward` is on, truncated episodes bootstrapped."""
        rewards = self.reward_scaler(batch, context.pool) if self.reward_scaler else batch.rewards
        with context.autocast():
            return bootstrap_truncated(self.policy, rewards, batch, self.hp.gamma)

    def observe(self, batch: Rollout, context: UpdateContext) -> None:
        """After an update: the observation statistics take in the batch, so that the next policy
        version acts and learns with the same ones."""
        if self.policy.obs_normalizer is not None:
            self.policy.obs_normalizer.update_from(batch, context.pool)

    def extra_state(self) -> dict[str, Any]:
        return {} if self.reward_scaler is None else {"reward_scaler": self.reward_scaler.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.load_normalizer_state(state)

    def load_normalizer_state(self, state: dict[str, Any]) -> None:
        if self.reward_scaler is not None and "reward_scaler" in state:
            self.reward_scaler.load_state_dict(state["reward_scaler"])


def continuous(action_space: gym.Space) -> bool:
    return isinstance(action_space, gym.spaces.Box)


def normalization(normalize_obs: bool | None, normalize_reward: bool | None, parts: Components,
                  every_env: bool = False) -> tuple[bool, bool]:
    """The options as set, or (null) on for continuous actions, where returns and observations
    have scales no default fits (Pendulum's returns reach -1,600), and off for discrete ones;
    `every_env`: on for discrete actions too where a single agent acts (APPO, the default algorithm: a user's
    env brings scales of its own).

    Rewards stay as they are by default where several agents act (a PettingZoo env): there, returns scaled
    to a few units made a shared policy collapse where raw rewards did not (benchmarks/SUITE.md)."""
    single_agent = parts.env_factory.agents is None
    auto = continuous(parts.action_space) or (every_env and single_agent)
    scale_rewards = auto and single_agent
    return (auto if normalize_obs is None else normalize_obs), (scale_rewards if normalize_reward is None else normalize_reward)


def chosen_by_env(hp: Any, **resolved: Any) -> dict[str, Any]:
    """Of the `resolved` values of `hp`'s keys, those the config left null (the algorithm chose them by what the
    env is): what `Run.chosen` reports."""
    return {key: value for key, value in resolved.items() if getattr(hp, key) is None}


def reward_scaler(enabled: bool, gamma: float) -> RewardScaler | None:
    return RewardScaler(gamma) if enabled else None


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over the steps where `mask` (real transitions, not autoreset steps) holds. The other
    steps are selected away, not multiplied by 0: whatever they hold (an infinite log-ratio too) never
    reaches the mean or its gradient."""
    keep = mask.bool()
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / keep.sum().to(x.dtype).clamp(min=1.0)


def normalized_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`advantages` shifted and scaled to mean 0, std 1 over the real steps: the policy gradient then has
    the same size on any reward scale, so the entropy bonus weighs the same against it everywhere."""
    mean = masked_mean(advantages, mask)
    std = masked_mean((advantages - mean).pow(2), mask).sqrt()
    return (advantages - mean) / (std + 1e-8)


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
