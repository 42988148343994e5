"""Stable-Baselines3 on the same tasks and stopping rules as maze_cli's time-to-solve runs.

    python benchmarks/sb3_baseline.py ppo --seed 1            # PPO, rl-zoo CartPole-v1 settings, to a 100-episode mean of 475
    python benchmarks/sb3_baseline.py ppo-acrobot --seed 1    # PPO, rl-zoo Acrobot-v1 settings, to a 100-episode mean of -100
    python benchmarks/sb3_baseline.py ppo-pendulum --seed 1   # PPO, rl-zoo Pendulum-v1 settings, to a 10-episode mean of -200
    python benchmarks/sb3_baseline.py sac --seed 1            # SAC, rl-zoo Pendulum-v1 settings, to a 10-episode mean of -200
    python benchmarks/sb3_baseline.py dqn --seed 1 --eval-every 1024           # DQN, rl-zoo CartPole-v1 settings
    python benchmarks/sb3_baseline.py dqn-acrobot --seed 1 --eval-every 1024   # DQN, rl-zoo Acrobot-v1 settings

Hyperparameters are rl-baselines3-zoo's (hyperparams/ppo.yml, sac.yml, dqn.yml). PPO runs for the zoo's
n_timesteps, because its linear schedules anneal over exactly that many steps, and stops early once
the mean return of the last `window` finished training episodes reaches the target (no separate
evaluation), the rule maze_cli's `eval.interval=0 target_window=<window>` applies; or, with
`--eval-every N`, once a deterministic evaluation on maze_cli's eval seeds reaches it (maze_cli's
default rule: it evaluates once an epoch, so N is the env steps of one of its epochs). `--max-s` bounds
the training time. An optional benchmark dependency (pip install 'maze_cli[bench]'), never a runtime
one. Prints one JSON line: solved, env steps, training seconds. Whole-process time is measured by the caller.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable


def linear(start: float) -> Callable[[float], float]:
    """rl-zoo's `lin_<start>`: SB3 passes the remaining progress, 1 at the start, 0 at total_timesteps."""
    return lambda progress: progress * start


# target and window: the stopping rule; total_timesteps: the zoo's n_timesteps for PPO (its schedules
# depend on it), a budget only for SAC; n_envs, normalize (VecNormalize on observations and rewards)
# and hyperparams: the zoo's, per env.
TASKS: dict[str, dict[str, Any]] = {
    "ppo": dict(algo="ppo", env="CartPole-v1", target=475.0, window=100, total_timesteps=100_000, n_envs=8, normalize=False,
                hyperparams=dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                                 learning_rate=linear(0.001), clip_range=linear(0.2))),
    "ppo-acrobot": dict(algo="ppo", env="Acrobot-v1", target=-100.0, window=100, total_timesteps=1_000_000, n_envs=16,
                        normalize=True, hyperparams=dict(n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0)),
    "ppo-pendulum": dict(algo="ppo", env="Pendulum-v1", target=-200.0, window=10, total_timesteps=100_000, n_envs=4,
                         normalize=False, hyperparams=dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                                                           learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4)),
    "sac": dict(algo="sac", env="Pendulum-v1", target=-200.0, window=10, total_timesteps=100_000, n_envs=1, normalize=False,
                hyperparams=dict(learning_rate=1e-3, use_sde=True)),
}
# DQN: rl-zoo's exploration schedules run over n_timesteps (exploration_fraction of it)
TASKS["dqn"] = dict(algo="dqn", env="CartPole-v1", target=475.0, window=100, total_timesteps=50_000, n_envs=1, normalize=False,
                    hyperparams=dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                                     target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                                     exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256])))
TASKS["dqn-acrobot"] = dict(algo="dqn", env="Acrobot-v1", target=-100.0, window=100, total_timesteps=100_000, n_envs=1,
                            normalize=False,
                            hyperparams=dict(learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0, gamma=0.99,
                                             target_update_interval=250, train_freq=4, gradient_steps=-1, exploration_fraction=0.12,
                                             exploration_final_eps=0.1, policy_kwargs=dict(net_arch=[256, 256])))
TASKS["ppo-cartpole"] = TASKS["ppo"]


def make_model(name: str, seed: int):
    from stable_baselines3 import DQN, PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    task = TASKS[name]
    # Monitor sits under VecNormalize, so the episode returns the stopping rule reads stay unnormalized.
    env = make_vec_env(task["env"], n_envs=task["n_envs"], seed=seed)
    if task["normalize"]:
        env = VecNormalize(env, gamma=task["hyperparams"].get("gamma", 0.99))
    algo = {"ppo": PPO, "sac": SAC, "dqn": DQN}[task["algo"]]
    return algo("MlpPolicy", env, seed=seed, device="cpu", **task["hyperparams"])


def evaluate(model, env_id: str, seed: int, episodes: int) -> float:
    """Mean return of `episodes` deterministic episodes on the env seeds maze_cli's evaluation uses for
    this master seed (maze_cli.seeding), one after another in one env, as maze_cli's rule b judges."""
    import gymnasium as gym

    from maze_cli.seeding import derive_seeds

    normalizer = model.get_vec_normalize_env()
    env, returns = gym.make(env_id), []
    for env_seed in derive_seeds(seed, "eval_env", episodes):
        obs, _ = env.reset(seed=env_seed)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(normalizer.normalize_obs(obs) if normalizer else obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return sum(returns) / len(returns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-s", type=float, help="stop, unsolved, after this many seconds of training")
    parser.add_argument("--total-timesteps", type=int, help="override the task's total (a quick check; changes the schedules)")
    parser.add_argument("--eval-every", type=int, help="judge by evaluation instead (maze_cli's default rule): every this many env "
                        "steps, --eval-episodes deterministic episodes on maze_cli's eval seeds for --seed")
    parser.add_argument("--eval-episodes", type=int, default=10)
    args = parser.parse_args()
    from stable_baselines3.common.callbacks import BaseCallback

    task = TASKS[args.task]
    start = time.perf_counter()

    class StopAtTarget(BaseCallback):
        """Stop once the mean return of the last `window` finished episodes reaches the target, or at --max-s."""

        solved = False

        evaluations = 0

        def _on_step(self) -> bool:
            if args.eval_every:
                if self.model.num_timesteps // args.eval_every > StopAtTarget.evaluations:
                    StopAtTarget.evaluations += 1
                    if evaluate(self.model, task["env"], args.seed, args.eval_episodes) >= task["target"]:
                        StopAtTarget.solved = True
                        return False
            else:
                episodes = [info["r"] for info in self.model.ep_info_buffer][-task["window"]:]
                if len(episodes) >= task["window"] and sum(episodes) / len(episodes) >= task["target"]:
                    StopAtTarget.solved = True
                    return False
            return args.max_s is None or time.perf_counter() - start < args.max_s

    model = make_model(args.task, args.seed)
    model.learn(total_timesteps=args.total_timesteps or task["total_timesteps"], callback=StopAtTarget())
    print(json.dumps({"solved": StopAtTarget.solved, "env_steps": int(model.num_timesteps),
                      "train_s": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
