"""IMPALA: an actor-critic learner with V-trace off-policy correction (Espeholt et al. 2018).

Actors act with a policy a few versions behind the learner (the behaviour policy mu); V-trace
corrects for that lag with truncated importance weights, so the learner can consume rollouts as
they arrive instead of waiting for on-policy data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.algorithms.on_policy import (ActorCriticConfig, ActorCriticObjective, chosen_by_env, normalization,
                                           normalized_advantages)
from maze_cli.algorithms.returns import vtrace
from maze_cli.config.fields import Fraction, NonNegativeFloat, PositiveFloat, PositiveInt, key
from maze_cli.config.schema import register_schema
from maze_cli.contract import Step, UpdateContext
from maze_cli.learner import Learner
from maze_cli.loops import OnPolicyLoop
from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.policies.base import Observations, State
from maze_cli.policies.groups import grouped_policy
from maze_cli.records import Rollout


@dataclass
class ImpalaConfig(ActorCriticConfig):
    """IMPALA with V-trace (Espeholt et al. 2018)."""

    _target_: str = "maze_cli.algorithms.impala.Impala"
    lr: PositiveFloat = key(1e-3)
    n_rollout_steps: PositiveInt = key(32)
    rho_bar: PositiveFloat = key(1.0, "V-trace's clip of the importance weights")
    c_bar: PositiveFloat = key(1.0, "V-trace's clip of the trace coefficients")
    vtrace_lambda: Fraction = key(1.0,
                                   "V-trace's traces scaled by this (c_i = lambda min(c_bar, pi/mu)): below 1 the "
                                   "value targets lean more on the critic and less on the rollout's far rewards "
                                   "(lower variance, more bias), as GAE's lambda does for PPO")
    entropy_coef: NonNegativeFloat = key(0.01)
    shared_network: bool = key(False, "one policy network for the action and value heads (true) or one each")


register_schema("algorithm", "impala", ImpalaConfig)


@dataclass
class Impala(ImpalaConfig, Algorithm):
    """`algorithm=impala`: actor-critic policy, actors feeding batches of rollouts as they come, V-trace."""

    # chosen by wall time to a target, not by env steps/s: more envs per actor mean fewer updates per env step
    envs_per_actor = 16
    epoch_length = 80  # updates of 2 x 16 x 32 samples: an epoch (a row of stats, an evaluation) of about a second
    network_defaults = {"activation": "tanh"}

    def build(self, parts: Components) -> Run:
        normalize_obs, normalize_reward = normalization(self.normalize_obs, self.normalize_reward, parts)
        kwargs = {"network": parts.network, "shared_network": self.shared_network, "normalize_obs": normalize_obs,
                  "normalize_images": self.normalize_images, "action_mask_key": parts.action_mask_key}
        policy, blueprint = grouped_policy(ActorCritic, parts, kwargs, {"log_std_init": self.log_std_init})
        learner = Learner(ImpalaObjective(policy, self, normalize_reward), parts.device, **parts.learner)
        actors = parts.make_actors(policy=learner.policy, n_rollout_steps=self.n_rollout_steps)
        return Run(OnPolicyLoop(actors, learner), actors, learner, blueprint,
                   chosen=chosen_by_env(self, normalize_obs=normalize_obs, normalize_reward=normalize_reward))


class ImpalaObjective(ActorCriticObjective):
    """IMPALA's update: one gradient step per batch of rollouts; knows nothing of actors or backends."""

    title = "IMPALA's loss"
    compiled = ("loss",)

    def steps(self, batch: Rollout, context: UpdateContext) -> Iterator[Step]:
        """One gradient step on a time-major batch."""
        rewards = self.rewards(batch, context)
        discounts = self.hp.gamma * (~batch.dones).float()
        # Autoreset steps are no transitions: averages run over the real steps only. Their value
        # targets never reach real steps, since the step before each ended an episode (discount 0).
        real = (~batch.autoreset).float()
        loss, metrics = self.loss(batch.observations, batch.initial_state, batch.episode_start, batch.actions,
                                  batch.behaviour_logp, rewards, discounts, real)
        yield Step({"policy": loss}, metrics, samples=real.sum() if context.group is not None else None)

    def summary(self, batch: Rollout, steps: list[dict[str, Any]], context: UpdateContext) -> dict[str, Any]:
        self.observe(batch, context)
        return steps[0]

    def loss(self, observations: Observations, initial_state: State, episode_start: torch.Tensor, actions: torch.Tensor,
             behaviour_logp: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, real: torch.Tensor,
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The actor-critic loss with V-trace targets (section 4 of the paper):

            L = -sum_s rho_s A_s log pi(a_s|x_s) + value_coef 0.5 sum_s (v_s - V(x_s))^2 - entropy_coef H(pi(.|x_s))

        averaged over the real steps; `rewards` are already scaled and bootstrapped where truncated."""
        hp = self.hp
        T = actions.shape[0]
        # One forward pass over all T+1 observations gives V(x_0..x_T): the last row bootstraps.
        out = self.policy(observations, initial_state, episode_start)
        params, values_all = out.params[:T].float(), out.values.float()
        values, bootstrap_value = values_all[:T], values_all[T]
        dist = self.policy.distribution
        target_logp = dist.log_prob(params, actions)
        n_real = real.sum().clamp(min=1.0)
        entropy = (dist.entropy(params) * real).sum() / n_real
        targets = vtrace(
            behaviour_logp, target_logp.detach(), rewards, values.detach(), bootstrap_value.detach(), discounts, hp.rho_bar, hp.c_bar,
            lam=hp.vtrace_lambda,
        )
        advantages = normalized_advantages(targets.pg_advantages, real) if hp.normalize_advantage else targets.pg_advantages
        policy_loss = -(advantages * target_logp * real).sum() / n_real
        value_loss = 0.5 * ((targets.vs - values).pow(2) * real).sum() / n_real
        loss = policy_loss + hp.value_coef * value_loss - hp.entropy_coef * entropy
        metrics = {
            "loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
            "rho_mean": targets.clipped_rhos.mean(), "value_mean": values.mean(),
        }
        return loss, {k: v.detach() for k, v in metrics.items()}
