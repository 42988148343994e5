"""DQN and its family: double Q, dueling heads, n-step returns, prioritized replay, Ape-X exploration.

A Q-network acts epsilon-greedily; workers fill a replay buffer and the learner samples from it at
`replay_ratio` updates per collected transition (maze_cli/algorithms/replay.py), regressing Q(s, a)
onto r + gamma^n max_a' Q'(s', a') (Mnih et al. 2015) with a target network Q' that follows the
online one every `target_update_interval` updates. Each extension is a key: `double_q` (van Hasselt
et al. 2016), `dueling` (Wang et al. 2016), `n_step` (Sutton 1988; Hessel et al. 2018),
`replay_buffer=prioritized` (Schaul et al. 2016), and `exploration=apex`: Ape-X's fixed epsilon per
env, eps_i = apex_epsilon^(1 + apex_alpha * i / (N - 1)) over the run's N envs (Horgan et al. 2018),
instead of one epsilon that falls over the first `epsilon_steps` env steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated, Iterator

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.algorithms.base import Algorithm, Components, Run
from maze_cli.algorithms.replay import ReplayConfig, check_feed_forward, check_single_agent, replay_run
from maze_cli.config.fields import Fraction, Gt, Le, NonNegativeFloat, OneOf, PositiveFloat, PositiveInt, key
from maze_cli.config.schema import register_schema
from maze_cli.contract import Objective, OptimizerGroup, Step, UpdateContext
from maze_cli.errors import ConfigError
from maze_cli.learner import Learner
from maze_cli.parallel.workers_with_buffer import SampledBatch
from maze_cli.policies.base import Observations, Policy, PolicyOutput, State, one_step
from maze_cli.policies.blueprint import policy_blueprint
from maze_cli.policies.mlp import linear, mlp_network
from maze_cli.policies.network import build_network

@dataclass
class DqnConfig(ReplayConfig):
    """DQN (Mnih et al. 2015) with double Q, dueling heads, n-step returns and Ape-X exploration; Discrete actions."""

    _target_: str = "maze_cli.algorithms.dqn.Dqn"
    lr: PositiveFloat = key(5e-4, "Adam's learning rate")
    double_q: bool = key(True,
                          "the online network picks the next action, the target network values it (van Hasselt et "
                          "al. 2016)")
    dueling: bool = key(True, "Q = V + A - mean(A): a value head and an advantage head (Wang et al. 2016)")
    n_step: PositiveInt = key(3,
                               "rewards summed over up to n steps before bootstrapping (fewer where the rollout "
                               "ends)")
    target_update_interval: PositiveInt = key(100, "updates between target network updates")
    tau: Annotated[float, Gt(0), Le(1)] = key(1.0,
                                               "the target's step towards the online network: 1 copies it, less is "
                                               "Polyak averaging")
    max_grad_norm: PositiveFloat = key(10.0, "clip the gradient's norm")
    exploration: Annotated[str, OneOf("linear", "apex")] = key(
        "linear",
        "linear: one epsilon for every env, falling from initial_epsilon to final_epsilon over epsilon_steps; apex: "
        "env i of the run's N acts with apex_epsilon^(1 + apex_alpha * i / (N - 1)) throughout (Horgan et al. 2018)")
    initial_epsilon: Fraction = key(1.0, "exploration=linear: epsilon at the start")
    final_epsilon: Fraction = key(0.05, "... after epsilon_steps")
    epsilon_steps: PositiveInt = key(10_000, "... env steps (every actor's together) over which epsilon falls")
    apex_epsilon: Annotated[float, Gt(0), Le(1)] = key(0.4, "exploration=apex: the base epsilon")
    apex_alpha: NonNegativeFloat = key(7.0, "... and its exponent's spread over the envs")
    n_rollout_steps: PositiveInt = key(16, "steps per worker rollout (n-step windows end with it)")
    batch_size: PositiveInt = key(128)
    replay_ratio: PositiveFloat = key(0.25)


register_schema("algorithm", "dqn", DqnConfig)


def check_action_space(action_space: gym.Space) -> None:
    """DQN's actions: Discrete (a Q-value per action)."""
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        raise ConfigError(f"algorithm=dqn takes Discrete actions, not {action_space}: a Q-value per joint action would "
                          f"grow with their product; use algorithm=ppo, appo or impala")
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"algorithm=dqn takes Discrete actions, not {action_space}; use algorithm=sac or td3 "
                          f"(Box actions) or ppo")


