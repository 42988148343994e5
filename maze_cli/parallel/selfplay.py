"""Self-play against a pool of earlier versions (`selfplay.pool_size`): what an actor of a turn-based game
does besides playing every seat with the current policy (`maze_cli.envs.turn_based`).

Each actor keeps its own pool: every `snapshot_every` policy versions it receives, a copy of the weights
joins the pool (the oldest leaves once it holds `pool_size`). When a game starts, with probability
`pool_share` (once the pool holds a version) one of its seats, drawn at random, is given to the pool: that
seat's moves come from a version drawn from the pool (one per rollout), and its rows are recorded as
autoreset steps, so they never reach the learner. The other seats play and learn as in plain self-play,
now against an earlier self, which keeps the policy from forgetting how to beat the play it has left behind.
The pool travels with no weights of its own: every actor builds it from the versions it is sent.
"""

from __future__ import annotations

import collections
import copy
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn


class OpponentPool:
    """An actor's pool of earlier policy versions and the seats it plays; `n_seats` rows per game, game g's
    seats in rows `g * n_seats ... g * n_seats + n_seats - 1` (`maze_cli.envs.multiagent.MultiAgentBatch`)."""

    def __init__(self, policy: nn.Module, n_rows: int, n_seats: int, pool_size: int, pool_share: float, snapshot_every: int,
                 seed: int, greedy: bool = False):
        self.opponent = copy.deepcopy(policy).requires_grad_(False)
        self.versions: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=pool_size)
        self.n_seats, self.share, self.every, self.greedy = n_seats, pool_share, snapshot_every, greedy
        self.n_games = n_rows // n_seats
        self.rng = np.random.default_rng(seed)
        self.seat_of_pool = np.full(self.n_games, -1)  # per game: the seat the pool plays, -1 for none
        self.rows = np.zeros(n_rows, dtype=bool)
        self.state = self.opponent.initial_state(n_rows)
        self._last_snapshot: int | None = None

    def offer(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """A policy version the actor adopts: it joins the pool every `snapshot_every` versions."""
        if self._last_snapshot is None or version - self._last_snapshot >= self.every:
            self.versions.append({k: v.detach().clone() for k, v in state_dict.items()})
            self._last_snapshot = version

    def next_rollout(self) -> None:
        """The version the pool plays with in this rollout, drawn uniformly from the pool."""
        if self.versions:
            self.opponent.load_state_dict(self.versions[int(self.rng.integers(len(self.versions)))])

    def act(self, observations: dict[str, torch.Tensor], episode_start: torch.Tensor, actions: torch.Tensor) -> np.ndarray:
        """`actions` with the pool's seats' moves put in (in place); returns which rows the pool played."""
        starts = episode_start.numpy()
        for game in np.flatnonzero(starts[:: self.n_seats][: self.n_games]):  # a game starts: does the pool take a seat?
            pooled = self.versions and self.rng.random() < self.share
            self.seat_of_pool[game] = int(self.rng.integers(self.n_seats)) if pooled else -1
        self.rows[:] = False
        for game in np.flatnonzero(self.seat_of_pool >= 0):
            self.rows[game * self.n_seats + self.seat_of_pool[game]] = True
        if self.rows.any():
            theirs, _, self.state = self.opponent.act(observations, self.state, episode_start, deterministic=self.greedy)
            rows = torch.from_numpy(self.rows)
            actions[rows] = theirs[rows].to(actions.dtype)
        return self.rows.copy()


def pool_settings(source: Any) -> dict[str, Any] | None:
    """The `selfplay` settings an env source carries where the pool is on (a turn-based game, pool_size > 0)."""
    settings = getattr(source, "selfplay", None)
    if not settings or not settings.get("pool_size") or not getattr(source, "turn_based", False):
        return None
    return settings
