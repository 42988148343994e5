"""Small real gymnasium envs for tests: exact, cheap, and with every space kind maze_cli supports."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """Observation = steps taken in the current episode; reward 1 per step; ends after `length` steps.

    Makes time order visible: along a rollout's time axis the count rises by one until a reset.
    `obs_kind`: 'box' or 'dict' (Box count + Discrete parity); `action_kind`: 'discrete',
    'multidiscrete' or 'box'. `truncate` ends episodes by truncation instead of termination.
    """

    def __init__(self, length: int = 5, obs_kind: str = "box", action_kind: str = "discrete", truncate: bool = False):
        self.length = length
        self.truncate = truncate
        self.obs_kind = obs_kind
        count_space = gym.spaces.Box(0.0, float(length), (1,), np.float32)
        if obs_kind == "dict":
            self.observation_space = gym.spaces.Dict({"count": count_space, "parity": gym.spaces.Discrete(2)})
        else:
            self.observation_space = count_space
        self.action_space = {
            "discrete": gym.spaces.Discrete(2),
            "multidiscrete": gym.spaces.MultiDiscrete([2, 3]),
            "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }[action_kind]
        self.count = 0

    def _obs(self):
        count = np.array([self.count], dtype=np.float32)
        if self.obs_kind == "dict":
            return {"count": count, "parity": self.count % 2}
        return count

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), f"bad action {action!r}"
        self.count += 1
        ended = self.count >= self.length
        return self._obs(), 1.0, ended and not self.truncate, ended and self.truncate, {}


class MissionEnv(CountingEnv):
    """CountingEnv's Dict observation with a text `mission` beside it, as MiniGrid's and BabyAI's have:
    a key no network reads, which `env.obs_keys` leaves out."""

    def __init__(self, **kwargs):
        super().__init__(obs_kind="dict", **kwargs)
        self.observation_space = gym.spaces.Dict({**self.observation_space.spaces, "mission": gym.spaces.Text(32)})

    def _obs(self):
        return {**super()._obs(), "mission": "count to the end"}


class SlowEnv(CountingEnv):
    """Fault injection: sleeps in every step when reset with one of `slow_seeds` (the env seeds of one actor)."""

    def __init__(self, slow_seeds: frozenset = frozenset(), **kwargs):
        super().__init__(**kwargs)
        self.slow_seeds = slow_seeds
        self.slow = False

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.slow = seed in self.slow_seeds
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.slow:
            time.sleep(0.01)
        return super().step(action)


class StepRaisingEnv(CountingEnv):
    """Fault injection: raises in `step` after `fail_after` steps in total."""

    def __init__(self, fail_after: int = 20, **kwargs):
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.total_steps = 0

    def step(self, action):
        self.total_steps += 1
        if self.total_steps > self.fail_after:
            raise RuntimeError("injected failure in step")
        return super().step(action)


class SelfKillingEnv(CountingEnv):
    """Fault injection: SIGKILLs its own process once, at step `kill_after`, unless `marker` exists
    (it creates the marker first, so a restarted process runs on)."""

    def __init__(self, marker: str, kill_after: int = 200, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker
        self.kill_after = kill_after
        self.total_steps = 0

    def step(self, action):
        import os
        import signal

        self.total_steps += 1
        if self.total_steps == self.kill_after and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class OutOfSpaceEnv(CountingEnv):
    """A wrong env: its observations lie outside its observation space."""

    def _obs(self):
        return np.array([-7.0], dtype=np.float32)


class FaultOnceEnv(CountingEnv):
    """Fault injection, once per marker file: at the `after`-th step (or reset) of one env instance
    it raises in `step`, raises in `reset`, SIGKILLs its own process, or hangs in `step`."""

    def __init__(self, marker: str, fault: str = "raise_step", after: int = 200, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.fault, self.after = marker, fault, after
        self.calls = 0

    def _maybe_fault(self, where: str) -> None:
        import os
        import signal
        import time

        if not self.fault.endswith(where) and not (where == "step" and self.fault in ("sigkill", "hang")):
            return
        self.calls += 1
        if self.calls != self.after:
            return
        try:  # claimed atomically: env instances in several actors reach `after` at the same moment
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected failure in {where}")

    def reset(self, *, seed=None, options=None):
        self._maybe_fault("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._maybe_fault("step")
        return super().step(action)


class LearnerSideFaultEnv(CountingEnv):
    """Fault injection for evaluation: raises in `step` in the main process (where the learner
    evaluates) once that process has stepped any instance `after` times; never in an actor's process."""

    steps_in_process = 0

    def __init__(self, after: int = 100, **kwargs):
        super().__init__(**kwargs)
        self.after = after

    def step(self, action):
        import multiprocessing

        if multiprocessing.parent_process() is None:
            LearnerSideFaultEnv.steps_in_process += 1
            if LearnerSideFaultEnv.steps_in_process > self.after:
                raise RuntimeError("injected failure in evaluation")
        return super().step(action)


