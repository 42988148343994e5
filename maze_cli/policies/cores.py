"""Cores: what a policy network does between its encoders and its heads (`policy.core`).

`identity` passes the features on; `lstm` and `gru` give the policy memory. A recurrent core is
unrolled over time-major features `[T, B, F]`, its state reset to zeros wherever `episode_start`
is set, so a learner replaying a rollout from the state stored at its start computes exactly what
the actor computed step by step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

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
        if torch.compiler.is_compiling():  # the pieces below depend on the resets' steps: a graph break
            return self._forward_stepwise(x, state, episode_start)
        if episode_start is None or not episode_start[1:].any():
            if episode_start is not None:
                state = _reset(state, episode_start[0], x.dtype)
            return self._unroll(x, state)
        return self._unroll_pieces(x, state, episode_start)

    def _fused(self, inputs: tuple[torch.Tensor, ...], state: State) -> tuple[torch.Tensor, State]:
        """One call of torch's fused LSTM/GRU (the cell's weights, laid out as nn.LSTM's and nn.GRU's) on
        `inputs`: `(x,)` time-major, or a packed sequence's `(data, batch_sizes)`. It runs in the weights'
        precision, as the cell does under autocast: a state carried over many steps in bf16 would drift
        from the one the actors carried."""
        cell = self.cell
        weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        hidden = tuple(s.unsqueeze(0).to(cell.weight_hh.dtype) for s in state)
        options = (True, 1, 0.0, self.training, False) + (() if len(inputs) == 2 else (False,))  # batch_first: unpacked only
        with torch.autocast(inputs[0].device.type, enabled=False):
            inputs = (inputs[0].to(cell.weight_hh.dtype), *inputs[1:])
            if self.kind == "lstm":
                out, h, c = torch.lstm(*inputs, hidden, weights, *options)
                return out, (h[0], c[0])
            out, h = torch.gru(*inputs, hidden[0], weights, *options)
            return out, (h[0],)

    def _unroll(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """The cell over `[T, B, F]` with no reset inside, in one fused call: a learner's unroll costs one
        call rather than one per step, forward and backward."""
        return self._fused((x,), state)

    def _unroll_pieces(self, x: torch.Tensor, state: State, episode_start: torch.Tensor) -> tuple[torch.Tensor, State]:
        """`[T, B, F]` with episode starts inside: each env's column cut at its own episode starts, and
        all the pieces unrolled side by side as one packed sequence in one fused call. Short episodes
        cost as many sequential steps as the longest piece, not T (cutting the whole time axis wherever
        any env's episode started left spans of a few steps, one call each)."""
        pieces = _Pieces(episode_start)
        padded = x[pieces.padded_steps(), pieces.column.unsqueeze(0)]  # [L, n, F]
        keep = (~episode_start[pieces.start, pieces.column]).unsqueeze(-1)
        packed = pack_padded_sequence(padded, pieces.length.cpu(), enforce_sorted=False)
        first = tuple((s[pieces.column] * keep.to(s.dtype))[packed.sorted_indices] for s in state)
        out, final = self._fused((packed.data, packed.batch_sizes), first)
        out, _ = pad_packed_sequence(packed._replace(data=out), total_length=padded.shape[0])  # [L, n, H]
        last = pieces.last_of_each_column()
        return pieces.gather(out), tuple(f[packed.unsorted_indices][last] for f in final)

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


class _Pieces:
    """A `[T, B]` time axis cut at episode starts, column by column: piece k is column `column[k]` from
    step `start[k]` for `length[k]` steps; each column's step 0 starts a piece."""

    def __init__(self, episode_start: torch.Tensor):
        starts = episode_start.clone()
        starts[0] = True
        self.n_steps, self.n_columns = starts.shape
        self.column, self.start = torch.nonzero(starts.T, as_tuple=True)  # ordered by column, then step
        following = torch.full_like(self.start, self.n_steps)
        same_column = self.column[1:] == self.column[:-1]
        following[:-1] = torch.where(same_column, self.start[1:], following[:-1])
        self.length = following - self.start
        # the piece of each step `[T, B]`, to put the outputs back in place
        self.of_step = (torch.cumsum(starts.T.reshape(-1).long(), 0) - 1).view(self.n_columns, self.n_steps).T

    def padded_steps(self) -> torch.Tensor:
        """`[L, n]`: the time index of each piece's j-th step (past its end, its last step: padding)."""
        offsets = torch.arange(int(self.length.max()), device=self.start.device).unsqueeze(1)
        return (self.start.unsqueeze(0) + offsets).clamp(max=self.n_steps - 1)

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """`[L, n, ...]`, piece by piece, back to `[T, B, ...]`."""
        steps = torch.arange(self.n_steps, device=self.start.device).unsqueeze(1)
        return padded[steps - self.start[self.of_step], self.of_step]

    def last_of_each_column(self) -> torch.Tensor:
        return torch.cumsum(torch.bincount(self.column, minlength=self.n_columns), 0) - 1


def make_core(kind: str, in_dim: int, size: int | None) -> nn.Module:
    """`policy.core` with `policy.core_size` units (default 128)."""
    if kind == "identity":
        return IdentityCore(in_dim)
    return RecurrentCore(in_dim, size or 128, kind)
