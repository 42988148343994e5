"""Faults of the machine, not of the run: a run dir that cannot be written, a disk that fills, a
small /dev/shm. The full disk and the small /dev/shm are real: a tmpfs in a mount namespace of
their own (`unshare -m`), skipped where this machine does not permit one."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from maze_cli.stats.writers import read_rows
from tests.cli import REPO, SAC_CHEAP, TRAIN, run_train
from tests.helpers import processes_with_env_tag, wait_until

ROLLOUT = TRAIN.with_name("rollout")
FAST = ["+env=cartpole", "runner=subproc", "runner.n_actors=2", "eval.interval=0", "epoch_length=2"]


def _unshare_permitted() -> bool:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


needs_unshare = pytest.mark.skipif(not _unshare_permitted(), reason="a private mount namespace (unshare -m) is not permitted here")


class Namespace:
    """A mount namespace of its own, held open by a sleeping process: commands run in it with
    nsenter, and the tmpfs mounted there lives until `close`, across several commands."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
        assert wait_until(lambda: os.readlink(f"/proc/{self.holder.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"), timeout=10)

    def run(self, *command: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", "--", *command], capture_output=True, text=True,
                              env=env, timeout=timeout, stdin=subprocess.DEVNULL)

    def mount_tmpfs(self, where: Path, size: str, remount: bool = False) -> None:
        options = f"remount,size={size}" if remount else f"size={size}"
        result = self.run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where))
        assert result.returncode == 0, result.stderr

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def namespace():
    space = Namespace()
    yield space
    space.close()


def _train_env(tag: str, **extra: str) -> dict:
    env = {**os.environ, "MAZE_TEST_TAG": tag, "PYTHONPATH": str(REPO), **extra}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


# -- a run dir that cannot be written ---------------------------------------------------------------
def test_a_file_where_the_run_dir_should_be_is_one_line_before_anything_starts(tmp_path):
    (tmp_path / "taken").write_text("a file, not a dir")
    result = run_train(*FAST, "max_env_steps=2000", f"hydra.run.dir={tmp_path / 'taken' / 'run'}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("train: error: the run dir cannot be written: ") and str(tmp_path / "taken") in lines[0]
    assert "hydra.run.dir=" in lines[0] and "Traceback" not in result.stderr


@needs_unshare
def test_a_read_only_run_dir_is_one_line_and_so_is_rollouts_video_path(tmp_path, namespace):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    namespace.mount_tmpfs(read_only, "1m")
    assert namespace.run("mount", "-o", "remount,ro", str(read_only)).returncode == 0
    tag = uuid.uuid4().hex
    result = namespace.run(str(TRAIN), *FAST, "max_env_steps=2000", f"hydra.run.dir={read_only / 'run'}", env=_train_env(tag))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert "the run dir cannot be written" in result.stderr and "Read-only file system" in result.stderr
    assert processes_with_env_tag(tag) == []

    run_dir = tmp_path / "run"
    trained = run_train(*FAST, "max_env_steps=2000", run_dir=run_dir)
    assert trained.returncode == 0, trained.stderr
    result = namespace.run(str(ROLLOUT), f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=1", "video=true",
                           f"video_path={read_only / 'videos' / 'ep.mp4'}", env=_train_env(tag))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"rollout: error: video_path={read_only / 'videos' / 'ep.mp4'} cannot be written: "
                                      f"{read_only / 'videos'}: Read-only file system; choose another with video_path=<file>")
    assert "episodes: return" not in result.stdout  # refused before the episodes ran