def apex_epsilons(env_ids: range, n_envs: int, epsilon: float, alpha: float) -> torch.Tensor:
    """Ape-X's epsilon of each env: eps_i = epsilon^(1 + alpha * i / (N - 1)) (Horgan et al. 2018,
    section 4.1): from `epsilon` for env 0 to epsilon^(1 + alpha) for env N - 1."""
    i = torch.tensor(list(env_ids), dtype=torch.float64)
    return (epsilon ** (1 + alpha * i / max(n_envs - 1, 1))).float()


class DqnPolicy(Policy):
    """A Q-network: a value per action (dueling: V(s) + A(s, a) - mean A(s)); acts epsilon-greedily.

    The epsilon of linear exploration is a buffer: the learner sets it, and it reaches the actors
    with the weights. With Ape-X exploration each actor's copy holds its envs' own epsilons instead.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, network: dict | None = None,
                 dueling: bool = True, exploration: str = "linear", apex_epsilon: float = 0.4, apex_alpha: float = 7.0,
                 action_mask_key: str | None = None):
        super().__init__()
        check_action_space(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.action_mask_key = action_mask_key
        self.network = build_network(dict(network or mlp_network((256, 256), "relu")), observation_space)
        self.n_actions = int(action_space.n)
        self.advantage = linear(self.network.out_dim, self.n_actions, 1.0)
        self.value = linear(self.network.out_dim, 1, 1.0) if dueling else None
        self.exploration, self.apex = exploration, (apex_epsilon, apex_alpha)
        self.register_buffer("epsilon", torch.tensor(1.0))
        self.env_epsilons: torch.Tensor | None = None  # Ape-X: one per env this copy acts in

    def q_values(self, features: torch.Tensor) -> torch.Tensor:
        advantage = self.advantage(features)
        if self.value is None:
            return advantage
        return self.value(features) + advantage - advantage.mean(-1, keepdim=True)

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> PolicyOutput:
        features, state = self.network(observations, state, episode_start)
        return PolicyOutput(self.q_values(features), None, state)

    def q(self, observations: Observations) -> torch.Tensor:
        """Q-values `[N, n_actions]` of flat batches of observations `[N, ...]`, in fp32; a forbidden action's
        lowest of all, so that neither a target's max nor double Q's argmax takes it."""
        return self.masked(self.q_values(self.network(observations, (), None)[0]).float(), observations)

    def for_envs(self, env_ids: range, n_run_envs: int) -> None:
        if self.exploration == "apex":
            self.env_epsilons = apex_epsilons(env_ids, n_run_envs, *self.apex)

    @torch.no_grad()
    def act(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None,
            deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        """What an actor calls: (actions, zeros: an epsilon-greedy policy reports no log-probs, state);
        greedy when deterministic (evaluation, `rollout`)."""
        obs, starts = one_step(observations, episode_start)
        features, state = self.network(obs, state, starts)
        greedy = self.masked(self.q_values(features[0]), observations).argmax(-1)
        zeros = torch.zeros(greedy.shape[0], device=greedy.device)
        if deterministic:
            return greedy, zeros, state
        epsilon = self.epsilon if self.env_epsilons is None or len(self.env_epsilons) != len(greedy) else self.env_epsilons
        explore = torch.rand(greedy.shape, device=greedy.device) < epsilon
        # uniform among the legal actions: the largest of uniform draws, forbidden ones masked out
        random = self.masked(torch.rand(len(greedy), self.n_actions, device=greedy.device), observations).argmax(-1)
        return torch.where(explore, random, greedy), zeros, state


@dataclass
class Dqn(DqnConfig, Algorithm):
    """`algorithm=dqn`: workers fill a replay buffer; the learner samples from it at `replay_ratio`."""

    envs_per_actor = 4  # a quarter of an update per transition: a few envs per actor keep the learner fed
    epoch_length = 16  # iterations of 16 rollouts' worth of updates
    network_defaults = {"activation": "relu"}

    def build(self, parts: Components) -> Run:
        check_single_agent(parts, "dqn")
        check_action_space(parts.action_space)
        kwargs = {"network": parts.network, "dueling": self.dueling, "exploration": self.exploration,
                  "apex_epsilon": self.apex_epsilon, "apex_alpha": self.apex_alpha,
                  "action_mask_key": parts.action_mask_key}
        policy = DqnPolicy(parts.observation_space, parts.action_space, **kwargs)
        check_feed_forward(policy, parts, "dqn")
        learner = Learner(DqnObjective(policy, self), parts.device, **parts.learner)
        blueprint = policy_blueprint(DqnPolicy, parts.observation_space, parts.action_space, kwargs)
        return replay_run(parts, learner, self, blueprint, n_step=self.n_step)


class DqnObjective(Objective):
    """DQN's update: one gradient step of the Huber loss between Q(s, a) and its (double, n-step)
    target; the target network follows every `target_update_interval` updates, and the epsilon
    of linear exploration follows the env steps collected."""

    title = "DQN's loss"
    compiled = ("td_loss",)

    def __init__(self, policy: DqnPolicy, hp: DqnConfig):
        self.policy = policy
        self.hp = hp
        self.target = copy.deepcopy(policy).requires_grad_(False)
        policy.epsilon.fill_(hp.initial_epsilon)
        self._td_errors: torch.Tensor | None = None

    def modules(self) -> dict[str, nn.Module]:
        return {"policy": self.policy, "target": self.target}

    def optimizer_groups(self) -> dict[str, OptimizerGroup]:
        self.online, self.targets = list(self.policy.parameters()), list(self.target.parameters())
        return {"q": OptimizerGroup(self.online, self.hp.lr, "td_loss", max_grad_norm=self.hp.max_grad_norm)}

    def epsilon_at(self, env_steps: int) -> float:
        """Linear exploration's epsilon after `env_steps` env steps."""
        hp = self.hp
        done = min(1.0, env_steps / hp.epsilon_steps)
        return hp.initial_epsilon + done * (hp.final_epsilon - hp.initial_epsilon)

    def steps(self, batch: SampledBatch, context: UpdateContext) -> Iterator[Step]:
        tr = batch.transitions
        horizon = 1 if tr.horizon is None else tr.horizon.float()
        discount = torch.as_tensor(self.hp.gamma, device=tr.rewards.device) ** horizon
        loss, td, q_mean = self.td_loss(tr.observations, tr.actions, tr.rewards, tr.next_observations, tr.terminated,
                                        discount, batch.weights)
        self._td_errors = td
        metrics = {"td_loss": loss.detach(), "q_mean": q_mean}
        if self.policy.exploration == "linear":  # the schedule's float: reading the buffer would wait for a GPU learner
            metrics["epsilon"] = self.epsilon_at(context.env_steps)
        yield Step({"q": loss}, metrics)

    def td_loss(self, observations: Observations, actions: torch.Tensor, rewards: torch.Tensor, next_observations: Observations,
                terminated: torch.Tensor, discount: torch.Tensor, weights: torch.Tensor):
        """The importance-weighted Huber loss of the TD error, with

            y = R + gamma^n (1 - terminated) Q'(s', a*),  a* = argmax_a Q(s', a) (double Q) or argmax_a Q'(s', a)

        where R sums the n rewards between s and s'. Returns the loss, the TD errors (detached) and the mean Q(s, a)."""
        with torch.no_grad():
            q_next = self.target.q(next_observations)
            chooser = self.policy.q(next_observations) if self.hp.double_q else q_next
            v_next = q_next.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
            target = rewards + discount * (~terminated).float() * v_next
        q = self.policy.q(observations).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        return loss, (q - target).detach(), q.detach().mean()

    def after_update(self, context: UpdateContext) -> None:
        if context.updates % self.hp.target_update_interval == 0:
            with torch.no_grad():
                torch._foreach_lerp_(self.targets, self.online, self.hp.tau)
        self.policy.epsilon.fill_(self.epsilon_at(context.env_steps))

    def priorities(self) -> torch.Tensor | None:
        return self._td_errors
