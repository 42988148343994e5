"""Stable-Baselines3 on the same tasks and stopping rules as maze_cli's time-to-solve runs.

    python benchmarks/sb3_baseline.py ppo --seed 1   # PPO, rl-zoo CartPole-v1 settings, to a 100-episode mean of 475
    python benchmarks/sb3_baseline.py sac --seed 1   # SAC, rl-zoo Pendulum-v1 settings, to a 10-episode mean of -200

An optional benchmark dependency (pip install 'maze_cli[bench]'), never a runtime one. Prints one
JSON line: solved, env steps, training seconds. Whole-process time is measured by the caller.
"""

from __future__ import annotations

import argparse
import json
import time

TASKS = {
    # rl-zoo hyperparams/ppo.yml, CartPole-v1
    "ppo": dict(env="CartPole-v1", target=475.0, window=100, max_steps=500_000),
    # rl-zoo hyperparams/sac.yml, Pendulum-v1
    "sac": dict(env="Pendulum-v1", target=-200.0, window=10, max_steps=100_000),
}


def make_model(algo: str, seed: int):
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env

    def linear(start: float):
        return lambda progress: progress * start

    if algo == "ppo":
        env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
        return PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                   learning_rate=linear(0.001), clip_range=linear(0.2), seed=seed, device="cpu")
    return SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, use_sde=True, seed=seed, device="cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo", choices=sorted(TASKS))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    from stable_baselines3.common.callbacks import BaseCallback

    task = TASKS[args.algo]

    class StopAtTarget(BaseCallback):
        """Stop once the mean return of the last `window` finished episodes reaches the target."""

        solved = False

        def _on_step(self) -> bool:
            episodes = [info["r"] for info in self.model.ep_info_buffer][-task["window"]:]
            if len(episodes) >= task["window"] and sum(episodes) / len(episodes) >= task["target"]:
                StopAtTarget.solved = True
                return False
            return True

    start = time.perf_counter()
    model = make_model(args.algo, args.seed)
    model.learn(total_timesteps=task["max_steps"], callback=StopAtTarget())
    print(json.dumps({"solved": StopAtTarget.solved, "env_steps": int(model.num_timesteps),
                      "train_s": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
