"""The return of uniform random play on MPE's simple_spread (3 agents, 25 steps): the floor that a
trained policy's return in benchmarks/MULTIAGENT.md is read against; and the returns of two scripted
policies that read where a learned one stands:

- `nearest`: each agent steers to the landmark nearest to it (agents may share a landmark);
- `own`: agent k steers to landmark k (every landmark covered, by a fixed, not the best, assignment).

    python benchmarks/multiagent_random.py
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from mpe2 import simple_spread_v3

NO_OP, LEFT, RIGHT, DOWN, UP = range(5)


def steer(observation: np.ndarray, landmark: int) -> int:
    """The discrete action that pushes an agent toward `landmark` (its velocity damped), from its own
    observation: [self_vel (2), self_pos (2), landmark_rel_positions (2 each), ...]."""
    velocity = observation[0:2]
    target = observation[4 + 2 * landmark: 6 + 2 * landmark]
    if np.linalg.norm(target) < 0.03 and np.linalg.norm(velocity) < 0.05:
        return NO_OP
    want = target - 0.5 * velocity
    if abs(want[0]) > abs(want[1]):
        return RIGHT if want[0] > 0 else LEFT
    return UP if want[1] > 0 else DOWN


def nearest(observation: np.ndarray, k: int, rng: np.random.Generator) -> int:
    landmarks = observation[4:10].reshape(3, 2)
    return steer(observation, int(np.argmin(np.linalg.norm(landmarks, axis=1))))


def own(observation: np.ndarray, k: int, rng: np.random.Generator) -> int:
    return steer(observation, k)


def uniform(observation: np.ndarray, k: int, rng: np.random.Generator) -> int:
    return int(rng.integers(5))


def play(policy: Callable[[np.ndarray, int, np.random.Generator], int], episodes: int) -> list[float]:
    """Each episode's return per agent (the mean of the agents' returns), env seeds 0..episodes-1."""
    returns = []
    for seed in range(episodes):
        env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
        observations, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        total = {agent: 0.0 for agent in env.possible_agents}
        while env.agents:
            actions = {agent: policy(observations[agent], k, rng) for k, agent in enumerate(env.agents)}
            observations, rewards, _, _, _ = env.step(actions)
            for agent, reward in rewards.items():
                total[agent] += reward
        returns.append(float(np.mean(list(total.values()))))
        env.close()
    return returns


def main(episodes: int = 100) -> None:
    for name, policy in (("random play", uniform), ("nearest landmark", nearest), ("landmark k for agent k", own)):
        returns = play(policy, episodes)
        mean = float(np.mean(returns))
        print(f"{name}, {episodes} episodes: per-agent return {mean:.1f} +- {np.std(returns):.1f}, team return {3 * mean:.1f}")


if __name__ == "__main__":
    main()
