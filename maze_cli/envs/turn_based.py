"""Turn-based games (PettingZoo AEC envs such as connect_four_v3, tictactoe_v3) trained by self-play.

A turn-based AEC env (one whose metadata does not declare it parallelizable) becomes a parallel env in
which every agent acts at every step (`TurnBasedParallel`): the agent whose turn it is makes its move;
every other agent must *pass*, an extra last action that its action mask makes the only legal one (so
it is taken with probability one and no policy gradient flows through it). Each seat is then a row of
the actors' batch like any agent, one policy plays every seat against itself, and the rewards a move
earns reach every seat at the step they are given: a loser's row gets its -1 on the step the winner
moves, from which its value flows back to the moves that led there.

Evaluation plays the policy against fixed opponents instead of itself (`play_against`): `random`
(uniform among legal moves) and `lookahead` (a one-step lookahead: a winning move if there is one, else a
move after which the opponent has no winning reply, else any legal move), half the games in each seat;
it reports win, draw and loss rates per opponent.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from maze_cli.envs.action_mask import MASK_KEY
from maze_cli.errors import EnvConfigError

OPPONENTS = ("random", "lookahead")


def is_turn_based(env: Any) -> bool:
    """An AEC env that PettingZoo does not declare safe to step as a parallel env: its agents take turns."""
    from pettingzoo import AECEnv

    return isinstance(env, AECEnv) and not env.metadata.get("is_parallelizable", False)


def legal_moves(env: Any, agent: str) -> np.ndarray:
    """The moves `agent` may make now: its observation's action mask where it has one, else every action."""
    observation = env.observe(agent)
    if isinstance(observation, dict) and MASK_KEY in observation:
        return np.flatnonzero(np.asarray(observation[MASK_KEY]))
    return np.arange(env.action_space(agent).n)


class TurnBasedParallel:
    """A turn-based AEC env as a parallel env of `maze_cli.envs.turn_based`'s layout: actions Discrete(n + 1),
    the last one *pass*; observations the env's own keys plus `action_mask` (n + 1 entries)."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.agents: list[str] = []
        first = self.possible_agents[0]
        space = env.action_space(first)
        if not isinstance(space, gym.spaces.Discrete) or any(env.action_space(a) != space for a in self.possible_agents):
            raise EnvConfigError(f"a turn-based env's agents must share one Discrete action space to be trained by self-play; "
                                 f"{first}'s is {space}")
        self.n_moves = int(space.n)
        self._action_space = gym.spaces.Discrete(self.n_moves + 1)
        own = env.observation_space(first)
        keys = {k: s for k, s in own.spaces.items() if k != MASK_KEY} if isinstance(own, gym.spaces.Dict) else {"observation": own}
        self._observation_space = gym.spaces.Dict({**keys, MASK_KEY: gym.spaces.Box(0, 1, (self.n_moves + 1,), np.int8)})
        self._pass_only = np.eye(self.n_moves + 1, dtype=np.int8)[-1]
        # games begin after a number of random legal moves drawn from 0..opening_moves (actors' envs under
        # selfplay.opening_moves): positions off self-play's own lines, to learn wins and blocks from
        self.opening_moves = 0
        self._opening_rng = np.random.default_rng(0)

    def observation_space(self, agent: str) -> gym.spaces.Dict:
        return self._observation_space

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return self._action_space

    def observe(self, agent: str) -> dict[str, Any]:
        """`agent`'s observation: the env's own, with a mask that allows its legal moves on its turn, else only *pass*."""
        observation = self.env.observe(agent)
        keys = {k: v for k, v in observation.items() if k != MASK_KEY} if isinstance(observation, dict) else {"observation": observation}
        if agent != self.env.agent_selection:
            return {**keys, MASK_KEY: self._pass_only}
        mask = np.zeros(self.n_moves + 1, dtype=np.int8)
        mask[legal_moves(self.env, agent)] = 1
        return {**keys, MASK_KEY: mask}

    def _skip_finished(self, rewards: dict[str, float]) -> None:
        """AEC envs step a finished agent with None before it leaves; its rewards still count."""
        env = self.env
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            env.step(None)
            for agent, reward in env.rewards.items():
                rewards[agent] = rewards.get(agent, 0.0) + float(reward)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._opening_rng = np.random.default_rng(seed)
        self.env.reset(seed=seed, options=options)
        self._skip_finished({})
        if self.opening_moves:
            self._play_opening()
        self.agents = list(self.env.agents)
        return {a: self.observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def _play_opening(self) -> None:
        """Random legal moves from the start, 0..opening_moves of them; a game they end starts over."""
        rng, env = self._opening_rng, self.env
        for _ in range(int(rng.integers(self.opening_moves + 1))):
            env.step(random_move(env, env.agent_selection, rng))
            if not env.agents or any(env.terminations.values()) or any(env.truncations.values()):
                env.reset(seed=int(rng.integers(2**31)))
                self._skip_finished({})
                return

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        env = self.env
        mover = env.agent_selection
        move = int(actions[mover])
        if move >= self.n_moves:
            raise ValueError(f"agent {mover} passed on its own turn; its action mask forbids that")
        env.step(move)
        rewards = {a: 0.0 for a in self.agents}
        for agent, reward in env.rewards.items():
            rewards[agent] = rewards.get(agent, 0.0) + float(reward)
        self._skip_finished(rewards)
        live = set(env.agents)
        terminated = {a: bool(env.terminations.get(a, a not in live)) for a in self.agents}
        truncated = {a: bool(env.truncations.get(a, False)) and not terminated[a] for a in self.agents}
        ended = not env.agents or all(terminated[a] or truncated[a] for a in self.agents)
        if ended:
            terminated = {a: terminated[a] or not truncated[a] for a in self.agents}
        observations = {a: self.observe(a) for a in self.agents}
        previous, self.agents = self.agents, [] if ended else [a for a in self.agents if not (terminated[a] or truncated[a])]
        return observations, {a: rewards[a] for a in previous}, terminated, truncated, {a: {} for a in previous}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def random_move(env: Any, agent: str, rng: np.random.Generator) -> int:
    """Uniform among `agent`'s legal moves."""
    return int(rng.choice(legal_moves(env, agent)))


