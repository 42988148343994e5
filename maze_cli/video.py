"""Videos of a policy: one episode rendered to rgb_array frames, written as MP4 (imageio with its
ffmpeg plugin, the `video` extra) or, where that is missing, as a GIF (said once in the log).

Used by `train eval.video=true` (the first evaluation episode of every `eval.video_interval`-th
evaluation, to videos/epoch_<n>.mp4 and TensorBoard) and by `rollout video=true`.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from torch import nn

from maze_cli.disk import DiskFull, writing
from maze_cli.errors import first_line

log = logging.getLogger("maze_cli")
FPS = 30
_said_gif = False


def render_env_config(env_config: Mapping[str, Any]) -> dict[str, Any]:
    """The env config with `render_mode="rgb_array"` (a registered id's kwargs, or a `_target_`'s argument)."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen, no display needed
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    config = dict(env_config)
    if config.get("id"):
        config["kwargs"] = {**(config.get("kwargs") or {}), "render_mode": "rgb_array"}
    elif _takes_render_mode(config.get("_target_")):  # else it cannot render: recording says so in one line
        config["render_mode"] = "rgb_array"
    return config


def _takes_render_mode(target: str | None) -> bool:
    """Whether a `_target_` callable takes a `render_mode` argument (by name or as **kwargs)."""
    from hydra.utils import get_object

    from maze_cli.config.validation import keyword_arguments

    try:
        names = keyword_arguments(get_object(target))
    except Exception:  # noqa: BLE001 - not importable: building the env names the problem
        return True
    return names is None or "render_mode" in names


def record_episode(env_factory: Callable, policy: nn.Module, seed: int, deterministic: bool = True, device: str = "cpu",
                   max_steps: int | None = None) -> list[np.ndarray]:
    """The frames of one episode on env seed `seed` (one per step, rendered after each, at most
    `max_steps`); sampled actions are seeded by `seed` too."""
    from maze_cli.evaluation import eval_mode, run_episodes, seeded_sampling

    frames: list[np.ndarray] = []
    with eval_mode(policy), seeded_sampling(deterministic, seed, device):
        run_episodes(env_factory, policy, [seed], deterministic, device, on_frame=lambda i, env: frames.append(env.render()),
                     max_steps=max_steps)
    if not frames or frames[0] is None:
        raise ValueError("render() returned no rgb_array frame")
    return [np.asarray(f, dtype=np.uint8) for f in frames]


def write_video(frames: list[np.ndarray], path: Path) -> Path:
    """`path` as MP4 if imageio's ffmpeg plugin is installed, else beside it as a GIF; returns the file
    written. A full disk raises `DiskFull` naming the file, and what was written of it is removed."""
    out = path.with_suffix(".mp4" if _has_mp4_writer() else ".gif")
    try:
        with writing(out):
            path.parent.mkdir(parents=True, exist_ok=True)
            if out.suffix == ".mp4":
                import imageio.v2 as imageio

                imageio.mimwrite(out, frames, fps=FPS, macro_block_size=1)
            else:
                out.write_bytes(gif_bytes(frames))
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


def _has_mp4_writer() -> bool:
    """Whether imageio's ffmpeg plugin is installed (said once in the log when it is not)."""
    global _said_gif
    try:
        import imageio.v2  # noqa: F401
        import imageio_ffmpeg  # noqa: F401 - the MP4 writer's backend

        return True
    except ImportError:
        if not _said_gif:
            log.info("videos are GIFs: MP4 needs imageio and imageio-ffmpeg (pip install 'maze_cli[video]')")
            _said_gif = True
        return False


def gif_bytes(frames: list[np.ndarray]) -> bytes:
    """An animated GIF of the frames (PIL, which matplotlib brings): what TensorBoard shows as a video."""
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / FPS), loop=0)
    return out.getvalue()


class EvalVideos:
    """`eval.video=true`: the first evaluation episode (same env seed, the policy acting as evaluation's
    does; sampled actions are the video's own draws) of every `interval`-th evaluation to videos/epoch_<n>.mp4 and to `on_video(frames, env_steps)` (TensorBoard).
    An env that cannot render costs one line in the log; the run goes on without videos."""

    def __init__(self, env_factory: Callable, seed: int, directory: Path, interval: int, device: str = "cpu",
                 on_video: Callable[[list[np.ndarray], int], None] | None = None, deterministic: bool = True,
                 max_steps: int | None = None):
        self.env_factory, self.seed, self.directory, self.interval, self.device = env_factory, seed, directory, interval, device
        self.deterministic, self.max_steps = deterministic, max_steps
        self.on_video = on_video
        self.evaluations = 0
        self.enabled = True

    def __call__(self, policy: nn.Module, epoch: int, env_steps: int) -> Path | None:
        self.evaluations += 1
        if not self.enabled or (self.evaluations - 1) % self.interval:
            return None
        try:
            frames = record_episode(self.env_factory, policy, self.seed, self.deterministic, self.device, self.max_steps)
        except Exception as err:  # noqa: BLE001 - no renderer, no rgb_array mode: any of them
            log.warning(f"eval.video=true: the env cannot render rgb_array frames ({type(err).__name__}: {first_line(err)}); "
                        f"no videos, training goes on")
            self.enabled = False
            return None
        try:  # a picture: a full disk skips it (docs/runs.md says why); the next row or checkpoint stops the run
            path = write_video(frames, self.directory / f"epoch_{epoch}.mp4")
            if self.on_video is not None:
                self.on_video(frames, env_steps)
        except DiskFull as err:
            log.warning(f"eval.video=true: the video of epoch {epoch} not written: {err}; skipped, training goes on")
            return None
        return path
