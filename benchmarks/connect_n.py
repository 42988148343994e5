"""Connect-N on a board of any size, a development game for the turn-based family (`+env=board_game`):
PettingZoo's AEC layout of connect_four_v3 (agents player_0 and player_1; observations
`{"observation": int8 [rows, cols, 2] (own pieces, the opponent's), "action_mask": int8 [cols]}`; +1 to
the winner, -1 to the loser, 0 each on a full board), so settings can be chosen on a smaller game than
Connect Four, which stays held out.

    train +env=board_game env._target_=connect_n.env +env.rows=5 +env.cols=6 +env.n=4   (benchmarks/ on PYTHONPATH)
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import AgentSelector, wrappers

DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def env(rows: int = 5, cols: int = 6, n: int = 4, **kwargs) -> AECEnv:
    """The game with PettingZoo's usual wrappers (an illegal move ends the game, -1 to its maker)."""
    game = ConnectN(rows, cols, n, **kwargs)
    game = wrappers.TerminateIllegalWrapper(game, illegal_reward=-1)
    return wrappers.OrderEnforcingWrapper(game)


class ConnectN(AECEnv):
    metadata = {"render_modes": [], "name": "connect_n", "is_parallelizable": False}

    def __init__(self, rows: int = 5, cols: int = 6, n: int = 4, render_mode: str | None = None):
        super().__init__()
        self.rows, self.cols, self.n, self.render_mode = rows, cols, n, render_mode
        self.possible_agents = ["player_0", "player_1"]
        self.agents = self.possible_agents[:]
        self.action_spaces = {a: spaces.Discrete(cols) for a in self.agents}
        self.observation_spaces = {a: spaces.Dict({"observation": spaces.Box(0, 1, (rows, cols, 2), np.int8),
                                                   "action_mask": spaces.Box(0, 1, (cols,), np.int8)}) for a in self.agents}
        self.board = np.zeros((rows, cols), np.int8)

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def observe(self, agent):
        me = self.possible_agents.index(agent) + 1
        planes = np.stack([self.board == me, self.board == 3 - me], axis=2).astype(np.int8)
        mask = (self.board[0] == 0).astype(np.int8) if agent == self.agent_selection else np.zeros(self.cols, np.int8)
        return {"observation": planes, "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.board = np.zeros((self.rows, self.cols), np.int8)
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self._agent_selector = AgentSelector(self.agents)
        self.agent_selection = self._agent_selector.reset()

    def step(self, action):
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            return self._was_dead_step(action)
        column = int(action)
        assert self.board[0, column] == 0, "played illegal move."
        piece = self.agents.index(self.agent_selection) + 1
        row = int(np.flatnonzero(self.board[:, column] == 0)[-1])
        self.board[row, column] = piece
        mover, next_agent = self.agent_selection, self._agent_selector.next()
        self.rewards = dict.fromkeys(self.agents, 0)
        if self._wins(row, column, piece):
            self.rewards[mover], self.rewards[next_agent] = 1, -1
            self.terminations = dict.fromkeys(self.agents, True)
        elif not (self.board[0] == 0).any():
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = next_agent
        self._cumulative_rewards[mover] = 0
        self._accumulate_rewards()

    def _wins(self, row: int, column: int, piece: int) -> bool:
        """Whether the piece just placed at (row, column) completes n in a line."""
        for dr, dc in DIRECTIONS:
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, column + sign * dc
                while 0 <= r < self.rows and 0 <= c < self.cols and self.board[r, c] == piece:
                    count, r, c = count + 1, r + sign * dr, c + sign * dc
            if count >= self.n:
                return True
        return False

    def render(self):
        return None

    def close(self):
        pass
