"""eval.background: evaluation of weight snapshots in a thread, off the learner's path; best.pt from the
snapshot's weights; the final weights still evaluated; the auto rule by cores."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from maze_cli.cli.build import learner_threads
from maze_cli.cli.session import _background_eval
from maze_cli.evaluation import BackgroundEvaluation, Snapshot
from maze_cli.budget import Budget
from maze_cli.training import Trainer
from tests.cli import run_train
from tests.test_train import read_stats
from tests.test_trainer import FakeLoop, FakeWriter


class Policy(nn.Module):
    """Stands for the learner's policy: its one weight is set to the env steps trained so far."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()), requires_grad=False)


class LearningLoop(FakeLoop):
    """A FakeLoop whose every update sets the policy's weight to the env steps trained so far."""

    def __init__(self, policy: Policy, **kwargs):
        super().__init__(**kwargs)
        self.policy = policy

    def iteration(self):
        steps = super().iteration()
        self.policy.w.fill_(self.n_updates * self.steps)
        return steps


def background_trainer(sleep_s, eval_s=0.05, target=None, fail_at=(), max_env_steps=100):
    """A Trainer whose snapshots score their weight (the env steps when copied) after `eval_s` seconds;
    the foreground evaluation scores the env steps it is called at."""
    policy = Policy()
    loop = LearningLoop(policy, sleep_s=sleep_s)
    bests: list[Snapshot] = []
    threads: set[str] = set()

    def evaluate_snapshot(snapshot: Snapshot) -> dict:
        threads.add(threading.current_thread().name)
        time.sleep(eval_s)
        if snapshot.epoch in fail_at:
            raise RuntimeError("env broke")
        return {"eval/return_mean": float(snapshot.policy.w)}

    def foreground() -> dict:
        foreground.calls += 1
        return {"eval/return_mean": float(trainer.env_steps)}

    foreground.calls = 0
    writer = FakeWriter()
    trainer = Trainer(loop, Budget(max_env_steps=max_env_steps, epoch_length=1, target_return=target), [writer], progress=False,
                      evaluate=foreground, eval_interval=1, background_eval=BackgroundEvaluation(evaluate_snapshot, lambda: policy),
                      on_best_snapshot=lambda trainer, snapshot: bests.append(snapshot))
    return trainer, writer, foreground, bests, threads


def test_snapshots_are_judged_in_a_thread_while_the_learner_trains_on():
    trainer, writer, foreground, bests, threads = background_trainer(0.02)
    trainer.run()
    evaluated = [row for row in writer.rows[:-1] if "eval/return_mean" in row]
    assert len(evaluated) >= 2 and threads == {"maze-eval"}
    for row in evaluated:  # the result of weights copied at an earlier epoch's end, in this row
        assert row["eval/snapshot_env_steps"] < row["env_steps"]
        assert row["eval/return_mean"] == row["eval/snapshot_env_steps"]
    # the learner never waited for the 0.05 s episodes: its share is the copy of the weights alone
    assert all(row["time/eval_share"] < 0.2 for row in evaluated), [row["time/eval_share"] for row in evaluated]
    last = writer.rows[-1]  # the final weights, evaluated by the learner itself
    assert foreground.calls == 1 and "eval/snapshot_env_steps" not in last and last["eval/return_mean"] == 100.0
    # every snapshot scored a new best (its env steps): each handed on for best.pt, the one still running at the end too
    best_steps = [b.env_steps for b in bests]
    assert best_steps == sorted(best_steps) and {row["eval/snapshot_env_steps"] for row in evaluated} <= set(best_steps)
    assert all(float(b.policy.w) == b.env_steps for b in bests)  # each best is the copy, not the live policy


def test_a_snapshot_that_reaches_the_target_stops_the_run_without_another_evaluation():
    trainer, writer, foreground, bests, _ = background_trainer(0.01, eval_s=0.01, target=30.0, max_env_steps=1000)
    result = trainer.run()
    assert result.stop_reason == "target_return" and foreground.calls == 0
    assert writer.rows[-1]["eval/return_mean"] >= 30.0 and bests[-1].env_steps == writer.rows[-1]["eval/snapshot_env_steps"]


def test_a_failing_snapshot_evaluation_is_skipped_and_training_goes_on(caplog):
    trainer, writer, _, _, _ = background_trainer(0.01, eval_s=0.0, fail_at={1})
    result = trainer.run()
    assert result.stop_reason == "max_env_steps" and writer.rows[-1]["env_steps"] == 100
    assert sum(row.get("eval/failures", 0) for row in writer.rows) == 1
    assert "evaluation of epoch 1's weights failed (RuntimeError: env broke)" in caplog.text


