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
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.config.schema import SacConfig
from maze_cli.errors import ConfigError
from maze_cli.learner import Learner
from maze_cli.buffers import Sampler
from maze_cli.parallel.workers_with_buffer import BaseDistributedWorkersWithBuffer, SampledBatch, initial_sampling_policy_or_random
from maze_cli.policies.base import Observations, Policy, PolicyOutput, State, one_step
from maze_cli.policies.blueprint import policy_blueprint
from maze_cli.policies.distributions import Categorical
from maze_cli.policies.mlp import linear, mlp_network
from maze_cli.policies.network import build_network

_LOG_STD_MIN, _LOG_STD_MAX = -5.0, 2.0
ACTION_KEY = "_action"  # the action's key among a Box-action critic's inputs


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

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, network: dict | None = None):
        super().__init__()
        check_action_space(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.network = build_network(dict(network or mlp_network((256, 256), "relu")), observation_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else 2 * int(np.prod(action_space.shape))
        self.distribution = Categorical(n_out) if self.discrete else None
        self.head = linear(self.network.out_dim, n_out, 0.01)
        if not self.discrete:
            low, high = action_space.low.flatten(), action_space.high.flatten()
            self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
            self.register_buffer("bias", torch.as_tensor((high + low) / 2, dtype=torch.float32))

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> PolicyOutput:
        features, state = self.network(observations, state, episode_start)
        return PolicyOutput(self.head(features), None, state)

    def sample(self, observations: Observations, deterministic: bool = False):
        """For flat batches of transitions `[N, ...]`. Continuous: (action in env units, log-prob).
        Discrete: (probs, log-probs) over all actions."""
        out = self.head(self.network(observations, (), None)[0]).float()  # the distribution's math in fp32
        if self.discrete:
            log_probs = F.log_softmax(out, dim=-1)
            return log_probs.exp(), log_probs
        return self.squashed_sample(out, deterministic)

    def squashed_sample(self, out: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """a = bias + scale * tanh(u), u ~ N(mean, std) (reparameterized), and log pi(a)."""
        mean, log_std = out.chunk(2, dim=-1)
        log_std = log_std.clamp(_LOG_STD_MIN, _LOG_STD_MAX)
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
        log_probs = F.log_softmax(out, dim=-1)
        actions = log_probs.argmax(-1) if deterministic else torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        return actions, log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), state


def critic_space(observation_space: gym.Space, action_space: gym.Space) -> gym.Space:
    """What a critic sees: the observation, plus the action as one more key for Box actions."""
    if isinstance(action_space, gym.spaces.Discrete):
        return observation_space
    keys = dict(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else {"obs": observation_space}
    return gym.spaces.Dict({**keys, ACTION_KEY: action_space})


class TwinCritic(nn.Module):
    """Q1 and Q2, each a policy network of the same config: of (s, a) for Box actions (the action one
    more input key), or of s for every Discrete action at once."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, network: dict):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        space = critic_space(observation_space, action_space)
        n_out = int(action_space.n) if self.discrete else 1
        self.nets = nn.ModuleList(build_network(network, space) for _ in range(2))
        self.heads = nn.ModuleList(linear(net.out_dim, n_out, 1.0) for net in self.nets)

    def forward(self, observations: Observations, actions: torch.Tensor | None = None):
        if not self.discrete:
            observations = {**observations, ACTION_KEY: actions}
        q1, q2 = (head(net(observations, (), None)[0]) for net, head in zip(self.nets, self.heads))
        return (q1, q2) if self.discrete else (q1.squeeze(-1), q2.squeeze(-1))


@dataclass
class Sac(SacConfig, Algorithm):
    """`algorithm=sac`: workers fill a replay buffer; the learner samples from it at `replay_ratio`."""

    # SAC makes one update per transition, so env steps/s never limit it and a few envs suffice: with 2 per
    # actor the envs' episodes (what a training window judges) end sooner after the policy improves, and the
    # suite's Box-action and Dict tasks learned as fast or faster than with 8 (benchmarks/SUITE.md)
    envs_per_actor = 2
    epoch_length = 16  # an iteration is 16 gradient steps, an epoch 256 of them (Algorithm.epoch_length says why)
    network_defaults = {"activation": "relu"}

    def build(self, parts: Components) -> Run:
        if getattr(parts.env_factory, "agents", None):  # finished agents' steps are no transitions for the buffer
            raise ConfigError("algorithm=sac: a multi-agent (PettingZoo) env trains with algorithm=impala, appo or ppo; "
                              "SAC's replay buffer takes single-agent envs only")
        kwargs = {"network": parts.network}
        policy = SacPolicy(parts.observation_space, parts.action_space, **kwargs)
        if policy.is_recurrent:
            raise ConfigError(f"algorithm=sac takes feed-forward policy networks only; policy._target_={parts.network['_target_']} "
                              f"is recurrent (recurrent SAC is not supported: use algorithm=impala)")
        learner = SacLearner(policy, self, parts.network, parts.device, **parts.learner)
        initial = initial_sampling_policy_or_random(policy, self.initial_policy(parts))
        # Envs one by one: no autoreset steps, so every step is a transition for the buffer (the
        # replay ratio makes the learner, not env stepping, the bottleneck of off-policy training).
        env_factory = getattr(parts.env_factory, "without_vectorization", lambda: parts.env_factory)()
        actors = parts.make_actors(policy=learner.policy, n_rollout_steps=self.n_rollout_steps, env_factory=env_factory,
                                   batch_size=self.rollouts_per_iteration, initial_policy=initial)
        workers = BaseDistributedWorkersWithBuffer(
            actors, parts.make_replay_buffer, batch_size=self.batch_size, initial_buffer_size=self.initial_buffer_size,
            split_rollouts_into_transitions=self.split_rollouts_into_transitions,
        )
        # A sampler that overrides update_priorities wants the TD errors back (prioritized replay).
        prioritized = type(workers.replay_buffer.sampler).update_priorities is not Sampler.update_priorities
        blueprint = policy_blueprint(SacPolicy, parts.observation_space, parts.action_space, kwargs)
        return Run(SacLoop(workers, learner, self.replay_ratio, prioritized), workers, learner, blueprint)

    def initial_policy(self, parts: Components):
        """The policy that fills the buffer before learning: None (uniform random), a checkpoint, or a `_target_`."""
        from maze_cli.policies.blueprint import initial_sampling_policy

        return initial_sampling_policy(self.initial_sampling_policy, parts.observation_space, parts.action_space, parts.load_policy)


class SacLearner(Learner):
    """SAC's losses on the shared learner: the actor, the twin critics and their targets, the entropy
    coefficient; three parameter groups (critic, policy, alpha), each with its own Adam."""

    def __init__(self, policy: SacPolicy, hp: SacConfig, network: dict | None = None, device: str = "cpu", **options: Any):
        super().__init__(device, **options)
        self.policy = policy.to(self.device)
        self.hp = hp
        self.critic = TwinCritic(policy.observation_space, policy.action_space, dict(network or mlp_network((256, 256), "relu"))).to(self.device)
        shared = self._share_encoder() if hp.share_encoder else set()
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_params, self.critic_target_params = list(self.critic.parameters()), list(self.critic_target.parameters())
        self.log_alpha = torch.tensor(math.log(hp.init_alpha), device=self.device, requires_grad=True)
        space = policy.action_space
        if hp.target_entropy is not None:
            self.target_entropy = hp.target_entropy
        elif policy.discrete:
            self.target_entropy = hp.target_entropy_scale * math.log(int(space.n))
        else:
            self.target_entropy = -float(np.prod(space.shape))
        self.policy_params = [p for p in self.policy.parameters() if id(p) not in shared]  # the actor's loss leaves the encoder be
        self.add_optimizer("critic", self.critic_params, lr=hp.lr)
        self.add_optimizer("policy", self.policy_params, lr=hp.lr)
        self.add_optimizer("alpha", [self.log_alpha], lr=hp.alpha_lr)
        self.forward_critic_loss = self.loss_function(self.critic_loss, "SAC's critic loss")
        self.forward_actor_loss = self.loss_function(self.actor_loss, "SAC's actor loss")
        self.updates = 0

    def _share_encoder(self) -> set[int]:
        """Both critics use the actor's conv encoder (policy=cnn); the ids of its parameters."""
        from maze_cli.policies.cnn import share_image_encoders

        shared = [share_image_encoders(self.policy.network, net) for net in self.critic.nets]
        return {id(p) for params in shared for p in params}

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.exp())

    def update(self, batch: SampledBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient step of critics, then actor and alpha; returns metrics (tensors, also
        recorded for the epoch) and per-transition TD errors."""
        tr, w = batch.transitions, batch.weights
        alpha = self.log_alpha.exp().detach()
        critic_loss, td1, td2, q_mean = self.forward_critic_loss(tr.observations, tr.actions, tr.rewards, tr.next_observations,
                                                                 tr.terminated, w, alpha)
        self.step({"critic": critic_loss})
        policy_loss, alpha_loss, entropy = self.forward_actor_loss(tr.observations, alpha)
        self.step({"policy": policy_loss, "alpha": alpha_loss})
        with torch.no_grad():  # Polyak averaging of the target critics
            torch._foreach_lerp_(self.critic_target_params, self.critic_params, self.hp.tau)
        self.updates += 1
        losses = {"critic_loss": critic_loss, "policy_loss": policy_loss, "alpha_loss": alpha_loss}
        self.watch(losses)
        metrics = {k: v.detach() for k, v in losses.items()} | {"alpha": alpha, "entropy": entropy, "q_mean": q_mean}
        self.record(metrics)
        return metrics, (td1.abs() + td2.abs()) / 2

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

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "optimizers": self.optimizer_state(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.load_optimizer_state(state)
        self.updates = state["updates"]

    def load_optimizer_state(self, state: dict) -> None:
        """Everything the optimizers' state belongs to: the critics, their targets and the
        temperature with their optimizers (resume, and `init_from.optimizer=true`)."""
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        super().load_optimizer_state(state["optimizers"])


class SacLoop:
    """One SAC iteration: move finished rollouts into the buffer, then `replay_ratio` updates per new
    transition, then one broadcast. The first iteration fills the buffer with the initial policy."""

    def __init__(self, workers: BaseDistributedWorkersWithBuffer, learner: SacLearner, replay_ratio: float, prioritized: bool):
        self.workers = workers
        self.learner = learner
        self.replay_ratio = replay_ratio
        self.prioritized = prioritized
        self.actor_stats = workers.get_epoch_stats_aggregator()
        self.learner_stats = learner.metrics  # the learner's metrics (tensors until read) and this loop's timings
        self.credit = 0.0
        self.learning_steps = 0  # transitions collected since learning started

    def updates(self) -> int:
        return self.learner.updates

    def state_dict(self) -> dict:
        """The replay ratio's bookkeeping: updates owed (a fraction of one) and transitions learned from."""
        return {"credit": self.credit, "learning_steps": self.learning_steps}

    def load_state_dict(self, state: dict) -> None:
        self.credit, self.learning_steps = float(state["credit"]), int(state["learning_steps"])

    def _collected(self, steps: int) -> float:
        """The transitions this iteration's updates are owed for: this learner's, or with several
        learners their mean, so that all of them make the same number of updates (each one a
        collective) and each learner's replay ratio holds on average."""
        group = self.learner.group
        return steps if group is None else group.sum([steps])[0] / group.world_size

    def iteration(self) -> int:
        steps_before = self.workers.env_steps
        t0 = time.perf_counter()
        new_steps = 0  # collected for learning (the initial buffer earns no updates)
        if self.workers.env_steps == 0:
            self.workers.init_replay_buffer()
            queue_before = 0.0
        else:
            queue_before, _, _ = self.workers.collect_rollouts()
            new_steps = self.workers.env_steps - steps_before
            self.learning_steps += new_steps
        self.credit += self.replay_ratio * self._collected(new_steps)
        t1 = time.perf_counter()
        sample_s = learn_s = 0.0
        n_updates = int(self.credit)
        self.credit -= n_updates
        stats = self.learner_stats
        for _ in range(n_updates):
            ta = time.perf_counter()
            batch = self.workers.sample_batch(self.learner.device)
            tb = time.perf_counter()
            _, td_errors = self.learner.update(batch)
            if self.prioritized:
                self.workers.update_priorities(batch, td_errors)
            sample_s += tb - ta
            learn_s += time.perf_counter() - tb
        self.learner.check_finite()
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
        timings = self.learner.take_timings()
        stats.add("time/learner_forward_s", timings["forward"])
        stats.add("time/learner_backward_s", timings["backward"])
        stats.add("time/broadcast_s", time.perf_counter() - t2)
        return self.workers.env_steps - steps_before
