"""One policy per group of agents (`env.policy_groups`), held as one module the actors and learner use
like any policy.

Rows arrive in the layout of `maze_cli.envs.policy_groups`: `policy_group` says whose row it is, and each
group's observation sits under the group's name. `PolicyGroups` hands every group's rows to its own member
policy (an `ActorCritic` of the group's spaces, with its own weights, observation statistics and action
mask) and puts their outputs back in row order. The learner, the weight broadcast and checkpoints see one
module: one optimizer, whose Adam moments are per weight and so per group, one state dict holding every
group, one blueprint that rebuilds them all.

A feed-forward policy is dispatched per step (any row of any time step may be any group's); a recurrent
one by whole columns (a column is one agent for its whole rollout), so each member unrolls its own core.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from maze_cli.envs.action_mask import ILLEGAL
from maze_cli.envs.policy_groups import GROUP_KEY
from maze_cli.envs.spaces import OBS_KEY, observation_specs, space_from_dict, space_to_dict
from maze_cli.policies.base import Observations, Policy, PolicyOutput, State
from maze_cli.policies.blueprint import policy_blueprint
from maze_cli.policies.distributions import make_distribution


def _member_keys(observation_space: gym.spaces.Dict, group: str) -> dict[str, str]:
    """`{row key: member key}`: the group's own keys, under the names its policy knows them by."""
    keys = {}
    for key in observation_specs(observation_space):
        if key == group:
            keys[key] = OBS_KEY
        elif key.startswith(group + "/"):
            keys[key] = key[len(group) + 1:]
    return keys


class GroupNormalizers:
    """The members' observation statistics, updated as one (what `ActorCriticObjective.observe` calls):
    each member takes in its own group's rows only."""

    def __init__(self, policy: "PolicyGroups"):
        self.policy = policy

    def update_from(self, batch: Any, pool: Any = None) -> None:
        observations = {k: v[: batch.n_steps] for k, v in batch.observations.items()}
        group = observations[GROUP_KEY]
        for index, (name, member) in enumerate(self.policy.members.items()):
            rows = group == index
            member.obs_normalizer.update({mine: observations[key][rows] for key, mine in self.policy.keys[name].items()}, pool)


