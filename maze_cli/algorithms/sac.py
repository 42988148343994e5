"""SAC: soft actor-critic (Haarnoja et al. 2018) with twin critics, Polyak-averaged target critics
and automatic entropy tuning; discrete actions as in Christodoulou (2019).

Workers act with `SacPolicy` and fill a replay buffer; the learner samples from it at
`replay_ratio` gradient updates per collected transition (maze_cli/algorithms/replay.py).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Annotated, Iterator, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.algorithms.critics import TwinCritic
from maze_cli.algorithms.replay import ReplayConfig, check_feed_forward, check_single_agent, replay_run
from maze_cli.config.fields import Gt, Le, PositiveFloat, key
from maze_cli.config.schema import register_schema
from maze_cli.contract import Objective, OptimizerGroup, Step, UpdateContext
from maze_cli.errors import ConfigError
from maze_cli.learner import Learner
from maze_cli.parallel.workers_with_buffer import SampledBatch
from maze_cli.policies.base import Observations, Policy, PolicyOutput, State, one_step, register_action_bounds
from maze_cli.policies.blueprint import policy_blueprint
from maze_cli.policies.distributions import Categorical
from maze_cli.policies.mlp import linear, mlp_network
from maze_cli.policies.network import build_network

_LOG_STD_MIN, _LOG_STD_MAX = -5.0, 2.0


@dataclass
class SacConfig(ReplayConfig):
    """SAC (Haarnoja et al. 2018); discrete actions as in Christodoulou (2019)."""

    _target_: str = "maze_cli.algorithms.sac.Sac"
    lr: PositiveFloat = key(1e-3, "Adam's learning rate of the actor and the critics")
    alpha_lr: PositiveFloat = key(1e-3, "Adam's learning rate of the entropy coefficient")
    tau: Annotated[float, Gt(0), Le(1)] = key(0.005, "Polyak averaging of the target critics")
    init_alpha: PositiveFloat = key(1.0, "the entropy coefficient at the start (tuned automatically from there)")
    target_entropy: Optional[float] = key(None,
                                           "null: -dim(A) for Box actions, target_entropy_scale * log(n) for "
                                           "Discrete(n)")
    target_entropy_scale: Annotated[float, Gt(0), Le(1)] = key(
        0.5,
        "Discrete actions only: the target entropy as a share of the maximum")
    split_rollouts_into_transitions: bool = key(True,
                                                 "store single transitions (true), or whole rollouts sampled as "
                                                 "sequences")
    share_encoder: bool = key(True,
                               "policy=cnn: actor and both critics use one conv encoder, trained by the critic loss "
                               "only (as in SAC-AE and DrQ); false: each network its own")


register_schema("algorithm", "sac", SacConfig)


def check_action_space(action_space: gym.Space) -> None:
    """SAC's actions: Discrete, or a Box with finite bounds (the squashed Gaussian is scaled to them)."""
    if isinstance(action_space, gym.spaces.Box):
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise ConfigError(
                f"algorithm=sac needs finite action bounds: its tanh-squashed policy is scaled to [low, high], and this env's "
                f"action space {action_space} has infinite ones; wrap the env to rescale its actions "
                f"(gymnasium.wrappers.RescaleAction) or use algorithm=impala"
            )
        return
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"algorithm=sac supports Box and Discrete actions, not {action_space}; use algorithm=impala")


