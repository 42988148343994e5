"""Action distributions over flat parameter vectors, written out by hand.

torch.distributions validates and builds objects per call; an actor samples thousands of times a
second, so each distribution here is a few tensor ops on the head's output.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from maze_cli.errors import UnsupportedSpaceError

_LOG_2PI = math.log(2 * math.pi)


class ActionDistribution:
    """Interface: `n_params` outputs of the policy head parametrise the distribution."""

    n_params: int

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A sample and its log-prob, as actors need them every step (distributions share the work)."""
        actions = self.sample(params)
        return actions, self.log_prob(params, actions)


class Categorical(ActionDistribution):
    """One discrete choice; params are logits."""

    def __init__(self, n: int):
        self.n_params = n

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return self.sample_with_log_prob(params)[0]

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Gumbel-max on the log-softmax the log-prob needs anyway: argmax(log p - log E) with E ~ Exp(1)
        # (-log E is a standard Gumbel), one random draw per logit. The log-prob is the log-softmax
        # entry of the chosen action, exactly what `log_prob` returns for it.
        logp = F.log_softmax(params, dim=-1)
        actions = (logp - torch.empty_like(logp).exponential_().log_()).argmax(dim=-1, keepdim=True)
        return actions.squeeze(-1), logp.gather(-1, actions).squeeze(-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(dim=-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(params, dim=-1)
        return logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(params, dim=-1)
        return -(logp.exp() * logp).sum(-1)


class MultiCategorical(ActionDistribution):
    """Independent discrete choices (MultiDiscrete); log-probs and entropies add up."""

    def __init__(self, nvec: list[int]):
        self.parts = [Categorical(int(n)) for n in nvec]
        self.sizes = [int(n) for n in nvec]
        self.n_params = sum(self.sizes)

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return params.split(self.sizes, dim=-1)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return self.sample_with_log_prob(params)[0]

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actions, logps = zip(*(d.sample_with_log_prob(p) for d, p in zip(self.parts, self._split(params))))
        return torch.stack(actions, dim=-1), sum(logps)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([d.mode(p) for d, p in zip(self.parts, self._split(params))], dim=-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return sum(d.log_prob(p, actions[..., i]) for i, (d, p) in enumerate(zip(self.parts, self._split(params))))

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return sum(d.entropy(p) for d, p in zip(self.parts, self._split(params)))


# The log std's upper clamp in units of [-1, 1]: a guard against a std that runs away.
LOG_STD_MAX = 2.0


class DiagGaussian(ActionDistribution):
    """Box actions; params are the mean and log std, concatenated. Clipping to bounds happens in the env adapter.

    :param log_std_max: the log std's upper clamp: `LOG_STD_MAX`, raised by the log of the widest half
        range where the policy scales to a Box's bounds."""

    def __init__(self, dim: int, log_std_max: float = LOG_STD_MAX):
        self.dim = dim
        self.n_params = 2 * dim
        self.log_std_max = log_std_max

    def mean_and_log_std(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The params' mean and their log std within its clamp, what sampling and an exported model use."""
        mean, log_std = params.split(self.dim, dim=-1)
        return mean, log_std.clamp(-20.0, self.log_std_max)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return self.sample_with_log_prob(params)[0]

    def sample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # a = mean + std * z with z ~ N(0, 1): the log-prob's standardized action is z itself
        # (`log_prob` recomputes it as (a - mean) / std, equal up to float rounding).
        mean, log_std = self.mean_and_log_std(params)
        z = torch.randn_like(mean)
        actions = torch.addcmul(mean, log_std.exp(), z)
        logp = z.square().mul_(-0.5).sub_(log_std).sum(-1).sub_(0.5 * _LOG_2PI * self.dim)
        return actions, logp

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return self.mean_and_log_std(params)[0]

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.mean_and_log_std(params)
        z = (actions - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        _, log_std = self.mean_and_log_std(params)
        return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)


def make_distribution(space: gym.Space, box_range: tuple[torch.Tensor, torch.Tensor] | None = None) -> ActionDistribution:
    """The distribution for an action space (Discrete, MultiDiscrete, Box); `box_range` is a Box's
    `action_range`, where the caller has it already."""
    if isinstance(space, gym.spaces.Discrete):
        return Categorical(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical(list(space.nvec.flatten()))
    if isinstance(space, gym.spaces.Box):
        scale, _ = box_range or action_range(space)
        widest = float(scale.log().max()) if scale.numel() else 0.0
        return DiagGaussian(scale.numel(), LOG_STD_MAX + max(0.0, widest))
    raise UnsupportedSpaceError(f"action space {space!r} is not supported; use Discrete, MultiDiscrete or Box")


def action_range(space: gym.spaces.Box) -> tuple[torch.Tensor, torch.Tensor]:
    """The half range and the middle of a Box's bounds, flattened: the affine map from [-1, 1] to the
    env's range. A dim unbounded on either side keeps scale 1 and bias 0."""
    low, high = space.low.flatten().astype(np.float64), space.high.flatten().astype(np.float64)
    bounded = np.isfinite(low) & np.isfinite(high) & (high > low)
    scale = np.where(bounded, (high - low) / 2, 1.0)
    bias = np.where(bounded, (high + low) / 2, 0.0)
    return torch.as_tensor(scale, dtype=torch.float32), torch.as_tensor(bias, dtype=torch.float32)
