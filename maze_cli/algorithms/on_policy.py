"""What the actor-critic algorithms (IMPALA, PPO, APPO) share: their objective's optimizer group,
reward scaling and observation statistics, averages over real steps, and the normalization options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import gymnasium as gym
import torch

from maze_cli.algorithms.returns import bootstrap_truncated
from maze_cli.config.fields import Fraction, NonNegativeFloat, PositiveFloat, PositiveInt, key
from maze_cli.contract import Objective, OptimizerGroup, StateDict, UpdateContext
from maze_cli.normalization import RewardScaler
from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.records import Rollout

if TYPE_CHECKING:
    from maze_cli.algorithms.base import Components


@dataclass
class ActorCriticConfig:
    """The keys every actor-critic algorithm (IMPALA, PPO, APPO) takes; each algorithm's config adds its own
    and may change a default."""

    _target_: str = ""
    lr: PositiveFloat = key(3e-4, "Adam's learning rate")
    gamma: Fraction = key(0.99, "discount")
    n_rollout_steps: PositiveInt = key(64, "steps per rollout (T)")
    value_coef: NonNegativeFloat = key(0.5, "weight of the value loss")
    entropy_coef: NonNegativeFloat = key(0.0, "weight of the entropy bonus")
    normalize_advantage: bool = key(True,
                                     "advantages to mean 0, std 1 (IMPALA: over the batch; PPO: per minibatch), so "
                                     "that the entropy bonus weighs the same on any reward scale")
    max_grad_norm: PositiveFloat = key(0.5, "gradient clipping by global norm")
    clip_per_network: bool = key(False,
                                  "with a value network of its own (shared_network=false), its gradient norm and the "
                                  "policy network's each clipped to max_grad_norm: where returns run to hundreds, the "
                                  "value loss's gradient is far above the clip and, clipped together, shrinks the "
                                  "policy's step with it")
    anneal_lr: bool = key(False,
                           "lr falls linearly to 0 over the budget: max_env_steps, or max_time_s where that ends "
                           "first")
    adam_eps: PositiveFloat = key(1e-5, "Adam's epsilon")
    normalize_obs: Optional[bool] = key(None,
                                         "vector observations normalized by a running mean/std (updated by the "
                                         "learner from every actor's data, frozen in evaluation, saved in "
                                         "checkpoints, used by rollout); null: on for continuous (Box) actions")
    normalize_reward: Optional[bool] = key(None,
                                            "rewards divided by the running std of the discounted return (followed "
                                            "per env across rollouts), clipped at 10; null: on for continuous (Box) "
                                            "actions of a single-agent env")
    normalize_images: bool = key(False,
                                  "image observations normalized too, each pixel by its own running mean/std (Sample "
                                  "Factory's normalize_input): the static background of a game's frames becomes 0, "
                                  "and what moves stands out")
    log_std_init: float = key(0.0,
                               "Box actions: the Gaussian's log std at the start, a parameter of its own (not a "
                               "function of the state), in units of the action's half range (the Gaussian is centred "
                               "in the Box's bounds and scaled to them); below 0 the policy explores less at first "
                               "(SB3's MuJoCo settings start at -2)")


class ActorCriticObjective(Objective):
    """What the objectives of IMPALA, PPO and APPO share: the actor-critic, its one optimizer group
    ("policy", its gradient norm clipped to `max_grad_norm`: with `clip_per_network`, that of the
    policy network and that of the value network each on its own), the reward scaler, and the update
    of the observation statistics after each batch. Subclasses write `steps(batch)`."""

    def __init__(self, policy: ActorCritic, hp: ActorCriticConfig, normalize_reward: bool = False):
        self.policy = policy
        self.hp = hp
        self.reward_scaler = reward_scaler(normalize_reward, hp.gamma)

    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        hp = self.hp
        parts = self.policy.network_parameters() if hp.clip_per_network else None
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

    def extra_state(self) -> StateDict:
        return {} if self.reward_scaler is None else {"reward_scaler": self.reward_scaler.state_dict()}

    def load_extra_state(self, state: StateDict) -> None:
        self.load_normalizer_state(state)

    def load_normalizer_state(self, state: StateDict) -> None:
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


def chosen_by_env(hp: ActorCriticConfig, **resolved: object) -> dict[str, object]:
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
