"""Population-based training (`pbt.*`): which keys may change mid-run and how a running member takes
them, refusals before anything starts, and a population on Ray Tune end to end."""

from __future__ import annotations

import json

import pytest
import torch

from maze_cli.checkpoint import load_checkpoint
from maze_cli.errors import ConfigError
from maze_cli.pbt import journal
from maze_cli.pbt.journal import score_error, score_of
from maze_cli.pbt.mutations import Mutation, apply_values, check_mutations
from tests.cli import run_train
from tests.helpers import processes_with_env_tag
from tests.test_checkpoints import build
from tests.test_cli_errors import assert_one_line_error

PPO = {"_target_": "maze_cli.algorithms.ppo.Ppo", "lr": 3e-4, "entropy_coef": 0.0, "n_epochs": 4, "clip_value": None,
       "n_rollout_steps": 64, "hidden_sizes": None}


@pytest.mark.parametrize("mutations,needle", [
    ({"policy.hidden_sizes": [16, 64]}, "policy.hidden_sizes cannot change mid-run"),
    ({"algorithm.lrr": [1e-5, 1e-3]}, "did you mean 'lr'"),
    ({"algorithm.n_rollout_steps": [16, 128]}, "algorithm.n_rollout_steps cannot change mid-run"),
    ({"algorithm.lr": [1e-3]}, "expected a range [low, high]"),
    ({"algorithm.lr": [1e-3, 1e-4]}, "is empty"),
    ({"algorithm.lr": [1e-3, 1e-2]}, "outside its range"),
    ({"algorithm.clip_value": [0.1, 0.5]}, "set a starting value"),
    ({}, "pbt.population needs pbt.mutations"),
])
def test_a_key_pbt_cannot_change_is_refused_with_the_keys_it_can(mutations, needle):
    with pytest.raises(ConfigError) as info:
        check_mutations(mutations, PPO)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_ranges_are_log_uniform_across_decades_and_integer_keys_stay_integers():
    lr, entropy = check_mutations({"algorithm.lr": [1e-5, 3e-3], "algorithm.entropy_coef": [0, 0.05]}, PPO)
    assert lr.log_scale and not entropy.log_scale
    assert lr.clip(1.0) == 3e-3 and entropy.clip(-1) == 0.0
    (epochs,) = check_mutations({"algorithm.n_epochs": [1, 10]}, PPO)
    assert epochs.integer and epochs.clip(4.6) == 5 and isinstance(epochs.clip(4.6), int)
    assert not Mutation("algorithm.tau", 0.001, 0.009).log_scale  # under a decade apart


@pytest.mark.parametrize("margin,top,top_error,copies", [
    (2.0, 6.2, 0.5, False),   # 0.8 above, within two standard errors of the difference: noise, no copy
    (0.0, 6.2, 0.5, True),    # Ray Tune's rule: whoever ranks above
    (2.0, 9.0, 0.5, True),    # 3.6 above: clearly better
    (2.0, 5.4, 0.0, False),   # a tie never copies
])
def test_a_member_at_the_bottom_copies_only_a_member_clearly_better_than_noise(tmp_path, margin, top, top_error, copies):
    from types import SimpleNamespace

    pytest.importorskip("ray.tune")
    from maze_cli.cli.population import _scheduler

    pbt = SimpleNamespace(interval_env_steps=1000, quantile_fraction=0.25, synchronous=False, scheduler="pbt",
                          copy_margin=margin, resample_probability=0.25)
    scheduler = _scheduler(pbt, [Mutation("algorithm.lr", 1e-5, 1e-2)], tmp_path)
    better, bottom = object(), object()
    scheduler._trial_state = {better: SimpleNamespace(last_score=top), bottom: SimpleNamespace(last_score=5.4)}
    scheduler._errors = {better: top_error, bottom: 0.5}
    assert scheduler._clearly_better(better, bottom) is copies


