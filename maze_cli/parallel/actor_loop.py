"""The one actor loop every backend runs: step a batch of envs, one batched forward pass per step.

An `Actor` owns its envs, a private copy of the policy and its own random state, and writes
rollouts into whatever record it is handed: a local tensor (sequential backend) or a slot of
shared memory (subprocess backend). Backends differ only in how records and weights travel.
"""

from __future__ import annotations

import copy
import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from maze_cli.envs.spaces import ObservationWriter, action_to_env, observation_specs
from maze_cli.records import Rollout, RolloutInfo
from maze_cli.seeding import derive_seeds


class Actor:
    """Collects rollouts of `n_steps` steps from `n_envs` envs with a local copy of the policy.

    Seeds: env j of this actor is reset once with a seed derived from `env_seed`; the actor's
    sampling uses a torch RNG state seeded by `agent_seed` and swapped in only while it collects,
    so several actors in one process (and the learner beside them) never disturb each other.
    With an `initial_policy` (e.g. uniform random, to fill a replay buffer) the actor acts with it
    until the first broadcast arrives (policy version 0).
    """

    def __init__(
        self,
        index: int,
        env_factory: Callable[[], gym.Env],
        policy: nn.Module,
        n_envs: int,
        n_steps: int,
        env_seed: int,
        agent_seed: int,
        initial_policy: nn.Module | None = None,
    ):
        self.index = index
        self.n_envs = n_envs
        self.n_steps = n_steps
        self.env_seed = env_seed
        self.agent_seed = agent_seed
        self.envs = [env_factory() for _ in range(n_envs)]
        self.action_space = self.envs[0].action_space
        self.writer = ObservationWriter(self.envs[0].observation_space)
        self.policy = copy.deepcopy(policy).requires_grad_(False)
        self.initial_policy = initial_policy
        self.policy_version = 0
        generator_seed = torch.Generator().manual_seed(agent_seed)
        self._rng_state = generator_seed.get_state()

        self.current_obs = {
            k: torch.zeros((n_envs,) + s.shape, dtype=s.dtype)
            for k, s in observation_specs(self.envs[0].observation_space).items()
        }
        seeds = derive_seeds(env_seed, "env", n_envs)
        self.writer.write([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)], self.current_obs)
        self.episode_return = np.zeros(n_envs, dtype=np.float64)
        self.episode_length = np.zeros(n_envs, dtype=np.int64)
        self._rewards = np.zeros(n_envs, dtype=np.float32)
        self._terminated = np.zeros(n_envs, dtype=bool)
        self._truncated = np.zeros(n_envs, dtype=bool)

    def load_policy(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Adopt a new policy version (copying the weights into the local module)."""
        self.policy.load_state_dict(state_dict)
        self.policy_version = version

    def collect(self, out: Rollout) -> RolloutInfo:
        """Fill `out` with the next rollout; return its metadata (episode stats, timings)."""
        outer_rng = torch.get_rng_state()
        torch.set_rng_state(self._rng_state)
        try:
            with torch.inference_mode():
                info = self._collect(out)
        finally:
            self._rng_state = torch.get_rng_state()
            torch.set_rng_state(outer_rng)
        return info

    def _collect(self, out: Rollout) -> RolloutInfo:
        info = RolloutInfo(actor_index=self.index, policy_version=self.policy_version, env_steps=self.n_steps * self.n_envs)
        t_env = t_inference = 0.0
        for key, value in self.current_obs.items():
            out.observations[key][0].copy_(value)
        out.policy_version.fill_(self.policy_version)
        for value in out.final_observations.values():
            value.zero_()
        policy = self.initial_policy if self.initial_policy is not None and self.policy_version == 0 else self.policy
        for t in range(self.n_steps):
            t0 = time.perf_counter()
            obs_t = {key: value[t] for key, value in out.observations.items()}
            actions, logp, _ = policy.act(obs_t)
            out.actions[t].copy_(actions)
            out.behaviour_logp[t].copy_(logp)
            t1 = time.perf_counter()
            next_obs, truncated_final = self._step_envs(actions.numpy(), info)
            self.writer.write(next_obs, {key: value[t + 1] for key, value in out.observations.items()})
            out.rewards[t].copy_(torch.from_numpy(self._rewards))
            out.terminated[t].copy_(torch.from_numpy(self._terminated))
            out.truncated[t].copy_(torch.from_numpy(self._truncated))
            for i, final_obs in truncated_final.items():
                self.writer.write_one(final_obs, i, {key: value[t] for key, value in out.final_observations.items()})
            t2 = time.perf_counter()
            t_env += t2 - t1
            t_inference += t1 - t0 + time.perf_counter() - t2
        for key, value in self.current_obs.items():
            value.copy_(out.observations[key][self.n_steps])
        info.timings = {"actor_env_step_s": t_env, "actor_inference_s": t_inference}
        return info

    def _step_envs(self, actions: np.ndarray, info: RolloutInfo) -> tuple[list, dict[int, object]]:
        """Step every env once; reset finished ones. Returns next observations and, for
        truncated episodes, their final observations (to bootstrap from)."""
        next_obs = []
        truncated_final: dict[int, object] = {}
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(action_to_env(self.action_space, actions[i]))
            self._rewards[i] = reward
            self.episode_return[i] += reward
            self.episode_length[i] += 1
            truncated = truncated and not terminated
            self._terminated[i] = terminated
            self._truncated[i] = truncated
            if terminated or truncated:
                info.episode_returns.append(float(self.episode_return[i]))
                info.episode_lengths.append(int(self.episode_length[i]))
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
                if truncated:
                    truncated_final[i] = obs
                obs, _ = env.reset()
            next_obs.append(obs)
        return next_obs, truncated_final

    def close(self) -> None:
        for env in self.envs:
            env.close()
