"""Atari through the Arcade Learning Environment with the standard preprocessing (`+env=atari`).

Machado et al. 2018 / the IMPALA paper's setup via gymnasium's wrappers: frames skipped (max over the
last two), up to `noop_max` no-op starts, 84x84 grayscale, `frame_stack` frames stacked (CHW, uint8),
optional end of an episode at a life lost. Rewards are left as the game gives them: the episode
return the stats report is the game's score; `env.reward_clip` clips what the learner sees.
"""

from __future__ import annotations

import gymnasium as gym

from maze_cli.errors import ConfigError

INSTALL = "pip install 'maze_cli[atari]' (ale-py and opencv-python-headless)"


def make_atari(id: str, frame_skip: int, frame_stack: int, noop_max: int, screen_size: int, episodic_life: bool,
               repeat_action_probability: float, max_episode_steps: int | None, **kwargs) -> gym.Env:
    """One preprocessed ALE env; `id` as ALE registers it (e.g. ALE/Pong-v5); `kwargs` go to the game.
    The settings' defaults are in conf/env/atari.yaml (`+env=atari`)."""
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
