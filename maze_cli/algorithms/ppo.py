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
from dataclasses import dataclass

import torch
from torch import nn

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.algorithms.impala import vtrace
from maze_cli.algorithms.on_policy import ActorCriticLearner, OnPolicyLoop, gae, masked_mean, normalization
from maze_cli.config.schema import AppoConfig, PpoConfig
from maze_cli.policies.actor_critic import ActorCritic
from maze_cli.policies.blueprint import policy_blueprint
from maze_cli.records import Rollout


def clipped_surrogate(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
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


class PpoLearner(ActorCriticLearner):
    """Owns the actor-critic, its optimizer and the update; knows nothing of actors or backends.

    :param vtrace_targets: APPO's V-trace targets (else GAE).
    :param max_env_steps: the run's budget, which `anneal_lr` / `anneal_clip` count down.
    """

    def __init__(self, policy: ActorCritic, hp: PpoConfig, device: str = "cpu", normalize_reward: bool = False,
                 vtrace_targets: bool = False, max_env_steps: int | None = None):
        super().__init__(policy, hp, device, normalize_reward)
        self.vtrace_targets = vtrace_targets
        self.max_env_steps = max_env_steps
        self.env_steps = 0  # consumed, for the schedules

    def progress_left(self) -> float:
        """1 at the start of the budget, 0 at its end (what the annealed lr and clip are scaled by)."""
        if not self.max_env_steps:
            return 1.0
        return max(0.0, 1.0 - self.env_steps / self.max_env_steps)

    @torch.no_grad()
    def targets(self, batch: Rollout) -> Targets:
        """Advantages and value targets of the whole batch, under the policy before the update."""
        hp, T = self.hp, batch.n_steps
        rewards = self.rewards(batch)
        out = self.policy(batch.observations, batch.initial_state, batch.episode_start)
        values, bootstrap_value = out.values[:T], out.values[T]
        discounts = hp.gamma * (~batch.dones).float()
        if not self.vtrace_targets:
            advantages = gae(rewards, values, bootstrap_value, discounts, hp.gae_lambda)
            return Targets(advantages, advantages + values, values)
        target_logp = self.policy.distribution.log_prob(out.params[:T], batch.actions)
        vs = vtrace(batch.behaviour_logp, target_logp, rewards, values, bootstrap_value, discounts, hp.rho_bar, hp.c_bar).vs
        vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        # The surrogate's ratio already weighs by pi/mu: the advantage itself is not weighted again.
        return Targets(rewards + discounts * vs_tp1 - values, vs, values)

    def _view(self, batch: Rollout, targets: Targets) -> dict:
        """The batch as minibatch material, every tensor `[T', B', ...]` with minibatches taken along B':
        whole sequences for a recurrent policy (T'=T), single steps for a feed-forward one (T'=1)."""
        T, B = batch.n_steps, batch.n_envs
        view = {
            "observations": {k: v[:T] for k, v in batch.observations.items()},
            "episode_start": batch.episode_start[:T],
            "actions": batch.actions, "behaviour_logp": batch.behaviour_logp, "real": ~batch.autoreset,
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

    def update(self, batch: Rollout) -> dict[str, float]:
        """`n_epochs` x `n_minibatches` gradient steps on one batch; returns this batch's learner stats."""
        hp = self.hp
        t0 = time.perf_counter()
        targets = self.targets(batch)
        view = self._view(batch, targets)
        n_columns = view["actions"].shape[1]
        if n_columns < hp.n_minibatches:
            raise ValueError(f"algorithm.n_minibatches={hp.n_minibatches} is more than the batch's {n_columns} "
                             "sequences (a recurrent policy splits by env): lower it or collect more envs per batch")
        left = self.progress_left()
        lr = hp.lr * left if hp.anneal_lr else hp.lr
        clip = hp.clip_range * left if hp.anneal_clip else hp.clip_range
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums: dict[str, float] = {}
        steps, stopped = 0, False
        forward_s = backward_s = 0.0
        t_prep = time.perf_counter() - t0
        for _ in range(hp.n_epochs):
            for columns in torch.randperm(n_columns, device=view["actions"].device).chunk(hp.n_minibatches):
                t1 = time.perf_counter()
                loss, stats = self._loss(self._columns(view, columns), clip)
                t2 = time.perf_counter()
                forward_s += t2 - t1
                if hp.target_kl is not None and stats["approx_kl"] > 1.5 * hp.target_kl:
                    stopped = True
                    break
                self.optimizer.zero_grad()
                loss.backward()
                stats["grad_norm"] = float(nn.utils.clip_grad_norm_(self.policy.parameters(), hp.max_grad_norm))
                self.optimizer.step()
                backward_s += time.perf_counter() - t2
                self.updates += 1
                steps += 1
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value
            if stopped:
                break
        self.observe(batch)
        self.env_steps += batch.rewards.numel()
        self.timings = {"forward": t_prep + forward_s, "backward": backward_s}
        result = {key: value / max(steps, 1) for key, value in sums.items()}
        if not steps:  # the first minibatch already exceeded target_kl: report it, untrained
            result = {k: v for k, v in stats.items()} | {"grad_norm": 0.0}
        real = batch.autoreset.logical_not()
        result |= {
            "gradient_steps": float(steps), "kl_stop": float(stopped), "lr": lr, "clip_range": clip,
            "value_mean": float(masked_mean(targets.old_values, real)),
            "explained_variance": explained_variance(targets.old_values[real], targets.returns[real]),
        }
        return result

    def _loss(self, mb: dict, clip: float) -> tuple[torch.Tensor, dict[str, float]]:
        hp = self.hp
        out = self.policy(mb["observations"], mb["initial_state"], mb["episode_start"])
        dist = self.policy.distribution
        logp = dist.log_prob(out.params, mb["actions"])
        real = mb["real"]
        advantages = mb["advantages"]
        if hp.normalize_advantage:
            mean = masked_mean(advantages, real)
            std = masked_mean((advantages - mean).pow(2), real).sqrt()
            advantages = (advantages - mean) / (std + 1e-8)
        surrogate, ratio = clipped_surrogate(logp, mb["behaviour_logp"], advantages, clip)
        policy_loss = -masked_mean(surrogate, real)
        v_loss = masked_mean(value_loss(out.values, mb["old_values"], mb["returns"], hp.clip_value), real)
        entropy = masked_mean(dist.entropy(out.params), real)
        loss = policy_loss + hp.value_coef * v_loss - hp.entropy_coef * entropy
        with torch.no_grad():
            log_ratio = logp - mb["behaviour_logp"]
            approx_kl = masked_mean(ratio - 1.0 - log_ratio, real)  # Schulman's unbiased, non-negative estimator
            clip_fraction = masked_mean(((ratio - 1.0).abs() > clip).float(), real)
        return loss, {
            "loss": loss.item(), "policy_loss": policy_loss.item(), "value_loss": v_loss.item(), "entropy": entropy.item(),
            "approx_kl": approx_kl.item(), "clip_fraction": clip_fraction.item(),
        }

    def state_dict(self) -> dict:
        return super().state_dict() | {"env_steps": self.env_steps}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.env_steps = state["env_steps"]


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target): 1 for a perfect value function, 0 for a constant one."""
    var = float(target.var()) if target.numel() > 1 else 0.0
    return float("nan") if var == 0 else 1.0 - float((target - predicted).var()) / var


@dataclass
class Ppo(PpoConfig, Algorithm):
    """`algorithm=ppo`: actor-critic policy, batches of the current policy version only, GAE, clipped surrogate."""

    envs_per_actor = 8
    network_defaults = {"activation": "tanh"}

    def build(self, parts: Components) -> Run:
        return self._build(parts, on_policy=True)

    def _build(self, parts: Components, **actor_options) -> Run:
        normalize_obs, normalize_reward = normalization(self.normalize_obs, self.normalize_reward, parts.action_space)
        kwargs = {"network": parts.network, "shared_network": self.shared_network, "normalize_obs": normalize_obs}
        policy = ActorCritic(parts.observation_space, parts.action_space, **kwargs)
        learner = PpoLearner(policy, self, parts.device, normalize_reward, vtrace_targets=isinstance(self, Appo),
                             max_env_steps=parts.max_env_steps)
        actors = parts.make_actors(policy=learner.policy, n_rollout_steps=self.n_rollout_steps, **actor_options)
        blueprint = policy_blueprint(ActorCritic, parts.observation_space, parts.action_space, kwargs)
        return Run(OnPolicyLoop(actors, learner), actors, learner, blueprint)


@dataclass
class Appo(AppoConfig, Ppo):
    """`algorithm=appo`: PPO's update on rollouts as they come (none older than max_policy_lag), V-trace targets."""

    def build(self, parts: Components) -> Run:
        return self._build(parts, max_policy_lag=self.max_policy_lag)
