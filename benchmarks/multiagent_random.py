"""The return of uniform random play on MPE's simple_spread (3 agents, 25 steps): the floor that a
trained policy's return in benchmarks/MULTIAGENT.md is read against.

    python benchmarks/multiagent_random.py
"""

from __future__ import annotations

import numpy as np
from mpe2 import simple_spread_v3


def main(episodes: int = 100) -> None:
    returns = []
    for seed in range(episodes):
        env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        total = {agent: 0.0 for agent in env.possible_agents}
        while env.agents:
            _, rewards, _, _, _ = env.step({agent: int(rng.integers(5)) for agent in env.agents})
            for agent, reward in rewards.items():
                total[agent] += reward
        returns.append(np.mean(list(total.values())))
        env.close()
    mean = float(np.mean(returns))
    print(f"random play, {episodes} episodes: per-agent return {mean:.1f} +- {np.std(returns):.1f}, team return {3 * mean:.1f}")


if __name__ == "__main__":
    main()
