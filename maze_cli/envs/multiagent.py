"""Multi-agent envs (PettingZoo): each agent a row of the actors' batch, one policy shared by all (or,
under `env.policy_groups`, one per group: `maze_cli.envs.policy_groups`).

A PettingZoo `ParallelEnv` (or an AEC env, converted with `aec_to_parallel`) with N possible agents
gives an actor N rows of its batch, so the actors, records and learners see what they see for N
single-agent envs. An agent that is done before the others spends the steps until the whole env ends
as *autoreset steps* (`maze_cli.envs.batch`): no transition, masked out of every learner's loss, so no
step of a finished agent is ever trained on. The env resets when all its agents are done.

Per env episode the team's statistics travel as env statistics (`maze_cli.envs.info_stats`):
`env/team_return` (the sum of the agents' returns), `env/agent/<name>/return` and, with policy groups,
`env/group/<name>/return` (the mean of the group's agents' returns).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
import torch

from maze_cli.envs.batch_step import BatchStep
from maze_cli.envs.parallel_wrapper import ParallelObservationWrapper
from maze_cli.envs.policy_groups import group_return_key
from maze_cli.envs.spaces import ObservationWriter, actions_to_env, observation_specs
from maze_cli.errors import ConfigError
from maze_cli.seeding import derive_seeds

TEAM_RETURN = "team_return"


def agent_return_key(agent: str) -> str:
    """The info key (and, under env/, the stat) of one agent's episode return."""
    return f"agent/{agent}/return"


def team_info_stats(agents: Sequence[str], groups: Sequence[str] | None = None) -> dict[str, str]:
    """The env statistics a multi-agent env reports at the end of each of its episodes (with policy
    groups, each group's mean return too)."""
    return {TEAM_RETURN: "last", **{agent_return_key(a): "last" for a in agents},
            **{group_return_key(g): "last" for g in groups or ()}}


def is_multiagent(env: Any) -> bool:
    """Whether `env` is a PettingZoo env (parallel or AEC); False where PettingZoo is not installed."""
    try:
        from pettingzoo import AECEnv, ParallelEnv
    except ImportError:
        return False
    return isinstance(env, (ParallelEnv, AECEnv))


def as_parallel(env: Any) -> Any:
    """The env as a `ParallelEnv`: an AEC env goes through PettingZoo's `aec_to_parallel`, a turn-based one
    (not declared parallelizable) through `TurnBasedParallel` (`maze_cli.envs.turn_based`)."""
    from pettingzoo import AECEnv
    from pettingzoo.utils.conversions import aec_to_parallel

    from maze_cli.envs.turn_based import TurnBasedParallel, is_turn_based

    if is_turn_based(env):
        return TurnBasedParallel(env)
    return aec_to_parallel(env) if isinstance(env, AECEnv) else env


