"""Runs a user can trust: evaluation, checkpoints, interruption and resume, rollout, sweeps."""

import csv
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import torch

from maze_cli.stats.writers import read_rows
from tests.cli import REPO, TRAIN, run_train
from tests.helpers import processes_with_env_tag, wait_until
from tests.test_train import read_stats

ROLLOUT = TRAIN.with_name("rollout")


def start_train(*overrides, run_dir=None, sigint_ignored: bool = False):
    """`train` in the background (in `run_dir`, unless it resumes one); `sigint_ignored`: as a shell
    script's `train ... &` starts it."""
    tag = uuid.uuid4().hex
    env = {**os.environ, "MAZE_TEST_TAG": tag, "PYTHONPATH": str(REPO)}
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    where = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([str(TRAIN), *overrides, *where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL, preexec_fn=ignore)
    return proc, tag


def wait_for_epoch(proc, run_dir, epoch, timeout=60) -> None:
    """Wait until the run's stats reach `epoch`, else fail saying why: the process's exit code and
    output tell a run that crashed (on a resume, say) from one that hangs."""
    if wait_until(lambda: last_epoch(run_dir) >= epoch, timeout=timeout):
        return
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=30)
    pytest.fail(f"epoch {epoch} not reached in {timeout} s (last: {last_epoch(run_dir)}, exit code {proc.returncode})\n"
                f"stdout: {out[-1500:]}\nstderr: {err[-3000:]}")


def test_evaluation_runs_every_interval_and_best_checkpoint_follows_it(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "runner=sequential", "runner.envs_per_actor=8", "max_env_steps=15360", "epoch_length=3", "eval.interval=2",
                       "eval.episodes=3", "target_return=null", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    stats = read_stats(run_dir)
    n = len(stats)
    assert n >= 4
    # Every 2nd epoch, and the last one whatever its number.
    assert [row["epoch"] for row in stats if "eval/return_mean" in row] == [e for e in range(1, n + 1) if e % 2 == 0 or e == n]
    for row in stats:
        if "eval/return_mean" in row:
            assert {"eval/return_std", "eval/episode_length_mean", "eval/best_return_mean", "time/eval_s"} <= set(row)
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)
    assert best["trainer"]["best_eval"] == max(row["eval/return_mean"] for row in stats if "eval/return_mean" in row)
    assert (run_dir / "learning_curve.png").stat().st_size > 1000


def test_the_target_is_judged_on_evaluation_when_it_is_on(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "runner=sequential", "eval.interval=1", "eval.episodes=2", "target_return=15",
                       "target_window=1000", "epoch_length=1", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    # The training window of 1000 episodes cannot be full after one epoch: only evaluation can stop it.
    assert "stopped: target_return" in result.stdout
    assert read_stats(run_dir)[-1]["eval/return_mean"] >= 15


@pytest.mark.slow
def test_a_run_interrupted_by_sigint_resumes_its_step_count_and_improves(tmp_path):
    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", "runner=subproc", "target_return=null", "max_env_steps=10000000", run_dir=run_dir)
    wait_for_epoch(proc, run_dir, 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=10)
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert saved["stop_reason"] == "interrupted"
    before = read_stats(run_dir)
    steps = saved["trainer"]["env_steps"]
    assert steps >= before[-1]["env_steps"]

    result = run_train(f"resume={run_dir}", f"max_env_steps={steps + 150000}", run_dir=None)
    assert result.returncode == 0, result.stderr
    after = read_stats(run_dir)[len(before):]
    assert after[0]["epoch"] == saved["trainer"]["epoch"] + 1
    assert after[0]["env_steps"] > steps and after[-1]["env_steps"] >= steps + 150000
    # an epoch in which no episode ended (the short one the interrupt cut, say) has no training return
    returns = [[row["train/return_mean"] for row in rows if "train/return_mean" in row] for rows in (before, after)]
    assert returns[1] and max(returns[1]) > max(returns[0][0], 100)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tb_steps = [e.step for e in events.Scalars("train/return_mean")]
    assert tb_steps[-1] == after[-1]["env_steps"] and max(tb_steps[: len(before)]) < after[0]["env_steps"]


def test_kill_int_stops_a_run_started_with_sigint_ignored(tmp_path):
    """A background job of a script inherits SIGINT as ignored; an explicit kill -INT still stops it gracefully."""
    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", "runner=subproc", "target_return=null", "max_env_steps=10000000", run_dir=run_dir,
                            sigint_ignored=True)
    wait_for_epoch(proc, run_dir, 2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted: actors stopped, checkpoints/last.pt written" in out
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=10)


