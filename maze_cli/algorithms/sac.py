"""SAC: soft actor-critic (Haarnoja et al. 2018) with twin critics, Polyak-averaged target critics
and automatic entropy tuning; discrete actions as in Christodoulou (2019).

Workers act with `SacPolicy` and fill a replay buffer; the learner samples from it at
`replay_ratio` gradient updates per collected transition.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.algorithms.optim import Adam
from maze_cli.parallel.workers_with_buffer import BaseDistributedWorkersWithBuffer, SampledBatch
from maze_cli.policies.actor_critic import ObservationEncoder, _mlp
from maze_cli.stats.aggregator import EpochStatsAggregator
from maze_cli.training import check_finite

_LOG_STD_MIN, _LOG_STD_MAX = -5.0, 2.0


def _check_space(action_space: gym.Space) -> None:
    if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        from maze_cli.envs.spaces import UnsupportedSpaceError

        raise UnsupportedSpaceError(f"algorithm=sac supports Box and Discrete actions, not {action_space!r}")


class SacPolicy(nn.Module):
    """The actor: a tanh-squashed Gaussian scaled to the Box bounds, or a categorical over Discrete."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(256, 256), activation: str = "relu"):
        super().__init__()
        _check_space(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.encoder = ObservationEncoder(observation_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else 2 * int(np.prod(action_space.shape))
        self.net = _mlp([self.encoder.out_dim, *hidden_sizes, n_out], activation, 0.01)
        if not self.discrete:
            low, high = action_space.low.flatten(), action_space.high.flatten()
            self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
            self.register_buffer("bias", torch.as_tensor((high + low) / 2, dtype=torch.float32))

    def sample(self, observations: dict[str, torch.Tensor], deterministic: bool = False):
        """Continuous: (action in env units, log-prob). Discrete: (probs, log-probs) over all actions."""
        out = self.net(self.encoder(observations))
        if self.discrete:
            log_probs = F.log_softmax(out, dim=-1)
            return log_probs.exp(), log_probs
        mean, log_std = out.chunk(2, dim=-1)
        log_std = log_std.clamp(_LOG_STD_MIN, _LOG_STD_MAX)
        u = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
        a = torch.tanh(u)
        # log pi(a) = log N(u) - sum log(1 - tanh(u)^2) - sum log(scale)   (Haarnoja et al. 2018, appendix C)
        log_prob = (-0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (torch.log(1 - a.pow(2) + 1e-6) + torch.log(self.scale)).sum(-1)
        return a * self.scale + self.bias, log_prob

    @torch.no_grad()
    def act(self, observations: dict[str, torch.Tensor], deterministic: bool = False):
        """What an actor calls: (actions, log-probs)."""
        if self.discrete:
            _, log_probs = self.sample(observations)
            if deterministic:
                actions = log_probs.argmax(-1)
            else:
                actions = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
            logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        else:
            actions, logp = self.sample(observations, deterministic)
        return actions, logp


class TwinCritic(nn.Module):
    """Q1 and Q2: of (s, a) for Box actions, or of s for every Discrete action at once."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes=(256, 256), activation: str = "relu"):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_in = self.encoder.out_dim + (0 if self.discrete else int(np.prod(action_space.shape)))
        n_out = int(action_space.n) if self.discrete else 1
        self.q1 = _mlp([n_in, *hidden_sizes, n_out], activation, 1.0)
        self.q2 = _mlp([n_in, *hidden_sizes, n_out], activation, 1.0)

    def forward(self, observations: dict[str, torch.Tensor], actions: torch.Tensor | None = None):
        x = self.encoder(observations)
        if not self.discrete:
            x = torch.cat([x, actions], dim=-1)
            return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)
        return self.q1(x), self.q2(x)


@dataclass(frozen=True)
class SacHyperparameters:
    lr: float = 1e-3
    alpha_lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    init_alpha: float = 1.0
    target_entropy: float | None = None  # None: -|A| for Box, target_entropy_scale * log|A| for Discrete
    target_entropy_scale: float = 0.5


class SacLearner:
    """Owns the actor, the twin critics and their targets, the entropy coefficient and the updates."""

    def __init__(self, policy: SacPolicy, hp: SacHyperparameters, hidden_sizes=(256, 256), activation: str = "relu", device: str = "cpu"):
        self.policy = policy.to(device)
        self.hp = hp
        self.device = device
        self.critic = TwinCritic(policy.observation_space, policy.action_space, hidden_sizes, activation).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_params, self.critic_target_params = list(self.critic.parameters()), list(self.critic_target.parameters())
        self.log_alpha = torch.tensor(math.log(hp.init_alpha), device=device, requires_grad=True)
        space = policy.action_space
        if hp.target_entropy is not None:
            self.target_entropy = hp.target_entropy
        elif policy.discrete:
            self.target_entropy = hp.target_entropy_scale * math.log(int(space.n))
        else:
            self.target_entropy = -float(np.prod(space.shape))
        self.policy_optimizer = Adam(self.policy.parameters(), lr=hp.lr)
        self.critic_optimizer = Adam(self.critic.parameters(), lr=hp.lr)
        self.alpha_optimizer = Adam([self.log_alpha], lr=hp.alpha_lr)
        self.updates = 0

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.exp())

    def update(self, batch: SampledBatch) -> tuple[dict[str, float], torch.Tensor]:
        """One gradient step of critics, actor and alpha; returns stats and per-transition TD errors."""
        tr, w, hp = batch.transitions, batch.weights, self.hp
        alpha = self.log_alpha.exp().detach()
        # Critic: y = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(.|s')
        with torch.no_grad():
            if self.policy.discrete:
                probs_next, logp_next = self.policy.sample(tr.next_observations)
                q1_t, q2_t = self.critic_target(tr.next_observations)
                v_next = (probs_next * (torch.min(q1_t, q2_t) - alpha * logp_next)).sum(-1)
            else:
                a_next, logp_next = self.policy.sample(tr.next_observations)
                q1_t, q2_t = self.critic_target(tr.next_observations, a_next)
                v_next = torch.min(q1_t, q2_t) - alpha * logp_next
            target = tr.rewards + hp.gamma * (~tr.terminated).float() * v_next
        q1, q2 = self.critic(tr.observations, None if self.policy.discrete else tr.actions)
        if self.policy.discrete:
            index = tr.actions.long().unsqueeze(-1)
            q1, q2 = q1.gather(-1, index).squeeze(-1), q2.gather(-1, index).squeeze(-1)
        td1, td2 = q1 - target, q2 - target
        critic_loss = (w * td1.pow(2)).mean() + (w * td2.pow(2)).mean()
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()

        # Actor: E_s[ E_a~pi [alpha log pi(a|s) - min_i Q_i(s, a)] ];  alpha: E[-alpha (log pi + target entropy)]
        if self.policy.discrete:
            probs, logp = self.policy.sample(tr.observations)
            with torch.no_grad():
                q_min = torch.min(*self.critic(tr.observations))
            policy_loss = (probs * (alpha * logp - q_min)).sum(-1).mean()
            entropy = -(probs * logp).sum(-1).detach()
            alpha_loss = -(self.log_alpha * (self.target_entropy - entropy)).mean()
        else:
            actions, logp = self.policy.sample(tr.observations)
            q_min = torch.min(*self.critic(tr.observations, actions))
            policy_loss = (alpha * logp - q_min).mean()
            entropy = -logp.detach()
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.policy_optimizer.zero_grad()
        policy_loss.backward(inputs=self.policy_optimizer.params)  # through Q into the actor only
        self.policy_optimizer.step()
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()

        with torch.no_grad():  # Polyak averaging of the target critics
            torch._foreach_lerp_(self.critic_target_params, self.critic_params, hp.tau)
        self.updates += 1
        stats = {
            "critic_loss": critic_loss.item(),
            "policy_loss": policy_loss.item(),
            "alpha": float(alpha),
            "alpha_loss": alpha_loss.item(),
            "entropy": entropy.mean().item(),
            "q_mean": q1.detach().mean().item(),
        }
        return stats, (td1.detach().abs() + td2.detach().abs()) / 2

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "optimizers": {k: getattr(self, f"{k}_optimizer").state_dict() for k in ("policy", "critic", "alpha")},
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for key, saved in state["optimizers"].items():
            getattr(self, f"{key}_optimizer").load_state_dict(saved)
        self.updates = state["updates"]


class SacLoop:
    """One SAC iteration: move finished rollouts into the buffer, then `replay_ratio` updates per new
    transition, then one broadcast. The first iteration fills the buffer with the initial policy."""

    def __init__(self, workers: BaseDistributedWorkersWithBuffer, learner: SacLearner, replay_ratio: float, prioritized: bool):
        self.workers = workers
        self.learner = learner
        self.replay_ratio = replay_ratio
        self.prioritized = prioritized
        self.actor_stats = workers.get_epoch_stats_aggregator()
        self.learner_stats = EpochStatsAggregator()
        self.credit = 0.0
        self.learning_steps = 0  # transitions collected since learning started

    def updates(self) -> int:
        return self.learner.updates

    def iteration(self) -> int:
        steps_before = self.workers.env_steps
        t0 = time.perf_counter()
        if self.workers.env_steps == 0:
            self.workers.init_replay_buffer()
            queue_before = 0.0
        else:
            queue_before, _, _ = self.workers.collect_rollouts()
            self.credit += self.replay_ratio * (self.workers.env_steps - steps_before)
            self.learning_steps += self.workers.env_steps - steps_before
        t1 = time.perf_counter()
        sample_s = learn_s = 0.0
        n_updates = int(self.credit)
        self.credit -= n_updates
        stats = self.learner_stats
        for _ in range(n_updates):
            ta = time.perf_counter()
            batch = self.workers.sample_batch(self.learner.device)
            tb = time.perf_counter()
            update, td_errors = self.learner.update(batch)
            check_finite(update, ("critic_loss", "policy_loss", "alpha_loss"))
            if self.prioritized:
                self.workers.update_priorities(batch, td_errors)
            sample_s += tb - ta
            learn_s += time.perf_counter() - tb
            for key, value in update.items():
                stats.add(f"learner/{key}", value)
        t2 = time.perf_counter()
        if n_updates:
            self.workers.broadcast_updated_policy(self.learner.policy.state_dict())
        buffer = self.workers.replay_buffer
        stats.add("queue_size", queue_before)
        stats.add("buffer/size", len(buffer))
        stats.add("buffer/fill", len(buffer) / buffer.capacity)
        if self.learning_steps:
            stats.add("learner/replay_ratio", self.learner.updates / self.learning_steps)
        stats.add("time/wait_actors_s", t1 - t0)
        stats.add("time/sample_s", sample_s)
        stats.add("time/learner_s", learn_s)
        stats.add("time/broadcast_s", time.perf_counter() - t2)
        return self.workers.env_steps - steps_before
