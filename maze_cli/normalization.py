"""Observation normalization and reward scaling for the on-policy algorithms.

Observation statistics live in the policy (`ObservationNormalizer`, buffers of the module): they
travel to the actors with every weight broadcast, are saved in checkpoints and used by `rollout`
and evaluation, which never change them. Only the learner updates them, from the batches it trains
on, i.e. from every actor's data pooled; merging per-chunk moments (Chan et al. 1979) gives exactly
the moments of the pooled data, in any order and chunking.

Reward scaling divides rewards by the running standard deviation of the discounted return, as
Engstrom et al. (2020) describe PPO's implementation: the learner follows each env's return across
rollouts by the rollouts' `env_id`, so it needs no state in the actors.
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.envs.spaces import _flatten_spaces, is_image
from maze_cli.records import Rollout

_EPS = 1e-8
# (mean, var, count) of this learner's samples -> those of every learner's (LearnerGroup.pooled_moments)
Pool = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor, float]]


class RunningMeanStd(nn.Module):
    """Mean and variance of everything seen so far, per element of `shape` (buffers: mean, var, count)."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, pool: Pool | None = None) -> None:
        """Add samples `x` `[N, *shape]`; with `pool` (several learners), every learner's samples of
        this call, so that all learners keep the same statistics."""
        # floats in float64 (the pooled moments exact); pixels in float32: a batch of frames is tens of
        # millions of bytes, and their moments need no more
        x = x.detach().to(torch.float64 if x.is_floating_point() else torch.float32).reshape(-1, *self.mean.shape)
        if pool is None:
            if x.shape[0]:
                self.merge(x.mean(0), x.var(0, unbiased=False), float(x.shape[0]))
            return
        zeros = torch.zeros_like(self.mean)
        mean, var, count = pool(x.mean(0) if x.shape[0] else zeros, x.var(0, unbiased=False) if x.shape[0] else zeros,
                                float(x.shape[0]))
        if count:
            self.merge(mean, var, count)

    @torch.no_grad()
    def merge(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        """Combine with the moments of `count` other samples (population variance)."""
        total = self.count + count
        delta = mean.to(self.mean) - self.mean
        m2 = self.var * self.count + var.to(self.var) * count + delta.pow(2) * self.count * count / total
        self.mean += delta * count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor, clip: float) -> torch.Tensor:
        """(x - mean) / std, clipped to [-clip, clip], in x's dtype (float32 for pixels)."""
        x = x if x.is_floating_point() else x.float()
        mean, std = self.mean.to(x.dtype), (self.var + _EPS).sqrt().to(x.dtype)
        return ((x - mean) / std).clamp(-clip, clip)

    def normalize_step(self, x: torch.Tensor, clip: float) -> torch.Tensor:
        """`normalize` for acting, which normalizes every step while the statistics change once per
        weight update: their conversion to x's dtype is kept until `mean` or `var` is replaced or
        written in place (merged, loaded), as their version counters tell. Not for the learner's
        forward (a compiled graph would not see the check)."""
        x = x if x.is_floating_point() else x.float()
        mean, var = self.mean, self.var
        try:
            versions = (mean._version, var._version)
        except RuntimeError:  # inference tensors (a module built under inference_mode) count no versions
            return self.normalize(x, clip)
        cached = self.__dict__.get("_step_moments")
        if cached is None or cached[0] is not mean or cached[1] is not var or cached[2] != versions or cached[3] != x.dtype:
            with torch.inference_mode(False):  # ordinary tensors, whatever mode the actor runs in
                cached = (mean, var, versions, x.dtype, mean.to(x.dtype), (var + _EPS).sqrt().to(x.dtype))
            self.__dict__["_step_moments"] = cached
        return ((x - cached[4]) / cached[5]).clamp_(-clip, clip)


