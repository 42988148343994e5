"""TD3: twin delayed deep deterministic policy gradient (Fujimoto et al. 2018).

A deterministic actor mu(s), squashed by tanh into the Box bounds, explores with Gaussian noise
added by the actors; twin critics and the minimum of their targets curb DDPG's overestimation,
target actions are smoothed with clipped noise, and the actor and the target networks follow
the critics every `policy_delay` updates. Workers fill a replay buffer; the learner samples from it
at `replay_ratio` updates per collected transition (maze_cli/algorithms/replay.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated, Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.algorithms.critics import TwinCritic
from maze_cli.algorithms.replay import ReplayConfig, check_feed_forward, check_single_agent, replay_run
from maze_cli.config.fields import Gt, Le, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, key
from maze_cli.config.schema import register_schema
from maze_cli.contract import Objective, OptimizerGroup, Step, UpdateContext
from maze_cli.errors import ConfigError
from maze_cli.learner import Learner
from maze_cli.parallel.workers_with_buffer import SampledBatch
from maze_cli.policies.base import Observations, Policy, PolicyOutput, State, one_step, register_action_bounds
from maze_cli.policies.blueprint import policy_blueprint
from maze_cli.policies.mlp import linear, mlp_network
from maze_cli.policies.network import build_network


@dataclass
class Td3Config(ReplayConfig):
    """TD3 (Fujimoto et al. 2018): Box actions, a deterministic actor with exploration noise."""

    _target_: str = "maze_cli.algorithms.td3.Td3"
    lr: PositiveFloat = key(3e-4, "Adam's learning rate of the actor and the critics")
    tau: Annotated[float, Gt(0), Le(1)] = key(0.005, "Polyak averaging of the target networks")
    exploration_noise: NonNegativeFloat = key(0.1,
                                               "the actors' Gaussian exploration noise, its std as a share of the "
                                               "action range's half-width")
    policy_noise: NonNegativeFloat = key(0.2, "target policy smoothing: the noise's std, as a share of the half-width")
    noise_clip: NonNegativeFloat = key(0.5, "... clipped at this share of the half-width")
    policy_delay: PositiveInt = key(2, "critic updates per actor (and target network) update")
    initial_buffer_size: NonNegativeInt = key(10_000)


register_schema("algorithm", "td3", Td3Config)


def check_action_space(action_space: gym.Space) -> None:
    """TD3's actions: a Box with finite bounds (the tanh-squashed actor is scaled to them)."""
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(f"algorithm=td3 takes Box (continuous) actions, not {action_space}; use algorithm=sac, ppo or impala")
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise ConfigError(f"algorithm=td3 needs finite action bounds: its actor is scaled to [low, high], and this env's action "
                          f"space {action_space} has infinite ones; wrap the env to rescale its actions "
                          f"(gymnasium.wrappers.RescaleAction) or use algorithm=ppo")