def test_a_member_that_just_copied_is_not_copied_over_before_its_explored_values_show(tmp_path):
    """The member at the bottom after a copy is the next lowest one, until the copier has trained two
    intervals with what it explored."""
    from types import SimpleNamespace

    pytest.importorskip("ray.tune")
    from maze_cli.cli.population import _scheduler

    pbt = SimpleNamespace(interval_env_steps=1000, quantile_fraction=0.25, synchronous=False, scheduler="pbt",
                          copy_margin=0.0, resample_probability=0.25)
    scheduler = _scheduler(pbt, [Mutation("algorithm.lr", 1e-5, 1e-2)], tmp_path)

    class StandInTrial:  # what the scheduler reads of Tune's Trial here
        def is_finished(self) -> bool:
            return False

    top, copier, middle, old = (StandInTrial() for _ in range(4))
    scores = {top: 9.0, copier: 5.0, middle: 7.0, old: 6.0}
    scheduler._trial_state = {t: SimpleNamespace(last_score=s, last_result={"env_steps": 3000}) for t, s in scores.items()}
    assert scheduler._quantiles() == ([copier], [top])
    scheduler._copied_at[copier] = 2000  # one interval ago: its score is still mostly the donor's weights
    assert scheduler._quantiles() == ([old], [top])
    scheduler._trial_state[copier].last_result = {"env_steps": 4000}  # two intervals with its own values
    assert scheduler._quantiles() == ([copier], [top])


def test_a_member_is_ranked_by_its_latest_evaluation_not_by_training_returns_between_two():
    """A run evaluating every few epochs reports in between with rows of training returns alone, whose
    scale (sampled actions) a greedy evaluation's need not share; a run that never evaluates is ranked by
    its training returns."""
    evaluated = [{"epoch": 1, "train/return_mean": 20.0, "eval/return_mean": 90.0, "eval/return_std": 10.0},
                 {"epoch": 2, "train/return_window_mean": 30.0, "train/return_window_std": 8.0}]
    assert score_of(evaluated) == 90.0 and score_error(evaluated, episodes=4, window=16) == pytest.approx(5.0)
    unevaluated = [{"epoch": 1, "train/return_mean": 20.0}, {"epoch": 2, "train/return_window_mean": 30.0}]
    assert score_of(unevaluated) == 30.0 and score_error(unevaluated, episodes=4, window=16) == 0.0
    assert score_of([{"epoch": 1}]) is None
    # pbt.score=train: the training window's mean, its error from the window's spread over its episodes
    assert score_of(evaluated, by="train") == 30.0 and score_error(evaluated, episodes=4, window=16, by="train") == pytest.approx(2.0)
    assert score_error([{"epoch": 1, "train/return_mean": 20.0}], episodes=4, window=16, by="train") == 0.0  # window not yet full


def test_an_explore_crosses_a_range_of_any_width_in_a_few_steps_and_turns_at_its_bounds():
    import random

    lr = Mutation("algorithm.lr", 1e-5, 3e-3)
    assert lr.perturb(1e-5, up=False) == pytest.approx(1e-5 * 300 ** (1 / 8))  # at the bottom: up, not clipped in place
    value = 1e-5
    for _ in range(8):
        value = lr.perturb(value, up=True)
    assert value == pytest.approx(3e-3)
    entropy = Mutation("algorithm.entropy_coef", 0.0, 0.04)
    assert entropy.perturb(0.0, up=True) == pytest.approx(0.005)  # a linear range leaves 0 (a factor never would)
    assert entropy.perturb(0.04, up=True) == pytest.approx(0.035)
    epochs = Mutation("algorithm.n_epochs", 1, 4, integer=True)
    assert epochs.perturb(2, up=True) == 3 and epochs.perturb(4, up=True) == 3
    rng = random.Random(0)
    drawn = [lr.explore(1e-5, rng, resample_probability=1.0) for _ in range(200)]
    assert all(1e-5 <= v <= 3e-3 for v in drawn) and sum(v > 1e-4 for v in drawn) > 100  # log-uniform: ~60% above 1e-4


