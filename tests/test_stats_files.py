"""stats.jsonl after a crash: a last line cut short never stops a resume, a learning curve or a sweep summary."""

import json

import pytest

from maze_cli.stats.plots import read_stats, write_learning_curve
from maze_cli.stats.writers import JsonlWriter, read_rows

TORN = '{"epoch": 6, "env_steps": 6000, "train/retu'  # what a kill in the middle of a write could leave


def write_rows(path, epochs, torn: bool = False):
    """Rows for `epochs`, then (with `torn`) a last line a crash cut short."""
    writer = JsonlWriter(path)
    for epoch in epochs:
        writer.write({"epoch": epoch, "env_steps": 1000 * epoch, "train/return_mean": 10.0 * epoch})
    writer.close()
    if torn:
        with open(path, "a") as f:
            f.write(TORN)


def test_a_resume_drops_the_rows_after_the_checkpoint_and_a_line_a_crash_cut_short(tmp_path):
    path = tmp_path / "stats.jsonl"
    write_rows(path, range(1, 6), torn=True)
    writer = JsonlWriter(path)
    assert writer.rewind(epoch=4, env_steps=4000) == 1  # row 5; the torn line was never a row
    writer.write({"epoch": 5, "env_steps": 5000})
    writer.close()
    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_a_torn_last_line_after_the_checkpoint_is_dropped_too(tmp_path):
    path = tmp_path / "stats.jsonl"
    write_rows(path, range(1, 4), torn=True)
    writer = JsonlWriter(path)
    assert writer.rewind(epoch=3, env_steps=3000) == 0
    writer.write({"epoch": 4, "env_steps": 4000})
    writer.close()
    assert [row["epoch"] for row in read_rows(path)] == [1, 2, 3, 4] and path.read_text().count("\n") == 4


def test_readers_skip_a_torn_line(tmp_path):
    write_rows(tmp_path / "stats.jsonl", range(1, 4), torn=True)
    assert [row["epoch"] for row in read_stats(tmp_path)] == [1, 2, 3]
    assert write_learning_curve(tmp_path) == tmp_path / "learning_curve.png"
    assert read_rows(tmp_path / "missing.jsonl") == []


def test_a_learning_curve_that_cannot_be_written_costs_a_warning_not_the_run(tmp_path, caplog):
    from maze_cli.stats.plots import start_learning_curve

    write_rows(tmp_path / "stats.jsonl", range(1, 4))
    (tmp_path / "learning_curve.png").mkdir()  # the file cannot replace a directory
    thread = start_learning_curve(tmp_path)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "learning_curve.png not written" in caplog.text


def test_a_stat_that_is_nan_is_written_to_stats_jsonl_as_null_and_the_row_is_kept(tmp_path):
    import numpy as np
    import torch

    from maze_cli.stats.writers import JsonlWriter, parse_row

    writer = JsonlWriter(tmp_path / "stats.jsonl")
    # PPO's explained variance is NaN where the returns do not vary: a row must still be written, not crash the run
    writer.write({"epoch": 1, "env_steps": np.int64(2048), "learner/explained_variance": float("nan"),
                  "learner/value_mean": torch.tensor(0.5), "learner/lr": np.float32(3e-4), "time/inf": float("inf")})
    writer.close()
    row = parse_row((tmp_path / "stats.jsonl").read_text().splitlines()[0])
    assert row == {"epoch": 1, "env_steps": 2048, "learner/explained_variance": None, "learner/value_mean": 0.5,
                   "learner/lr": pytest.approx(3e-4), "time/inf": None}