def _copy_game(env: Any) -> Any:
    """A copy of the game's state to try moves on: its unwrapped env's attributes copied (PettingZoo's envs
    pickle as their constructor's arguments, so `copy.deepcopy` would give a new game, not this one)."""
    raw = env.unwrapped
    clone = object.__new__(type(raw))
    clone.__dict__.update(copy.deepcopy(raw.__dict__))
    return clone


def _wins_after(env: Any, agent: str, move: int) -> bool:
    """Whether `move` ends the game with a positive reward for `agent` (on a copy of the env)."""
    trial = _copy_game(env)
    trial.step(move)
    return trial.rewards.get(agent, 0) > 0 and (trial.terminations.get(agent, False) or not trial.agents)


def lookahead_move(env: Any, agent: str, rng: np.random.Generator) -> int:
    """One-step lookahead: a move that wins now; else one after which the opponent cannot win with its
    next move; else any legal move (each choice uniform among its candidates)."""
    moves = legal_moves(env, agent)
    winning = [m for m in moves if _wins_after(env, agent, int(m))]
    if winning:
        return int(rng.choice(winning))
    safe = []
    for move in moves:
        trial = _copy_game(env)
        trial.step(int(move))
        if not trial.agents or trial.terminations.get(trial.agent_selection, False):
            safe.append(move)
            continue
        opponent = trial.agent_selection
        if not any(_wins_after(trial, opponent, int(reply)) for reply in legal_moves(trial, opponent)):
            safe.append(move)
    return int(rng.choice(safe if safe else moves))


OPPONENT_MOVES: dict[str, Callable[[Any, str, np.random.Generator], int]] = {"random": random_move, "lookahead": lookahead_move}


def turns_of(env: Any) -> TurnBasedParallel:
    """The `TurnBasedParallel` inside a parallel env's wrappers (agent_id, policy groups)."""
    while not isinstance(env, TurnBasedParallel):
        env = env.env
    return env


def play_against(make_env: Callable[[], Any], policy: torch.nn.Module, opponent: str, seeds: list[int], device: str | torch.device = "cpu",
                 deterministic: bool = True) -> dict[str, float]:
    """One game per seed between `policy` and a fixed opponent, the policy in seat `i % n_seats` of game `i`.
    `make_env` builds the game as the policy sees it (the run's parallel env, its wrappers included); the
    opponent moves on the game itself. Returns the policy's win, draw and loss rates and mean return (its
    reward summed over the game)."""
    from maze_cli.envs.spaces import ObservationWriter, observation_specs

    move_of = OPPONENT_MOVES[opponent]
    outcomes, returns = [], []
    for i, seed in enumerate(seeds):
        parallel = make_env()
        turns = turns_of(parallel)
        game, agents = turns.env, list(parallel.possible_agents)
        space = parallel.observation_space(agents[0])
        writer, specs = ObservationWriter(space), observation_specs(space)
        rng = np.random.default_rng(seed)
        seat = agents[i % len(agents)]
        observations, _ = parallel.reset(seed=seed)
        total, state, start = 0.0, tuple(s.to(device) for s in policy.initial_state(1)), True
        while parallel.agents:
            mover = game.agent_selection
            if mover == seat:
                obs = {k: torch.zeros((1,) + s.shape, dtype=s.dtype) for k, s in specs.items()}
                writer.write([observations[seat]], obs)
                starts = torch.full((1,), start, dtype=torch.bool, device=device)
                with torch.no_grad():
                    action, _, state = policy.act({k: v.to(device) for k, v in obs.items()}, state, starts, deterministic=deterministic)
                start, move = False, int(action[0])
            else:
                move = move_of(game, mover, rng)
            actions = {a: (move if a == mover else turns.n_moves) for a in parallel.agents}
            observations, rewards, _, _, _ = parallel.step(actions)
            total += float(rewards.get(seat, 0.0))
        parallel.close()
        returns.append(total)
        outcomes.append(np.sign(total))
    outcomes = np.asarray(outcomes)
    return {"win_rate": float(np.mean(outcomes > 0)), "draw_rate": float(np.mean(outcomes == 0)),
            "loss_rate": float(np.mean(outcomes < 0)), "return": float(np.mean(returns))}