def normalized_keys(space: gym.Space, vectors: bool = True, images: bool = False) -> list[str]:
    """The observation keys to normalize: with `vectors`, float Boxes of rank 0-2; with `images`, the integer
    or bool images the CNN policy convolves (`is_image`), each pixel by its own statistics, as Sample
    Factory's `normalize_input` does. Images left out keep their own scaling (bytes to [0, 1] in the network)."""
    def chosen(sub: gym.Space) -> bool:
        if not isinstance(sub, gym.spaces.Box):
            return False
        return (vectors and sub.dtype.kind == "f" and len(sub.shape) <= 2) or (images and sub.dtype.kind in "uib" and is_image(sub))

    return [key for key, sub in _flatten_spaces(space).items() if chosen(sub)]


class ObservationNormalizer(nn.Module):
    """Normalizes the vector keys of an observation dict, its pixels or both, by running statistics
    (clipped at `clip`)."""

    def __init__(self, observation_space: gym.Space, clip: float = 10.0, vectors: bool = True, images: bool = False):
        super().__init__()
        self.keys = normalized_keys(observation_space, vectors, images)
        spaces = _flatten_spaces(observation_space)
        self.stats = nn.ModuleList(RunningMeanStd(tuple(spaces[k].shape)) for k in self.keys)
        self.clip = clip

    def forward(self, observations: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(observations)
        for key, stats in zip(self.keys, self.stats):
            out[key] = stats.normalize(observations[key], self.clip)
        return out

    def step(self, observations: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`forward` for acting (see `RunningMeanStd.normalize_step`): the same values, fewer ops."""
        out = dict(observations)
        for key, stats in zip(self.keys, self.stats):
            out[key] = stats.normalize_step(observations[key], self.clip)
        return out

    @torch.no_grad()
    def update(self, observations: dict[str, torch.Tensor], pool: Pool | None = None) -> None:
        """Add a batch of observations (any leading dims); `pool`: see RunningMeanStd.update."""
        for key, stats in zip(self.keys, self.stats):
            stats.update(observations[key], pool)

    def update_from(self, batch: Rollout, pool: Pool | None = None) -> None:
        """Add a batch's observations, each once: the last row (the one to bootstrap from) is the
        first of the actor's next rollout."""
        self.update({key: value[: batch.n_steps] for key, value in batch.observations.items()}, pool)


class RewardScaler:
    """Scales rewards by 1 / std of the discounted return R_t = gamma R_{t-1} + r_t (reset at episode
    ends), followed per env across rollouts; the scaled reward is clipped at `clip`."""

    def __init__(self, gamma: float, clip: float = 10.0):
        self.gamma = gamma
        self.clip = clip
        self.stats = RunningMeanStd()
        self.returns = torch.zeros(0, dtype=torch.float64)  # by env id

    @torch.no_grad()
    def __call__(self, batch: Rollout, pool: Pool | None = None) -> torch.Tensor:
        """The batch's rewards, scaled; updates the statistics with the batch's returns first (with
        `pool`, every learner's returns: see RunningMeanStd.update)."""
        ids = batch.env_id.cpu()
        if int(ids.max()) >= self.returns.numel():
            grown = torch.zeros(int(ids.max()) + 1, dtype=torch.float64)
            grown[: self.returns.numel()] = self.returns
            self.returns = grown
        # The recurrence in numpy, whose small-array ops cost a fraction of torch's (the learner runs
        # it every update); the same float64 math, so the same numbers.
        rewards, dones = batch.rewards.to(torch.float64).cpu().numpy(), batch.dones.cpu().numpy()
        ret, returns = self.returns[ids].numpy(), np.empty_like(rewards)
        for t in range(rewards.shape[0]):
            ret = ret * self.gamma + rewards[t]
            returns[t] = ret
            ret = np.where(dones[t], 0.0, ret)
        self.returns[ids] = torch.from_numpy(ret)
        self.stats.update(torch.from_numpy(returns[~batch.autoreset.cpu().numpy()]), pool)  # autoreset steps are no transitions
        scale = float((self.stats.var + _EPS).sqrt())
        return (batch.rewards / scale).clamp(-self.clip, self.clip)

    def state_dict(self) -> dict:
        return {"stats": self.stats.state_dict(), "returns": self.returns.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.stats.load_state_dict(state["stats"])
        self.returns = state["returns"].clone()
