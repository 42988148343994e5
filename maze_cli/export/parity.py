"""The check at export: the written model against the trained policy, on observations drawn from the env.

Envs play greedily with the trained policy (their seeds derived from `seed`), every env of a batch stepped
together, an env that ends reset with the next seed, until `n_observations` observations were seen; a
recurrent policy then plays the episodes under way to their end, with the model fed its own `state_out`
(zeros where an episode starts) as a deployment would. At every step both get the same batch, the model
its raw observations, the policy them as `rollout` makes its tensors; every output must agree within
`TOLERANCE` (relative to a value above 1) and every discrete action exactly. One more call at batch 1 checks that the batch size is free.

A multi-agent env's rows are its agents (`maze_cli.envs.multiagent.MultiAgentBatch`): the trained policy
plays every agent, and a policy group's model is checked on its own group's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from maze_cli.envs.spaces import ObservationWriter, action_to_env, observation_specs
from maze_cli.export.contract import ACTION, STATE, STATE_OUT, raw_batch
from maze_cli.export.formats import Run
from maze_cli.export.graph import PolicyGraph

# max absolute difference of an fp32 output; for a value above 1 in magnitude, relative to it (float32 itself
# resolves a value of 100, a well-trained critic's, to about 1e-5)
TOLERANCE = 1e-5
N_ENVS = 8


@dataclass
class Difference:
    """The first output found beyond the tolerance: its name and the max absolute difference (for a
    discrete action, the share of observations whose action differs)."""

    output: str
    value: float
    discrete: bool = False

    def __str__(self) -> str:
        if self.discrete:
            return (f"output '{self.output}' differs from the trained policy's on {self.value:.0%} of the observations "
                    f"(discrete actions must be the same)")
        return (f"output '{self.output}' differs from the trained policy's by {self.value:.3g} (max absolute difference; "
                f"at most {TOLERANCE:g} passes, or that share of a value above 1)")


@dataclass
class Parity:
    """What the check saw: observations compared and the largest difference of each output."""

    observations: int
    max_difference: dict[str, float]


class Reference:
    """The trained policy stepped as `rollout` steps it, its outputs as the contract names them."""

    def __init__(self, graph: PolicyGraph):
        self.graph = graph
        self.policy = graph.policy
        self.writer = ObservationWriter(self.policy.observation_space)
        self.specs = observation_specs(self.policy.observation_space)

    def __call__(self, observations: list, state: np.ndarray | None) -> tuple[dict[str, np.ndarray], list]:
        """The contract's outputs for raw `observations` (one per env), and each env's action for `env.step`."""
        tensors = {k: torch.zeros((len(observations), *s.shape), dtype=s.dtype) for k, s in self.specs.items()}
        self.writer.write(observations, tensors)
        policy_state = () if state is None else self.graph.split_state(torch.from_numpy(state))
        with torch.no_grad():
            outputs, policy_state = self.graph.head.reference(tensors, policy_state)
        result = {name: value.numpy() for name, value in outputs.items()}
        space = self.policy.action_space
        env_actions = [action_to_env(space, a) for a in result[ACTION]]
        actions = np.stack([np.asarray(a) for a in env_actions])
        result[ACTION] = actions if isinstance(space, gym.spaces.Discrete) else actions.reshape(len(observations), -1)
        if policy_state:
            result[STATE_OUT] = self.graph.join_state(policy_state).numpy()
        return result, env_actions


class SingleAgentEnvs:
    """`N_ENVS` envs of `make_env`; `step` takes the checked policy's actions."""

    def __init__(self, make_env: Callable[[], gym.Env], seeds: list[int]):
        self.envs = [make_env() for _ in range(N_ENVS)]
        self.seeds = iter(seeds)
        self.resetting = True  # whether an env that ends begins another episode
        self.running = np.ones(N_ENVS, dtype=bool)

    def reset(self) -> list[Any]:
        return [env.reset(seed=next(self.seeds))[0] for env in self.envs]

    def view(self, observations: list[Any]) -> tuple[list[Any], np.ndarray]:
        """The checked policy's observations and which of them count (their env still plays)."""
        return observations, self.running.copy()

    def step(self, observations: list[Any], env_actions: list) -> tuple[list[Any], np.ndarray]:
        """The next observations, and where an episode starts (its state to zero)."""
        starts = np.zeros(N_ENVS, dtype=bool)
        for i in np.flatnonzero(self.running):
            observations[i], _, terminated, truncated, _ = self.envs[i].step(env_actions[i])
            if terminated or truncated:
                seed = next(self.seeds, None) if self.resetting else None
                if seed is None:
                    self.running[i] = False
                else:
                    observations[i], starts[i] = self.envs[i].reset(seed=seed)[0], True
        return observations, starts

    def close(self) -> None:
        for env in self.envs:
            env.close()


