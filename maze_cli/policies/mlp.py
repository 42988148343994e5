"""The MLP policy network (`policy=mlp`): every observation key flattened, concatenated, hidden layers."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.errors import ConfigError
from maze_cli.envs.spaces import _flatten_spaces, observation_specs
from maze_cli.policies.base import Observations, PolicyNetwork, State
from maze_cli.policies.cores import make_core


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

    torch's CPU tanh kernel is several times slower than its sigmoid, which made tanh a large share
    of IMPALA's forward pass (docs/benchmarks.md). Small batches (acting) keep the native kernel:
    there the autograd.Function's fixed cost would outweigh the saving. The two agree to float32
    rounding (about 1e-7).
    """

    SIGMOID_FROM = 65536  # elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda or x.numel() < self.SIGMOID_FROM:
            return torch.tanh(x)
        return _SigmoidTanh.apply(x)


ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def orthogonal_init(layer: nn.Linear | nn.Conv2d, gain: float) -> nn.Linear | nn.Conv2d:
    """`layer` with orthogonal weights of `gain` and a zero bias, as the PPO and IMPALA reference
    implementations start their layers."""
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


def linear(n_in: int, n_out: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights of `gain` and zero bias (a small gain on a policy head
    starts the policy near uniform)."""
    return orthogonal_init(nn.Linear(n_in, n_out), gain)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """Observations as floats for a network: uint8 (pixels) scaled to [0, 1], the rest as they are."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


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
        # Per key: (key, its categories (0 for a Box), the dims of one observation), read every step.
        self._keys = [(key, self.n_categories.get(key, 0), len(spec.shape)) for key, spec in self.specs.items()]

    def forward(self, observations: Observations) -> torch.Tensor:
        parts = []
        for key, n_categories, n_dims in self._keys:
            x = observations[key]
            if n_categories:
                parts.append(F.one_hot(x.long(), n_categories).float())
            elif n_dims == 1:
                parts.append(as_float(x))
            elif n_dims == 0:
                parts.append(as_float(x).unsqueeze(-1))
            else:
                parts.append(as_float(x).flatten(-n_dims))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class MlpNetwork(PolicyNetwork):
    """Encoded observations through `hidden_sizes` layers (each followed by `activation`), then the core.

    :param observation_space: the env's observation space (any supported kind, Dict included).
    :param hidden_sizes: widths of the hidden layers; empty: the encoded observations themselves.
    :param activation: tanh, relu or elu.
    :param core: identity (no memory), lstm or gru.
    :param core_size: units of a recurrent core (default 128).
    """

    def __init__(self, observation_space: gym.Space, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
                 core: str = "identity", core_size: int | None = None):
        super().__init__()
        self.encoder = self.make_encoder(observation_space, activation)
        self.torso, n_in = hidden_layers(self.encoder.out_dim, hidden_sizes, activation)
        self.core = make_core(core, n_in, core_size)
        self.out_dim = self.core.out_dim
        self._layers = layer_plan(self.torso)

    def make_encoder(self, observation_space: gym.Space, activation: str) -> nn.Module:
        """Observations -> one flat feature vector (subclasses encode images with convolutions)."""
        return ObservationEncoder(observation_space)

    def initial_state(self, batch_size: int) -> State:
        return self.core.initial_state(batch_size)

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        x = self.encoder(observations)
        for params, module, _ in self._layers:
            x = F.linear(x, params["weight"], params["bias"]) if params is not None else module.forward(x)
        return self.core(x, state, episode_start)

    def step(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        """`forward` for one step `[B, ...]`, without autograd: activations in place, the core stepped once."""
        x = self.encoder.forward(observations)
        for params, module, inplace in self._layers:
            if params is not None:
                x = F.linear(x, params["weight"], params["bias"])
            else:
                x = inplace(x) if inplace is not None else module.forward(x)
        return self.core.step(x, state, episode_start)


def hidden_layers(n_in: int, hidden_sizes: Sequence[int], activation: str) -> tuple[nn.Sequential, int]:
    """Linear layers of `hidden_sizes`, each followed by `activation`; returns them and the output width."""
    if activation not in ACTIVATIONS:
        raise ConfigError(f"activation '{activation}': use one of {', '.join(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [linear(n_in, int(width), math.sqrt(2)), ACTIVATIONS[activation]()]
        n_in = int(width)
    return nn.Sequential(*layers), n_in


_INPLACE = {Tanh: torch.tanh_, nn.ReLU: torch.relu_}  # activations that acting may apply in place


def layer_plan(torso: nn.Sequential) -> list[tuple[dict | None, nn.Module, Callable | None]]:
    """The torso as plain steps, run without a module call per layer (each costs more than a small
    layer's math): (a linear layer's parameters, the layer, an in-place form of an activation that
    follows a linear layer, for acting). The parameters are the layer's own dict of them, so the steps
    see whatever the layer holds now: weights loaded in place or assigned anew alike."""
    plan: list[tuple[dict | None, nn.Module, Callable | None]] = []
    for module in torso:
        after_linear = bool(plan) and plan[-1][0] is not None
        if type(module) is nn.Linear:
            plan.append((module._parameters, module, None))
        else:
            plan.append((None, module, _INPLACE.get(type(module)) if after_linear else None))
    return plan


def mlp_network(hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh") -> dict[str, Any]:
    """The config of an MLP network, as `policy=mlp` gives it (for building policies in code)."""
    return {"_target_": f"{MlpNetwork.__module__}.{MlpNetwork.__qualname__}", "hidden_sizes": list(hidden_sizes), "activation": activation}
