"""Atari through the Arcade Learning Environment with the standard preprocessing (`+env=atari`).

Machado et al. 2018 / the IMPALA paper's setup via gymnasium's wrappers: frames skipped (max over the
last two), up to `noop_max` no-op starts, 84x84 grayscale, `frame_stack` frames stacked (CHW, uint8),
optional end of an episode at a life lost. Rewards are left as the game gives them: the episode
return the stats report is the game's score; `env.reward_clip` clips what the learner sees.

`backend` chooses what an actor steps: `gymnasium` (one env per copy, stepped in a loop) or
`envpool` (all of an actor's envs as one envpool vector env, `maze_cli.envs.atari_envpool`). Single
envs (the env check, evaluation, `rollout`) are always gymnasium's.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym

from maze_cli.errors import ConfigError

INSTALL = "pip install 'maze_cli[atari]' (ale-py and opencv-python-headless)"
BACKENDS = ("gymnasium", "envpool")
_announced: set[str] = set()  # envpool tasks this process has logged


def make_atari(id: str, frame_skip: int, frame_stack: int, noop_max: int, screen_size: int, episodic_life: bool,
               repeat_action_probability: float, max_episode_steps: int | None, backend: str = "gymnasium",
               envpool_threads: int = 1, **kwargs) -> gym.Env:
    """One preprocessed ALE env; `id` as ALE registers it (e.g. ALE/Pong-v5); `kwargs` go to the game.
    The settings' defaults are in conf/env/atari.yaml (`+env=atari`). With `backend=envpool` the env
    is still gymnasium's, once envpool is known to take these settings (the actors' batches are envpool's)."""
    if backend not in BACKENDS:
        raise ConfigError(f"env.backend={backend}: not a backend of env=atari; use one of {', '.join(BACKENDS)}")
    if backend == "envpool":
        from maze_cli.envs.atari_envpool import envpool_options, task_id

        task = task_id(id)
        if envpool_threads < 0:
            raise ConfigError(f"env.envpool_threads={envpool_threads}: give envpool's threads per actor (>= 1; 0: envpool's choice)")
        envpool_options(frame_skip, frame_stack, noop_max, screen_size, episodic_life, repeat_action_probability,
                        max_episode_steps, **{k: v for k, v in kwargs.items() if k != "render_mode"})
        if task not in _announced:
            _announced.add(task)
            logging.getLogger("maze_cli").info(f"env.backend=envpool: each actor steps its envs as one envpool {task} "
                                               f"({envpool_threads} thread{'s' if envpool_threads != 1 else ''}); "
                                               f"evaluation and rollout use gymnasium's env")
    try:
        import ale_py
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        gym.register_envs(ale_py)
        env = gym.make(id, frameskip=1, repeat_action_probability=repeat_action_probability,
                       max_episode_steps=max_episode_steps and max_episode_steps * frame_skip, **kwargs)
        env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                                 terminal_on_life_loss=episodic_life, grayscale_obs=True)
    except (ImportError, gym.error.DependencyNotInstalled) as err:
        raise ConfigError(f"env=atari needs the optional extra: {INSTALL} ({err})") from None
    return FrameStackObservation(env, frame_stack) if frame_stack > 1 else env


def make_atari_vector(n_envs: int, backend: str = "gymnasium", envpool_threads: int = 1, **arguments: Any) -> gym.vector.VectorEnv | None:
    """`n_envs` copies of `make_atari(**arguments)` as one vector env (`backend=envpool`), or None:
    the actors step gymnasium's envs one by one."""
    if backend != "envpool":
        return None
    from maze_cli.envs.atari_envpool import make_envpool_atari

    return make_envpool_atari(n_envs, num_threads=envpool_threads, **arguments)


make_atari.vector_env = make_atari_vector  # type: ignore[attr-defined]  # maze_cli.envs.source.VectorizedEnvTarget
