"""The base of maze_cli's wrappers of a PettingZoo `ParallelEnv` that rewrite each agent's observation."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class ParallelObservationWrapper:
    """A `ParallelEnv` passing everything through to `env` but the observations, which reset and step hand
    to `observe` (and the observation spaces, which a subclass gives); `step` hands the actions to
    `act` on the way in (unchanged by default)."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents = list(env.possible_agents)

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    def observation_space(self, agent: str) -> gym.Space:
        raise NotImplementedError

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    def observe(self, observations: dict[str, Any]) -> dict[str, Any]:
        """Each agent's observation as this wrapper's agents see it."""
        raise NotImplementedError

    def act(self, actions: dict[str, Any]) -> dict[str, Any]:
        """Each agent's action as the wrapped env takes it."""
        return actions

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        observations, infos = self.env.reset(seed=seed, options=options)
        return self.observe(observations), infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, *rest = self.env.step(self.act(actions))
        return (self.observe(observations), *rest)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