def agent_spaces(env: Any, what: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action space all agents share; spaces that differ are one line naming them
    (one policy serves every agent)."""
    agents = list(env.possible_agents)
    if not agents:
        raise ConfigError(f"{what}: the multi-agent env has no possible_agents")
    first = agents[0]
    observation_space, action_space = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        for kind, mine, theirs in (("observation", env.observation_space(agent), observation_space),
                                   ("action", env.action_space(agent), action_space)):
            if mine != theirs:
                raise ConfigError(f"{what}: agent {agent}'s {kind} space {mine} differs from agent {first}'s {theirs}; one "
                                  f"policy is shared by all agents, so their spaces must be the same: give each kind of agent its own "
                                  f"policy with env.policy_groups={{<group>: [<agents>], ...}}, or pad the spaces with a "
                                  f"PettingZoo wrapper, e.g. supersuit's pad_observations_v0 / pad_action_space_v0")
    return observation_space, action_space


AGENT_ID_KEY = "agent_id"


class AgentIdObservation(ParallelObservationWrapper):
    """A `ParallelEnv` whose agents' observations also hold their agent's index, one-hot, under
    `agent_id` (`env.agent_id=true`): the shared policy can then act differently per agent. A Dict
    observation gets the key beside its own; any other becomes `{obs: ..., agent_id: ...}`."""

    def __init__(self, env: Any):
        super().__init__(env)
        n = len(self.possible_agents)
        self._one_hot = {a: np.eye(n, dtype=np.float32)[i] for i, a in enumerate(self.possible_agents)}
        self._spaces = {a: self._space(env.observation_space(a), n) for a in self.possible_agents}

    @staticmethod
    def _space(space: gym.Space, n: int) -> gym.spaces.Dict:
        own = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {"obs": space}
        if AGENT_ID_KEY in own:
            raise ConfigError(f"env.agent_id=true: the observation already has a key {AGENT_ID_KEY}; leave env.agent_id out")
        return gym.spaces.Dict({**own, AGENT_ID_KEY: gym.spaces.Box(0.0, 1.0, (n,), np.float32)})

    def observation_space(self, agent: str) -> gym.spaces.Dict:
        return self._spaces[agent]

    def observe(self, observations: dict[str, Any]) -> dict[str, Any]:
        return {a: {**(o if isinstance(o, dict) else {"obs": o}), AGENT_ID_KEY: self._one_hot[a]} for a, o in observations.items()}


class MultiAgentBatch:
    """`n_rows` rows for an actor: `n_rows // N` parallel envs of N agents each, agent k of env e in row
    `e * N + k`; rows left over (where N does not divide `n_rows`) are always autoreset steps.
    Steps follow gymnasium's "same step" autoreset: the step that ends an env's last agents returns the
    new episode's first observations."""

    next_step_autoreset = False

    def __init__(self, make_env: Callable[[], Any], n_rows: int, what: str):
        first = make_env()
        self.agents = tuple(first.possible_agents)
        n_agents = len(self.agents)
        if n_rows < n_agents:
            first.close()
            raise ConfigError(f"{what}: the env has {n_agents} agents, more than the {n_rows} envs of an actor; set "
                              f"runner.envs_per_actor={n_agents} (or a multiple of it: each env takes one row per agent)")
        self.envs = [first] + [make_env() for _ in range(n_rows // n_agents - 1)]
        self.n_envs = n_rows
        self.n_agents = n_agents
        self.observation_space, self.action_space = agent_spaces(first, what)
        groups = getattr(first, "agent_groups", None)  # {agent: group} under env.policy_groups
        self.group_rows = {} if groups is None else {
            g: [k for k, a in enumerate(self.agents) if groups[a] == g] for g in dict.fromkeys(groups.values())}
        self.writer = ObservationWriter(self.observation_space)
        self.returns = np.zeros((len(self.envs), n_agents))
        self.alive = np.zeros((len(self.envs), n_agents), dtype=bool)
        self.observation_space.seed(0)  # padding rows keep these: the same in every run
        self.observations: list[Any] = [self.observation_space.sample() for _ in range(n_rows)]

    def reset(self, seed: int) -> list[Any]:
        for e, (env, s) in enumerate(zip(self.envs, derive_seeds(seed, "env", len(self.envs)))):
            self._start(e, env.reset(seed=s)[0])
        return list(self.observations)

    def _start(self, e: int, observations: dict[str, Any]) -> None:
        """Env `e` begins an episode: its agents' first observations; agents absent from it sit it out."""
        self.returns[e] = 0.0
        for k, agent in enumerate(self.agents):
            self.alive[e, k] = agent in observations
            if agent in observations:
                self.observations[e * self.n_agents + k] = observations[agent]

    def step(self, actions: np.ndarray) -> BatchStep:
        n = self.n_envs
        rewards = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        autoreset = np.ones(n, dtype=bool)  # padding rows and finished agents: no transition
        final: dict[int, Any] = {}
        infos: dict[int, Any] = {}
        row_actions = actions_to_env(self.action_space, actions)
        for e, env in enumerate(self.envs):
            base = e * self.n_agents
            alive = self.alive[e]
            step_actions = {agent: row_actions[base + k] for k, agent in enumerate(self.agents) if alive[k]}
            obs, rew, term, trunc, _ = env.step(step_actions)
            present = set(env.agents)  # an agent the env dropped without ending it ends here (truncated)
            for k, agent in enumerate(self.agents):
                if not alive[k]:
                    continue
                row = base + k
                autoreset[row] = False
                rewards[row] = rew.get(agent, 0.0)
                self.returns[e, k] += rewards[row]
                terminated[row] = bool(term.get(agent, False))
                truncated[row] = (bool(trunc.get(agent, False)) or agent not in present) and not terminated[row]
                if agent in obs:
                    self.observations[row] = obs[agent]
                if terminated[row] or truncated[row]:
                    alive[k] = False
                    if truncated[row]:
                        final[row] = self.observations[row]
            if not alive.any():
                ended = np.flatnonzero(terminated[base:base + self.n_agents] | truncated[base:base + self.n_agents])
                if len(ended):  # reported once per env episode, on a row that ends with this step
                    infos[base + int(ended[0])] = self.team_info(e)
                self._start(e, env.reset()[0])
        return BatchStep(list(self.observations), rewards, terminated, truncated, final, autoreset, infos)

    def team_info(self, e: int) -> dict[str, float]:
        """Env `e`'s episode as env statistics: the team's return, each agent's and each group's (the
        mean of its agents')."""
        returns = self.returns[e]
        return {TEAM_RETURN: float(returns.sum()), **{agent_return_key(a): float(r) for a, r in zip(self.agents, returns)},
                **{group_return_key(g): float(returns[rows].mean()) for g, rows in self.group_rows.items()}}

    def write(self, observations: list[Any], out: dict[str, torch.Tensor | np.ndarray]) -> None:
        self.writer.write(observations, out)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def run_team_episodes(make_env: Callable[[], Any], n_agents: int, policy: torch.nn.Module, seeds: list[int], deterministic: bool,
                      device: str | torch.device, episode_info: Any, what: str,
                      on_frame: Callable[[int, Any], None] | None = None,
                      max_steps: int | None = None) -> tuple[list[float], list[int], int]:
    """One episode of a multi-agent env per seed, all agents acting with `policy` in one batched forward
    pass per step (evaluation and `rollout`). Returns each agent's episode return (the mean is comparable
    with training's `train/episode_return`), each episode's length and how many episodes were cut short
    at `max_steps` (as `maze_cli.evaluation.run_episodes` cuts them); `episode_info` (one column per
    seed) gets the team's statistics; `on_frame(i, env)` is called after each step of episode i but its
    last (whose env has already begun its next episode)."""
    batch = MultiAgentBatch(make_env, len(seeds) * n_agents, what)
    try:
        for e, (env, seed) in enumerate(zip(batch.envs, seeds)):
            batch._start(e, env.reset(seed=seed)[0])
        specs_obs = {k: torch.zeros((batch.n_envs,) + s.shape, dtype=s.dtype) for k, s in observation_specs(batch.observation_space).items()}
        batch.write(batch.observations, specs_obs)
        state = tuple(s.to(device) for s in policy.initial_state(batch.n_envs))
        starts = torch.ones(batch.n_envs, dtype=torch.bool, device=device)
        returns: list[float] = [0.0] * (len(seeds) * n_agents)
        lengths = np.zeros(len(seeds), dtype=np.int64)
        running = np.ones(len(seeds), dtype=bool)
        cut_short = 0
        while running.any():
            with torch.no_grad():
                actions, _, state = policy.act({k: v.to(device) for k, v in specs_obs.items()}, state, starts, deterministic=deterministic)
            starts = torch.zeros_like(starts)  # each env plays one episode: only its first step starts one
            step = batch.step(actions.cpu().numpy())
            lengths += running
            infos, ended = {}, np.zeros(len(seeds), dtype=bool)
            for row, info in step.infos.items():
                e = row // n_agents
                if running[e]:
                    running[e], ended[e], infos[e] = False, True, info
                    returns[e * n_agents:(e + 1) * n_agents] = [info[agent_return_key(a)] for a in batch.agents]
            for e in np.flatnonzero(running & (lengths >= (max_steps or np.inf))):
                running[e], ended[e], infos[e], cut_short = False, True, batch.team_info(e), cut_short + 1
                returns[e * n_agents:(e + 1) * n_agents] = batch.returns[e].tolist()
            if episode_info is not None:
                episode_info.observe(infos, ended)
            if on_frame is not None:
                for e in np.flatnonzero(running):
                    on_frame(int(e), batch.envs[e])
            batch.write(step.observations, specs_obs)
        return returns, lengths.tolist(), cut_short
    finally:
        batch.close()