class PolicyGroups(Policy):
    """A member policy per group, each on its group's spaces.

    :param observation_space: the rows' Dict (`policy_group` and one key per group).
    :param action_space: the rows' one action space (`maze_cli.envs.policy_groups.shared_action_space`).
    :param member: `{_target_: the member policy class, kwargs: its arguments}`, the same for every group.
    :param groups: `{group: {action_space: its space as data, action_mask_key: its mask key or None}}`,
        in the order of the groups' indices.
    """

    def __init__(self, observation_space: gym.spaces.Dict, action_space: gym.Space, member: Mapping[str, Any],
                 groups: Mapping[str, Mapping[str, Any]]):
        from hydra.utils import get_object

        super().__init__()
        self.observation_space, self.action_space = observation_space, action_space
        cls = get_object(member["_target_"])
        kwargs = dict(member.get("kwargs") or {})
        self.members = nn.ModuleDict({
            name: cls(observation_space[name], space_from_dict(spec["action_space"]),
                      **kwargs, action_mask_key=spec.get("action_mask_key"))
            for name, spec in groups.items()})
        self.keys = {name: _member_keys(observation_space, name) for name in groups}
        self.distribution = make_distribution(action_space)
        self._state_sizes = [len(m.initial_state(1)) for m in self.members.values()]
        has_normalizer = [getattr(m, "obs_normalizer", None) is not None for m in self.members.values()]
        self.obs_normalizer = GroupNormalizers(self) if all(has_normalizer) else None

    def network_parameters(self) -> list[list[nn.Parameter]]:
        """The members' action sides together and their value sides together (`ActorCritic.network_parameters`);
        one list where a member shares one network or cannot tell."""
        parts = [m.network_parameters() if hasattr(m, "network_parameters") else [list(m.parameters())]
                 for m in self.members.values()]
        if any(len(p) != 2 for p in parts):
            return [list(self.parameters())]
        return [[q for p in parts for q in p[0]], [q for p in parts for q in p[1]]]

    def initial_state(self, batch_size: int) -> State:
        return tuple(s for m in self.members.values() for s in m.initial_state(batch_size))

    def _states(self, state: State) -> list[State]:
        """The members' states out of the concatenated one (each covers every row)."""
        out, start = [], 0
        for n in self._state_sizes:
            out.append(tuple(state[start:start + n]))
            start += n
        return out

    def _padded(self, params: torch.Tensor, width: int) -> torch.Tensor:
        """A smaller Discrete group's logits padded to the rows' action space with forbidden actions."""
        return params if params.shape[-1] == width else F.pad(params, (0, width - params.shape[-1]), value=ILLEGAL)

    def _dispatch(self, observations: Observations, state: State, episode_start: torch.Tensor | None, lead: int,
                  run: Callable[[nn.Module, Observations, State, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None, State]]
                  ) -> tuple[torch.Tensor, torch.Tensor | None, State]:
        """Each member's `run` on its own rows along dim `lead` (0: acting's `[B]`; 1: the learner's
        `[T, B]`, grouped by the first step's groups), outputs put back in row order."""
        group = observations[GROUP_KEY]
        if lead == 1:
            group = group[0]
        params = values = None
        states = self._states(state)
        new_state: list[torch.Tensor] = []
        for index, (name, member) in enumerate(self.members.items()):
            rows = (group == index).nonzero().squeeze(1)
            mine = {m: observations[k].index_select(lead, rows) for k, m in self.keys[name].items()}
            starts = None if episode_start is None else episode_start.index_select(lead, rows)
            p, v, s = run(member, mine, tuple(x.index_select(0, rows) for x in states[index]), starts)
            if params is None:
                shape = list(observations[GROUP_KEY].shape)
                params = p.new_zeros(shape + [self.distribution.n_params])
                values = None if v is None else v.new_zeros(shape)
            params = params.index_copy(lead, rows, self._padded(p, self.distribution.n_params))
            if v is not None:
                values = values.index_copy(lead, rows, v)
            new_state += [x.index_copy(0, rows, y) for x, y in zip(states[index], s)]
        return params, values, tuple(new_state)

    def forward(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> PolicyOutput:
        """Params `[T, B, P]` and values `[T, B]`; a feed-forward policy's steps are dispatched one by one
        (as one column of `T * B` steps), a recurrent one's by columns."""
        T, B = observations[GROUP_KEY].shape[:2]
        flat = not self.is_recurrent and T > 1
        if flat:
            observations = {k: v.reshape(1, T * B, *v.shape[2:]) for k, v in observations.items()}
            episode_start = None if episode_start is None else episode_start.reshape(1, T * B)

        def run(member, obs, member_state, starts):
            out = member(obs, member_state, starts)
            return out.params, out.values, out.state

        params, values, state = self._dispatch(observations, state, episode_start, 1, run)
        if flat:
            params, values = params.reshape(T, B, -1), None if values is None else values.reshape(T, B)
        return PolicyOutput(params, values, state)

    def action_params(self, observations: Observations, state: State, episode_start: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        def run(member, obs, member_state, starts):
            params, member_state = member.action_params(obs, member_state, starts)
            return params, None, member_state

        params, _, state = self._dispatch(observations, state, episode_start, 0, run)
        return params, state

    @torch.no_grad()
    def value(self, observations: Observations, state: State = (), episode_start: torch.Tensor | None = None) -> torch.Tensor:
        """V(s) of time-major observations `[T, B, ...]`, each row by its group's value head."""
        return self(observations, state, episode_start).values


def grouped_policy(cls: type, parts: Any, kwargs: Mapping[str, Any], weights_init: Mapping[str, Any] | None = None
                   ) -> tuple[Policy, dict[str, Any]]:
    """The policy an algorithm acts with, and its blueprint: `cls(observation_space, action_space,
    **kwargs, **weights_init)`, or under `env.policy_groups` a `PolicyGroups` of one `cls` per group (each
    with its group's action mask). `weights_init`: arguments that only set the first weights (a checkpoint
    holds the weights), so they stay out of the blueprint. What every algorithm that trains multi-agent
    envs builds its policy with."""
    weights_init = dict(weights_init or {})
    groups = parts.env_factory.policy_groups
    if groups is None:
        policy = cls(parts.observation_space, parts.action_space, **kwargs, **weights_init)
        return policy, policy_blueprint(cls, parts.observation_space, parts.action_space, dict(kwargs))
    shared = {k: v for k, v in kwargs.items() if k != "action_mask_key"}

    def arguments(member_kwargs: dict[str, Any]) -> dict[str, Any]:
        return {
            "member": {"_target_": f"{cls.__module__}.{cls.__qualname__}", "kwargs": member_kwargs},
            "groups": {name: {"action_space": space_to_dict(action_space),
                              "action_mask_key": parts.env_factory.action_mask_key(observation_space, action_space)}
                       for name, (observation_space, action_space) in groups.items()},
        }

    policy = PolicyGroups(parts.observation_space, parts.action_space, **arguments({**shared, **weights_init}))
    return policy, policy_blueprint(PolicyGroups, parts.observation_space, parts.action_space, arguments(shared))
