"""The policy contract: what actors, learners, evaluation and `rollout` rely on.

    observations (a dict of tensors, one per key)
       -> PolicyNetwork: an encoder per key, concatenated, then a core (identity, or recurrent)
       -> features
       -> Policy heads: the action distribution (+ a value for actor-critics; SAC adds Q heads)

A `PolicyNetwork` is what a user swaps in through `policy._target_`: it knows nothing of actions or
algorithms. A `Policy` is the algorithm's network plus its heads. Both carry a recurrent `State`
(an empty tuple for feed-forward networks), so actors and learners never ask which kind they hold.

Shapes: acting works on one step of a batch of envs (`[B, ...]`); the learner's forward works on a
whole rollout, time-major (`[T, B, ...]`), unrolled from the state stored at the rollout's start
and reset where `episode_start` is set, exactly as the actors stepped it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from maze_cli.policies.distributions import ActionDistribution, action_range
from maze_cli.envs.action_mask import apply_mask

State = tuple[torch.Tensor, ...]
"""A recurrent state: tensors with the batch first (`[B, ...]`); `()` for feed-forward networks."""

Observations = dict[str, torch.Tensor]


class PolicyNetwork(nn.Module, abc.ABC):
    """Observations in, features of size `out_dim` out; built as `cls(observation_space, **config)`.

    Feed-forward networks implement `features` only (see `FeedForwardNetwork`); recurrent ones
    override `initial_state` and `forward`.
    """

    out_dim: int

    def initial_state(self, batch_size: int) -> State:
        """The state at an episode's start, for `batch_size` envs."""
        return ()

    @abc.abstractmethod
    def forward(self, observations: Observations, state: State, episode_start: torch.Tensor) -> tuple[torch.Tensor, State]:
        """Features `[T, B, out_dim]` of time-major observations `[T, B, ...]`, unrolled from `state`
        (the state before step 0) and reset to `initial_state` wherever `episode_start[t]` is set;
        returns the features and the state after the last step."""

    def step(self, observations: Observations, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """Acting's path: features `[B, out_dim]` of one step of a batch of envs `[B, ...]` (no autograd),
        and the state after it. It must compute what `forward` computes for a rollout of length 1 (the
        default does exactly that); networks override it where a cheaper path exists."""
        obs, starts = one_step(observations, episode_start)
        features, state = self(obs, state, starts)
        return features[0], state


class FeedForwardNetwork(PolicyNetwork):
    """A network without memory: `features` maps any leading dims `[..., obs]` to `[..., out_dim]`."""

    @abc.abstractmethod
    def features(self, observations: Observations) -> torch.Tensor:
        """Features of observations with any leading dimensions."""

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        return self.features(observations), state

    def step(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        return self.features(observations), state


@dataclass
class PolicyOutput:
    """The learner's view of a rollout: distribution params `[T, B, P]`, values `[T, B]` (None for a
    policy without a value head) and the state after the last step."""

    params: torch.Tensor
    values: torch.Tensor | None
    state: State


class Policy(nn.Module, abc.ABC):
    """A network with the heads an algorithm needs; the object actors act with and checkpoints hold.

    :param observation_space, action_space: the env's spaces.
    """

    observation_space: gym.Space
    action_space: gym.Space
    distribution: ActionDistribution
    network: PolicyNetwork
    # the observation key of the action mask (`maze_cli.envs.action_mask`); None: every action is legal
    action_mask_key: str | None = None

    def masked(self, logits: torch.Tensor, observations: Observations) -> torch.Tensor:
        """`logits` (or Q-values) with the actions the observations' mask forbids at the lowest value:
        what every use of the distribution must see (sampling, log-probs, entropy, greedy)."""
        if self.action_mask_key is None:
            return logits
        return apply_mask(logits, observations[self.action_mask_key])

    def initial_state(self, batch_size: int) -> State:
        return self.network.initial_state(batch_size)

    @property
    def is_recurrent(self) -> bool:
        return len(self.initial_state(1)) > 0

    @abc.abstractmethod
    def forward(self, observations: Observations, state: State, episode_start: torch.Tensor) -> PolicyOutput:
        """The learner's forward pass over time-major observations `[T, B, ...]`."""

    def valued_steps(self, observations: Observations, state: State = ()) -> torch.Tensor | None:
        """The steps `[T, B]` whose values `forward(..., value_forced=False)` computes, where a policy can
        skip its value network on forced steps (`ActorCritic`); None: it values every step, and its
        forward takes no `value_forced`."""
        return None

    def act(
        self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step for a batch of envs `[B, ...]`: (actions, their log-probs, the next state), without
        autograd. `deterministic` takes the distribution's mode (evaluation, `rollout`)."""
        if torch.is_grad_enabled():  # actors call it under inference_mode: no context to enter per step
            with torch.no_grad():
                return self.act(observations, state, episode_start, deterministic)
        params, state = self.action_params(observations, state, episode_start)
        dist = self.distribution
        if deterministic:
            actions = dist.mode(params)
            return actions, dist.log_prob(params, actions), state
        actions, logp = dist.sample_with_log_prob(params)
        return actions, logp, state

    def for_envs(self, env_ids: range, n_run_envs: int) -> None:
        """Called on an actor's private copy before it acts: the run-wide ids of the envs it steps
        among the run's `n_run_envs` (every learner's actors together). A policy that acts differently
        per env (Ape-X's epsilon per env) sets itself up here; the default acts alike everywhere."""

    def action_params(self, observations: Observations, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """Distribution params `[B, P]` for one step, and the next state (acting skips value heads)."""
        raise NotImplementedError


def register_action_bounds(module: nn.Module, action_space: gym.spaces.Box) -> None:
    """Buffers `scale` and `bias` of `module` that map [-1, 1] (a tanh-squashed action) to the Box's
    bounds, flattened: `bias + scale * tanh(u)`."""
    scale, bias = action_range(action_space)
    module.register_buffer("scale", scale)
    module.register_buffer("bias", bias)


def one_step(observations: Observations, episode_start: torch.Tensor | None) -> tuple[Observations, torch.Tensor | None]:
    """A batch of one step `[B, ...]` as a rollout of length 1 `[1, B, ...]`."""
    return {k: v.unsqueeze(0) for k, v in observations.items()}, None if episode_start is None else episode_start.unsqueeze(0)
