"""`rollout checkpoint=<path> episodes=N`: run a saved policy of any algorithm and report its return.

Arguments are `key=value` pairs, checked like `train`'s: a bad one ends in one line, exit code 2.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from maze_cli.cli import parse_key_values, quiet_on_closed_pipe, run_command
from maze_cli.config.fields import NonNegativeInt, PositiveInt, key
from maze_cli.errors import ConfigError, first_line


@dataclass
class RolloutConfig:
    checkpoint: Optional[str] = key(None, "a checkpoints/last.pt or best.pt of a run")
    model: Optional[str] = key(None, "or a model export-policy wrote (ONNX; TorchScript too), played instead")
    episodes: PositiveInt = key(10, "episodes played")
    seed: NonNegativeInt = key(0, "derives the episodes' env seeds")
    deterministic: Optional[bool] = key(None,
                                         "true: the most likely action; false: sampled; null: as the run's "
                                         "evaluation")
    max_episode_steps: Optional[PositiveInt] = key(None,
                                                    "steps after which an episode the env has not ended is cut "
                                                    "short; null: as the run's evaluation (eval.max_episode_steps)")
    video: bool = key(False, "record the first episode: MP4 (or GIF without the video extra)")
    video_path: Optional[str] = key(None, "default: videos/rollout.mp4 in the checkpoint's run dir")
    allow: List[str] = field(default_factory=list)  # classes (import paths) the checkpoint may build besides maze_cli's own
    trust_checkpoint: bool = key(False, "the checkpoint may name any class and hold pickled objects: runs code from it")


HELP = """rollout: play a policy saved by `train` (any algorithm) in its env and report its return.

Usage:
  rollout checkpoint=<run dir>/checkpoints/best.pt [key=value ...]

Keys:
  checkpoint=<path>        a checkpoints/last.pt or best.pt of a run (this or model= is required)
  model=<file.onnx>        a model written by export-policy, played with onnxruntime (greedy actions)
  episodes=10              episodes to play, all at once
  seed=0                   derives the episodes' env seeds
  deterministic=null       null: as the run's evaluation acted (eval.deterministic, by default the most
                           likely action); true: the most likely; false: sampled
  max_episode_steps=null   an episode the env has not ended after this many steps is cut short; null: as
                           the run's evaluation (eval.max_episode_steps, 27,000 by default)
  video=false              record the first episode (MP4 with pip install 'maze_cli[video]', else GIF)
  video_path=...           where; default videos/rollout.mp4 in the checkpoint's run dir
  allow=[my_pkg.MyNet]     classes of your own the checkpoint may build (policy network, env, env wrapper)
  trust_checkpoint=false   true: the file may hold pickled objects and name any class (runs code from it)

Examples:
  rollout checkpoint=outputs/2026-11-24/10-00-00/checkpoints/best.pt
  rollout checkpoint=outputs/2026-11-24/10-00-00/checkpoints/best.pt episodes=100 deterministic=false
  rollout checkpoint=outputs/2026-11-24/10-00-00/checkpoints/best.pt episodes=1 video=true
  rollout model=outputs/2026-11-24/10-00-00/checkpoints/policy.onnx episodes=100