IMPALA, PPO = "maze_cli.algorithms.impala.Impala", "maze_cli.algorithms.ppo.Ppo"


def _settings(threads=None, algorithm=IMPALA, runner="maze_cli.parallel.SubprocDistributedActors", n_actors=2, background=None,
              num_learners=1, reproducible=False):
    runner_config = {"_target_": runner, "n_actors": n_actors, **({"reproducible": True} if reproducible else {})}
    return SimpleNamespace(
        train=SimpleNamespace(eval=SimpleNamespace(background=background), learner=SimpleNamespace(num_learners=num_learners),
                              torch_threads=threads),
        algorithm=OmegaConf.create({"_target_": algorithm}), runner=OmegaConf.create(runner_config))


@pytest.mark.parametrize("background, runner, n_actors, threads, algorithm, cores, expected", [
    (None, "maze_cli.parallel.SubprocDistributedActors", 2, None, IMPALA, 2, False),   # 2 actors + a learner fill 2 cores
    (None, "maze_cli.parallel.SubprocDistributedActors", 2, None, IMPALA, 16, True),
    (None, "maze_cli.parallel.SubprocDistributedActors", 2, None, PPO, 16, False),  # PPO's learner takes every core
    (None, "maze_cli.parallel.SubprocDistributedActors", 2, 1, PPO, 16, True),
    (None, "maze_cli.parallel.SubprocDistributedActors", 8, 2, IMPALA, 10, False),
    (None, "maze_cli.parallel.SequentialDistributedActors", 2, 1, IMPALA, 16, False),  # its envs step in the learner's process
    (True, "maze_cli.parallel.SubprocDistributedActors", 2, 1, IMPALA, 2, True),
    (False, "maze_cli.parallel.SubprocDistributedActors", 2, 1, IMPALA, 16, False),
])
def test_background_evaluation_is_on_where_a_core_is_left_over(monkeypatch, background, runner, n_actors, threads, algorithm, cores,
                                                                expected):
    monkeypatch.setattr("maze_cli.cli.build.available_cores", lambda: cores)
    monkeypatch.setattr("maze_cli.cli.session.available_cores", lambda: cores)
    settings = _settings(threads, algorithm, runner, n_actors, background)
    assert _background_eval(settings) is expected


@pytest.mark.parametrize("algorithm, threads, num_learners, reproducible, expected", [
    (PPO, None, 1, False, 8),  # its actors wait while it learns: every core
    (PPO, None, 3, False, 2),  # divided among the learners
    (PPO, None, 1, True, 1),   # reproducible mode: results must not depend on the machine's cores
    (PPO, 3, 1, False, 3),     # as set
    ("maze_cli.algorithms.ppo.Appo", None, 1, False, 1),  # its actors never wait
    (IMPALA, None, 1, False, 1),
    ("maze_cli.algorithms.sac.Sac", 2, 1, False, 2),
])
def test_learner_threads_take_the_cores_the_actors_leave(monkeypatch, algorithm, threads, num_learners, reproducible, expected):
    monkeypatch.setattr("maze_cli.cli.build.available_cores", lambda: 8)
    settings = _settings(threads, algorithm, num_learners=num_learners, reproducible=reproducible)
    assert learner_threads(settings) == expected


def test_best_pt_holds_the_weights_the_background_evaluation_judged(tmp_path):
    """A real run: CartPole with subprocess actors, every evaluation in the background. best.pt, played on the
    evaluation's own seeds, scores exactly the best return of a snapshot row: its weights are the snapshot's."""
    from maze_cli.checkpoint import load_policy
    from maze_cli.envs.factory import EnvFactory
    from maze_cli.evaluation import Evaluator
    from maze_cli.seeding import derive_seeds

    result = run_train("+env=cartpole", "runner=subproc", "eval.background=true", "epoch_length=4", "max_env_steps=60000", "seed=5",
                       "target_return=null", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_stats(tmp_path / "run")
    snapshot_rows = [row for row in rows if "eval/snapshot_env_steps" in row]
    assert snapshot_rows and "eval/snapshot_env_steps" not in rows[-1]
    best = rows[-1]["eval/best_return_mean"]
    policy = load_policy(tmp_path / "run" / "checkpoints" / "best.pt")
    evaluator = Evaluator(EnvFactory({"id": "CartPole-v1"}), 10, derive_seeds(5, "eval_env", 10))
    assert evaluator(policy)["eval/return_mean"] == best
