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

from maze_cli.envs.batch import BatchStep, make_env_batch
from maze_cli.envs.spaces import observation_specs
from maze_cli.records import Rollout, RolloutInfo


class Actor:
    """Collects rollouts of `n_steps` steps from `n_envs` envs with a local copy of the policy.

    Its envs are one batch (`maze_cli.envs.batch`): the env's vectorized implementation where it
    has one, else single envs in a loop. Seeds: the batch is reset once with seeds derived from
    `env_seed`; the actor's sampling uses a torch RNG state seeded by `agent_seed` and swapped in
    only while it collects, so several actors in one process (and the learner beside them) never
    disturb each other.
    With an `initial_policy` (e.g. uniform random, to fill a replay buffer) the actor acts with it
    until the first broadcast arrives (policy version 0).
    The policy's recurrent state is carried from step to step and across rollouts (reset by the
    policy where an episode starts); each record keeps the state at its rollout's start.
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
        self.envs = make_env_batch(env_factory, n_envs)
        self.reward_clip = getattr(env_factory, "reward_clip", None)  # the learner's rewards; stats keep the env's
        self.policy = copy.deepcopy(policy).requires_grad_(False)
        self.initial_policy = initial_policy
        self.policy_version = 0
        self._rng_state = torch.Generator().manual_seed(agent_seed).get_state()
        self.current_obs = {
            k: torch.zeros((n_envs,) + s.shape, dtype=s.dtype) for k, s in observation_specs(self.envs.observation_space).items()
        }
        self.envs.write(self.envs.reset(env_seed), self.current_obs)
        self.episode_start = torch.ones(n_envs, dtype=torch.bool)  # current_obs begins an episode
        self.state = self.policy.initial_state(n_envs)
        # In gymnasium's "next step" autoreset mode the observation after an episode's end is its
        # last; the episode after it starts with the autoreset step's observation.
        self._resets_next_step = bool(getattr(self.envs, "next_step_autoreset", False))
        self.episode_return = np.zeros(n_envs, dtype=np.float64)
        self.episode_length = np.zeros(n_envs, dtype=np.int64)

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
        t_env = t_inference = t_record = 0.0
        for key, value in self.current_obs.items():
            out.observations[key][0].copy_(value)
        out.episode_start[0].copy_(self.episode_start)
        for mine, slot in zip(self.state, out.initial_state):
            slot.copy_(mine)
        out.policy_version.fill_(self.policy_version)
        if out.env_id is not None:
            torch.arange(self.index * self.n_envs, (self.index + 1) * self.n_envs, out=out.env_id)
        for value in out.final_observations.values():
            value.zero_()
        policy = self.initial_policy if self.initial_policy is not None and self.policy_version == 0 else self.policy
        state = self.state
        for t in range(self.n_steps):
            t0 = time.perf_counter()
            obs_t = {key: value[t] for key, value in out.observations.items()}
            actions, logp, state = policy.act(obs_t, state, out.episode_start[t])
            out.actions[t].copy_(actions)
            out.behaviour_logp[t].copy_(logp)
            t1 = time.perf_counter()
            step = self.envs.step(actions.numpy())
            t2 = time.perf_counter()
            self.envs.write(step.observations, {key: value[t + 1] for key, value in out.observations.items()})
            rewards = torch.from_numpy(step.rewards)
            out.rewards[t].copy_(rewards if self.reward_clip is None else rewards.clamp(-self.reward_clip, self.reward_clip))
            out.terminated[t].copy_(torch.from_numpy(step.terminated))
            out.truncated[t].copy_(torch.from_numpy(step.truncated))
            out.autoreset[t].copy_(torch.from_numpy(step.autoreset))
            ended = step.terminated | step.truncated
            starts = step.autoreset if self._resets_next_step else ended | step.autoreset
            out.episode_start[t + 1].copy_(torch.from_numpy(starts))
            for i, final_obs in step.final_observations.items():
                self.envs.writer.write_one(final_obs, i, {key: value[t] for key, value in out.final_observations.items()})
            self._count_episodes(step, info)
            t_inference += t1 - t0
            t_env += t2 - t1
            t_record += time.perf_counter() - t2
        for key, value in self.current_obs.items():
            value.copy_(out.observations[key][self.n_steps])
        self.episode_start.copy_(out.episode_start[self.n_steps])
        self.state = state
        if out.behaviour_value is not None:
            self._record_values(out)
        info.timings = {"actor_env_step_s": t_env, "actor_inference_s": t_inference, "actor_record_s": t_record}
        return info

    def _record_values(self, out: Rollout) -> None:
        """V(s_t) under the acting policy for the whole rollout, in one pass (algorithms that need
        the behaviour policy's values ask for them in the rollout spec)."""
        observations = {key: value[: self.n_steps] for key, value in out.observations.items()}
        out.behaviour_value.copy_(self.policy.value(observations, out.initial_state, out.episode_start[: self.n_steps]))

    def _count_episodes(self, step: BatchStep, info: RolloutInfo) -> None:
        """Add the step to the running episodes; report and restart those that ended."""
        real = ~step.autoreset
        self.episode_return += step.rewards * real
        self.episode_length += real
        ended = step.terminated | step.truncated
        if ended.any():
            info.episode_returns.extend(self.episode_return[ended].tolist())
            info.episode_lengths.extend(self.episode_length[ended].tolist())
            self.episode_return[ended] = 0.0
            self.episode_length[ended] = 0

    def close(self) -> None:
        self.envs.close()
