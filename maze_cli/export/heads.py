"""What each policy kind computes for one greedy step, twice: as the exported graph computes it, and as
the trained policy computes it when `rollout` plays it (the reference the export is checked against).

The graph takes the policy's own parts (its network's one-step path, its heads, its mask, its observation
statistics) and leaves out what depends on the data in Python (acting's skipping of forced steps becomes
a `where`), so that one trace serves every batch. The reference calls the policy as actors and `rollout`
do (`act`, `action_params`, `forward`). Actions here are in the policy's units (Discrete from 0, Box
flattened); `maze_cli.export.graph` maps them to the env's.
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from maze_cli.errors import ConfigError
from maze_cli.policies.base import Observations, Policy, State

Outputs = dict[str, torch.Tensor]


class Head(abc.ABC):
    """One policy kind's step: `outputs` names what it gives beside `action`."""

    outputs: tuple[str, ...] = ()

    def __init__(self, policy: Policy):
        self.policy = policy

    @abc.abstractmethod
    def graph(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        """The exported step: `{action, *outputs}` and the next state."""

    @abc.abstractmethod
    def reference(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        """The same step as the trained policy takes it."""

    def _greedy(self, observations: Observations, state: State) -> tuple[torch.Tensor, State]:
        actions, _, state = self.policy.act(observations, state, None, deterministic=True)
        return actions, state


def _one_step_params(policy: Policy, observations: Observations, state: State) -> torch.Tensor:
    """The params of the policy's learner forward for one step `[B, ...]`."""
    return policy({k: v.unsqueeze(0) for k, v in observations.items()}, state, None).params[0]


class ActorCriticHead(Head):
    """IMPALA, APPO, PPO: the distribution's mode, its params (`logits`; a Box's `mean` and `log_std`) and `value`."""

    def __init__(self, policy: Policy):
        super().__init__(policy)
        self.gaussian = policy.gaussian
        self.outputs = ("mean", "log_std", "value") if self.gaussian else ("logits", "value")

    def _named(self, params: torch.Tensor, value: torch.Tensor) -> Outputs:
        if self.gaussian:
            mean, log_std = self.policy.distribution.mean_and_log_std(params)
            return {"mean": mean, "log_std": log_std, "value": value}
        return {"logits": params, "value": value}

    def graph(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        params, value, next_state = self.policy.step_outputs(observations, state)
        return {"action": self.policy.distribution.mode(params), **self._named(params, value)}, next_state

    def reference(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        actions, next_state = self._greedy(observations, state)
        params, _ = self.policy.action_params(observations, state, None)
        value = self.policy({k: v.unsqueeze(0) for k, v in observations.items()}, state, None).values[0]
        return {"action": actions, **self._named(params, value)}, next_state


class DqnHead(Head):
    """DQN: the greedy action and the (masked) `q_values`."""

    outputs = ("q_values",)

    def graph(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        p = self.policy
        features, state = p.network.step(observations, state, None)
        q = p.masked(p.q_values(features), observations)
        return {"action": q.argmax(-1), "q_values": q}, state

    def reference(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        actions, next_state = self._greedy(observations, state)
        q = self.policy.masked(_one_step_params(self.policy, observations, state), observations)
        return {"action": actions, "q_values": q}, next_state


class SacHead(Head):
    """SAC: Box, the squashed Gaussian's mean action and its `mean` and `log_std` before the tanh; Discrete,
    the most likely action and the (masked) `logits`."""

    def __init__(self, policy: Policy):
        super().__init__(policy)
        self.outputs = ("logits",) if policy.discrete else ("mean", "log_std")

    def _named(self, out: torch.Tensor, observations: Observations) -> Outputs:
        p = self.policy
        if p.discrete:
            logits = p.masked(out, observations)
            return {"action": logits.argmax(-1), "logits": logits}
        mean, log_std = p.mean_and_log_std(out)
        return {"action": torch.tanh(mean) * p.scale + p.bias, "mean": mean, "log_std": log_std}

    def graph(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        features, state = self.policy.network.step(observations, state, None)
        return self._named(self.policy.head(features), observations), state

    def reference(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        actions, next_state = self._greedy(observations, state)
        named = self._named(_one_step_params(self.policy, observations, state), observations)
        return {**named, "action": actions}, next_state


class Td3Head(Head):
    """TD3: the deterministic actor's action."""

    def graph(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        p = self.policy
        features, state = p.network.step(observations, state, None)
        return {"action": torch.tanh(p.head(features)) * p.scale + p.bias}, state

    def reference(self, observations: Observations, state: State) -> tuple[Outputs, State]:
        actions, next_state = self._greedy(observations, state)
        return {"action": actions}, next_state


def head_for(policy: nn.Module, where: str) -> Head:
    """The head of `policy`'s kind; a kind without one is a ConfigError naming it."""
    from maze_cli.algorithms.dqn import DqnPolicy
    from maze_cli.algorithms.sac import SacPolicy
    from maze_cli.algorithms.td3 import Td3Policy
    from maze_cli.policies.actor_critic import ActorCritic

    for cls, head in ((ActorCritic, ActorCriticHead), (DqnPolicy, DqnHead), (SacPolicy, SacHead), (Td3Policy, Td3Head)):
        if isinstance(policy, cls):
            return head(policy)
    raise ConfigError(f"{where}: its policy is a {type(policy).__name__}, which export-policy cannot export "
                      f"(it exports ActorCritic, DqnPolicy, SacPolicy and Td3Policy, and a policy group's member with group=<name>)")
