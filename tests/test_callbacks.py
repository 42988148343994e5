"""Callbacks (`callbacks.<name>._target_`) through the real `train` command: their hooks, the keys they
add to the row, a clean stop they ask for, a callback that raises, resume, and bad input."""

import json
from pathlib import Path

from tests.cli import run_train
from tests.helpers import processes_with_env_tag

SHORT = ["+env=cartpole", "runner=sequential", "epoch_length=1", "max_env_steps=100000", "target_return=null", "eval.episodes=2"]


def read_stats(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]


def stopper(tmp_path: Path, stop_at: int) -> list[str]:
    return ["+callbacks.stopper._target_=tests.user_components.StopAtEpoch", f"+callbacks.stopper.out_dir={tmp_path}",
            f"+callbacks.stopper.stop_at={stop_at}"]


def test_a_callback_adds_keys_to_the_row_and_stops_the_run_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(*SHORT, *stopper(tmp_path, 2), run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    assert [row["cb/epoch"] for row in rows] == [1, 2]
    assert "done: callback stopper" in result.stdout
    assert json.loads((tmp_path / "start.json").read_text())["env"]["id"] == "CartPole-v1"
    end = json.loads((tmp_path / "end.json").read_text())
    assert end["stop_reason"] == "callback stopper" and end["objective"] == max(row["eval/return_mean"] for row in rows)
    # Config, not a pickle: the checkpoint holds the callback's config only.
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    # A resumed run builds the callback again from its saved config: it trains one more epoch, which
    # the callback (stop_at=2) stops.
    resumed = run_train(f"resume={run_dir}", run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert [row["cb/epoch"] for row in read_stats(run_dir)] == [1, 2, 3]
    assert "done: callback stopper" in resumed.stdout


def test_a_callback_from_a_yaml_file_in_the_config_dir(tmp_path):
    config_dir = tmp_path / "conf"
    (config_dir / "callbacks").mkdir(parents=True)
    (config_dir / "callbacks" / "stop.yaml").write_text(
        f"stop:\n  _target_: tests.user_components.StopAtEpoch\n  out_dir: {tmp_path}\n  stop_at: 1\n")
    result = run_train("--config-dir", str(config_dir), *SHORT, "+callbacks=stop", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert [row["cb/epoch"] for row in read_stats(tmp_path / "run")] == [1]


def test_a_raising_callback_is_one_line_naming_it_with_last_pt_written_and_nothing_left_running(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(*SHORT[:1], "runner=subproc", *SHORT[2:], "+callbacks.boom._target_=tests.user_components.RaisingCallback",
                       run_dir=run_dir)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "train: error: callbacks.boom (tests.user_components.RaisingCallback) raised in on_epoch_end: RuntimeError: injected failure"), lines
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert len(read_stats(run_dir)) == 2  # the failing epoch's row is kept
    assert processes_with_env_tag(result.tag) == []


def test_bad_callback_configs_are_one_line(tmp_path):
    result = run_train(*SHORT, "+callbacks.x._target_=no_such_pkg.Callback", run_dir=tmp_path / "a")
    assert result.returncode == 2 and result.stderr.strip().startswith("train: error: callbacks.x._target_=no_such_pkg.Callback: cannot import it")
    result = run_train(*SHORT, "+callbacks.x._target_=tests.user_components.NoHooks", run_dir=tmp_path / "b")
    assert result.returncode == 2
    assert result.stderr.strip() == ("train: error: callbacks.x._target_=tests.user_components.NoHooks: has none of the hooks "
                                     "on_train_start, on_epoch_end, on_train_end")
    result = run_train(*SHORT, "+callbacks.x._target_=tests.user_components.StopAtEpoch", "+callbacks.x.stop_after=3", run_dir=tmp_path / "c")
    assert result.returncode == 2 and "callbacks.x.stop_after: unknown key" in result.stderr
    result = run_train(*SHORT, "+callbacks.x._target_=tests.user_components.StopAtEpoch", run_dir=tmp_path / "d")  # out_dir missing
    assert result.returncode == 2
    assert result.stderr.strip().startswith("train: error: callbacks.x: building tests.user_components.StopAtEpoch failed (TypeError:")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "d" / "stats.jsonl").exists()