def last_epoch(run_dir) -> int:
    rows = read_rows(run_dir / "stats.jsonl")  # a running run's last line may be caught half written
    return rows[-1]["epoch"] if rows else 0


@pytest.mark.slow
def test_every_trained_epoch_appears_once_across_three_interrupts_and_resumes(tmp_path):
    """SIGINT and SIGTERM keep the interrupted epoch's row; SIGKILL between checkpoints rolls the rows
    back to the last checkpoint on resume. Either way epochs and env steps go up one row at a time."""
    rng = replayable_rng()
    run_dir = tmp_path / "run"
    first = ["+env=cartpole", "runner=subproc", "checkpoint.interval=3", "target_return=null", "max_env_steps=100000000",
             "epoch_length=2", "eval.interval=2", "eval.episodes=2"]
    for i, sig in enumerate((signal.SIGINT, signal.SIGKILL, signal.SIGTERM)):
        proc, tag = start_train(*first, run_dir=run_dir) if i == 0 else start_train(f"resume={run_dir}")
        target = last_epoch(run_dir) + 4
        wait_for_epoch(proc, run_dir, target, timeout=90)
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment: inside an update, an evaluation or a write
        proc.send_signal(sig)
        proc.communicate(timeout=30)
        assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=15)
    steps = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["trainer"]["env_steps"]
    result = run_train(f"resume={run_dir}", f"max_env_steps={steps + 30000}")
    assert result.returncode == 0, result.stderr
    rows = read_stats(run_dir)
    assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(a["env_steps"] < b["env_steps"] for a, b in zip(rows, rows[1:]))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("epoch")] == [(r["env_steps"], r["epoch"]) for r in rows]


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert run_train("+env=cartpole", "runner=sequential", "max_env_steps=2048", "eval.interval=0", run_dir=run_dir).returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    result = run_train(f"resume={run_dir}")
    assert result.returncode == 0, result.stderr
    assert "the run is finished (stopped by max_env_steps" in result.stdout and "max_env_steps=" in result.stdout
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    extended = run_train(f"resume={run_dir}", "max_env_steps=6000")  # the key it named extends it
    assert extended.returncode == 0 and read_stats(run_dir)[-1]["env_steps"] >= 6000


def test_a_new_run_in_the_dir_of_another_is_refused_and_the_other_is_kept(tmp_path):
    """The same hydra.run.dir twice without resume=: the second command stops before writing, names the
    dir, what it holds and both ways on; the first run's files are as they were (its rows would otherwise
    be followed by the second's, its checkpoints replaced)."""
    run_dir = tmp_path / "run"
    assert run_train("+env=cartpole", "runner=sequential", "max_env_steps=2048", "eval.interval=0", run_dir=run_dir).returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "train.log"}
    again = run_train("+env=cartpole", "runner=sequential", "max_env_steps=2048", "seed=2", run_dir=run_dir)
    assert again.returncode == 2
    message = again.stderr.strip().splitlines()[-1]
    assert f"{run_dir} holds a run already (stats.jsonl, checkpoints/last.pt" in message
    assert f"resume={run_dir}" in message and "hydra.run.dir" in message and "Traceback" not in again.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "train.log"} == before


def test_a_corrupt_last_checkpoint_gives_way_to_the_newest_intact_one_at_resume(tmp_path):
    """last.pt cut short (a crash or a full disk while it was written): the resume says so in one line
    and goes on from previous.pt, the last.pt before it, rewinding the rows written after it; with no
    intact checkpoint left it is refused in one line, as before."""
    run_dir = tmp_path / "run"
    assert run_train("+env=cartpole", "runner=sequential", "max_env_steps=4096", "epoch_length=1", "eval.interval=0",
                     "checkpoint.interval=1", run_dir=run_dir).returncode == 0
    checkpoints = run_dir / "checkpoints"
    previous_steps = torch.load(checkpoints / "previous.pt", weights_only=True)["trainer"]["env_steps"]
    last = checkpoints / "last.pt"
    assert previous_steps < torch.load(last, weights_only=True)["trainer"]["env_steps"]
    broken = last.read_bytes()[:1000]
    last.write_bytes(broken)
    result = run_train(f"resume={run_dir}", "max_env_steps=8192")
    assert result.returncode == 0, result.stderr
    log = (run_dir / "train.log").read_text()
    assert "truncated or corrupt checkpoint" in log and "resuming from checkpoints/previous.pt instead" in log
    assert f"{previous_steps:,} env steps" in log
    # the broken file set aside, not rotated over the intact previous.pt by the resumed run's first save
    assert (checkpoints / "last.corrupt.pt").read_bytes() == broken
    torch.load(checkpoints / "previous.pt", weights_only=True)
    rows = read_stats(run_dir)
    assert rows[-1]["env_steps"] >= 8192 and len({row["epoch"] for row in rows}) == len(rows)  # no epoch twice
    for name in ("last.pt", "previous.pt", "best.pt"):
        (checkpoints / name).write_bytes(b"garbage")
    refused = run_train(f"resume={run_dir}", "max_env_steps=20000")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "checkpoints/last.pt: not a maze_cli checkpoint" in refused.stderr and "no intact previous.pt or best.pt" in refused.stderr


