"""Policy groups: the agents of a multi-agent env split into groups, one policy each (`env.policy_groups`).

`env.policy_groups: {group: [agent names or fnmatch patterns]}` claims every agent for exactly one group.
Agents of one group share their group's policy and must have the same spaces; groups may differ in
both. So that the actors, records and learners keep seeing one batch of like rows, every agent's
observation becomes one Dict of the same layout (`PolicyGroupObservation`):

    {policy_group: the group's index, <group A>: A's observation, <group B>: B's observation, ...}

where an agent fills its own group's key and the others hold zeros. The policy (`maze_cli.policies.groups`)
reads `policy_group` and hands each row to its group's policy, which sees only its own key, under the
names the env gave it. Actions take one space for all: the groups' own where they are the same; for
Discrete spaces of different sizes, the largest, whose surplus actions a smaller group's policy never takes.

Each env episode also reports, per group, the mean return of its agents (`env/group/<group>/return`).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np

from maze_cli.envs.parallel_wrapper import ParallelObservationWrapper
from maze_cli.envs.spaces import describe_space
from maze_cli.errors import EnvConfigError

GROUP_KEY = "policy_group"  # the observation key of an agent's group index
WHAT = "env.policy_groups"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def group_return_key(group: str) -> str:
    """The info key (and, under env/, the stat) of a group's mean return per env episode."""
    return f"group/{group}/return"


def assign_groups(spec: Any, agents: Sequence[str]) -> dict[str, str]:
    """`{agent: group}` from `env.policy_groups`, in the env's agent order; a spec that leaves an agent
    out, claims one twice, has a group that matches no agent, or is not a mapping of lists of names is
    one line naming the group or agent and the fix."""
    if not isinstance(spec, Mapping) or not spec:
        raise EnvConfigError(f"{WHAT}: give a mapping of group names to lists of agent names or patterns, e.g. "
                             f"{{adversaries: [adversary_*], good: [agent_0, agent_1]}} (the env's agents: {', '.join(agents)})")
    owner: dict[str, str] = {}
    for group, patterns in spec.items():
        if not isinstance(group, str) or not _NAME.match(group) or group == GROUP_KEY:
            raise EnvConfigError(f"{WHAT}: group name '{group}' is not allowed; use letters, digits, _ and - (not {GROUP_KEY})")
        if isinstance(patterns, str):
            patterns = [patterns]
        if not isinstance(patterns, Sequence) or not patterns or not all(isinstance(p, str) for p in patterns):
            raise EnvConfigError(f"{WHAT}.{group}: give a list of agent names or patterns (the env's agents: {', '.join(agents)})")
        matched = [a for a in agents if any(fnmatch.fnmatchcase(a, p) for p in patterns)]
        if not matched:
            raise EnvConfigError(f"{WHAT}.{group}: {list(patterns)} names no agent of the env; its agents are {', '.join(agents)}")
        for agent in matched:
            if agent in owner:
                raise EnvConfigError(f"{WHAT}: agent {agent} is claimed by two groups, {owner[agent]} and {group}; "
                                     f"an agent belongs to exactly one group")
            owner[agent] = group
    missing = [a for a in agents if a not in owner]
    if missing:
        raise EnvConfigError(f"{WHAT}: agent{'s' if len(missing) > 1 else ''} {', '.join(missing)} in no group; add "
                             f"{'them' if len(missing) > 1 else 'it'} to one (patterns such as 'agent_*' match several)")
    return {a: owner[a] for a in agents}


def group_spaces(env: Any, owner: Mapping[str, str]) -> dict[str, tuple[gym.Space, gym.Space]]:
    """Each group's observation and action space, in the order the groups first appear among the agents;
    agents of one group with different spaces are one line naming them."""
    spaces: dict[str, tuple[gym.Space, gym.Space]] = {}
    first: dict[str, str] = {}
    for agent, group in owner.items():
        mine = (env.observation_space(agent), env.action_space(agent))
        if group not in spaces:
            spaces[group], first[group] = mine, agent
            continue
        for kind, a, b in zip(("observation", "action"), mine, spaces[group]):
            if a != b:
                raise EnvConfigError(f"{WHAT}.{group}: agent {agent}'s {kind} space {describe_space(a)} differs from agent "
                                     f"{first[group]}'s {describe_space(b)}; the agents of a group share one policy, so put "
                                     f"them in groups of their own")
    return spaces


def shared_action_space(spaces: Mapping[str, tuple[gym.Space, gym.Space]]) -> gym.Space:
    """The one action space of every row: the groups' own where they are all the same; the largest of
    Discrete spaces of different sizes (a smaller group's policy leaves the surplus actions out)."""
    actions = [a for _, a in spaces.values()]
    if all(a == actions[0] for a in actions):
        return actions[0]
    if all(isinstance(a, gym.spaces.Discrete) for a in actions):
        return gym.spaces.Discrete(max(int(a.n) for a in actions))
    described = ", ".join(f"{g}: {describe_space(a)}" for g, (_, a) in spaces.items())
    raise EnvConfigError(f"{WHAT}: the groups' action spaces ({described}) are neither the same nor all Discrete; "
                         f"maze_cli's policy groups take one action layout for all agents: pad them inside the env's "
                         f"_target_ (e.g. SuperSuit's pad_action_space_v0)")


def _blank(space: gym.Space) -> Any:
    """What an agent writes under another group's key: zeros (a Discrete's first value)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _blank(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    return np.zeros(space.shape, dtype=space.dtype)


class PolicyGroupObservation(ParallelObservationWrapper):
    """A `ParallelEnv` whose agents all see the observation layout of `maze_cli.envs.policy_groups`
    and act in one action space; actions go back to the env in each agent's own space."""

    def __init__(self, env: Any, spec: Any):
        super().__init__(env)
        self.agent_groups = assign_groups(spec, self.possible_agents)
        self.group_spaces = group_spaces(env, self.agent_groups)
        self.groups = list(self.group_spaces)
        self._observation_space = gym.spaces.Dict({
            GROUP_KEY: gym.spaces.Discrete(len(self.groups)), **{g: o for g, (o, _) in self.group_spaces.items()}})
        self._action_space = shared_action_space(self.group_spaces)
        self._blank = {g: _blank(o) for g, (o, _) in self.group_spaces.items()}
        self._index = {g: i for i, g in enumerate(self.groups)}
        # A padded Discrete starts at 0: an agent's action moves to its own space's start on the way back.
        padded = self._action_space not in [a for _, a in self.group_spaces.values()]
        self._start = {a: int(self.group_spaces[g][1].start) for a, g in self.agent_groups.items()} if padded else {}

    def observation_space(self, agent: str) -> gym.spaces.Dict:
        return self._observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def observe(self, observations: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for agent, obs in observations.items():
            group = self.agent_groups[agent]
            out[agent] = {GROUP_KEY: self._index[group], **self._blank, group: obs}
        return out

    def act(self, actions: dict[str, Any]) -> dict[str, Any]:
        return {a: int(x) + self._start[a] for a, x in actions.items()} if self._start else actions