class UnboundedActionEnv(CountingEnv):
    """Box actions without bounds (as some control envs declare them): SAC cannot scale to them."""

    def __init__(self, length: int = 5):
        super().__init__(length, action_kind="box")
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


class CueRecallEnv(gym.Env):
    """A memory task: step 0 shows one of two cues, then `delay` blank steps, then a query step where
    the action must name the cue (reward 1, else 0). Without memory the best is chance (0.5)."""

    def __init__(self, delay: int = 4):
        self.delay = delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)  # [cue 0, cue 1, query]
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, dtype=np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        if self.t == self.delay + 1:
            obs[2] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if self.t <= self.delay + 1:
            return self._obs(), 0.0, False, False, {}
        return np.zeros(3, dtype=np.float32), float(int(action) == self.cue), True, False, {}


class ImageEnv(gym.Env):
    """Pixels that say which action pays: a uint8 frame (HWC or CHW) whose left or right half is lit;
    action 0 pays for the left, 1 for the right. `with_vector` adds a Dict key beside the image."""

    def __init__(self, size: int = 12, layout: str = "hwc", dtype: str = "uint8", with_vector: bool = False, length: int = 8):
        shape = (size, size, 3) if layout == "hwc" else (3, size, size)
        high = 1 if dtype == "bool" else 255
        image = gym.spaces.Box(0, high, shape, np.dtype(dtype))
        self.observation_space = gym.spaces.Dict({"image": image, "vec": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}) if with_vector else image
        self.action_space = gym.spaces.Discrete(2)
        self.layout, self.size, self.high, self.with_vector, self.length = layout, size, high, with_vector, length
        self.dtype = np.dtype(dtype)

    def _obs(self):
        frame = np.zeros((self.size, self.size, 3), dtype=self.dtype)
        half = slice(0, self.size // 2) if self.side == 0 else slice(self.size // 2, self.size)
        frame[:, half, :] = self.high
        if self.layout == "chw":
            frame = frame.transpose(2, 0, 1).copy()
        return {"image": frame, "vec": np.zeros(2, np.float32)} if self.with_vector else frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.side = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, self.t >= self.length, False, {}


class InfoEnv(CountingEnv):
    """CountingEnv that reports in `info`: `distance` = the step count at every step (so an episode
    of `length` steps has last/max = length, min = 1, sum = length*(length+1)/2, mean = (length+1)/2),
    `label`, a text, and at each episode's end `is_success`, true for every other episode of each
    env (the first one succeeds): success rate 1/2 over an even number of episodes."""

    def __init__(self, length: int = 5, truncate: bool = False, **kwargs):
        super().__init__(length=length, truncate=truncate, **kwargs)
        self.episodes = 0

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        info = {"distance": float(self.count), "label": "far"}
        if terminated or truncated:
            info["is_success"] = self.episodes % 2 == 0
            self.episodes += 1
        return obs, reward, terminated, truncated, info


class ScaledReward(gym.RewardWrapper):
    """A wrapper of the user's own package (for `env.wrappers`): rewards times `scale`."""

    def __init__(self, env: gym.Env, scale: float = 1.0):
        super().__init__(env)
        self.scale = scale

    def reward(self, reward):
        return reward * self.scale


def signal_team_env(length: int = 8, n_agents: int = 2, leave_at: int | None = None, differing_spaces: bool = False,
                    opposite: bool = False, masked: bool = False):
    """A `SignalTeamEnv` (built by a function, so that pettingzoo is imported only where it is used)."""
    return _signal_team_class()(length, n_agents, leave_at, differing_spaces, opposite, masked)


def _signal_team_class():
    from pettingzoo import ParallelEnv

    class SignalTeamEnv(ParallelEnv):
        """A cooperative PettingZoo env: each step every agent sees a private random bit (one-hot) that only
        it sees, and the team earns 1/N for each agent whose action repeats its own bit; every agent gets
        the team's reward. A shared policy reaches a team return of `length` (each agent's return is the
        team's); random play gets half. `leave_at`: the last agent is done (terminated) after that many
        steps while the others play on; during those steps its observation's second entry is 5 (outside
        what a live agent sees), so a test can tell a finished agent's rows. `opposite`: the last agent
        earns by answering the opposite of its bit, which a policy that cannot tell the agents apart
        cannot learn for both. `masked`: PettingZoo's layout `{"observation", "action_mask"}`, the mask
        allowing only the action that earns, so a policy that honours it earns everything from the start.
        `differing_spaces`: agent_1 is of another kind: it sees its bit one-hot followed by a 1 (Box(3,)) and
        has three actions (the third never earns); an action outside an agent's own space is an error."""

        metadata = {"name": "signal_team_v0"}

        def __init__(self, length: int, n_agents: int, leave_at: int | None, differing_spaces: bool, opposite: bool,
                     masked: bool = False):
            self.length, self.leave_at, self.masked = length, leave_at, masked
            self.flipped = self.possible_agents_of(n_agents)[-1] if opposite else None
            self.possible_agents = self.possible_agents_of(n_agents)
            self._observation = {a: gym.spaces.Box(0.0, 5.0, (2 + (differing_spaces and i == 1),), np.float32)
                                 for i, a in enumerate(self.possible_agents)}
            self._rng = np.random.default_rng()

        @staticmethod
        def possible_agents_of(n_agents):
            return [f"agent_{i}" for i in range(n_agents)]

        def observation_space(self, agent):
            if self.masked:
                return gym.spaces.Dict({"observation": self._observation[agent], "action_mask": gym.spaces.Box(0, 1, (2,), np.int8)})
            return self._observation[agent]

        def action_space(self, agent):
            return gym.spaces.Discrete(3 if self._observation[agent].shape == (3,) else 2)

        def reset(self, seed=None, options=None):
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            self.agents = list(self.possible_agents)
            self.t = 0
            return self._with_masks(self._observe()), {a: {} for a in self.agents}

        def _with_masks(self, observations):
            if not self.masked:
                return observations
            right = {a: (self.bits[a] == 1) != (a == self.flipped) for a in observations}  # the action that earns
            return {a: {"observation": o, "action_mask": np.eye(2, dtype=np.int8)[int(right[a])]} for a, o in observations.items()}

        def _observe(self):
            self.bits = {a: int(self._rng.integers(2)) for a in self.agents}
            return {a: np.eye(2, dtype=np.float32)[self.bits[a]] if self._observation[a].shape == (2,)
                    else np.array([*np.eye(2, dtype=np.float32)[self.bits[a]], 1.0], np.float32) for a in self.agents}

        def step(self, actions):
            if set(actions) != set(self.agents):
                raise ValueError(f"actions for {sorted(actions)}, but the agents are {sorted(self.agents)}")
            for a, action in actions.items():
                if not self.action_space(a).contains(action):
                    raise ValueError(f"agent {a}'s action {action!r} is not in its space {self.action_space(a)}")
            team = sum(float((actions[a] == self.bits[a]) != (a == self.flipped)) for a in self.agents) / len(self.possible_agents)
            self.t += 1
            leaving = self.possible_agents[-1] if self.leave_at is not None and self.t == self.leave_at else None
            terminated = {a: self.t >= self.length or a == leaving for a in self.agents}
            observations = self._observe()
            if leaving is not None:  # the value a finished agent's rows keep: no live agent ever sees it
                observations[leaving] = np.array([0.0, 5.0, 1.0][:self._observation[leaving].shape[0]], np.float32)
            observations = self._with_masks(observations)
            rewards = {a: team for a in self.agents}
            truncated = {a: False for a in self.agents}
            infos = {a: {} for a in self.agents}
            self.agents = [a for a in self.agents if not terminated[a]]
            return observations, rewards, terminated, truncated, infos

    return SignalTeamEnv


class UnpicklableEnv(CountingEnv):
    """A CountingEnv holding a lock, as envs holding a simulator's handle do: pickle refuses it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        import threading

        self.lock = threading.Lock()


def flat_tictactoe():
    """Tic-tac-toe whose observation is a flat vector (18 entries) beside its action mask: a turn-based game
    whose observations are not a board, as a card game's are not."""
    from pettingzoo.classic import tictactoe_v3
    from pettingzoo.utils.wrappers import BaseWrapper

    class FlatObservation(BaseWrapper):
        def observation_space(self, agent):
            space = self.env.observation_space(agent)
            return gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (18,), np.int8), "action_mask": space["action_mask"]})

        def observe(self, agent):
            observation = self.env.observe(agent)
            return {"observation": observation["observation"].reshape(-1), "action_mask": observation["action_mask"]}

    return FlatObservation(tictactoe_v3.env())


class OffsetSteerEnv(gym.Env):
    """Box actions whose range, [0, 10], is wide and not centred on 0: steer a point on a line to a goal,
    the action a velocity with 5 standing still, 0 and 10 full speed either way. Reward: minus the distance
    after the move, every step, for 20 steps. A policy acting around 0 only ever drives left."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)  # [position, goal]
        self.action_space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.goal], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.goal = self.np_random.uniform(-1.0, 1.0, 2)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        velocity = 0.2 * (float(np.clip(action[0], 0.0, 10.0)) / 5.0 - 1.0)
        self.position = float(np.clip(self.position + velocity, -1.0, 1.0))
        self.t += 1
        return self._obs(), -abs(self.position - self.goal), False, self.t >= 20, {}
