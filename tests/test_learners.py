"""Several learners (`learner.num_learners`): the same update as one learner on all their batches,
identical weights on every learner, runs that learn, stop together, fail in one line and resume."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp

from maze_cli.learner import Learner
from maze_cli.records import Rollout
from tests.cli import SAC_CHEAP, run_train
from tests.helpers import pid_alive, processes_with_env_tag, wait_until
from tests.learner_cases import CARTPOLE, PENDULUM, rollout
from tests.test_train import read_stats

UPDATES = 8


def _learner(algorithm: str, spaces, group=None):
    """A seeded learner: the same initial weights in every process."""
    from maze_cli.policies import ActorCritic, mlp_network

    normalize = algorithm == "impala"  # IMPALA on Pendulum: observations and rewards normalized (statistics pooled)
    torch.manual_seed(7)
    policy = ActorCritic(*spaces, mlp_network((16, 16), "tanh"), normalize_obs=normalize)
    if algorithm == "impala":
        from maze_cli.algorithms.impala import Impala, ImpalaObjective

        return Learner(ImpalaObjective(policy, Impala(normalize_advantage=False), normalize), "cpu", group=group)
    from maze_cli.algorithms.ppo import Ppo, PpoObjective

    # one minibatch, advantages as they are: the batch-wide statistics are then those of every learner's batch
    hp = Ppo(n_epochs=2, n_minibatches=1, normalize_advantage=False, entropy_coef=0.01)
    return Learner(PpoObjective(policy, hp, False), "cpu", max_env_steps=10_000, group=group)


def _columns(batch: Rollout, part: slice) -> Rollout:
    """The envs `part` of a time-major batch (batch-first fields sliced on their first dim)."""
    def cut(name: str, value):
        dim = 0 if name in Rollout.BATCH_FIRST else 1
        take = (lambda t: t[part]) if dim == 0 else (lambda t: t[:, part])
        if isinstance(value, dict):
            return {k: take(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(take(v) for v in value)
        return None if value is None else take(value)

    return Rollout(**{f.name: cut(f.name, getattr(batch, f.name)) for f in dataclasses.fields(batch)})


def _batches(spaces, n: int) -> list[Rollout]:
    """`n` different batches `[T, B]` (each learner of the distributed run takes its half of each)."""
    batches = []
    for i in range(n):
        torch.manual_seed(100 + i)
        b = rollout(spaces)
        b.rewards.add_(torch.randn(b.rewards.shape))
        b.observations["obs"].add_(torch.randn(b.observations["obs"].shape))
        batches.append(b)
    return batches


def _params(learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}


def _learner_process(rank: int, port: int, algorithm: str, spaces, results) -> None:
    from maze_cli.distributed import GroupSpec, LearnerGroup

    torch.set_num_threads(1)
    group = LearnerGroup(GroupSpec(rank, 2, "127.0.0.1", port, 60.0))
    try:
        learner = _learner(algorithm, spaces, group)
        for batch in _batches(spaces, UPDATES):
            half = batch.n_envs // 2
            learner.update(_columns(batch, slice(rank * half, (rank + 1) * half)))
        results.put((rank, {k: v.numpy() for k, v in _params(learner).items()}))
    finally:
        group.close()


def learners_in_processes(target, args_of_rank: dict[int, tuple]) -> dict[int, dict[str, torch.Tensor]]:
    """Run `target(rank, port, *args, results)` in a spawned process per rank, joined by one store; each
    puts `(rank, {name: parameter as numpy})` on `results`. Returns the parameters of every rank."""
    from maze_cli.distributed import main_store

    store = main_store("127.0.0.1", len(args_of_rank), 60.0)
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=target, args=(rank, store.port, *args, results)) for rank, args in args_of_rank.items()]
    for p in processes:
        p.start()
    try:
        return {rank: {k: torch.from_numpy(v) for k, v in params.items()} for rank, params in (results.get(timeout=120) for _ in processes)}
    finally:
        for p in processes:
            p.join(10)
            if p.is_alive():
                p.kill()


def assert_each_learner_made(got: dict[int, dict[str, torch.Tensor]], expected: dict[str, torch.Tensor],
                             start: dict[str, torch.Tensor]) -> None:
    """Every learner holds the same parameters, those of `expected` (one learner's update on all the data),
    and the updates moved them from `start`."""
    for name, value in expected.items():
        for rank in got:
            assert torch.equal(got[rank][name], got[0][name]), f"{name} differs between learners 0 and {rank}"
        torch.testing.assert_close(got[0][name], value, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert any(not torch.equal(start[k], expected[k]) for k in expected), "the updates changed nothing"


@pytest.mark.parametrize("algorithm,spaces", [("impala", PENDULUM), ("ppo", CARTPOLE)])
def test_two_learners_on_half_batches_make_the_update_of_one_learner_on_the_whole_batches(algorithm, spaces):
    got = learners_in_processes(_learner_process, {rank: (algorithm, spaces) for rank in (0, 1)})
    torch.set_num_threads(1)
    alone = _learner(algorithm, spaces)
    for batch in _batches(spaces, UPDATES):
        alone.update(batch)
    assert_each_learner_made(got, _params(alone), _params(_learner(algorithm, spaces)))


# -- whole runs ----------------------------------------------------------------------------------------
def _learner_pids(output: str) -> dict[int, int]:
    import re

    return {int(rank): int(pid) for rank, pid in re.findall(r"learner (\d+) \(pid (\d+)", output)}


@pytest.mark.parametrize("runner", ["subproc", "sequential", "ray"])
def test_two_learners_solve_cartpole_each_row_counting_both_and_leave_nothing_running(tmp_path, runner):
    """Solved on subproc; sequential and Ray learners run two epochs (the same learners, other transports)."""
    run_dir = tmp_path / "run"
    budget = "max_env_steps=2000000" if runner == "subproc" else f"max_env_steps={2 * 2 * 80 * 32 * 32}"
    result = run_train("+env=cartpole", f"runner={runner}", "learner.num_learners=2", "eval.interval=0", budget,
                       run_dir=run_dir, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_stats(run_dir)
    if runner == "subproc":
        assert "stopped: target_return" in result.stdout + result.stderr
        assert rows[-1]["train/return_window_mean"] >= 475
    else:
        assert len(rows) == 2 and rows[-1]["train/return_window_mean"] > rows[0]["train/return_mean"]
    # an epoch of 80 iterations, each learner learning from its own actor's rollout of 32 envs x 32 steps (tuning/cartpole_impala.yaml)
    assert rows[0]["env_steps"] == 2 * 80 * 1 * 32 * 32
    assert set(_learner_pids(result.stdout + result.stderr)) == {1}
    assert wait_until(lambda: processes_with_env_tag(result.tag) == [], timeout=15)


def test_more_learners_than_actors_is_one_line_before_anything_starts(tmp_path):
    result = run_train("+env=cartpole", "learner.num_learners=3", "runner.n_actors=2", run_dir=tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("train: error: learner.num_learners=3")
    assert "runner.n_actors" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_learners_needing_more_gpus_than_the_ray_cluster_has_is_one_line_before_anything_starts(tmp_path):
    result = run_train("+env=cartpole", "runner=ray", "runner.n_actors=3", "learner.num_learners=3", "learner.num_gpus_per_learner=1",
                       run_dir=tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "learner.num_learners=3" in last and "GPU 2" in last and "learner.num_gpus_per_learner" in last, last
    assert "Traceback" not in result.stderr
    assert wait_until(lambda: processes_with_env_tag(result.tag) == [], timeout=15)


@pytest.mark.parametrize("runner,why", [("subproc", "SIGKILL"), ("ray", "is gone")])
def test_a_killed_learner_stops_the_run_in_one_line_with_a_checkpoint_and_resume_goes_on_with_one_learner(tmp_path, runner, why):
    from tests.test_runs import start_train, wait_for_epoch

    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", f"runner={runner}", "learner.num_learners=2", "target_return=null", "max_env_steps=100000000",
                            "eval.interval=0", "epoch_length=20", "checkpoint.interval=1", run_dir=run_dir)
    wait_for_epoch(proc, run_dir, 2, timeout=120)
    log = (run_dir / "train.log").read_text()
    learner_1 = _learner_pids(log)[1]
    killed = time.monotonic()
    os.kill(learner_1, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - killed < 30
    assert proc.returncode not in (0, None)
    last = err.strip().splitlines()[-1]
    assert "learner 1" in last and why in last and f"resume={run_dir}" in last, err[-3000:]
    assert "Traceback" not in err
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=15)
    assert not pid_alive(learner_1)
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert saved["stop_reason"] == "learner_failed"
    steps = saved["trainer"]["env_steps"]
    result = run_train(f"resume={run_dir}", "learner.num_learners=1", f"max_env_steps={steps + 40000}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_stats(run_dir)
    assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(a["env_steps"] < b["env_steps"] for a, b in zip(rows, rows[1:]))
    assert rows[-1]["env_steps"] >= steps + 40000


@pytest.mark.parametrize("algorithm,env", [("ppo", "cartpole"), ("appo", "cartpole"), ("sac", "pendulum"), ("dqn", "cartpole")])
def test_every_algorithm_trains_with_two_learners_each_row_counting_both(tmp_path, algorithm, env):
    run_dir = tmp_path / "run"
    cheap = {"sac": SAC_CHEAP, "dqn": ["algorithm.initial_buffer_size=500", "algorithm.exploration=apex"]}.get(algorithm, [])
    result = run_train(f"+env={env}", f"algorithm={algorithm}", "runner=sequential", "learner.num_learners=2", "epoch_length=4",
                       "max_env_steps=3000", "target_return=null", "eval.interval=2", "eval.episodes=1", *cheap, run_dir=run_dir, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_stats(run_dir)
    assert rows[-1]["env_steps"] >= 3000 and rows[-1]["learner/updates"] > 0
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert saved["trainer"]["env_steps"] == rows[-1]["env_steps"]
    assert wait_until(lambda: processes_with_env_tag(result.tag) == [], timeout=15)


def test_sigterm_stops_every_learner_with_143_and_a_checkpoint(tmp_path):
    from tests.test_runs import start_train, wait_for_epoch

    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", "learner.num_learners=2", "target_return=null", "max_env_steps=100000000",
                            "eval.interval=0", "epoch_length=20", run_dir=run_dir)
    wait_for_epoch(proc, run_dir, 1, timeout=120)
    learner_1 = _learner_pids((run_dir / "train.log").read_text())[1]
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143 and time.monotonic() - start < 20
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["stop_reason"] == "interrupted"
    assert wait_until(lambda: processes_with_env_tag(tag) == [] and not pid_alive(learner_1), timeout=15)


def test_a_learner_that_stops_answering_is_named_after_the_collective_timeout(tmp_path):
    from tests.test_runs import start_train, wait_for_epoch

    run_dir = tmp_path / "run"
    proc, tag = start_train("+env=cartpole", "learner.num_learners=2", "target_return=null", "max_env_steps=100000000",
                            "eval.interval=0", "epoch_length=20", "learner.collective_timeout_s=5", run_dir=run_dir)
    wait_for_epoch(proc, run_dir, 1, timeout=120)
    learner_1 = _learner_pids((run_dir / "train.log").read_text())[1]
    os.kill(learner_1, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        os.kill(learner_1, signal.SIGCONT) if pid_alive(learner_1) else None
    last = err.strip().splitlines()[-1]
    assert proc.returncode not in (0, None)
    assert "learner 1 stopped answering" in last and "collective_timeout_s" in last and f"resume={run_dir}" in last, err[-3000:]
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=20)