def test_new_values_reach_a_running_learner_at_its_next_update():
    """What a member does on an explore: the objective's config, the learner's optimizer settings and a
    replay loop's ratio take the values, which the next update uses; weights and Adam's moments stay."""
    run = build(["+env=cartpole", "algorithm=ppo", "runner=sequential", "policy.hidden_sizes=[8]", "runner.envs_per_actor=4",
                 "algorithm.n_rollout_steps=16"])
    with run.runner:
        run.runner.broadcast_updated_policy(run.learner.policy.state_dict())
        run.learner.update(run.runner.collect_outputs("cpu")[0])
        group = run.learner.groups["policy"]
        moments = [m.clone() for m in group.optimizer.exp_avg]
        weights = {k: v.clone() for k, v in run.learner.policy.state_dict().items()}
        apply_values(run, {"algorithm.lr": 1e-3, "algorithm.entropy_coef": 0.05, "algorithm.max_grad_norm": 0.25})
        assert all(torch.equal(v, run.learner.policy.state_dict()[k]) for k, v in weights.items())
        assert all(torch.equal(a, b) for a, b in zip(moments, group.optimizer.exp_avg))
        run.learner.update(run.runner.collect_outputs("cpu")[0])
    assert group.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * run.learner.progress_left() if group.anneal else 1e-3)
    assert group.max_grad_norm == 0.25 and run.learner.objective.hp.entropy_coef == 0.05


