"""`rollout checkpoint=<path> episodes=N`: run a saved policy of any algorithm and report its return.

Arguments are `key=value` pairs, checked like `train`'s: a bad one ends in one line, exit code 2.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import MISSING, OmegaConf

from maze_cli.cli.schema import ConfigError, _f, validate_section


@dataclass
class RolloutConfig:
    checkpoint: str = MISSING  # a checkpoints/last.pt or best.pt of a run
    episodes: int = _f(10, ge=1)
    seed: int = _f(0, ge=0)  # derives the episodes' env seeds
    deterministic: bool = True  # the policy's most likely action (false: sample)
    render: bool = False  # write a GIF of the first episode
    render_path: Optional[str] = None  # default: rollout.gif beside the run's checkpoints dir


def _parse(argv: list[str]) -> RolloutConfig:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\nkeys: checkpoint (required), episodes=10, seed=0, deterministic=true, render=false, render_path")
        sys.exit(0)
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise ConfigError(f"{bad[0]}: arguments are key=value, e.g. rollout checkpoint=outputs/<run>/checkpoints/best.pt episodes=10")
    return validate_section(RolloutConfig, OmegaConf.from_dotlist(argv), "", "rollout")


def _save_gif(frames: list, path: Path) -> None:
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], duration=33, loop=0)


def run_rollout(cfg: RolloutConfig) -> dict[str, float]:
    from maze_cli.checkpoint import load_checkpoint, load_policy
    from maze_cli.envs.factory import EnvFactory
    from maze_cli.evaluation import run_episodes
    from maze_cli.seeding import derive_seeds

    path = Path(cfg.checkpoint)
    if not path.is_file():
        raise ConfigError(f"checkpoint={cfg.checkpoint}: no such file")
    try:
        payload = load_checkpoint(path)
        env_config = payload["config"]["env"]
        policy = load_policy(path)
    except Exception as err:
        raise ConfigError(f"checkpoint={cfg.checkpoint}: not a maze_cli checkpoint ({type(err).__name__}: {err})") from None
    seeds = derive_seeds(cfg.seed, "rollout_env", cfg.episodes)
    returns, lengths = run_episodes(EnvFactory(env_config), policy, seeds, cfg.deterministic)
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
    print(f"{cfg.episodes} episodes: return {mean:.2f} +- {std:.2f} (min {min(returns):.2f}, max {max(returns):.2f}), "
          f"episode length {sum(lengths) / len(lengths):.1f}")
    if cfg.render:
        import os

        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # render off-screen, no display needed
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        render_config = dict(env_config)
        if render_config.get("id"):
            render_config["kwargs"] = {**(render_config.get("kwargs") or {}), "render_mode": "rgb_array"}
        else:
            render_config["render_mode"] = "rgb_array"
        frames: list = []
        try:
            run_episodes(EnvFactory(render_config), policy, seeds[:1], cfg.deterministic, on_frame=lambda i, env: frames.append(env.render()))
        except Exception as err:  # most often a missing renderer (pygame): say so in one line
            raise ConfigError(f"render=true: the env cannot render ({type(err).__name__}: {str(err).strip().splitlines()[0]})") from None
        out = Path(cfg.render_path) if cfg.render_path else path.parent.parent / "rollout.gif"
        _save_gif([f for f in frames if f is not None], out)
        print(f"wrote {out} ({len(frames)} frames)")
    return {"return_mean": mean, "return_std": std}


def main() -> None:
    """Console script `rollout`."""
    try:
        run_rollout(_parse(sys.argv[1:]))
    except ConfigError as err:
        print(f"rollout: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