class SacPolicy(Policy):
    """The actor: a tanh-squashed Gaussian scaled to the Box bounds, or a categorical over Discrete."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, network: dict | None = None,
                 action_mask_key: str | None = None):
        super().__init__()
        check_action_space(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.action_mask_key = action_mask_key
        self.network = build_network(dict(network or mlp_network((256, 256), "relu")), observation_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else 2 * int(np.prod(action_space.shape))
        self.distribution = Categorical(n_out) if self.discrete else None
        self.head = linear(self.network.out_dim, n_out, 0.01)
        if not self.discrete:
            register_action_bounds(self, action_space)

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> PolicyOutput:
        features, state = self.network(observations, state, episode_start)
        return PolicyOutput(self.head(features), None, state)

    def sample(self, observations: Observations, deterministic: bool = False):
        """For flat batches of transitions `[N, ...]`. Continuous: (action in env units, log-prob).
        Discrete: (probs, log-probs) over all actions."""
        out = self.head(self.network(observations, (), None)[0]).float()  # the distribution's math in fp32
        if self.discrete:
            log_probs = F.log_softmax(self.masked(out, observations), dim=-1)
            return log_probs.exp(), log_probs
        return self.squashed_sample(out, deterministic)

    @staticmethod
    def mean_and_log_std(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian before the squash: the head's mean and its log std within its clamp."""
        mean, log_std = out.chunk(2, dim=-1)
        return mean, log_std.clamp(_LOG_STD_MIN, _LOG_STD_MAX)

    def squashed_sample(self, out: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """a = bias + scale * tanh(u), u ~ N(mean, std) (reparameterized), and log pi(a)."""
        mean, log_std = self.mean_and_log_std(out)
        u = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
        a = torch.tanh(u)
        # log pi(a) = log N(u) - sum log(1 - tanh(u)^2) - sum log(scale)   (Haarnoja et al. 2018, appendix C)
        log_prob = (-0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (torch.log(1 - a.pow(2) + 1e-6) + torch.log(self.scale)).sum(-1)
        return a * self.scale + self.bias, log_prob

    @torch.no_grad()
    def act(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None,
            deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        """What an actor calls: (actions, log-probs, state)."""
        obs, starts = one_step(observations, episode_start)
        features, state = self.network(obs, state, starts)
        out = self.head(features[0])
        if not self.discrete:
            actions, logp = self.squashed_sample(out, deterministic)
            return actions, logp, state
        log_probs = F.log_softmax(self.masked(out, observations), dim=-1)
        actions = log_probs.argmax(-1) if deterministic else torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        return actions, log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), state


@dataclass
class Sac(SacConfig, Algorithm):
    """`algorithm=sac`: workers fill a replay buffer; the learner samples from it at `replay_ratio`."""

    # one update per transition: env steps/s never limit SAC, and with few envs the episodes a training
    # window judges end soon after the policy improves
    envs_per_actor = 2
    epoch_length = 16  # an iteration is 16 gradient steps, an epoch 256 of them (Algorithm.epoch_length says why)
    network_defaults = {"activation": "relu"}

    def build(self, parts: Components) -> Run:
        check_single_agent(parts, "sac")
        kwargs = {"network": parts.network, "action_mask_key": parts.action_mask_key}
        policy = SacPolicy(parts.observation_space, parts.action_space, **kwargs)
        check_feed_forward(policy, parts, "sac")
        learner = Learner(SacObjective(policy, self, parts.network), parts.device, **parts.learner)
        blueprint = policy_blueprint(SacPolicy, parts.observation_space, parts.action_space, kwargs)
        return replay_run(parts, learner, self, blueprint, self.split_rollouts_into_transitions)


class Temperature(nn.Module):
    """SAC's entropy coefficient alpha, learned as its log."""

    def __init__(self, init_alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))


class SacObjective(Objective):
    """SAC's update: the twin critics' step, then the actor's and the temperature's; the target
    critics follow by Polyak averaging. Three optimizer groups: critic, policy, alpha."""

    title = "SAC's loss"
    compiled = ("critic_loss", "actor_loss")

    def __init__(self, policy: SacPolicy, hp: SacConfig, network: dict | None = None):
        self.policy = policy
        self.hp = hp
        self.critic = TwinCritic(policy.observation_space, policy.action_space, dict(network or mlp_network((256, 256), "relu")))
        self.shared = self._share_encoder() if hp.share_encoder else set()
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.temperature = Temperature(hp.init_alpha)
        space = policy.action_space
        if hp.target_entropy is not None:
            self.target_entropy = hp.target_entropy
        elif policy.discrete:
            self.target_entropy = hp.target_entropy_scale * math.log(int(space.n))
        else:
            self.target_entropy = -float(np.prod(space.shape))
        self._td_errors: torch.Tensor | None = None

    def modules(self) -> dict[str, nn.Module]:
        return {"policy": self.policy, "critic": self.critic, "critic_target": self.critic_target, "temperature": self.temperature}

    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        hp = self.hp
        self.critic_params, self.critic_target_params = list(self.critic.parameters()), list(self.critic_target.parameters())
        policy_params = [p for p in self.policy.parameters() if id(p) not in self.shared]  # the actor's loss leaves the encoder be
        return {"critic": OptimizerGroup(self.critic_params, hp.lr, "critic_loss"),
                "policy": OptimizerGroup(policy_params, hp.lr, "policy_loss"),
                "alpha": OptimizerGroup([self.log_alpha], hp.alpha_lr, "alpha_loss")}

    def _share_encoder(self) -> set[int]:
        """Both critics use the actor's conv encoder (policy=cnn); the ids of its parameters."""
        from maze_cli.policies.cnn import share_image_encoders

        shared = [share_image_encoders(self.policy.network, net) for net in self.critic.nets]
        return {id(p) for params in shared for p in params}

    @property
    def log_alpha(self) -> nn.Parameter:
        return self.temperature.log_alpha

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.exp())

    def steps(self, batch: SampledBatch, context: UpdateContext) -> Iterator[Step]:
        """One update: a gradient step of the critics, then one of actor and alpha."""
        tr, w = batch.transitions, batch.weights
        alpha = self.log_alpha.exp().detach()
        critic_loss, td1, td2, q_mean = self.critic_loss(tr.observations, tr.actions, tr.rewards, tr.next_observations,
                                                         tr.terminated, w, alpha)
        yield Step({"critic": critic_loss}, ends_update=False)
        policy_loss, alpha_loss, entropy = self.actor_loss(tr.observations, alpha)
        losses = {"critic_loss": critic_loss, "policy_loss": policy_loss, "alpha_loss": alpha_loss}
        metrics = {k: v.detach() for k, v in losses.items()} | {"alpha": alpha, "entropy": entropy, "q_mean": q_mean}
        self._td_errors = (td1.abs() + td2.abs()) / 2
        yield Step({"policy": policy_loss, "alpha": alpha_loss}, metrics)

    def after_update(self, context: UpdateContext) -> None:
        with torch.no_grad():  # Polyak averaging of the target critics
            torch._foreach_lerp_(self.critic_target_params, self.critic_params, self.hp.tau)

    def priorities(self) -> torch.Tensor | None:
        return self._td_errors

    def critic_loss(self, observations: Observations, actions: torch.Tensor, rewards: torch.Tensor,
                    next_observations: Observations, terminated: torch.Tensor, weights: torch.Tensor, alpha: torch.Tensor):
        """Soft Bellman residuals of both critics, importance-weighted (prioritized replay):

            y = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(.|s')
            L = E[w (Q_1(s, a) - y)^2] + E[w (Q_2(s, a) - y)^2]

        Returns the loss, both TD errors (detached) and the mean of Q_1."""
        with torch.no_grad():
            if self.policy.discrete:
                probs_next, logp_next = self.policy.sample(next_observations)
                q1_t, q2_t = (q.float() for q in self.critic_target(next_observations))
                v_next = (probs_next * (torch.min(q1_t, q2_t) - alpha * logp_next)).sum(-1)
            else:
                a_next, logp_next = self.policy.sample(next_observations)
                q1_t, q2_t = (q.float() for q in self.critic_target(next_observations, a_next))
                v_next = torch.min(q1_t, q2_t) - alpha * logp_next
            target = rewards + self.hp.gamma * (~terminated).float() * v_next
        q1, q2 = (q.float() for q in self.critic(observations, None if self.policy.discrete else actions))
        if self.policy.discrete:
            index = actions.long().unsqueeze(-1)
            q1, q2 = q1.gather(-1, index).squeeze(-1), q2.gather(-1, index).squeeze(-1)
        td1, td2 = q1 - target, q2 - target
        loss = (weights * td1.pow(2)).mean() + (weights * td2.pow(2)).mean()
        return loss, td1.detach(), td2.detach(), q1.detach().mean()

    def actor_loss(self, observations: Observations, alpha: torch.Tensor):
        """The actor's and the temperature's losses, and the policy's entropy (detached):

            L_pi    = E_s[ E_a~pi [alpha log pi(a|s) - min_i Q_i(s, a)] ]
            L_alpha = E[-log alpha (log pi + target entropy)]
        """
        if self.policy.discrete:
            probs, logp = self.policy.sample(observations)
            with torch.no_grad():
                q_min = torch.min(*self.critic(observations)).float()
            policy_loss = (probs * (alpha * logp - q_min)).sum(-1).mean()
            entropy = -(probs * logp).sum(-1).detach()
            alpha_loss = -(self.log_alpha * (self.target_entropy - entropy)).mean()
        else:
            actions, logp = self.policy.sample(observations)
            q_min = torch.min(*self.critic(observations, actions)).float()
            policy_loss = (alpha * logp - q_min).mean()
            entropy = -logp.detach()
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        return policy_loss, alpha_loss, entropy.mean()