@pytest.mark.slow
def test_a_population_on_ray_tune_trains_members_copies_the_better_and_keeps_the_best(tmp_path):
    """Two members from a learning rate too small, synchronous (so that they meet at every interval
    whatever the machine's load): the weaker copies the stronger's checkpoint and perturbs its lr (a
    row of pbt.jsonl each), one console line per member per interval, each member an ordinary run dir,
    the best member's checkpoint at the top, nothing left running."""
    run_dir = tmp_path / "pop"
    result = run_train("+env=cartpole", "runner=sequential", "pbt.population=2", "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}",
                       "pbt.synchronous=true",
                       "algorithm.lr=1e-5", "max_env_steps=16000", "pbt.interval_env_steps=4000", "epoch_length=2", "target_return=null",
                       "eval.episodes=3", run_dir=run_dir, timeout=280, env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    for member in (0, 1):
        rows = [json.loads(line) for line in (run_dir / f"member_{member}" / "stats.jsonl").read_text().splitlines()]
        assert rows[-1]["env_steps"] >= 16000
        # one line per interval it trained: 4,096 ... 16,384 (fewer where a copy took it ahead with the other's counters)
        assert 1 <= log.count(f"member {member}: ") <= 5
        assert (run_dir / f"member_{member}" / "checkpoints" / "last.pt").is_file()
    assert log.count("member 0: ") + log.count("member 1: ") >= 5
    exploits = journal.read(run_dir)
    assert exploits, "the weaker of two members copies the stronger at some interval"
    for row in exploits:
        assert row["member"] != row["copied"] and row["copied_score"] >= row["score"]
        assert 1e-5 <= row["after"]["algorithm.lr"] <= 3e-3
    assert any(row["before"]["algorithm.lr"] != row["after"]["algorithm.lr"] for row in exploits)
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert "policy" in best["learner"]
    assert (run_dir / "pbt.png").is_file()
    assert processes_with_env_tag(result.tag) == []


def test_a_population_with_a_key_it_cannot_change_fails_before_ray_starts(tmp_path):
    result = run_train("+env=cartpole", "pbt.population=2", "pbt.mutations={policy.hidden_sizes: [8, 64]}", run_dir=tmp_path / "run")
    assert_one_line_error(result, "pbt.mutations: policy.hidden_sizes cannot change mid-run", "algorithm.lr")


def test_a_population_whose_env_cannot_be_built_fails_before_ray_starts(tmp_path):
    result = run_train("+env=gym", "env.id=CartPol-v1", "pbt.population=2", "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}",
                       run_dir=tmp_path / "run")
    assert_one_line_error(result, "CartPol-v1")
    assert not (tmp_path / "run" / "tune").exists()


@pytest.mark.slow
def test_ctrl_c_stops_every_member_of_a_population_and_resume_goes_on_from_each_members_checkpoint(tmp_path):
    """SIGINT while the members train with actors of their own: the command ends as interrupted, each
    member's rows so far are in its dir, and no process of the population (Ray's included) is left.
    `train resume=<population> max_env_steps=...` then goes on: each member from its own last.pt, with
    its own explored values, each epoch once in its rows; resumed again, the population is finished."""
    import signal

    from tests.helpers import wait_until
    from tests.test_runs import start_train

    run_dir = tmp_path / "pop"
    proc, tag = start_train("+env=cartpole", "runner=subproc", "runner.n_actors=1", "pbt.population=2",
                            "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}", "target_return=null", "max_env_steps=100000000",
                            "pbt.interval_env_steps=20000", run_dir=run_dir)
    log = run_dir / "train.log"
    assert wait_until(lambda: log.is_file() and "member 1: " in log.read_text() and "member 0: " in log.read_text(),
                      timeout=180), proc.poll()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted: every member stopped" in log.read_text()
    assert all((run_dir / f"member_{i}" / "stats.jsonl").stat().st_size > 0 for i in (0, 1))
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=30), processes_with_env_tag(tag)

    stopped = {i: load_checkpoint(run_dir / f"member_{i}" / "checkpoints" / "last.pt")["trainer"]["env_steps"] for i in (0, 1)}
    budget = max(stopped.values()) + 20000
    resumed = run_train(f"resume={run_dir}", f"max_env_steps={budget}", timeout=240, env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for i in (0, 1):
        rows = [json.loads(line) for line in (run_dir / f"member_{i}" / "stats.jsonl").read_text().splitlines()]
        assert [row["epoch"] for row in rows] == list(range(1, len(rows) + 1))
        assert rows[-1]["env_steps"] >= budget
        assert f"resumed {run_dir / f'member_{i}'} at epoch" in (run_dir / f"member_{i}" / "train.log").read_text()
    again = run_train(f"resume={run_dir}", f"max_env_steps={budget}")
    assert again.returncode == 0 and "every member of the population is finished" in again.stdout
    assert "max_env_steps (e.g." in again.stdout


@pytest.mark.slow
def test_a_member_whose_process_dies_starts_again_from_its_checkpoint_and_the_population_goes_on(tmp_path):
    """A member's Ray worker killed (SIGKILL) mid-run: it starts again from its last checkpoint, says so in
    one line, the population ends normally, and the member's rows hold each epoch once."""
    import os
    import signal
    from pathlib import Path

    from tests.helpers import wait_until
    from tests.test_runs import start_train

    run_dir = tmp_path / "pop"
    proc, tag = start_train("+env=cartpole", "runner=sequential", "pbt.population=2", "pbt.mutations={algorithm.lr: [1e-5, 3e-3]}",
                            "target_return=null", "max_env_steps=600000", "pbt.interval_env_steps=50000", run_dir=run_dir)
    log = run_dir / "train.log"
    assert wait_until(lambda: log.is_file() and log.read_text().count("member 0: ") >= 2 and "member 1: " in log.read_text(),
                      timeout=180), proc.poll()

    def member_workers() -> list[int]:
        return [pid for pid in processes_with_env_tag(tag)
                if b"ResourceTrainable" in Path(f"/proc/{pid}/cmdline").read_bytes()]

    workers = member_workers()
    assert workers
    os.kill(workers[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    text = log.read_text()
    assert "failed; started again from its last checkpoint" in text
    for member in (0, 1):
        rows = [json.loads(line) for line in (run_dir / f"member_{member}" / "stats.jsonl").read_text().splitlines()]
        assert rows[-1]["env_steps"] >= 600000
        steps = [row["env_steps"] for row in rows]
        assert len(steps) == len(set(steps)), steps  # no epoch written twice
    assert wait_until(lambda: processes_with_env_tag(tag) == [], timeout=30)
