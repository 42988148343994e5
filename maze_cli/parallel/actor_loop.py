"""The one actor loop every backend runs: step a batch of envs, one batched forward pass per step.

An `Actor` owns its envs, a private copy of the policy and its own random state, and writes
rollouts into whatever record it is handed: a local tensor (sequential backend) or a slot of
shared memory (subprocess backend). Backends differ only in how records and weights travel.
"""

from __future__ import annotations

import copy
import io
import pickle
import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from gymnasium.utils import EzPickle
from torch import nn

from maze_cli.envs.batch import make_env_batch
from maze_cli.envs.info_stats import EpisodeInfoStats
from maze_cli.envs.source import EnvSource, as_env_source
from maze_cli.envs.spaces import observation_specs
from maze_cli.parallel.selfplay import OpponentPool, pool_settings
from maze_cli.policies.base import Policy
from maze_cli.records import Rollout, RolloutInfo
from maze_cli.seeding import derive_seed


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
    `run_envs` is (the run-wide ids of this actor's envs, the number of envs of the whole run), told
    to the actor's copy of the policy (`Policy.for_envs`: Ape-X gives each env its own epsilon).
    """

    def __init__(
        self,
        index: int,
        env_factory: EnvSource | Callable[[], gym.Env],
        policy: nn.Module,
        n_envs: int,
        n_steps: int,
        env_seed: int,
        agent_seed: int,
        initial_policy: nn.Module | None = None,
        snapshot: bytes | None = None,
        run_envs: tuple[range, int] | None = None,
    ):
        self.index = index
        self.n_envs = n_envs
        self.n_steps = n_steps
        self.env_seed = env_seed
        self.agent_seed = agent_seed
        source = as_env_source(env_factory)
        info_stats = dict(source.info_stats)  # env statistics: `env.info_stats`
        self.envs = make_env_batch(source, n_envs, tuple(info_stats))
        self.episode_info = EpisodeInfoStats(info_stats, n_envs)
        self.reward_clip = source.reward_clip  # the learner's rewards; stats keep the env's
        self.policy = copy.deepcopy(policy).requires_grad_(False)
        if run_envs is not None and isinstance(self.policy, Policy):
            self.policy.for_envs(*run_envs)
        self.initial_policy = initial_policy
        self.policy_version = 0
        selfplay = pool_settings(source)  # a turn-based game's pool of earlier versions (maze_cli.parallel.selfplay)
        self.pool = None if selfplay is None else OpponentPool(
            self.policy, n_envs, len(source.agents), selfplay["pool_size"], selfplay["pool_share"], selfplay["snapshot_every"],
            derive_seed(agent_seed, "selfplay"), bool(selfplay.get("pool_greedy", False)))
        self._rng_state = torch.Generator().manual_seed(agent_seed).get_state()
        self.current_obs = {
            k: torch.zeros((n_envs,) + s.shape, dtype=s.dtype) for k, s in observation_specs(self.envs.observation_space).items()
        }
        self.envs.write(self.envs.reset(env_seed), self.current_obs)
        self.episode_start = torch.ones(n_envs, dtype=torch.bool)  # current_obs begins an episode
        self.state = self.policy.initial_state(n_envs)
        # In gymnasium's "next step" autoreset mode the observation after an episode's end is its
        # last; the episode after it starts with the autoreset step's observation.
        self._resets_next_step = self.envs.next_step_autoreset
        self.episode_return = np.zeros(n_envs, dtype=np.float64)
        self.episode_length = np.zeros(n_envs, dtype=np.int64)
        if snapshot is not None:  # a resumed reproducible run: go on where the saved actor was
            self.restore(snapshot)

    # What a reproducible run's resume needs to go on where the actor was: everything but the weights,
    # which the learner holds (each rollout names the version it is collected with).
    _STATE = ("envs", "episode_info", "_rng_state", "current_obs", "episode_start", "state", "episode_return", "episode_length")

    def snapshot(self) -> bytes:
        """The actor between two rollouts, pickled: its envs as they are, its random state, the
        observation it acts on next, its recurrent state and the episodes it is in the middle of.
        Raises whatever pickle raises for an env that cannot be pickled."""
        out = io.BytesIO()
        _StatePickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump({name: getattr(self, name) for name in self._STATE})
        return out.getvalue()

    def restore(self, snapshot: bytes) -> None:
        """Go on from `snapshot` (one of this actor's, from a run of the same config): the envs it
        built are closed and replaced by the saved ones. Its policy version is left unknown, so the
        next rollout loads the weights it is asked to collect with."""
        saved = pickle.loads(snapshot)
        self.envs.close()
        for name in self._STATE:
            setattr(self, name, saved[name])
        self.policy_version = -1

    def load_policy(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Adopt a new policy version (copying the weights into the local module)."""
        self.policy.load_state_dict(state_dict)
        self.policy_version = version
        if self.pool is not None:
            self.pool.offer(state_dict, version)

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
        n_steps = self.n_steps
        t_env = t_inference = t_record = 0.0
        # The record's rows, made once per rollout: the policy reads torch views of them; the env's
        # results go in through numpy views of the same memory (an assignment costs a fraction of a
        # tensor copy_, which an actor would pay a dozen times a step).
        obs_rows = {key: value.unbind(0) for key, value in out.observations.items()}
        obs_np = {key: value.numpy() for key, value in out.observations.items()}
        start_rows = out.episode_start.unbind(0)
        episode_start = out.episode_start.numpy()
        actions, logps = [], []
        rewards, terminated = out.rewards.numpy(), out.terminated.numpy()
        truncated, autoreset = out.truncated.numpy(), out.autoreset.numpy()
        env_rewards = rewards if self.reward_clip is None else np.empty_like(rewards)  # the stats keep the env's
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
        envs, state, episode_info, pool = self.envs, self.state, self.episode_info, self.pool
        if pool is not None:
            pool.next_rollout()
        pooled = None
        for t in range(n_steps):
            t0 = time.perf_counter()
            action, logp, state = policy.act({key: rows[t] for key, rows in obs_rows.items()}, state, start_rows[t])
            if pool is not None:  # the seats an earlier version plays: their moves, and no transitions to learn from
                pooled = pool.act({key: rows[t] for key, rows in obs_rows.items()}, start_rows[t], action)
            actions.append(action)
            logps.append(logp)
            t1 = time.perf_counter()
            step = envs.step(action.numpy())
            t2 = time.perf_counter()
            envs.write(step.observations, {key: value[t + 1] for key, value in obs_np.items()})
            env_rewards[t] = step.rewards
            terminated[t] = step.terminated
            truncated[t] = step.truncated
            autoreset[t] = step.autoreset if pooled is None else step.autoreset | pooled
            if self._resets_next_step:
                episode_start[t + 1] = step.autoreset
            else:
                np.logical_or(step.terminated, step.truncated, out=episode_start[t + 1])
                episode_start[t + 1] |= step.autoreset
            if step.infos or episode_info.holds_values:
                episode_info.observe(step.infos, terminated[t] | truncated[t], step.autoreset)
            for i, final_obs in step.final_observations.items():
                envs.writer.write_one(final_obs, i, {key: value[t] for key, value in out.final_observations.items()})
            t_inference += t1 - t0
            t_env += t2 - t1
            t_record += time.perf_counter() - t2
        t2 = time.perf_counter()
        out.actions.copy_(torch.stack(actions))  # (copy_: casts what a user's initial policy returns)
        out.behaviour_logp.copy_(torch.stack(logps))
        if self.reward_clip is not None:
            np.clip(env_rewards, -self.reward_clip, self.reward_clip, out=rewards)
        self._count_episodes(env_rewards, terminated | truncated, ~autoreset, info)
        info.episode_info, info.info_error = episode_info.take(), episode_info.error
        for key, value in self.current_obs.items():
            value.copy_(out.observations[key][n_steps])
        self.episode_start.copy_(out.episode_start[n_steps])
        self.state = state
        t_record += time.perf_counter() - t2
        info.timings = {"actor_env_step_s": t_env, "actor_inference_s": t_inference, "actor_record_s": t_record}
        return info

    def _count_episodes(self, rewards: np.ndarray, ended: np.ndarray, real: np.ndarray, info: RolloutInfo) -> None:
        """Add a rollout's steps `[T, B]` to the running episodes (autoreset steps are no part of one);
        report those that ended, in the order they ended, and restart them."""
        step_returns = np.cumsum(rewards * real, axis=0, dtype=np.float64)
        step_lengths = np.cumsum(real, axis=0, dtype=np.int64)
        # An episode's return is the cumulative sum where it ended less where it began; `base` holds
        # the latter per env (minus what it had gathered in earlier rollouts).
        base_return, base_length = -self.episode_return, -self.episode_length
        for t, i in np.argwhere(ended).tolist():
            info.episode_returns.append(float(step_returns[t, i] - base_return[i]))
            info.episode_lengths.append(int(step_lengths[t, i] - base_length[i]))
            base_return[i], base_length[i] = step_returns[t, i], step_lengths[t, i]
        self.episode_return = step_returns[-1] - base_return
        self.episode_length = step_lengths[-1] - base_length

    def close(self) -> None:
        self.envs.close()


class _StatePickler(pickle.Pickler):
    """Pickles an env with its state. gymnasium's EzPickle (MuJoCo, Box2D, Atari envs) pickles the
    arguments to build a fresh env, which would lose the episode under way: such an object is pickled
    with its attributes instead (an Atari env with its emulator's state), and one that holds something
    unpicklable (a Box2D world) fails here rather than come back as a new env."""

    def reducer_override(self, obj):
        if not isinstance(obj, EzPickle) or type(obj).__getstate__ is not EzPickle.__getstate__:
            return NotImplemented
        attributes = dict(obj.__dict__)
        emulator = attributes.pop("ale", None)
        if emulator is not None and hasattr(emulator, "cloneState"):  # an Atari env: the emulator's own state
            state = emulator.cloneState(include_rng=True)  # (with the RNG of its sticky actions)
            return _atari_env, (type(obj), obj._ezpickle_args, obj._ezpickle_kwargs, state, attributes)
        return _with_attributes, (type(obj), attributes)


def _with_attributes(cls: type, attributes: dict) -> object:
    obj = cls.__new__(cls)
    obj.__dict__.update(attributes)
    return obj


def _atari_env(cls: type, args: tuple, kwargs: dict, emulator_state, attributes: dict) -> object:
    """An Atari env built anew (its emulator loads the ROM), then put in the saved emulator state."""
    env = cls(*args, **kwargs)
    env.ale.restoreState(emulator_state)
    env.__dict__.update(attributes)
    return env
