"""The check at export: the written model against the trained policy, on observations drawn from the env.

Envs play episodes greedily with the trained policy (their seeds derived from `seed`), every env of a
batch stepped together, until `n_observations` observations were seen; a recurrent policy plays each
round of episodes to its end, with the model fed its own `state_out` as a deployment would. At every step
both get the same batch, the model its raw observations, the policy them as `rollout` makes its tensors;
every output must agree within `TOLERANCE` and every discrete action exactly. One more call at batch 1
checks that the batch size is free.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from maze_cli.envs.spaces import ObservationWriter, action_to_env, observation_specs
from maze_cli.export.contract import ACTION, STATE, STATE_OUT, raw_batch
from maze_cli.export.formats import Run
from maze_cli.export.graph import PolicyGraph

TOLERANCE = 1e-5  # max absolute difference of any fp32 output
N_ENVS = 8


@dataclass
class Difference:
    """The first output found beyond the tolerance: its name and the max absolute difference."""

    output: str
    value: float
    discrete: bool = False

    def __str__(self) -> str:
        if self.discrete:
            return f"output '{self.output}' differs from the trained policy's on {self.value:.0%} of the observations (discrete actions must be the same)"
        return f"output '{self.output}' differs from the trained policy's by {self.value:.3g} (max absolute difference; at most {TOLERANCE:g} passes)"


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


def compare(model: dict[str, np.ndarray], reference: dict[str, np.ndarray], discrete: bool, seen: dict[str, float]) -> Difference | None:
    """Record each output's largest difference in `seen`; the first one beyond what passes, if any."""
    for name, expected in reference.items():
        got = model[name]
        if got.shape != expected.shape:
            return Difference(name, float("inf"))
        if name == ACTION and discrete:
            wrong = float(np.mean(np.any((got != expected).reshape(len(got), -1), axis=-1)))
            seen[name] = max(seen.get(name, 0.0), wrong)
            if wrong:
                return Difference(name, wrong, discrete=True)
            continue
        diff = float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)))) if got.size else 0.0
        seen[name] = max(seen.get(name, 0.0), diff)
        if not diff <= TOLERANCE:
            return Difference(name, diff)
    return None


def check_parity(run: Run, graph: PolicyGraph, make_env, n_observations: int, seeds: list[int]) -> Parity | Difference:
    """The model `run` against the trained policy of `graph` in envs of `make_env`, seeded from `seeds`
    (one per env and round, as many as given)."""
    reference = Reference(graph)
    discrete = not isinstance(graph.policy.action_space, gym.spaces.Box)
    is_dict = isinstance(graph.policy.observation_space, gym.spaces.Dict)
    seen: dict[str, float] = {}
    count, round_seeds = 0, list(seeds)
    envs = [make_env() for _ in range(N_ENVS)]
    try:
        while count < n_observations and round_seeds:
            batch, round_seeds = round_seeds[:N_ENVS], round_seeds[N_ENVS:]
            observations = [env.reset(seed=s)[0] for env, s in zip(envs, batch)]
            running = np.ones(len(batch), dtype=bool)
            state = np.zeros((len(batch), graph.state_size), np.float32) if graph.state_size else None
            model_state = state
            first = True
            while running.any() and (graph.state_size or count < n_observations):
                feeds = raw_batch(observations, graph.inputs, is_dict)
                if model_state is not None:
                    feeds[STATE] = model_state
                (expected, env_actions), got = reference(observations, state), run(feeds)
                difference = compare(got, expected, discrete, seen)
                if difference is None and first:  # any batch size: one row alone
                    one = {name: value[:1] for name, value in feeds.items()}
                    difference = compare(run(one), {k: v[:1] for k, v in expected.items()}, discrete, seen)
                if difference is not None:
                    return difference
                first = False
                count += int(running.sum())
                if state is not None:
                    state, model_state = expected[STATE_OUT], got[STATE_OUT]
                for i in np.flatnonzero(running):
                    o, _, terminated, truncated, _ = envs[i].step(env_actions[i])
                    observations[i] = o
                    running[i] = not (terminated or truncated)
    finally:
        for env in envs:
            env.close()
    return Parity(count, seen)

