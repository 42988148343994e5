"""Videos: evaluation episodes in the run dir and TensorBoard, `rollout video=true`, the GIF fallback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.cli import TRAIN, run_train
from tests.test_train import read_stats

imageio = pytest.importorskip("imageio.v2")
ROLLOUT = TRAIN.with_name("rollout")
SHORT = ["runner=sequential", "epoch_length=2", "eval.episodes=1", "max_env_steps=8000"]


def frames_of(path) -> list[np.ndarray]:
    with imageio.get_reader(path) as reader:
        return [frame for frame in reader]


def test_eval_videos_hold_the_evaluated_episode_frame_by_frame(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", *SHORT, "eval.video=true", "eval.video_interval=2", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    videos = sorted((run_dir / "videos").iterdir())
    recorded = [row for row in rows if row["epoch"] % 2 == 1]  # the 1st, 3rd, ... evaluation
    assert [v.name for v in videos] == sorted(f"epoch_{row['epoch']}.mp4" for row in recorded)
    for row in recorded:
        frames = frames_of(run_dir / "videos" / f"epoch_{row['epoch']}.mp4")
        assert len(frames) == row["eval/episode_length_mean"]  # one eval episode: its length
        assert frames[0].shape[2] == 3 and frames[0].std() > 0  # a real picture, not a blank
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert len(events.Images("eval/video")) == len(recorded)


def test_an_env_that_cannot_render_costs_one_line_and_the_run_goes_on(tmp_path):
    config_dir = tmp_path / "configs"
    (config_dir / "env").mkdir(parents=True)
    (config_dir / "env" / "counting.yaml").write_text("_target_: tests.envs.CountingEnv\nlength: 20\n")  # no render_mode
    run_dir = tmp_path / "run"
    result = run_train("--config-dir", str(config_dir), "+env=counting", *SHORT, "max_env_steps=1000", "eval.video=true", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "eval.video=true" in line]
    assert len(warnings) == 1 and "training goes on" in warnings[0]
    assert not (run_dir / "videos").exists()


def test_rollout_records_the_first_episode(tmp_path):
    run_dir = tmp_path / "run"
    assert run_train("+env=cartpole", *SHORT, "max_env_steps=1", run_dir=run_dir).returncode == 0
    out = tmp_path / "first.mp4"
    proc = subprocess.run([str(ROLLOUT), f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=1", "video=true",
                           f"video_path={out}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    length = float(proc.stdout.split("episode length ")[1].split()[0])
    assert len(frames_of(out)) == length


def test_without_the_ffmpeg_plugin_videos_are_gifs(tmp_path, monkeypatch):
    from PIL import Image

    from maze_cli import video

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if the video extra were not installed
    frames = [np.full((8, 12, 3), i * 20, dtype=np.uint8) for i in range(5)]
    written = video.write_video(frames, tmp_path / "epoch_1.mp4")
    assert written.suffix == ".gif"
    with Image.open(written) as gif:
        assert gif.n_frames == 5 and gif.size == (12, 8)
