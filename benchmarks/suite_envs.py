"""Envs of the defaults suites that no package ships: a goal-reaching task with Dict observations, a point to
steer with Box actions, a craft to land with discrete thrusters, a memory task, and (held-out suite) CartPole
with its velocities hidden.

GoalGrid is what many real tasks look like to a policy: several named inputs (where I am, where I
must go), a sparse-ish objective, short episodes. A policy that reads both inputs walks the shortest
path; one that ignores the goal wanders until the episode is truncated.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class GoalGrid(gym.Env):
    """Walk on a `size` x `size` grid to a goal; -1 per step, the episode ends at the goal.

    Observation: Dict(agent: Box(2,), goal: Box(2,)), coordinates scaled to [0, 1].
    Actions: Discrete(4) (up, down, left, right; a move into the wall stays put).
    Start and goal are drawn uniformly (distinct) at reset. Truncated after `max_steps`.
    The best policy's mean return is minus the mean Manhattan distance: `optimal_return(size)`.
    """

    metadata = {"render_modes": []}
    MOVES = np.array([(0, 1), (0, -1), (-1, 0), (1, 0)])

    def __init__(self, size: int = 7, max_steps: int = 50):
        self.size, self.max_steps = size, max_steps
        cell = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"agent": cell, "goal": cell})
        self.action_space = gym.spaces.Discrete(4)
        self._agent = self._goal = np.zeros(2, np.int64)
        self._steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        scale = np.float32(self.size - 1)
        return {"agent": self._agent.astype(np.float32) / scale, "goal": self._goal.astype(np.float32) / scale}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size * self.size, size=2, replace=False)
        self._agent = np.array(divmod(int(cells[0]), self.size))
        self._goal = np.array(divmod(int(cells[1]), self.size))
        self._steps = 0
        return self._obs(), {}

    def step(self, action):
        self._agent = np.clip(self._agent + self.MOVES[int(action)], 0, self.size - 1)
        self._steps += 1
        reached = bool((self._agent == self._goal).all())
        return self._obs(), -1.0, reached, self._steps >= self.max_steps and not reached, {}


def optimal_return(size: int = 7) -> float:
    """Mean return of the shortest-path policy: minus the mean Manhattan distance of two distinct cells."""
    coords = np.array([divmod(c, size) for c in range(size * size)])
    dist = np.abs(coords[:, None, :] - coords[None, :, :]).sum(-1)
    return -float(dist.sum() / (size * size * (size * size - 1)))


class PointReach(gym.Env):
    """Steer a point to a goal in the plane with continuous actions; the Box-action env of the suite.

    Observation: Box(4,) (position x, y and goal x, y, each in [-1, 1]). Action: Box(2,) in [-1, 1],
    a velocity: the point moves by `speed * action` (clipped to the square). Reward: minus the distance
    to the goal after the move, every step; no early end, truncated after `max_steps`, so a policy's
    return measures how fast it gets there and how well it stays. Start and goal are uniform.
    `action_range=(low, high)` gives the action another range, mapped linearly onto [-1, 1] (its middle
    stands still): the kind of Box whose range is wide and not centred on 0.
    """

    metadata = {"render_modes": []}

    def __init__(self, speed: float = 0.1, max_steps: int = 40, action_range: tuple[float, float] = (-1.0, 1.0)):
        self.speed, self.max_steps = speed, max_steps
        self.low, self.high = float(action_range[0]), float(action_range[1])
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Box(self.low, self.high, (2,), np.float32)
        self._position = self._goal = np.zeros(2)
        self._steps = 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self._position, self._goal]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._position, self._goal = self.np_random.uniform(-1.0, 1.0, (2, 2))
        self._steps = 0
        return self._obs(), {}

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float64), self.low, self.high)
        move = self.speed * (2.0 * (action - self.low) / (self.high - self.low) - 1.0)
        self._position = np.clip(self._position + move, -1.0, 1.0)
        self._steps += 1
        distance = float(np.linalg.norm(self._position - self._goal))
        return self._obs(), -distance, False, self._steps >= self.max_steps, {}


def mean_return(env: gym.Env, act, episodes: int, seed: int) -> float:
    """Mean return of the policy `act(observation) -> action` on `env` over `episodes` episodes seeded
    seed, seed + 1, ...: the scale a suite target is read against."""
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
    return total / episodes


def reach_optimal_return(episodes: int = 2000, seed: int = 0) -> float:
    """Mean return of the best policy on PointReach (full speed along the sign of the offset, no
    overshoot), estimated over `episodes` seeded episodes."""
    env = PointReach()
    return mean_return(env, lambda obs: np.clip((obs[2:] - obs[:2]) / env.speed, -1.0, 1.0), episodes, seed)


class Lander(gym.Env):
    """Land a point craft on a pad with discrete thrusters: long episodes, a shaped reward and a large
    reward at the end, the kind of control task LunarLander is (a development task of that kind, so that
    LunarLander itself stays held out).

    Observation: Box(4,) (position x, y and velocity vx, vy; the pad at the origin). Actions: Discrete(4):
    nothing, the main engine (up), the left or the right engine (a push to the right or to the left).
    Gravity pulls down. Reward: the change of a potential that grows as the craft nears the pad and slows
    down, minus fuel (the main engine 10 times a side one's); touching the ground ends the episode
    with +100 if the craft is on the pad and slow, -100 otherwise; leaving the area ends it with -100;
    truncated after `max_steps`. Starts high above the pad, off to a side, drifting."""

    metadata = {"render_modes": []}
    DT, GRAVITY, MAIN, SIDE = 0.02, 1.0, 2.0, 1.0  # seconds a step; accelerations in units/s^2
    FUEL = 0.12  # the main engine's cost a step (a side engine's: a tenth of it)
    PAD, SAFE_SPEED = 0.25, 0.5  # half-width of the pad; the fastest landing (each velocity component) that is not a crash
    WIDTH, CEILING = 1.5, 2.5  # the area: |x| <= WIDTH, y <= CEILING

    def __init__(self, max_steps: int = 1000):
        self.max_steps = max_steps
        self.observation_space = gym.spaces.Box(np.array([-self.WIDTH, -0.5, -5.0, -5.0], np.float32),
                                                np.array([self.WIDTH, self.CEILING, 5.0, 5.0], np.float32))
        self.action_space = gym.spaces.Discrete(4)
        self._state = np.zeros(4)
        self._steps = 0

    def _potential(self) -> float:
        x, y, vx, vy = self._state[:4]
        return -100.0 * float(np.hypot(x, y)) - 100.0 * float(np.hypot(vx, vy))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._state = self._start_state()
        self._steps = 0
        return self._obs(), {}

    def _start_state(self) -> np.ndarray:
        r = self.np_random
        return np.array([r.uniform(-0.8, 0.8), r.uniform(1.2, 1.6), r.uniform(-0.3, 0.3), r.uniform(-0.2, 0.0)])

    def _obs(self) -> np.ndarray:
        return np.clip(self._state, self.observation_space.low, self.observation_space.high).astype(np.float32)

    def step(self, action):
        action = int(action)
        before = self._potential()
        ax = {2: self.SIDE, 3: -self.SIDE}.get(action, 0.0)
        ay = -self.GRAVITY + (self.MAIN if action == 1 else 0.0)
        x, y, vx, vy = self._state
        vx, vy = vx + ax * self.DT, vy + ay * self.DT
        x, y = x + vx * self.DT, y + vy * self.DT
        self._state = np.array([x, y, vx, vy])
        self._steps += 1
        reward = self._potential() - before - self.FUEL * (1.0 if action == 1 else 0.1 if action in (2, 3) else 0.0)
        terminated = False
        if y <= 0.0:
            landed = abs(x) <= self.PAD and abs(vx) <= self.SAFE_SPEED and abs(vy) <= self.SAFE_SPEED
            reward, terminated = reward + (100.0 if landed else -100.0), True
        elif abs(x) > self.WIDTH or y > self.CEILING:
            reward, terminated = reward - 100.0, True
        return self._obs(), reward, terminated, self._steps >= self.max_steps, {}


def lander_controller(obs: np.ndarray) -> int:
    """A hand-made pilot for Lander: over the pad, brake to a slow descent; else drift towards it."""
    x, y, vx, vy = (float(v) for v in obs)
    if vy < -(0.2 + 0.6 * y):
        return 1
    want_vx = -0.8 * x
    if vx < want_vx - 0.1:
        return 2
    if vx > want_vx + 0.1:
        return 3
    return 0


def lander_controller_return(episodes: int = 1000, seed: int = 0) -> float:
    """Mean return of `lander_controller` on Lander over `episodes` seeded episodes: what a simple sound
    policy scores."""
    return mean_return(Lander(), lander_controller, episodes, seed)


class TiltLander(Lander):
    """Lander with an attitude to keep: the craft tilts, its main engine pushes along its own axis, and
    a side engine turns it (and pushes it a little sideways), as LunarLander's do. To move sideways the
    craft must tilt and fire, then right itself before touching down: a longer chain of actions than
    Lander's, where a policy that has learned to land can unlearn it.

    Observation: Box(6,): Lander's four and the tilt (radians, 0 upright) and its rate. Actions as
    Lander's; action 2 turns the craft counter-clockwise (and pushes it right), 3 clockwise (and left).
    Reward: Lander's, the potential also falling with the tilt; a landing counts only upright
    (|tilt| <= TILT_SAFE)."""

    TORQUE, PUSH = 3.0, 0.3  # a side engine's angular acceleration (rad/s^2) and sideways push (units/s^2)
    TILT_SAFE = 0.3

    def __init__(self, max_steps: int = 1000):
        super().__init__(max_steps)
        high = np.array([self.WIDTH, self.CEILING, 5.0, 5.0, np.pi, 5.0], np.float32)
        low = np.array([-self.WIDTH, -0.5, -5.0, -5.0, -np.pi, -5.0], np.float32)
        self.observation_space = gym.spaces.Box(low, high)
        self._state = np.zeros(6)

    def _potential(self) -> float:
        return super()._potential() - 100.0 * abs(float(self._state[4]))

    def _start_state(self) -> np.ndarray:
        return np.concatenate([super()._start_state(), self.np_random.uniform(-0.2, 0.2, 2)])

    def step(self, action):
        action = int(action)
        before = self._potential()
        x, y, vx, vy, tilt, rate = self._state
        main = self.MAIN if action == 1 else 0.0
        side = {2: 1.0, 3: -1.0}.get(action, 0.0)
        rate += side * self.TORQUE * self.DT
        vx += (-np.sin(tilt) * main + side * self.PUSH) * self.DT
        vy += (-self.GRAVITY + np.cos(tilt) * main) * self.DT
        x, y = x + vx * self.DT, y + vy * self.DT
        tilt = (tilt + rate * self.DT + np.pi) % (2 * np.pi) - np.pi
        self._state = np.array([x, y, vx, vy, tilt, rate])
        self._steps += 1
        reward = self._potential() - before - self.FUEL * (1.0 if action == 1 else 0.1 if side else 0.0)
        terminated = False
        if y <= 0.0:
            landed = (abs(x) <= self.PAD and abs(vx) <= self.SAFE_SPEED and abs(vy) <= self.SAFE_SPEED
                      and abs(tilt) <= self.TILT_SAFE)
            reward, terminated = reward + (100.0 if landed else -100.0), True
        elif abs(x) > self.WIDTH or y > self.CEILING:
            reward, terminated = reward - 100.0, True
        return self._obs(), reward, terminated, self._steps >= self.max_steps, {}


def tilt_lander_pilot(obs: np.ndarray) -> int:
    """A hand-made pilot for TiltLander: brake a fast descent; else tilt towards the speed that drifts
    to the pad (a PD law on the tilt). It lands about 9 episodes in 10."""
    x, y, vx, vy, tilt, rate = (float(v) for v in obs)
    if vy < -(0.2 + 0.6 * y) and abs(tilt) < 0.6:
        return 1
    target = float(np.clip(-0.6 * (-0.8 * x - vx), -0.25, 0.25))
    turn = 4.0 * (target - tilt) - 1.0 * rate
    return 2 if turn > 0.15 else 3 if turn < -0.15 else 0


class RepeatFirst(gym.Env):
    """A memory task (POPGym's RepeatFirst, shortened): each step shows one of `n_symbols` symbols,
    one-hot, drawn at random; after `length` steps the action must name the first one (reward 1,
    else 0). Only a policy that keeps the first symbol in memory beats chance (1 / n_symbols): the
    suite runs it with `policy.core=lstm`. A step's action before the query does not matter.

    `paced`: the agent has something else to do in between, and its answers are actions of their own.
    Actions: 0 moves on to the next symbol (and at the query stays there), 1..n_symbols answer; an
    action that does not move on before the query stays, shows a fresh symbol and costs 0.01, as does
    action 0 at the query, and the episode is truncated after 4 x `length` steps. A policy learns to
    move on first, and must then learn which answer the first symbol calls for."""

    metadata = {"render_modes": []}

    def __init__(self, n_symbols: int = 4, length: int = 8, paced: bool = False):
        self.n_symbols, self.length, self.paced = n_symbols, length, paced
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n_symbols + 1,), np.float32)  # symbol one-hot, query flag
        self.action_space = gym.spaces.Discrete(n_symbols + 1 if paced else n_symbols)
        self._first, self._t, self._steps = 0, 0, 0

    def _obs(self, symbol: int) -> np.ndarray:
        obs = np.zeros(self.n_symbols + 1, np.float32)
        obs[symbol] = 1.0
        obs[-1] = float(self._t == self.length - 1)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = self._steps = 0
        self._first = int(self.np_random.integers(self.n_symbols))
        return self._obs(self._first), {}

    def step(self, action):
        action, at_query = int(action), self._t == self.length - 1
        answer = action - 1 if self.paced else action
        if at_query and (not self.paced or action > 0):
            return np.zeros(self.n_symbols + 1, np.float32), float(answer == self._first), True, False, {}
        self._steps += 1
        symbol = int(self.np_random.integers(self.n_symbols))
        if self.paced and (action > 0 or at_query):
            return self._obs(symbol), -0.01, False, self._steps >= 4 * self.length, {}
        self._t += 1
        return self._obs(symbol), 0.0, False, False, {}


class HideVelocities(gym.ObservationWrapper):
    """CartPole with its velocities hidden (POPGym's StatelessCartPole): the policy sees the cart's position and
    the pole's angle only, so it must infer both velocities from what it saw before, a memory task of the
    held-out suite (`policy.core=lstm`)."""

    KEEP = (0, 2)  # cart position, pole angle

    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[list(self.KEEP)], box.high[list(self.KEEP)], dtype=box.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[list(self.KEEP)]


class Hover(gym.Env):
    """Hold a point mass at a target in 3-D with continuous thrust: a dense-reward Box task of a few dims with
    second-order dynamics (actions set accelerations, not positions), a held-out task of the level suite.

    Observation: Box(9,) (position, velocity, target; all three in the unit cube's scale). Action: Box(3,) in
    [-1, 1], an acceleration per axis. Reward: minus the distance to the target, minus a small cost of thrust,
    every step; truncated after `max_steps`. Start, initial velocity and target are random."""

    metadata = {"render_modes": []}
    DT, THRUST, DRAG, COST = 0.05, 4.0, 0.5, 0.05

    def __init__(self, max_steps: int = 100):
        self.max_steps = max_steps
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (9,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self._position = self._velocity = self._target = np.zeros(3)
        self._steps = 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self._position, self._velocity, self._target]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        r = self.np_random
        self._position, self._target = r.uniform(-1.0, 1.0, (2, 3))
        self._velocity = r.uniform(-0.5, 0.5, 3)
        self._steps = 0
        return self._obs(), {}

    def step(self, action):
        thrust = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self._velocity = self._velocity + (self.THRUST * thrust - self.DRAG * self._velocity) * self.DT
        self._position = self._position + self._velocity * self.DT
        self._steps += 1
        distance = float(np.linalg.norm(self._position - self._target))
        reward = -distance - self.COST * float(np.square(thrust).sum())
        return self._obs(), reward, False, self._steps >= self.max_steps, {}


def hover_controller(obs: np.ndarray) -> np.ndarray:
    """A hand-tuned PD controller for Hover: thrust towards the target, damped by the velocity."""
    position, velocity, target = obs[:3], obs[3:6], obs[6:]
    return np.clip(3.0 * (target - position) - 1.5 * velocity, -1.0, 1.0)


class CueCorridor(gym.Env):
    """A memory task with something to do in between (a T-maze, as in Bakker 2002): the first step shows
    one of `n_cues` cues; then the agent walks a corridor of `length` cells, seeing only where it is not
    yet at the end; at the end it picks an exit, and the right one is the cue's (reward 1, else 0). A step
    that does not walk on costs 0.01, and the episode is truncated after 4 x `length` steps. Without memory
    the best is 1 / n_cues.

    Observation: Box(n_cues + 1,): the cue one-hot (first step only), and 1 at the corridor's end.
    Actions: Discrete(n_cues + 1): walk on, or exit k (only at the end; elsewhere it stands still)."""

    metadata = {"render_modes": []}

    def __init__(self, n_cues: int = 2, length: int = 10):
        self.n_cues, self.length = n_cues, length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n_cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(n_cues + 1)
        self._cue = self._cell = self._steps = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.n_cues + 1, np.float32)
        if self._steps == 0:
            obs[self._cue] = 1.0
        obs[-1] = float(self._cell == self.length)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._cue, self._cell, self._steps = int(self.np_random.integers(self.n_cues)), 0, 0
        return self._obs(), {}

    def step(self, action):
        action = int(action)
        self._steps += 1
        truncated = self._steps >= 4 * self.length
        if self._cell == self.length and action > 0:
            return self._obs(), float(action - 1 == self._cue), True, False, {}
        if action == 0 and self._cell < self.length:
            self._cell += 1
            return self._obs(), 0.0, False, truncated, {}
        return self._obs(), -0.01, False, truncated, {}
