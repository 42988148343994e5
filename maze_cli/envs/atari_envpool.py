"""`env.backend=envpool` for `+env=atari`: an actor's batch of Atari envs as one envpool vector env.

envpool (https://github.com/sail-sg/envpool) steps its envs in C++ threads with the preprocessing
of `maze_cli.envs.atari` built in. Every envpool setting is given explicitly (its defaults differ:
fire at reset, 30 no-ops, no sticky actions), so that its observations are those of the gymnasium
path: with sticky actions off and `noop_max=1` both give the same frames bit for bit, except the
newest frame of a step whose frame skip the end of a game cut short (gymnasium max-pools it with an
older frame, envpool does not), and the same rewards and episode ends. Where they differ:

- `noop_max=0` is refused: envpool always takes 1 to `noop_max` no-op frames after a reset.
- `episodic_life=true`: after a lost life envpool goes on with the same game (DeepMind's
  EpisodicLifeEnv), gymnasium's AtariPreprocessing starts a new game.
- the time limit counts agent steps from the game's start in envpool, and frames including the
  no-op frames in gymnasium (ALE-v5's limit of 108,000 frames): episodes may end a few steps apart.
- the random streams (no-op counts, sticky actions) are envpool's own: the same seed gives other
  episodes than the gymnasium path, though ones from the same distribution.

Evaluation and `rollout` keep using one gymnasium env (`maze_cli.envs.atari.make_atari`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np

from maze_cli.errors import ConfigError
from maze_cli.seeding import derive_seeds

INSTALL = "pip install 'maze_cli[envpool]' (envpool 1.2 needs Python >= 3.11)"
ALE_V5_MAX_FRAMES = 108_000  # ale_py registers every ALE/<Game>-v5 with max_num_frames_per_episode=108000
# Arguments of ALE's env (`env.<key>`, passed on by make_atari) that envpool has too; any other is refused.
GAME_ARGUMENTS = ("full_action_space", "mode", "difficulty", "max_num_frames_per_episode")


def task_id(env_id: str) -> str:
    """envpool's id of an ALE id (`ALE/Pong-v5` -> `Pong-v5`), or a ConfigError naming the problem."""
    if importlib.util.find_spec("envpool") is None:
        raise ConfigError(f"env.backend=envpool: envpool is not installed; {INSTALL}, or env.backend=gymnasium")
    import envpool

    task = env_id.removeprefix("ALE/")
    if not (env_id.startswith("ALE/") and env_id.endswith("-v5") and task in envpool.list_all_envs()):
        raise ConfigError(f"env.id={env_id}: not an Atari game envpool ships (env.backend=envpool takes ALE/<Game>-v5 "
                          f"ids such as ALE/Pong-v5; env.backend=gymnasium runs any ALE id)")
    return task


def envpool_options(frame_skip: int, frame_stack: int, noop_max: int, screen_size: int, episodic_life: bool,
                    repeat_action_probability: float, max_episode_steps: int | None, **game: Any) -> dict[str, Any]:
    """Every envpool Atari setting, from `make_atari`'s arguments; a ConfigError for those envpool
    cannot match."""
    unknown = sorted(set(game) - set(GAME_ARGUMENTS))
    if unknown:
        raise ConfigError(f"env.{unknown[0]}: not an option of env.backend=envpool (it takes {', '.join(GAME_ARGUMENTS)}); "
                          f"use env.backend=gymnasium for other arguments of ALE's env")
    if noop_max < 1:
        raise ConfigError(f"env.noop_max={noop_max}: envpool takes 1 to noop_max no-op frames after every reset "
                          f"(0 crashes it); set env.noop_max>=1 (1: always exactly one) or env.backend=gymnasium")
    if frame_stack < 2:
        raise ConfigError(f"env.frame_stack={frame_stack}: envpool's frames keep a stack axis (1, {screen_size}, {screen_size}) "
                          f"where the gymnasium path has none; set env.frame_stack>=2 or env.backend=gymnasium")
    max_steps = game.get("max_num_frames_per_episode", ALE_V5_MAX_FRAMES) // frame_skip
    if max_episode_steps is not None:
        max_steps = min(max_steps, max_episode_steps)
    return dict(
        frame_skip=frame_skip, stack_num=frame_stack, noop_max=noop_max, img_height=screen_size, img_width=screen_size,
        gray_scale=True, use_inter_area_resize=True, episodic_life=episodic_life, zero_discount_on_life_loss=False,
        repeat_action_probability=float(repeat_action_probability), max_episode_steps=max_steps,
        reward_clip=False,  # the game's score; maze_cli clips what the learner sees (env.reward_clip)
        use_fire_reset=False,  # gymnasium's path presses nothing at a reset
        full_action_space=bool(game.get("full_action_space", False)),
        mode=-1 if game.get("mode") is None else int(game["mode"]),  # -1: the game's default
        difficulty=-1 if game.get("difficulty") is None else int(game["difficulty"]),
    )


class EnvpoolAtari(gym.vector.VectorEnv):
    """`n_envs` Atari envs stepped by one envpool (sync mode: every step steps all, results in env order).

    envpool fixes its seeds when it is built, so the pool is built by `reset(seed=...)`: env i gets
    the i-th of the seeds derived from `seed`. Episode ends follow gymnasium's "next step" autoreset,
    envpool's own convention: the step after an end resets the env (action ignored, reward 0).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, task: str, n_envs: int, options: dict[str, Any], num_threads: int):
        import envpool

        self.task, self.options, self.num_threads = task, options, num_threads
        self.num_envs = n_envs
        spec = envpool.make_spec(task, num_envs=n_envs, **options)
        self.single_observation_space = spec.gymnasium_observation_space
        self.single_action_space = spec.gymnasium_action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n_envs)
        self._pool: Any = None
        self._order = np.arange(n_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if self._pool is None or seed is not None:
            self._build(0 if seed is None else seed)
        observations, info = self._pool.reset()
        return observations, info

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        observations, rewards, terminated, truncated, info = self._pool.step(np.asarray(actions))
        if not np.array_equal(info["env_id"], self._order):  # sync mode keeps env order; never trust it blindly
            at = np.argsort(info["env_id"])
            observations, rewards, terminated, truncated = observations[at], rewards[at], terminated[at], truncated[at]
            info = {k: v[at] if isinstance(v, np.ndarray) and len(v) == self.num_envs else v for k, v in info.items()}
        return observations, rewards.astype(np.float32, copy=False), terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self._close_pool()

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _build(self, seed: int) -> None:
        import envpool

        self._close_pool()
        self._pool = envpool.make(self.task, env_type="gymnasium", num_envs=self.num_envs, batch_size=self.num_envs,
                                  num_threads=self.num_threads, seed=seed, env_seed=derive_seeds(seed, "env", self.num_envs),
                                  **self.options)


def make_envpool_atari(n_envs: int, id: str, num_threads: int, **arguments: Any) -> EnvpoolAtari:
    """`n_envs` envs of `make_atari(id, **arguments)` as one envpool vector env."""
    return EnvpoolAtari(task_id(id), n_envs, envpool_options(**arguments), num_threads)
