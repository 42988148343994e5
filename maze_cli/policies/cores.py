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
        if torch.compiler.is_compiling():  # the split below reads the resets' steps: a graph break
            return self._forward_stepwise(x, state, episode_start)
        outputs = []
        for start, end in _spans_between_resets(episode_start, x.shape[0]):
            if episode_start is not None:
                state = _reset(state, episode_start[start], x.dtype)
            out, state = self._unroll(x[start:end], state)
            outputs.append(out)
        return torch.cat(outputs) if len(outputs) > 1 else outputs[0], state

    def _unroll(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """The cell over `[T, B, F]` with no reset inside, in one call of torch's fused LSTM/GRU
        (the cell's weights, laid out as nn.LSTM's and nn.GRU's): a learner's unroll costs one call
        per span between episode starts rather than one per step, forward and backward. It runs in
        the weights' precision, as the cell does under autocast: a state carried over many steps in
        bf16 would drift from the one the actors carried."""
        cell = self.cell
        weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        hidden = tuple(s.unsqueeze(0).to(cell.weight_hh.dtype) for s in state)
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(cell.weight_hh.dtype)
            if self.kind == "lstm":
                out, h, c = torch.lstm(x, hidden, weights, True, 1, 0.0, self.training, False, False)
                return out, (h[0], c[0])
            out, h = torch.gru(x, hidden[0], weights, True, 1, 0.0, self.training, False, False)
            return out, (h[0],)

    def _forward_stepwise(self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """`forward` as one cell call per step: what torch.compile traces (no data-dependent split)."""
        outputs = []
        for t in range(x.shape[0]):
            h, state = self.step(x[t], state, None if episode_start is None else episode_start[t])
            outputs.append(h)
        return torch.stack(outputs), state

    def step(self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """One step of features `[B, F]` (acting): `forward` for a rollout of length 1, without its loop."""
        if not state:
            state = self.initial_state(x.shape[0])
        if episode_start is not None:
            state = _reset(state, episode_start, x.dtype)
        if self.kind == "lstm":
            h, c = self.cell.forward(x, state)
            return h, (h, c)
        h = self.cell.forward(x, state[0])
        return h, (h,)


def _reset(state: State, episode_start: torch.Tensor, dtype: torch.dtype) -> State:
    """The state zeroed where an episode starts (a multiply: cheaper than masked_fill on CPU)."""
    keep = (~episode_start).to(dtype).unsqueeze(-1)
    return tuple(s * keep for s in state)


def _spans_between_resets(episode_start: torch.Tensor | None, n_steps: int) -> list[tuple[int, int]]:
    """`[start, end)` spans of the time axis that no episode start of any env cuts after their first step."""
    if episode_start is None:
        return [(0, n_steps)]
    cuts = (torch.nonzero(episode_start[1:].any(dim=1)).flatten() + 1).tolist()
    bounds = [0, *cuts, n_steps]
    return list(zip(bounds[:-1], bounds[1:]))


def make_core(kind: str, in_dim: int, size: int | None) -> nn.Module:
    """`policy.core` with `policy.core_size` units (default 128)."""
    if kind == "identity":
        return IdentityCore(in_dim)
    return RecurrentCore(in_dim, size or 128, kind)
