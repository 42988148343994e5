"""Cores: what a policy network does between its encoders and its heads (`policy.core`).

`identity` passes the features on; `lstm` and `gru` give the policy memory. A recurrent core is
unrolled over time-major features `[T, B, F]`, its state reset to zeros wherever `episode_start`
is set, so a learner replaying a rollout from the state stored at its start computes exactly what
the actor computed step by step.
"""

from __future__ import annotations

import torch
from torch import nn

from maze_cli.errors import ConfigError
from maze_cli.policies.base import State

CORES = ("identity", "lstm", "gru")


class IdentityCore(nn.Module):
    """No memory: features of any leading dims pass through."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.out_dim = in_dim

    def initial_state(self, batch_size: int) -> State:
        return ()

    def forward(self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        return x, state

    def step(self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        return x, state


class RecurrentCore(nn.Module):
    """An LSTM or GRU cell stepped over `[T, B, F]`; state `(h, c)` or `(h,)`, each `[B, size]`."""

    def __init__(self, in_dim: int, size: int, kind: str):
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ConfigError(f"core '{kind}': use one of {', '.join(CORES)}")
        self.kind = kind
        self.cell = nn.LSTMCell(in_dim, size) if kind == "lstm" else nn.GRUCell(in_dim, size)
        self.out_dim = self.size = size

    def initial_state(self, batch_size: int) -> State:
        zeros = torch.zeros(batch_size, self.size, device=self.cell.weight_hh.device)
        return (zeros, zeros.clone()) if self.kind == "lstm" else (zeros,)

    def forward(self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        if x.dim() != 3:
            raise ConfigError(f"a recurrent core takes time-major features [T, B, F], got shape {tuple(x.shape)}")
        if not state:
            state = self.initial_state(x.shape[1])
        outputs = []
        for t in range(x.shape[0]):
            if episode_start is not None:
                keep = (~episode_start[t]).to(x.dtype).unsqueeze(-1)
                state = tuple(s * keep for s in state)
            if self.kind == "lstm":
                h, c = self.cell(x[t], state)
                state = (h, c)
            else:
                h = self.cell(x[t], state[0])
                state = (h,)
            outputs.append(h)
        return torch.stack(outputs), state

    def step(self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """One step of features `[B, F]` (acting): `forward` for a rollout of length 1, without its loop."""
        if not state:
            state = self.initial_state(x.shape[0])
        if episode_start is not None:  # as in forward (a multiply: cheaper than masked_fill on CPU)
            keep = (~episode_start).to(x.dtype).unsqueeze(-1)
            state = tuple(s * keep for s in state)
        if self.kind == "lstm":
            h, c = self.cell.forward(x, state)
            return h, (h, c)
        h = self.cell.forward(x, state[0])
        return h, (h,)


def make_core(kind: str, in_dim: int, size: int | None) -> nn.Module:
    """`policy.core` with `policy.core_size` units (default 128)."""
    if kind == "identity":
        return IdentityCore(in_dim)
    return RecurrentCore(in_dim, size or 128, kind)