def test_resume_of_a_population_without_its_config_names_a_member_to_resume(tmp_path):
    (tmp_path / "pop" / "member_0").mkdir(parents=True)
    result = run_train(f"resume={tmp_path / 'pop'}")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "a population without its config.yaml" in result.stderr and "member_0" in result.stderr


def test_resume_refuses_to_change_anything_but_the_budget(tmp_path):
    run_dir = tmp_path / "run"
    assert run_train("+env=cartpole", "runner=sequential", "max_env_steps=2048", run_dir=run_dir).returncode == 0
    result = run_train(f"resume={run_dir}", "algorithm.lr=0.1")
    assert result.returncode == 2 and "algorithm: cannot change when resuming" in result.stderr
    result = run_train(f"resume={tmp_path / 'nothing'}")
    assert result.returncode == 2 and "not a run dir" in result.stderr


def test_sigterm_stops_the_run_with_143_and_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", "runner=subproc", "target_return=null", "max_env_steps=10000000", run_dir=run_dir)
    wait_for_epoch(proc, run_dir, 1)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143 and time.monotonic() - start < 10
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["stop_reason"] == "interrupted"
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=10)


def test_a_checkpoint_written_while_being_killed_is_never_truncated(tmp_path):
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.pt"
    for delay in (0.0, 0.35, 0.7):  # after this process's first checkpoint, so the kills land at several points of a write
        written_before = last.stat().st_mtime_ns if last.exists() else None
        started = ("+env=cartpole", "runner=sequential", "checkpoint.interval=1", "epoch_length=1", "eval.interval=1",
                   "eval.episodes=1", "target_return=null", "max_env_steps=10000000", "policy.hidden_sizes=[512,512]")
        fresh = written_before is None  # then each kill's run goes on from it: a new run never writes into another's dir
        proc, tag = start_train(*(started if fresh else (f"resume={run_dir}",)), run_dir=run_dir if fresh else None)
        assert wait_until(lambda: last.exists() and last.stat().st_mtime_ns != written_before, timeout=120), proc.poll()
        time.sleep(delay)
        proc.kill()
        proc.communicate()
        for name in ("last.pt", "best.pt"):
            path = run_dir / "checkpoints" / name
            if path.exists():
                torch.load(path, weights_only=False)  # raises on a truncated file
        assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=10)


