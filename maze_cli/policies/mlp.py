"""The MLP policy network (`policy=mlp`): every observation key flattened, concatenated, hidden layers."""

from __future__ import annotations

import math
from typing import Any, Sequence

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.envs.spaces import _flatten_spaces, observation_specs
from maze_cli.policies.base import FeedForwardNetwork, Observations


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


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def linear(n_in: int, n_out: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights of `gain` and zero bias (as in the PPO and IMPALA
    reference implementations: a small gain on a policy head starts the policy near uniform)."""
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


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

    def forward(self, observations: Observations) -> torch.Tensor:
        parts = []
        for key, spec in self.specs.items():
            x = observations[key]
            lead = x.shape[: x.dim() - len(spec.shape)]
            if key in self.n_categories:
                parts.append(F.one_hot(x.long(), self.n_categories[key]).float())
            else:
                parts.append(x.reshape(*lead, -1).float())
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class MlpNetwork(FeedForwardNetwork):
    """Encoded observations through `hidden_sizes` layers, each followed by `activation`.

    :param observation_space: the env's observation space (any supported kind, Dict included).
    :param hidden_sizes: widths of the hidden layers; empty: the encoded observations themselves.
    :param activation: tanh, relu or elu.
    """

    def __init__(self, observation_space: gym.Space, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation '{activation}': use one of {', '.join(ACTIVATIONS)}")
        self.encoder = ObservationEncoder(observation_space)
        layers: list[nn.Module] = []
        n_in = self.encoder.out_dim
        for width in hidden_sizes:
            layers += [linear(n_in, int(width), math.sqrt(2)), ACTIVATIONS[activation]()]
            n_in = int(width)
        self.torso = nn.Sequential(*layers)
        self.out_dim = n_in

    def features(self, observations: Observations) -> torch.Tensor:
        return self.torso(self.encoder(observations))


def mlp_network(hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh") -> dict[str, Any]:
    """The config of an MLP network, as `policy=mlp` gives it (for building policies in code)."""
    return {"_target_": f"{MlpNetwork.__module__}.{MlpNetwork.__qualname__}", "hidden_sizes": list(hidden_sizes), "activation": activation}
