"""PPO (Schulman et al. 2017) and asynchronous PPO (APPO, as in Sample Factory) on the same actors.

Both take batches of rollouts `[T, B]`, compute advantages and value targets once per batch, then
make `n_epochs` passes of `n_minibatches` clipped-surrogate steps. They differ in which rollouts make
a batch and in the targets:

- PPO asks the actors for on-policy data (`on_policy=True`): a batch holds rollouts of the current
  policy version only, so the behaviour policy is the policy before the update; targets are GAE.
- APPO takes rollouts as they come, drops those older than `max_policy_lag` versions, and corrects
  for the lag with V-trace value targets; the ratio in the surrogate is against the behaviour policy.

Minibatches: a feed-forward policy's batch is shuffled step by step (T*B samples); a recurrent
policy's is split by env column, so each minibatch unrolls whole sequences from their stored state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Annotated, Any, Iterator, Optional

import torch

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.algorithms.on_policy import (ActorCriticConfig, ActorCriticObjective, chosen_by_env, masked_mean, normalization,
                                           normalized_advantages)
from maze_cli.algorithms.returns import gae, value_forced_steps, vtrace
from maze_cli.config.fields import Fraction, NonNegativeInt, OneOf, PositiveFloat, PositiveInt, key
from maze_cli.config.schema import register_schema
from maze_cli.contract import OptimizerGroup, Step, UpdateContext
from maze_cli.learner import Learner
from maze_cli.loops import OnPolicyLoop
from maze_cli.policies.actor_critic import ActorCritic, shares_network
from maze_cli.policies.base import Observations, State
from maze_cli.policies.groups import grouped_policy
from maze_cli.records import Rollout


@dataclass
class PpoConfig(ActorCriticConfig):
    """PPO (Schulman et al. 2017): synchronous, each batch collected with the current policy version."""

    _target_: str = "maze_cli.algorithms.ppo.Ppo"
    returns: Annotated[str, OneOf("gae", "vtrace")] = key(
        "gae", "the value targets and advantages: gae (GAE, gae_lambda) for batches of the current policy version, or "
               "vtrace (V-trace, rho_bar and c_bar) for rollouts of older ones")
    gae_lambda: Fraction = key(0.95, "GAE's lambda (0: one-step TD error, 1: Monte Carlo)")
    rho_bar: PositiveFloat = key(1.0, "returns=vtrace: V-trace's clip of the importance ratio in the value targets")
    c_bar: PositiveFloat = key(1.0, "returns=vtrace: V-trace's clip of the trace coefficients")
    n_epochs: PositiveInt = key(4, "passes over each batch")
    n_minibatches: PositiveInt = key(4,
                                      "gradient steps per pass (recurrent policies: split by env into whole "
                                      "sequences, at least 4 in a minibatch)")
    clip_range: PositiveFloat = key(0.2, "of the probability ratio in the surrogate")
    clip_value: Optional[PositiveFloat] = key(None,
                                               "null: a plain squared value error; a number: the value may move at "
                                               "most this far from its old estimate (the pessimistic max of the "
                                               "clipped and unclipped errors)")
    target_kl: Optional[PositiveFloat] = key(None,
                                              "stop the batch's passes once a minibatch's approx. KL exceeds 1.5 x "
                                              "this")
    adaptive_lr_kl: Optional[PositiveFloat] = key(None,
                                                   "the approx. KL each batch's update aims at: after a batch whose "
                                                   "mean passed twice this, the lr falls by 1.5x (to lr/100 at "
                                                   "most); under half of it, it rises by 1.5x, back to lr at most: a "
                                                   "Gaussian whose std shrinks moves further with each step of the "
                                                   "same lr, and this keeps the updates' size as it does")
    anneal_clip: bool = key(False, "clip_range likewise")
    shared_network: Optional[bool] = key(None,
                                          "one policy network for the action and value heads (true) or one each "
                                          "(false); null: one for a recurrent core (policy.core=lstm|gru: the memory "
                                          "learns from both losses), one each otherwise")


@dataclass
class AppoConfig(PpoConfig):
    """Asynchronous PPO (Sample Factory): actors never wait; V-trace targets correct for the lag."""

    _target_: str = "maze_cli.algorithms.ppo.Appo"
    n_rollout_steps: PositiveInt = key(128,
                                        "steps per rollout (T): with the default's 2 rollouts of 8 envs, batches of "
                                        "2,048 samples, each learned in 10 passes of 32 minibatches")
    n_epochs: PositiveInt = key(10)
    n_minibatches: PositiveInt = key(32)
    normalize_obs: Optional[bool] = key(None,
                                         "observations by a running mean/std; null: on (several agents: for Box "
                                         "actions only)")
    normalize_reward: Optional[bool] = key(None, "rewards by the return's std; null: on where a single agent acts")
    returns: Annotated[str, OneOf("gae", "vtrace")] = key("vtrace")
    max_policy_lag: NonNegativeInt = key(8, "rollouts older than this many policy versions are dropped")
    decoupled: bool = key(False,
                           "true: the surrogate's ratio against the policy as the batch's update began, each step "
                           "weighted by V-trace's clipped rho for the lag behind it (a decoupled objective, Hilton "
                           "et al. 2021): the clip bounds what one batch's update moves, however old its rollouts, "
                           "and approx_kl measures that update (what adaptive_lr_kl needs); false: the ratio against "
                           "the behaviour policy, as Sample Factory's APPO, the clip spent on the lag too")


register_schema("algorithm", "ppo", PpoConfig)
register_schema("algorithm", "appo", AppoConfig)


# A recurrent policy's minibatch holds at least this many whole sequences (of n_rollout_steps each): fewer make a pass a
# long chain of small sequential unrolls, and APPO's 32 minibatches of single sequences ran 20 times slower than IMPALA
MIN_SEQUENCES = 4


def clipped_surrogate(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, clip: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate objective per step, to maximize, and the probability ratio:

        L = min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A),  ratio = pi(a|s) / mu(a|s)
    """
    ratio = torch.exp(logp - behaviour_logp)
    return torch.min(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages), ratio


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Per step: 0.5 (V - R)^2, or with `clip` the pessimistic 0.5 max((V - R)^2, (V_clipped - R)^2)
    where V_clipped = V_old + clip(V - V_old, -clip, clip)."""
    loss = (values - returns).pow(2)
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.max(loss, (clipped - returns).pow(2))
    return 0.5 * loss


@dataclass(frozen=True)
class Targets:
    advantages: torch.Tensor  # [T, B]
    returns: torch.Tensor  # value targets, [T, B]
    old_values: torch.Tensor  # V(x_t) before this batch's update, [T, B]
    trained: torch.Tensor  # the real steps the losses average over, [T, B] bool
    value_trained: torch.Tensor  # those the value loss takes: all of them, or those with a choice (`skip_forced`)
    base_logp: torch.Tensor  # log-probs of the actions taken that the surrogate's ratio is against, [T, B]
    weights: torch.Tensor  # each step's weight in the surrogate, [T, B]
    skip_forced: bool = False  # the value network skips steps with one legal action (ActorCritic.valued_steps)


def _any_learner(context: UpdateContext, flag: bool) -> bool:
    """Whether `flag` holds on this learner or, with several, on any of them: they stop together or step together."""
    return flag if context.group is None else context.group.any(flag)


class PpoObjective(ActorCriticObjective):
    """PPO's and APPO's update: `n_epochs` x `n_minibatches` clipped-surrogate steps per batch; knows
    nothing of actors or backends.

    :param decoupled: the surrogate's ratio against the policy as the batch's update began, each step
        weighted by the clipped lag (`AppoConfig.decoupled`).
    """

    title = "PPO's loss"
    compiled = ("loss",)

    def __init__(self, policy: ActorCritic, hp: PpoConfig, normalize_reward: bool = False, decoupled: bool = False):
        super().__init__(policy, hp, normalize_reward)
        self.decoupled = decoupled
        self._batch: dict[str, Any] = {}  # what the summary of the batch being updated needs

    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        groups = super().optimizer_groups()
        return groups | {"policy": replace(groups["policy"], adaptive_kl=self.hp.adaptive_lr_kl)}

    @torch.no_grad()
    def targets(self, batch: Rollout, context: UpdateContext) -> Targets:
        """Advantages and value targets of the whole batch, under the policy before the update. Where the
        policy skips the value network on forced steps (a turn-based game's passes), their values come
        from their rewards (`value_forced_steps`), and the value loss leaves them out."""
        hp, T = self.hp, batch.n_steps
        rewards = self.rewards(batch, context)
        discounts = hp.gamma * (~batch.dones).float()
        real = ~batch.autoreset
        valued = self.policy.valued_steps(batch.observations, batch.initial_state)
        with context.autocast():
            out = self.policy(batch.observations, batch.initial_state, batch.episode_start,
                              **({} if valued is None else {"value_forced": False}))
        values_all, trained, value_trained = out.values.float(), real, real
        if valued is not None:
            forced = value_forced_steps(values_all, valued, rewards, discounts)
            values_all, rewards, discounts = forced.values, forced.rewards, forced.discounts
            trained = real & forced.kept
            value_trained = trained & valued[:T]
        values, bootstrap_value = values_all[:T], values_all[T]
        base_logp, weights = batch.behaviour_logp, torch.ones_like(values)
        if hp.returns == "vtrace" or self.decoupled:  # the policy as the update begins: pi, where the batch has mu
            proximal_logp = self.policy.distribution.log_prob(out.params[:T].float(), batch.actions)
        if hp.returns == "gae":
            advantages = gae(rewards, values, bootstrap_value, discounts, hp.gae_lambda)
            returns = advantages + values
        else:
            returns = vtrace(batch.behaviour_logp, proximal_logp, rewards, values, bootstrap_value, discounts, hp.rho_bar,
                             hp.c_bar).vs
            advantages = rewards + discounts * torch.cat([returns[1:], bootstrap_value.unsqueeze(0)]) - values
        if self.decoupled:
            # Against the behaviour policy the surrogate's ratio already weighs by pi/mu; decoupled, the clipped
            # rho does (finite where a step is not trained and its behaviour log-prob may be -inf)
            lag = torch.where(trained, proximal_logp - batch.behaviour_logp, torch.zeros_like(proximal_logp))
            base_logp, weights = proximal_logp, lag.exp().clamp(max=hp.rho_bar)
        return Targets(advantages, returns, values, trained, value_trained, base_logp, weights, valued is not None)

    def _view(self, batch: Rollout, targets: Targets) -> dict:
        """The batch as minibatch material, every tensor `[T', B', ...]` with minibatches taken along B':
        whole sequences for a recurrent policy (T'=T), single steps for a feed-forward one (T'=1)."""
        T, B = batch.n_steps, batch.n_envs
        view = {
            "observations": {k: v[:T] for k, v in batch.observations.items()},
            "episode_start": batch.episode_start[:T],
            "actions": batch.actions, "base_logp": targets.base_logp, "weights": targets.weights, "real": targets.trained,
            "value_real": targets.value_trained,
            "advantages": targets.advantages, "returns": targets.returns, "old_values": targets.old_values,
        }
        if self.policy.is_recurrent:
            view["initial_state"] = batch.initial_state
            return view

        def flat(x):
            return {k: flat(v) for k, v in x.items()} if isinstance(x, dict) else x.reshape(1, T * B, *x.shape[2:])

        return {k: flat(v) for k, v in view.items()} | {"initial_state": ()}

    @staticmethod
    def _columns(view: dict, columns: torch.Tensor) -> dict:
        def take(x):
            if isinstance(x, dict):
                return {k: take(v) for k, v in x.items()}
            return x[:, columns]

        mb = {k: take(v) for k, v in view.items() if k != "initial_state"}
        mb["initial_state"] = tuple(s[columns] for s in view["initial_state"])
        return mb

    def steps(self, batch: Rollout, context: UpdateContext) -> Iterator[Step]:
        """`n_epochs` x `n_minibatches` gradient steps on one batch, fewer where `target_kl` stops them."""
        hp = self.hp
        t0 = time.perf_counter()
        targets = self.targets(batch, context)
        view = self._view(batch, targets)
        n_columns = view["actions"].shape[1]
        n_minibatches = min(hp.n_minibatches, max(1, n_columns // MIN_SEQUENCES)) if self.policy.is_recurrent else hp.n_minibatches
        clip = hp.clip_range * context.progress_left if hp.anneal_clip else hp.clip_range
        clip_t = torch.tensor(clip, device=context.device)  # a tensor: an annealed clip never recompiles the loss
        targets_s = time.perf_counter() - t0  # counted with the first step's forward time
        self._batch = {"targets": targets, "clip": clip, "stopped": False, "last": None}
        for _ in range(hp.n_epochs):
            for columns in torch.randperm(n_columns, device=view["actions"].device).chunk(n_minibatches):
                mb = self._columns(view, columns)
                loss, metrics = self.loss(mb["observations"], mb["initial_state"], mb["episode_start"], mb["actions"],
                                          mb["base_logp"], mb["weights"], mb["advantages"], mb["returns"], mb["old_values"],
                                          mb["real"], mb["value_real"], clip_t, not targets.skip_forced)
                self._batch["last"] = metrics
                # target_kl is the one option that needs a number on the host per minibatch (and,
                # with several learners, their agreement: they stop together or step together)
                if hp.target_kl is not None and _any_learner(context, float(metrics["approx_kl"]) > 1.5 * hp.target_kl):
                    self._batch["stopped"] = True
                    return
                yield Step({"policy": loss}, metrics, samples=mb["real"].sum() if context.group is not None else None,
                           forward_s=targets_s)
                targets_s = 0.0

    def summary(self, batch: Rollout, steps: list[dict[str, Any]], context: UpdateContext) -> dict[str, Any]:
        """The minibatches' means, and what the batch's targets say of the value function."""
        self.observe(batch, context)
        targets, stopped = self._batch["targets"], self._batch["stopped"]
        if steps:
            result = {key: torch.stack([m[key] for m in steps]).mean() for key in steps[0]}
        else:  # the first minibatch already exceeded target_kl: report it, untrained
            result = self._batch["last"] | {"grad_norm": torch.zeros(())}
        valued = targets.value_trained
        result |= {
            "value_mean": masked_mean(targets.old_values, valued),
            "explained_variance": explained_variance(targets.old_values, targets.returns, valued),
        }
        result |= {"gradient_steps": float(len(steps)), "kl_stop": float(stopped), "lr": context.lrs["policy"],
                   "clip_range": self._batch["clip"]}
        self._batch = {}
        return result

    def loss(self, observations: Observations, initial_state: State, episode_start: torch.Tensor, actions: torch.Tensor,
             base_logp: torch.Tensor, weights: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor,
             old_values: torch.Tensor, real: torch.Tensor, value_real: torch.Tensor, clip: torch.Tensor,
             value_forced: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped-surrogate loss of one minibatch (eq. 9 of the paper, with the value and entropy terms):

            L = -E[w min(ratio A, clip(ratio, 1 - eps, 1 + eps) A)] + value_coef E[(V - R)^2 / 2] - entropy_coef E[H]

        with ratio = pi(a|s) / base(a|s) against `base_logp` and w the `weights` (`Targets`). The value term
        averages over `value_real`, the policy's over `real`; `value_forced=False` skips the value network
        where the batch's targets did (`Targets.skip_forced`)."""
        hp = self.hp
        out = self.policy(observations, initial_state, episode_start, **({} if value_forced else {"value_forced": False}))
        params, values = out.params.float(), out.values.float()
        dist = self.policy.distribution
        logp = dist.log_prob(params, actions)
        # Masked steps take the ratio 1: what their behaviour log-prob holds (an action a finished agent never
        # took, -inf) must not reach the gradient, where even a product with 0 would turn it into NaN.
        base_logp = torch.where(real, base_logp, logp.detach())
        if hp.normalize_advantage:
            advantages = normalized_advantages(advantages, real)
        surrogate, ratio = clipped_surrogate(logp, base_logp, advantages, clip)
        policy_loss = -masked_mean(weights * surrogate, real)
        v_loss = masked_mean(value_loss(values, old_values, returns, hp.clip_value), value_real)
        entropy = masked_mean(dist.entropy(params), real)
        loss = policy_loss + hp.value_coef * v_loss - hp.entropy_coef * entropy
        with torch.no_grad():
            log_ratio = logp - base_logp
            approx_kl = masked_mean(ratio - 1.0 - log_ratio, real)  # Schulman's unbiased, non-negative estimator
            clip_fraction = masked_mean(((ratio - 1.0).abs() > clip).float(), real)
        metrics = {"loss": loss, "policy_loss": policy_loss, "value_loss": v_loss, "entropy": entropy,
                   "approx_kl": approx_kl, "clip_fraction": clip_fraction}
        return loss, {k: v.detach() for k, v in metrics.items()}


def explained_variance(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(target - predicted) / Var(target) over the steps where `mask` holds: 1 for a perfect
    value function, 0 for a constant one, NaN where the targets do not vary. (A tensor: computed
    without reading anything back to the host.)"""
    var = masked_mean((target - masked_mean(target, mask)).pow(2), mask)
    residual = target - predicted
    var_residual = masked_mean((residual - masked_mean(residual, mask)).pow(2), mask)
    return torch.where(var > 0, 1.0 - var_residual / var, torch.full_like(var, float("nan")))


@dataclass
class Ppo(PpoConfig, Algorithm):
    """`algorithm=ppo`: actor-critic policy, batches of the current policy version only, GAE, clipped surrogate."""

    envs_per_actor = 8
    network_defaults = {"activation": "tanh"}
    actors_wait_for_learner = True
    normalizes_every_env = False  # null normalize_obs/normalize_reward: on for Box actions only (`normalization`)

    def build(self, parts: Components) -> Run:
        return self._build(parts, on_policy=True)

    def _build(self, parts: Components, **actor_options) -> Run:
        normalize_obs, normalize_reward = normalization(self.normalize_obs, self.normalize_reward, parts, self.normalizes_every_env)
        kwargs = {"network": parts.network, "shared_network": self.shared_network, "normalize_obs": normalize_obs,
                  "normalize_images": self.normalize_images, "action_mask_key": parts.action_mask_key}
        policy, blueprint = grouped_policy(ActorCritic, parts, kwargs, {"log_std_init": self.log_std_init})
        objective = PpoObjective(policy, self, normalize_reward, decoupled=actor_options.pop("decoupled", False))
        learner = Learner(objective, parts.device, **parts.learner)
        actors = parts.make_actors(policy=learner.policy, n_rollout_steps=self.n_rollout_steps, **actor_options)
        shared_network = shares_network(self.shared_network, policy.is_recurrent)
        return Run(OnPolicyLoop(actors, learner), actors, learner, blueprint,
                   chosen=chosen_by_env(self, normalize_obs=normalize_obs, normalize_reward=normalize_reward,
                                        shared_network=shared_network))


@dataclass
class Appo(AppoConfig, Ppo):
    """`algorithm=appo`: PPO's update on rollouts as they come (none older than max_policy_lag), V-trace targets."""

    actors_wait_for_learner = False
    # As Sample Factory's APPO (normalize_input, normalize_returns): the default algorithm meets envs whose
    # observations and rewards have any scale, whatever their actions are
    normalizes_every_env = True

    def build(self, parts: Components) -> Run:
        return self._build(parts, max_policy_lag=self.max_policy_lag, decoupled=self.decoupled)