@pytest.mark.slow
def test_rollout_of_a_trained_cartpole_policy_is_far_above_random(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("+env=cartpole", "runner=subproc", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    proc = subprocess.run([str(ROLLOUT), f"checkpoint={run_dir / 'checkpoints' / 'best.pt'}", "episodes=5", "video=true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    mean = float(proc.stdout.split("return ")[1].split()[0])
    assert mean > 200  # a random policy scores about 22
    assert (run_dir / "videos" / "rollout.mp4").stat().st_size > 1000


def test_rollout_errors_are_one_line(tmp_path):
    for args, needle in ((["checkpoint=/no/such.pt"], "no such checkpoint file"), (["checkpoint=x", "episode=3"], "did you mean 'episodes'"),
                         ([], "checkpoint: a value is required")):
        proc = subprocess.run([str(ROLLOUT), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_replay_buffer_is_kept_across_a_resume_when_asked(tmp_path):
    run_dir = tmp_path / "run"
    common = ["algorithm.initial_buffer_size=256", "algorithm.batch_size=32", "policy.hidden_sizes=[16,16]"]
    result = run_train("+env=pendulum", "algorithm=sac", "runner=sequential", "max_env_steps=800", "checkpoint.replay_buffer=true",
                       "eval.interval=0", *common, run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert saved["replay_buffer"]["size"] == saved["trainer"]["env_steps"]
    result = run_train(f"resume={run_dir}", "max_env_steps=1200")
    assert result.returncode == 0, result.stderr
    resumed = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert resumed["trainer"]["env_steps"] >= 1200
    assert resumed["replay_buffer"]["size"] == resumed["trainer"]["env_steps"]  # the old transitions plus the new ones


def test_a_two_seed_sweep_writes_both_rows_and_the_plot(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run([str(TRAIN), "-m", "+env=cartpole", "runner=sequential", "seed=1,2", "max_env_steps=4096",
                           "epoch_length=2", f"hydra.sweep.dir={sweep_dir}"], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(open(sweep_dir / "summary.csv")))
    assert len(rows) == 2 and "seed=1" in rows[0]["overrides"].split() and "seed=2" in rows[1]["overrides"].split()
    for r in rows:
        assert int(r["env_steps"]) >= 4096 and float(r["wall_time_s"]) > 0 and r["best_return"] and r["final_return"]
        assert r["return_key"] == "eval/return_mean"  # the jobs evaluated: the CSV and the plot's first panel report eval
    assert (sweep_dir / "summary.png").stat().st_size > 1000


def replayable_rng():
    """A random.Random for kill moments whose seed is printed (pytest shows it with a failure, to replay it)."""
    seed = random.randrange(2**32)
    print(f"kill moments drawn with random.Random({seed})")
    return random.Random(seed)


def actor_pids(train_pid: int) -> list[int]:
    """The actor processes of a `train` with subprocess actors (start method forkserver, the
    default): the forkserver's children, i.e. train's grandchildren."""
    def children(pid: int) -> list[int]:
        try:
            return [int(c) for c in (Path(f"/proc/{pid}/task/{pid}/children")).read_text().split()]
        except OSError:
            return []

    return [grandchild for child in children(train_pid) for grandchild in children(child)]


@pytest.mark.slow
def test_thirty_actor_kills_at_random_moments_never_stall_the_learner(tmp_path):
    """An actor SIGKILLed anywhere (inside a queue operation too) must not block the others: the run
    goes on with no long gap between epochs and leaves no process behind."""
    rng = replayable_rng()
    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", "runner=subproc", "runner.n_actors=4", "runner.envs_per_actor=8", "runner.max_restarts=60",
                            "target_return=null", "max_env_steps=100000000", "eval.interval=0", "epoch_length=4", run_dir=run_dir)
    wait_for_epoch(proc, run_dir, 2)
    kills = 0
    while kills < 30:
        actors = actor_pids(proc.pid)
        if actors:
            try:
                os.kill(rng.choice(actors), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        time.sleep(rng.uniform(0.02, 0.4))
    settled = last_epoch(run_dir) + 3
    wait_for_epoch(proc, run_dir, settled)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=15)
    rows = read_stats(run_dir)
    gaps = [b["time_s"] - a["time_s"] for a, b in zip(rows, rows[1:])]
    assert max(gaps) < 5.0, gaps
    assert sum(r["actor_restarts"] for r in rows) >= 25  # a kill of an actor about to be replaced anyway counts once


def test_the_sweep_plot_shows_single_epoch_jobs_as_points_and_both_returns():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from maze_cli.cli import sweep

    fig, ax = plt.subplots()
    sweep._plot_group(ax, [[(4096, 30.0)], [(4096, 32.0)]], "(all) (n=2)", "C0")
    assert [line.get_marker() for line in ax.lines] == ["o", "o"] and ax.get_ylim()[0] < 30.0 < 32.0 < ax.get_ylim()[1]
    plt.close(fig)
    jobs = [{"group": "(all)", "return_key": "eval/return_mean",
             "curves": {"eval/return_mean": [(4096, 30.0)], "train/return_mean": [(4096, 20.0)]}}]
    fig = sweep.summary_figure(jobs)
    assert [ax.get_ylabel() for ax in fig.axes] == ["eval return", "training return (epoch mean)"]
    plt.close(fig)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_impala_at_its_defaults_learns_a_sparse_reward_gridworld_from_another_package(tmp_path):
    """MiniGrid's empty room: reward only at the goal (1 - 0.9 t / 100), seven actions of which three
    move. Evaluation is greedy, so the policy must come to prefer the moves, not only sample them."""
    pytest.importorskip("minigrid")
    result = run_train("+env=gym", "env.id=MiniGrid-Empty-5x5-v0", "+env.obs_keys=[direction,image]", "target_return=0.9",
                       "max_env_steps=800000", "seed=1", run_dir=tmp_path / "run", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "stopped: target_return" in result.stdout, result.stdout[-2000:]