class MultiAgentEnvs:
    """`N_ENVS` multi-agent envs whose agents `policy` (the whole trained policy) plays greedily; `group`: the
    rows of that policy group alone are the checked policy's, each its group's part of the observation."""

    def __init__(self, source: Any, policy: torch.nn.Module, seed: int, group: str | None):
        from maze_cli.envs.multiagent import MultiAgentBatch
        from maze_cli.envs.policy_groups import GROUP_KEY

        self.batch = MultiAgentBatch(source.parallel_env, N_ENVS * len(source.agents), f"env._target_={source.describe()}")
        self.policy, self.seed, self.group = policy, seed, group
        self.resetting = True  # (the batch resets an env that ends by itself; the check stops at its count)
        space = self.batch.observation_space
        self.writer, self.specs = ObservationWriter(space), observation_specs(space)
        self.state = policy.initial_state(self.batch.n_envs)
        self.index = None if group is None else list(policy.members).index(group)
        self.group_key = GROUP_KEY
        self.done = np.zeros(self.batch.n_envs, dtype=bool)  # rows whose episode ended once resetting stopped

    def reset(self) -> list[Any]:
        self.starts = torch.ones(self.batch.n_envs, dtype=torch.bool)
        return self.batch.reset(self.seed)

    def _rows(self, observations: list[Any]) -> np.ndarray:
        if self.group is None:
            return ~self.done
        return np.array([int(o[self.group_key]) == self.index for o in observations]) & ~self.done

    def view(self, observations: list[Any]) -> tuple[list[Any], np.ndarray]:
        rows = self._rows(observations)
        mine = [o if self.group is None else o[self.group] for o in observations]
        return mine, rows

    def step(self, observations: list[Any], env_actions: list) -> tuple[list[Any], np.ndarray]:
        tensors = {k: torch.zeros((self.batch.n_envs, *s.shape), dtype=s.dtype) for k, s in self.specs.items()}
        self.writer.write(observations, tensors)
        with torch.no_grad():
            actions, _, self.state = self.policy.act(tensors, self.state, self.starts, deterministic=True)
        step = self.batch.step(actions.numpy())
        n = self.batch.n_agents
        restarted = np.zeros(self.batch.n_envs, dtype=bool)
        for row in step.infos:  # one per env episode that ended: all of its agents start again
            restarted[row // n * n:(row // n + 1) * n] = True
        self.starts = torch.from_numpy(restarted)
        if not self.resetting:
            self.done |= restarted
        return list(step.observations), restarted

    def close(self) -> None:
        self.batch.close()


def compare(model: dict[str, np.ndarray], reference: dict[str, np.ndarray], discrete: bool, seen: dict[str, float]) -> Difference | None:
    """Record each output's largest difference in `seen`; the first one beyond what passes, if any."""
    for name, expected in reference.items():
        got = model[name]
        if got.shape != expected.shape:
            return Difference(name, float("inf"))
        if name == ACTION and discrete:
            wrong = float(np.mean(np.any((got != expected).reshape(len(got), -1), axis=-1))) if len(got) else 0.0
            seen[name] = max(seen.get(name, 0.0), wrong)
            if wrong:
                return Difference(name, wrong, discrete=True)
            continue
        if not got.size:
            continue
        reference_values = expected.astype(np.float64)
        diff = np.abs(got.astype(np.float64) - reference_values)
        seen[name] = max(seen.get(name, 0.0), float(diff.max()))
        if not np.all(diff <= TOLERANCE * np.maximum(1.0, np.abs(reference_values))):  # NaN fails too
            return Difference(name, float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan"))
    return None


def check_parity(run: Run, graph: PolicyGraph, envs: SingleAgentEnvs | MultiAgentEnvs, n_observations: int) -> Parity | Difference:
    """The model `run` against the trained policy of `graph`, on observations of `envs`."""
    reference = Reference(graph)
    discrete = not isinstance(graph.policy.action_space, gym.spaces.Box)
    is_dict = isinstance(graph.policy.observation_space, gym.spaces.Dict)
    seen: dict[str, float] = {}
    count, first = 0, True
    try:
        observations = envs.reset()
        mine, rows = envs.view(observations)
        state = np.zeros((len(mine), graph.state_size), np.float32) if graph.state_size else None
        model_state = state
        while rows.any():
            chosen = np.flatnonzero(rows)
            batch = [mine[i] for i in chosen]
            feeds = raw_batch(batch, graph.inputs, is_dict)
            if state is not None:
                feeds[STATE] = model_state[chosen]
            (expected, env_actions), got = reference(batch, None if state is None else state[chosen]), run(feeds)
            difference = compare(got, expected, discrete, seen)
            if difference is None and first:  # any batch size: one row alone
                difference = compare(run({name: value[:1] for name, value in feeds.items()}), {k: v[:1] for k, v in expected.items()},
                                     discrete, seen)
            if difference is not None:
                return difference
            first = False
            count += len(chosen)
            if state is not None:
                state[chosen], model_state[chosen] = expected[STATE_OUT], got[STATE_OUT]
            actions = [None] * len(mine)
            for i, action in zip(chosen, env_actions):
                actions[i] = action
            if count >= n_observations:
                if not graph.state_size:
                    break
                envs.resetting = False  # a recurrent policy: the episodes under way played to their end
            observations, starts = envs.step(observations, actions)
            mine, rows = envs.view(observations)
            if state is not None:
                state[starts], model_state[starts] = 0.0, 0.0
    finally:
        envs.close()
    return Parity(count, seen)
