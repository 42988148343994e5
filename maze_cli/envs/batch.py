"""A batch of envs an actor steps together: gymnasium's own vectorized env where the env has one,
else a list of single envs stepped in a loop.

Both give the actor the same thing per step: next observations (batched), rewards, terminated,
truncated, the final observations of truncated episodes (to bootstrap from), the infos that may
hold keys the env statistics follow (`maze_cli.envs.info_stats`), and which columns were an
*autoreset step*. A vectorized env in gymnasium's "next step" autoreset mode spends the
step after an episode's end on resetting: the action is ignored, the reward is 0, and the returned
observation is the new episode's first. Such a step is no transition; learners mask it out.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from maze_cli.envs.batch_step import BatchStep
from maze_cli.envs.info_stats import SUCCESS_KEY, vector_infos
from maze_cli.envs.multiagent import MultiAgentBatch
from maze_cli.envs.source import EnvSource, as_env_source
from maze_cli.envs.spaces import ObservationWriter, actions_to_env
from maze_cli.seeding import derive_seed, derive_seeds


class EnvList:
    """`n` single envs stepped one after another; a finished env is reset within the same step.
    `info_keys`: the info keys the env statistics follow at every step (`is_success` is looked up at
    an episode's end in any case)."""

    next_step_autoreset = False  # a finished env is reset within the step that ends it

    def __init__(self, env_factory: Callable[[], gym.Env], n_envs: int, info_keys: tuple[str, ...] = ()):
        self.envs = [env_factory() for _ in range(n_envs)]
        self.follow_every_step = bool(info_keys)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.writer = ObservationWriter(self.observation_space)
        self._no_autoreset = np.zeros(n_envs, dtype=bool)

    def reset(self, seed: int) -> list[Any]:
        return [env.reset(seed=s)[0] for env, s in zip(self.envs, derive_seeds(seed, "env", len(self.envs)))]

    def step(self, actions: np.ndarray) -> BatchStep:
        n = len(self.envs)
        rewards = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        final: dict[int, Any] = {}
        infos: dict[int, Any] = {}
        next_obs = []
        for i, (env, action) in enumerate(zip(self.envs, actions_to_env(self.action_space, actions))):
            obs, reward, term, trunc, info = env.step(action)
            rewards[i], terminated[i], truncated[i] = reward, term, trunc and not term
            if info and (self.follow_every_step or term or trunc):
                infos[i] = info
            if term or trunc:
                if truncated[i]:
                    final[i] = obs
                obs, _ = env.reset()
            next_obs.append(obs)
        return BatchStep(next_obs, rewards, terminated, truncated, final, self._no_autoreset, infos)

    def write(self, observations: list[Any], out: dict[str, torch.Tensor | np.ndarray]) -> None:
        self.writer.write(observations, out)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class VectorEnvBatch:
    """gymnasium's vectorized implementation of an env (its `vector_entry_point`): one call steps
    all envs. Supports the "next step" and "same step" autoreset modes."""

    def __init__(self, vector_env: gym.vector.VectorEnv, info_keys: tuple[str, ...] = ()):
        from gymnasium.vector import AutoresetMode

        self.env = vector_env
        self.n_envs = vector_env.num_envs
        self.observation_space = vector_env.single_observation_space
        self.action_space = vector_env.single_action_space
        self.writer = ObservationWriter(self.observation_space)
        mode = vector_env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"vectorized env with autoreset mode {mode} is not supported; set env.vectorize=false")
        self.next_step_autoreset = mode == AutoresetMode.NEXT_STEP
        self._ended = np.zeros(self.n_envs, dtype=bool)
        self._no_autoreset = np.zeros(self.n_envs, dtype=bool)
        self.info_keys = tuple(dict.fromkeys((*info_keys, SUCCESS_KEY)))

    def reset(self, seed: int) -> Any:
        self._ended = np.zeros(self.n_envs, dtype=bool)
        return self.env.reset(seed=derive_seed(seed, "vector_env"))[0]

    def step(self, actions: np.ndarray) -> BatchStep:
        obs, rewards, terminated, truncated, info = self.env.step(_vector_actions(self.action_space, actions, self.n_envs))
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        any_truncated = np.count_nonzero(truncated) > 0  # (count_nonzero: cheaper than any() on small arrays)
        if any_truncated:
            truncated = truncated & ~terminated
        if self.next_step_autoreset:
            autoreset = self._ended  # replaced below, never written in place
            # The observation returned with an episode's end is its final one; next step resets.
            final = {int(i): _row(obs, i) for i in np.flatnonzero(truncated)} if any_truncated else {}
            self._ended = terminated | truncated
        else:
            autoreset = self._no_autoreset
            final = {int(i): _row(info["final_obs"], i) for i in np.flatnonzero(truncated)} if any_truncated else {}
        infos = vector_infos(info, self.info_keys, terminated | truncated, not self.next_step_autoreset) if info else {}
        return BatchStep(obs, np.asarray(rewards, dtype=np.float32), terminated, truncated, final, autoreset, infos)

    def write(self, observations: Any, out: dict[str, torch.Tensor | np.ndarray]) -> None:
        self.writer.write_batch(observations, out)

    def close(self) -> None:
        self.env.close()


def _row(batched: Any, i: int) -> Any:
    """Env `i`'s observation out of a batched (possibly dict) observation."""
    if isinstance(batched, dict):
        return {k: _row(v, i) for k, v in batched.items()}
    return batched[i]


def _vector_actions(space: gym.Space, actions: np.ndarray, n: int) -> np.ndarray:
    """The action tensor's rows as the batched action a vectorized env expects."""
    if isinstance(space, gym.spaces.Discrete):
        actions = actions.astype(space.dtype, copy=False)
        return actions + space.start if space.start else actions
    if isinstance(space, gym.spaces.MultiDiscrete):
        return actions.reshape(n, *space.nvec.shape).astype(space.dtype) + space.start
    return np.clip(actions.reshape(n, *space.shape), space.low, space.high).astype(space.dtype)


def make_env_batch(env_factory: EnvSource | Callable[[], gym.Env], n_envs: int,
                   info_keys: tuple[str, ...] = ()) -> EnvList | VectorEnvBatch | MultiAgentBatch:
    """The fastest batch this env allows: its vectorized implementation if the source offers one; for a
    multi-agent env, one row per agent (`maze_cli.envs.multiagent`)."""
    source = as_env_source(env_factory)
    if source.agents:
        return MultiAgentBatch(source.training_parallel_env, n_envs, f"env._target_={source.describe()}")
    vector_env = source.vector_env(n_envs)
    return VectorEnvBatch(vector_env, info_keys) if vector_env is not None else EnvList(source, n_envs, info_keys)