Prints: N episodes: return <mean> +- <std> (min, max), episode length <mean>; for a turn-based game
(+env=board_game, +env=connect_four), N games against each fixed opponent (random, lookahead), half in
each seat: win, draw and loss rates. Bad keys end in one line and exit code 2. More in docs/runs.md (its rollout section)."""


def _parse(argv: list[str]) -> RolloutConfig:
    cfg = parse_key_values(argv, RolloutConfig, "rollout", HELP, "checkpoint=outputs/<run>/checkpoints/best.pt episodes=10")
    if (cfg.checkpoint is None) == (cfg.model is None):
        raise ConfigError("checkpoint: a value is required (or model=<file.onnx>, a model export-policy wrote)"
                          if cfg.checkpoint is None else "checkpoint= and model=: give one of them, not both")
    return cfg


def run_rollout(cfg: RolloutConfig) -> dict[str, float]:
    from maze_cli.disk import DiskFull, check_writable_dir
    from maze_cli.envs.factory import EnvFactory
    from maze_cli.evaluation import cut_short_message, run_episodes, seeded_sampling
    from maze_cli.export.play import load_model_played
    from maze_cli.playing import load_played
    from maze_cli.seeding import derive_seeds

    path = Path(cfg.checkpoint or cfg.model)
    if cfg.model is not None:
        policy, env_factory = load_model_played(path, cfg.allow, cfg.trust_checkpoint)
        env_config, policy_config, run_config = policy.env_config, policy.policy_config, {}
    else:
        payload, policy, env_factory = load_played(path, cfg.allow, cfg.trust_checkpoint)
        run_config = payload.get("config") or {}
        env_config, policy_config = run_config["env"], run_config.get("policy")
    video_path = Path(cfg.video_path) if cfg.video_path else path.parent.parent / "videos" / "rollout.mp4"
    if cfg.video:  # before the episodes run: a place that cannot be written fails at once
        check_writable_dir(video_path.parent, f"video_path={video_path}", "choose another with video_path=<file>")
    seeds = derive_seeds(cfg.seed, "rollout_env", cfg.episodes)
    run_eval = {**_evaluation_defaults(), **(run_config.get("eval") or {})}  # what the run's evaluation did
    deterministic = bool(run_eval["deterministic"] if cfg.deterministic is None else cfg.deterministic)
    max_steps = run_eval["max_episode_steps"] if cfg.max_episode_steps is None else cfg.max_episode_steps
    if env_factory.turn_based:
        result = _against_opponents(env_factory, policy, seeds, deterministic)
    else:
        with seeded_sampling(deterministic, seeds[0]):
            returns, lengths, cut_short = run_episodes(env_factory, policy, seeds, deterministic, max_steps=max_steps)
        mean = sum(returns) / len(returns)
        std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
        print(f"{cfg.episodes} episodes: return {mean:.2f} +- {std:.2f} (min {min(returns):.2f}, max {max(returns):.2f}), "
              f"episode length {sum(lengths) / len(lengths):.1f}")
        if cut_short:
            print(cut_short_message(cut_short, cfg.episodes, max_steps, "max_episode_steps", "deterministic" if deterministic else None))
        result = {"return_mean": mean, "return_std": std}
    print(f"actions: {'the most likely' if deterministic else 'sampled'}")
    if cfg.video:
        from maze_cli.video import record_episode, render_env_config, write_video

        try:
            frames = record_episode(EnvFactory.for_policy(render_env_config(env_config), policy_config), policy, seeds[0], deterministic,
                                    max_steps=max_steps)
        except Exception as err:  # most often a missing renderer (pygame): say so in one line
            raise ConfigError(f"video=true: the env cannot render rgb_array frames ({type(err).__name__}: {first_line(err)})") from None
        try:
            out = write_video(frames, video_path)
        except DiskFull as err:  # the video is all this command writes: it ends in one line
            raise DiskFull(err.path, f"video_path={video_path}: {err}; free space there or choose another with "
                                     f"video_path=<file>") from None
        print(f"wrote {out} ({len(frames)} frames)")
    return result


def _evaluation_defaults() -> dict:
    """`train`'s evaluation settings as they default: what a model or a run that names none played with."""
    from maze_cli.config.schema import EvalConfig

    defaults = EvalConfig()
    return {"deterministic": defaults.deterministic, "max_episode_steps": defaults.max_episode_steps}


def _against_opponents(env_factory, policy, seeds: list[int], deterministic: bool) -> dict[str, float]:
    """A turn-based game: `episodes` games against each fixed opponent, half in each seat, as the run's
    evaluation plays them (a game against itself says nothing: every seat's return sums to 0)."""
    from maze_cli.envs.turn_based import OPPONENTS
    from maze_cli.evaluation import Evaluator

    stats = Evaluator(env_factory, len(seeds), seeds, deterministic=deterministic)(policy)
    for opponent in OPPONENTS:
        rates = {rate: stats[f"eval/{rate}_rate/{opponent}"] for rate in ("win", "draw", "loss")}
        print(f"{len(seeds)} games against {opponent}: win {rates['win']:.3f}, draw {rates['draw']:.3f}, loss {rates['loss']:.3f}")
    return {key.removeprefix("eval/"): value for key, value in stats.items()}


@quiet_on_closed_pipe
def main() -> None:
    """Console script `rollout`."""
    run_command("rollout", lambda: run_rollout(_parse(sys.argv[1:])))


if __name__ == "__main__":
    main()
