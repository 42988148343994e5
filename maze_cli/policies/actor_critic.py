"""The actor-critic network: observations (a dict of tensors) in, action-distribution params and a value out."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.envs.spaces import _flatten_spaces, observation_specs
from maze_cli.policies.distributions import DiagGaussian, make_distribution

class _SigmoidTanh(torch.autograd.Function):
    """tanh as 2 sigmoid(2x) - 1; the backward is torch's own tanh backward, from the output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Module):
    """tanh, computed through sigmoid on large CPU batches.

    torch's CPU tanh kernel is several times slower than its sigmoid (on one thread, about 0.8 ms
    against 0.15 ms for a learner batch of 4,224 x 64), which made tanh a third of IMPALA's
    forward pass. Small batches (acting) keep the native kernel: there the autograd.Function's
    fixed cost would outweigh the saving. The two agree to float32 rounding (about 1e-7).
    """

    SIGMOID_FROM = 65536  # elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda or x.numel() < self.SIGMOID_FROM:
            return torch.tanh(x)
        return _SigmoidTanh.apply(x)


_ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def _mlp(sizes: list[int], activation: str, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(n_in, n_out)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class ObservationEncoder(nn.Module):
    """Flattens each observation key (Box as floats, Discrete one-hot) and concatenates them."""

    def __init__(self, observation_space: gym.Space):
        super().__init__()
        self.specs = observation_specs(observation_space)
        self.n_categories = {
            key: int(sub.n) for key, sub in _flatten_spaces(observation_space).items() if isinstance(sub, gym.spaces.Discrete)
        }
        self.out_dim = sum(
            self.n_categories[k] if k in self.n_categories else max(1, math.prod(s.shape)) for k, s in self.specs.items()
        )

    def forward(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for key, spec in self.specs.items():
            x = observations[key]
            lead = x.shape[: x.dim() - len(spec.shape)]
            if key in self.n_categories:
                parts.append(F.one_hot(x.long(), self.n_categories[key]).float())
            else:
                parts.append(x.reshape(*lead, -1).float())
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class ActorCritic(nn.Module):
    """Separate (or shared) MLP torsos for the policy and the value function.

    Orthogonal initialisation with a small policy-head gain starts the policy near uniform,
    which keeps early exploration broad (as in the PPO and IMPALA reference implementations).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        shared_torso: bool = False,
    ):
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.encoder = ObservationEncoder(observation_space)
        self.distribution = make_distribution(action_space)
        self.gaussian = isinstance(self.distribution, DiagGaussian)
        n_head = self.distribution.dim if self.gaussian else self.distribution.n_params
        sizes = [self.encoder.out_dim, *hidden_sizes]
        self.shared_torso = shared_torso
        if shared_torso:
            self.torso = _mlp(sizes, activation, math.sqrt(2))
            self.torso.append(_ACTIVATIONS[activation]())
            self.policy_head = _mlp([sizes[-1], n_head], activation, 0.01)
            self.value_head = _mlp([sizes[-1], 1], activation, 1.0)
        else:
            self.policy_head = _mlp(sizes + [n_head], activation, 0.01)
            self.value_head = _mlp(sizes + [1], activation, 1.0)
        if self.gaussian:
            self.log_std = nn.Parameter(torch.zeros(self.distribution.dim))

    def forward(self, observations: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution params `[..., n_params]` and values `[...]`."""
        x = self._features(observations)
        return self._params(x), self.value_head(x).squeeze(-1)

    def _features(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.encoder(observations)
        return self.torso(x) if self.shared_torso else x

    def _params(self, x: torch.Tensor) -> torch.Tensor:
        params = self.policy_head(x)
        if self.gaussian:
            params = torch.cat([params, self.log_std.expand_as(params)], dim=-1)
        return params

    @torch.no_grad()
    def act(self, observations: dict[str, torch.Tensor], deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions; returns (actions, their log-probs). The value head is skipped: acting
        needs none, and it is half the forward pass."""
        params = self._params(self._features(observations))
        dist = self.distribution
        actions = dist.mode(params) if deterministic else dist.sample(params)
        return actions, dist.log_prob(params, actions)

    @torch.no_grad()
    def value(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        return self(observations)[1]

    def evaluate(
        self, observations: dict[str, torch.Tensor], actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the learner: log-probs of `actions`, entropies, values, and the raw params."""
        params, value = self(observations)
        dist = self.distribution
        return dist.log_prob(params, actions), dist.entropy(params), value, params