class Td3Policy(Policy):
    """The deterministic actor a = bias + scale * tanh(mu(s)); acting adds Gaussian noise of std
    `exploration_noise * scale`, clipped to the bounds (none when deterministic: evaluation, `rollout`)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, network: dict | None = None,
                 exploration_noise: float = 0.1):
        super().__init__()
        check_action_space(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.network = build_network(dict(network or mlp_network((256, 256), "relu")), observation_space)
        self.head = linear(self.network.out_dim, int(np.prod(action_space.shape)), 0.01)
        self.exploration_noise = exploration_noise
        register_action_bounds(self, action_space)

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> PolicyOutput:
        features, state = self.network(observations, state, episode_start)
        return PolicyOutput(self.head(features), None, state)

    def mu(self, observations: Observations) -> torch.Tensor:
        """The actor's action for flat batches of observations `[N, ...]`, in env units."""
        out = self.head(self.network(observations, (), None)[0]).float()
        return torch.tanh(out) * self.scale + self.bias

    @torch.no_grad()
    def act(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None,
            deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        """What an actor calls: (actions, log-probs (0: a deterministic policy has none), state)."""
        obs, starts = one_step(observations, episode_start)
        features, state = self.network(obs, state, starts)
        actions = torch.tanh(self.head(features[0]).float()) * self.scale + self.bias
        if not deterministic and self.exploration_noise > 0:
            noise = torch.randn_like(actions) * (self.exploration_noise * self.scale)
            actions = torch.maximum(torch.minimum(actions + noise, self.bias + self.scale), self.bias - self.scale)
        return actions, torch.zeros(actions.shape[0], device=actions.device), state


@dataclass
class Td3(Td3Config, Algorithm):
    """`algorithm=td3`: workers fill a replay buffer; the learner samples from it at `replay_ratio`."""

    envs_per_actor = 2  # as SAC: one update per transition, so a few envs suffice
    epoch_length = 16  # iterations of 16 updates: an epoch of 256 updates
    network_defaults = {"activation": "relu"}

    def build(self, parts: Components) -> Run:
        check_single_agent(parts, "td3")
        check_action_space(parts.action_space)
        kwargs = {"network": parts.network, "exploration_noise": self.exploration_noise}
        policy = Td3Policy(parts.observation_space, parts.action_space, **kwargs)
        check_feed_forward(policy, parts, "td3")
        learner = Learner(Td3Objective(policy, self, parts.network), parts.device, **parts.learner)
        blueprint = policy_blueprint(Td3Policy, parts.observation_space, parts.action_space, kwargs)
        return replay_run(parts, learner, self, blueprint)


class Td3Objective(Objective):
    """TD3's update: a step of the twin critics every update; every `policy_delay`-th update also a
    step of the actor, after which the target actor and critics follow by Polyak averaging."""

    title = "TD3's loss"
    compiled = ("critic_loss", "actor_loss")

    def __init__(self, policy: Td3Policy, hp: Td3Config, network: dict | None = None):
        self.policy = policy
        self.hp = hp
        self.critic = TwinCritic(policy.observation_space, policy.action_space, dict(network or mlp_network((256, 256), "relu")))
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.policy_target = copy.deepcopy(policy).requires_grad_(False)
        self._td_errors: torch.Tensor | None = None

    def modules(self) -> dict[str, nn.Module]:
        return {"policy": self.policy, "critic": self.critic, "critic_target": self.critic_target, "policy_target": self.policy_target}

    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        self.online = list(self.critic.parameters()) + list(self.policy.parameters())
        self.targets = list(self.critic_target.parameters()) + list(self.policy_target.parameters())
        return {"critic": OptimizerGroup(list(self.critic.parameters()), self.hp.lr, "critic_loss"),
                "policy": OptimizerGroup(list(self.policy.parameters()), self.hp.lr, "policy_loss")}

    def steps(self, batch: SampledBatch, context: UpdateContext) -> Iterator[Step]:
        tr = batch.transitions
        critic_loss, td1, td2, q_mean = self.critic_loss(tr.observations, tr.actions, tr.rewards, tr.next_observations,
                                                         tr.terminated, batch.weights)
        self._td_errors = (td1.abs() + td2.abs()) / 2
        metrics = {"critic_loss": critic_loss.detach(), "q_mean": q_mean}
        if (context.updates + 1) % self.hp.policy_delay != 0:  # this update steps the critics alone
            yield Step({"critic": critic_loss}, metrics)
            return
        yield Step({"critic": critic_loss}, metrics, ends_update=False)
        policy_loss = self.actor_loss(tr.observations)
        yield Step({"policy": policy_loss}, {"policy_loss": policy_loss.detach()})

    def critic_loss(self, observations: Observations, actions: torch.Tensor, rewards: torch.Tensor,
                    next_observations: Observations, terminated: torch.Tensor, weights: torch.Tensor):
        """Both critics' Bellman residuals against the smoothed, clipped double-Q target (eqs. 10 and 15 of the paper):

            a' = clip(mu'(s') + clip(eps, -c, c), low, high),  eps ~ N(0, sigma)
            y  = r + gamma (1 - terminated) min_i Q'_i(s', a')
            L  = E[w (Q_1(s, a) - y)^2] + E[w (Q_2(s, a) - y)^2]

        importance-weighted by `weights` (prioritized replay); returns the loss, both TD errors and the mean of Q_1."""
        hp, scale, bias = self.hp, self.policy.scale, self.policy.bias
        with torch.no_grad():
            mu_next = self.policy_target.mu(next_observations)
            noise = (torch.randn_like(mu_next) * (hp.policy_noise * scale)).clamp(-hp.noise_clip * scale, hp.noise_clip * scale)
            a_next = torch.maximum(torch.minimum(mu_next + noise, bias + scale), bias - scale)
            q1_t, q2_t = (q.float() for q in self.critic_target(next_observations, a_next))
            target = rewards + hp.gamma * (~terminated).float() * torch.min(q1_t, q2_t)
        q1, q2 = (q.float() for q in self.critic(observations, actions))
        td1, td2 = q1 - target, q2 - target
        loss = (weights * td1.pow(2)).mean() + (weights * td2.pow(2)).mean()
        return loss, td1.detach(), td2.detach(), q1.detach().mean()

    def actor_loss(self, observations: Observations) -> torch.Tensor:
        """The deterministic policy gradient's loss: L = -E[Q_1(s, mu(s))] (its gradient reaches the actor only)."""
        q1, _ = self.critic(observations, self.policy.mu(observations))
        return -q1.float().mean()

    def after_update(self, context: UpdateContext) -> None:
        if context.updates % self.hp.policy_delay == 0:  # the update that stepped the actor
            with torch.no_grad():
                torch._foreach_lerp_(self.targets, self.online, self.hp.tau)

    def priorities(self) -> torch.Tensor | None:
        return self._td_errors