# -- a disk that fills ------------------------------------------------------------------------------
@needs_unshare
def test_a_disk_that_fills_stops_the_run_in_one_line_and_a_resume_completes_it(tmp_path, namespace):
    """The run dir on a 640 KiB tmpfs, a checkpoint every epoch: the disk fills at some write (a
    checkpoint, a row, TensorBoard), the run stops in one line, nothing is lost, no temp file is
    left; after more room (the tmpfs grown), `train resume=` trains on with every epoch once."""
    disk = tmp_path / "disk"
    disk.mkdir()
    namespace.mount_tmpfs(disk, "640k")
    run_dir = disk / "run"
    tag = uuid.uuid4().hex
    first = namespace.run(str(TRAIN), *FAST, "checkpoint.interval=1", "max_env_steps=1000000000", "max_time_s=120",
                          "target_return=null", f"hydra.run.dir={run_dir}", env=_train_env(tag))
    assert first.returncode == 1, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1, first.stderr
    assert lines[0].startswith("train: error: no space left on the filesystem at ") and str(disk) in lines[0]
    assert "while writing " in lines[0] and f"train resume={run_dir}" in lines[0], lines[0]
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=15)  # the actors stopped

    namespace.mount_tmpfs(disk, "64m", remount=True)  # space freed
    saved_copy = tmp_path / "after_fill"
    assert namespace.run("cp", "-a", str(run_dir), str(saved_copy)).returncode == 0
    assert not [p.name for p in saved_copy.rglob("*tmp*")], "a temp file was left behind"
    saved = torch.load(saved_copy / "checkpoints" / "last.pt", weights_only=True)  # the last good checkpoint loads
    steps = saved["trainer"]["env_steps"]
    assert saved["trainer"]["epoch"] >= 1

    resumed = namespace.run(str(TRAIN), f"resume={run_dir}", f"max_env_steps={steps + 20000}", env=_train_env(tag))
    assert resumed.returncode == 0, resumed.stderr
    done = tmp_path / "done"
    assert namespace.run("cp", "-a", str(run_dir), str(done)).returncode == 0
    rows = read_rows(done / "stats.jsonl")
    assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))  # every epoch once
    assert rows[-1]["env_steps"] >= steps + 20000
    assert not [p.name for p in done.rglob("*tmp*")]


@needs_unshare
def test_a_sweep_job_whose_disk_fills_stops_alone_and_the_summary_has_the_others(tmp_path, namespace):
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "1").mkdir(parents=True)
    namespace.mount_tmpfs(sweep_dir / "1", "256k")  # job 1's dir: a small disk of its own
    tag = uuid.uuid4().hex
    result = namespace.run(str(TRAIN), "-m", *FAST, "runner=sequential", "seed=1,2,3", "max_env_steps=3000",
                           "checkpoint.interval=1", f"hydra.sweep.dir={sweep_dir}", env=_train_env(tag), timeout=280)
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("train: error:")]
    assert len(errors) == 1 and errors[0].startswith("train: error: job 1: no space left on ") and "Traceback" not in result.stderr
    rows = list(csv.DictReader(open(sweep_dir / "summary.csv")))
    assert [row["job"] for row in rows] == ["0", "2"]  # the jobs that finished
    assert all(int(row["env_steps"]) >= 3000 for row in rows)


def test_pictures_are_skipped_with_a_warning_on_a_full_disk(tmp_path, monkeypatch, caplog):
    """A fault-injected write (a fake savefig that fails as a full disk does): the learning curve is
    skipped with a warning, and no temp file stays."""
    import matplotlib.figure

    from maze_cli.stats.plots import draw_learning_curve

    (tmp_path / "stats.jsonl").write_text('{"epoch": 1, "env_steps": 10, "train/return_mean": 1.0}\n')

    def full_disk_savefig(self, path, **kwargs):  # a fake: writes part of the file, then ENOSPC
        Path(path).write_bytes(b"\x89PNG")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk_savefig)
    draw_learning_curve(tmp_path)
    assert "learning_curve.png not written: no space left on the filesystem at " in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.jsonl"]


def test_a_checkpoint_on_a_full_disk_keeps_the_last_good_one_and_leaves_no_temp_file(tmp_path, monkeypatch):
    from maze_cli import checkpoint
    from maze_cli.disk import DiskFull

    path = tmp_path / "checkpoints" / "last.pt"
    checkpoint.save_checkpoint(path, {"epoch": 1})
    real_save = torch.save

    def full_disk_save(obj, file, **kwargs):  # a fake: torch writes a part, then the disk is full
        Path(file).write_bytes(b"PK\x03\x04partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk_save)
    with pytest.raises(DiskFull, match=f"no space left on the filesystem at .* while writing {path}"):
        checkpoint.save_checkpoint(path, {"epoch": 2})
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert checkpoint.load_checkpoint(path)["epoch"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]


# -- a small /dev/shm -------------------------------------------------------------------------------
@needs_unshare
def test_a_run_whose_slots_do_not_fit_dev_shm_trains_from_a_file_and_leaves_nothing(tmp_path, namespace):
    """/dev/shm of 8 MiB, slots of about 10 MiB: the run warns once, trains from a file in TMPDIR,
    and no file is left there (it never had a name)."""
    namespace.mount_tmpfs(Path("/dev/shm"), "8m")
    temp = tmp_path / "temp"
    temp.mkdir()
    tag = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    result = namespace.run(str(TRAIN), *FAST, "algorithm.n_rollout_steps=256", "runner.envs_per_actor=64", "max_env_steps=70000",
                           f"hydra.run.dir={run_dir}", env=_train_env(tag, TMPDIR=str(temp)))
    assert result.returncode == 0, result.stderr
    log = (run_dir / "train.log").read_text()
    warnings = [line for line in log.splitlines() if "/dev/shm has" in line]
    assert len(warnings) == 1, log
    assert f"it is in a file under {temp} instead" in warnings[0] and "docker run --shm-size=" in warnings[0]
    assert read_rows(run_dir / "stats.jsonl")[-1]["env_steps"] >= 70000
    assert list(temp.glob("maze_cli-shared-*")) == []


def test_runner_shared_memory_file_shares_the_slots_through_a_nameless_file_gone_after_a_kill(tmp_path):
    """`runner.shared_memory=file`: the actors map a deleted file (their /proc maps say so); after
    the learner is killed (SIGKILL: no clean-up of its own) the actors exit and no file is left."""
    temp = tmp_path / "temp"
    temp.mkdir()
    tag = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(TRAIN), *FAST, "runner.shared_memory=file", "max_env_steps=100000000", "target_return=null",
                             f"hydra.run.dir={run_dir}"], env=_train_env(tag, TMPDIR=str(temp)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: len(read_rows(run_dir / "stats.jsonl")) >= 2, timeout=120), proc.stderr
        actors = [pid for pid in processes_with_env_tag(tag) if pid != proc.pid]
        maps = "".join(Path(f"/proc/{pid}/maps").read_text() for pid in actors if Path(f"/proc/{pid}/maps").exists())
        assert f"{temp}/maze_cli-shared-" in maps and "(deleted)" in maps
        assert list(temp.glob("maze_cli-shared-*")) == []  # (multiprocessing keeps a pymp-* dir of its own there)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=30)
    assert list(temp.glob("maze_cli-shared-*")) == []


@pytest.mark.parametrize("algorithm", ["impala", "sac"])
def test_an_actor_restarted_maps_the_same_file(tmp_path, algorithm):
    """A restarted actor maps the learner's file again (through a new copy of its descriptor): the
    run completes its budget; with SAC, workers fill the replay buffer through the same slots."""
    from tests.cli import fault_env

    sac = ["algorithm=sac", *SAC_CHEAP] if algorithm == "sac" else []
    result = run_train(*fault_env(tmp_path, "raise_step", **({"action_kind": "box"} if sac else {})), *sac, "runner=subproc",
                       "runner.shared_memory=file", "max_env_steps=6000", "epoch_length=2", run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fault").exists()
    log = (tmp_path / "run" / "train.log").read_text()
    assert "restarting it: restart 1 of 3" in log and "shared memory (a file in " in log
    assert sum(row.get("actor_restarts", 0) for row in read_rows(tmp_path / "run" / "stats.jsonl")) == 1
    assert processes_with_env_tag(result.tag) == []


def test_where_the_shared_memory_goes_by_runner_shared_memory(tmp_path, caplog):
    """`place` against the real free space of a dir standing for /dev/shm: a need it holds stays
    there; one it cannot hold goes to a file with one warning (auto) or is one line (shm)."""
    from maze_cli.parallel.shared_memory import SharedMemoryError, place

    fix = "runner.envs_per_actor"
    assert place("auto", 1024, fix, shm_dir=tmp_path) is None
    assert place("file", 1024, fix, shm_dir=tmp_path) is not None
    huge = 2**60
    with caplog.at_level("WARNING", logger="maze_cli"):
        assert place("auto", huge, fix, shm_dir=tmp_path) is not None
    assert len(caplog.records) == 1
    assert f"needs 1073741824.0 GiB and {tmp_path} has " in caplog.text and "docker run --shm-size=" in caplog.text
    with pytest.raises(SharedMemoryError, match=r"^runner.shared_memory=shm: .*docker run --shm-size="):
        place("shm", huge, fix, shm_dir=tmp_path)


def test_a_long_tmpdir_does_not_keep_the_actors_from_starting(tmp_path):
    """multiprocessing's forkserver listens on a Unix socket under TMPDIR, whose path may hold at most 107 bytes:
    under a longer TMPDIR it could not start, and with it no run on subprocess actors."""
    temp = tmp_path / ("t" * 100)
    temp.mkdir()
    result = run_train("+env=cartpole", "runner=subproc", "max_env_steps=3000", "eval.interval=0", run_dir=tmp_path / "run",
                       env={"TMPDIR": str(temp)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert list(temp.iterdir()) == []  # nothing of multiprocessing's left behind in it
