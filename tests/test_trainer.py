"""The Trainer on a scripted loop: budgets, epochs and their stats rows, the return window, evaluation, resume."""

import json
import math
import signal
import time

import pytest

from maze_cli import training
from maze_cli.stats.aggregator import EpochStatsAggregator
from maze_cli.budget import Budget
from maze_cli.training import Trainer


class FakeClock:
    """Stands in for the `time` module of maze_cli.training: seconds pass only when a test's fakes
    say so (`sleep`), so that a test of the trainer's clocks asserts exact figures, never wall time."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(training, "time", fake)
    return fake

class TerminatedForTest(KeyboardInterrupt):
    """What train's SIGTERM handler raises, stood in for here."""


def _raise_terminated_for_test(signum, frame):
    raise TerminatedForTest()


@pytest.fixture
def stop_signals_as_train_has_them():
    """SIGINT raises KeyboardInterrupt (pytest started as a background job would inherit it ignored)
    and SIGTERM raises TerminatedForTest, as train's own handler raises Terminated."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated_for_test)
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


SAFETY_STEPS = 1000  # 100 updates: a run that misses its stop condition fails fast instead of hanging


class FakeLoop:
    """A Loop (maze_cli.contract) whose every iteration consumes `steps` env steps and ends the episodes you script.

    `returns` maps an update's number (1, 2, ...) to the returns of the episodes that end in it;
    after the script runs out no more episodes end.
    """

    def __init__(self, steps=10, returns=None, sleep_s=0.0, sleep=time.sleep):
        self.sleep = sleep  # a FakeClock's, where a test times the trainer
        self.actor_stats = EpochStatsAggregator()
        self.learner_stats = EpochStatsAggregator()
        self.steps = steps
        self.returns = returns or {}
        self.sleep_s = sleep_s
        self.n_updates = 0

    def iteration(self):
        if self.sleep_s:
            self.sleep(self.sleep_s)
        self.n_updates += 1
        for value in self.returns.get(self.n_updates, []):
            self.actor_stats.add("episode_return", value)
            self.actor_stats.add("episode_length", 7)
        self.learner_stats.add("learner/loss", float(self.n_updates))
        self.learner_stats.add("time/learn_s", 0.5)
        return self.steps

    def updates(self):
        return self.n_updates


class FakeWriter:
    def __init__(self):
        self.rows = []

    def write(self, stats):
        self.rows.append(dict(stats))

    def close(self):
        pass


class ScriptedEval:
    """An `evaluate` callable: returns the scripted means in turn; an Exception in the script is raised."""

    def __init__(self, means):
        self.means = list(means)
        self.calls = 0

    def __call__(self):
        value = self.means[self.calls]
        self.calls += 1
        if isinstance(value, Exception):
            raise value
        return {"eval/return_mean": value, "eval/episodes": 3}


def make(loop=None, writer=None, **budget):
    loop = loop or FakeLoop()
    writer = writer or FakeWriter()
    kwargs = {k: budget.pop(k) for k in ("evaluate", "eval_interval", "eval_interval_env_steps", "eval_interval_s", "on_epoch_end") if k in budget}
    budget.setdefault("max_env_steps", SAFETY_STEPS)
    return Trainer(loop, Budget(**budget), [writer], progress=False, **kwargs), loop, writer


class InterruptedWriter(FakeWriter):
    """A writer during whose first write the process receives `signum` (a user's Ctrl-C or kill)."""

    def __init__(self, signum):
        super().__init__()
        self.signum = signum

    def write(self, stats):
        if not self.rows:
            signal.raise_signal(self.signum)
        super().write(stats)


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, TerminatedForTest)])
def test_an_interrupt_while_a_row_is_written_waits_until_every_writer_has_it(signum, raised, stop_signals_as_train_has_them):
    """stats.jsonl and TensorBoard are written one after the other: a signal between them must not
    leave an epoch in one file and not the other."""
    first, second = InterruptedWriter(signum), FakeWriter()
    trainer = Trainer(FakeLoop(), Budget(max_env_steps=SAFETY_STEPS, epoch_length=2), [first, second], progress=False)
    with pytest.raises(raised):
        trainer.run()
    assert [row["epoch"] for row in first.rows] == [row["epoch"] for row in second.rows] == [1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class InterruptedLoop(FakeLoop):
    """A loop whose updates are counted for the epoch's row while the process receives `signum`."""

    def __init__(self, signum):
        super().__init__()
        self.signum = signum

    def updates(self):
        if self.n_updates == 2:
            signal.raise_signal(self.signum)
        return super().updates()


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, TerminatedForTest)])
def test_an_interrupt_while_the_epochs_row_is_made_counts_the_epoch_once(signum, raised, stop_signals_as_train_has_them):
    """The epoch is counted, then its row assembled: a signal in between must not count it again
    on the way out (the resumed run's rows would skip an epoch)."""
    trainer, _, writer = make(InterruptedLoop(signum), epoch_length=2)
    with pytest.raises(raised):
        trainer.run()
    assert [row["epoch"] for row in writer.rows] == [1] and trainer.epoch == 1
    assert writer.rows[0]["learner/updates"] == 2


# ------------------------------------------------------------------------------------ budget and epochs


@pytest.mark.parametrize("max_env_steps, updates", [(95, 10), (100, 10), (101, 11), (1, 1)])
def test_max_env_steps_stops_at_the_first_update_that_reaches_it(max_env_steps, updates):
    trainer, loop, writer = make(max_env_steps=max_env_steps, epoch_length=4)
    result = trainer.run()
    assert result.stop_reason == "max_env_steps"
    assert loop.updates() == updates and result.env_steps == updates * 10 == trainer.env_steps
    assert result.epochs == math.ceil(updates / 4)
    assert writer.rows[-1]["env_steps"] == updates * 10 and writer.rows[-1]["learner/updates"] == updates


@pytest.mark.parametrize("updates, epoch_length", [(10, 5), (11, 5), (1, 20), (20, 20), (21, 20), (7, 1)])
def test_one_stats_row_per_epoch(updates, epoch_length):
    trainer, loop, writer = make(max_env_steps=updates * 10, epoch_length=epoch_length)
    result = trainer.run()
    epochs = math.ceil(updates / epoch_length)
    assert result.epochs == epochs == trainer.epoch
    assert [row["epoch"] for row in writer.rows] == list(range(1, epochs + 1))
    assert [row["env_steps"] for row in writer.rows] == [10 * min(e * epoch_length, updates) for e in range(1, epochs + 1)]
    assert [row["learner/updates"] for row in writer.rows] == [min(e * epoch_length, updates) for e in range(1, epochs + 1)]


def test_epoch_rows_reduce_only_that_epochs_values():
    returns = {1: [1.0, 3.0], 2: [5.0], 4: [10.0]}  # epoch 1 = updates 1-2, epoch 2 = updates 3-4, epoch 3 = 5
    trainer, loop, writer = make(FakeLoop(returns=returns), max_env_steps=50, epoch_length=2)
    trainer.run()
    first, second, third = writer.rows
    assert (first["train/episodes"], first["train/return_mean"], first["train/return_min"], first["train/return_max"]) == (3, 3.0, 1.0, 5.0)
    assert (second["train/episodes"], second["train/return_mean"]) == (1, 10.0)
    assert third["train/episodes"] == 0 and "train/return_mean" not in third  # None values are left out
    assert first["train/episode_length_mean"] == 7.0
    assert first["learner/loss"] == 1.5 and second["learner/loss"] == 3.5  # learner/* averaged over the epoch
    assert first["time/learn_s"] == 1.0 and third["time/learn_s"] == 0.5  # time/* summed
    assert all(row["sps"] > 0 and row["time/epoch_s"] >= 0 for row in writer.rows)
    json.dumps(writer.rows, allow_nan=False)  # plain numbers only


def test_on_epoch_end_sees_each_row():
    seen = []
    trainer, _, writer = make(max_env_steps=30, epoch_length=1, on_epoch_end=lambda trainer, row: seen.append(row))
    trainer.run()
    assert seen == writer.rows and [row["epoch"] for row in seen] == [1, 2, 3]


# -------------------------------------------------------------------------------------- target return


def test_target_return_is_judged_on_the_last_window_of_episodes():
    # Window of 4: after update 2 it holds [0, 0, 0, 20] (mean 5), after update 3 [0, 0, 20, 20] (mean 10).
    # The mean over all episodes so far would still be 40 / 6 < 10 at update 3.
    returns = {1: [0.0, 0.0, 0.0, 0.0], 2: [20.0], 3: [20.0], 4: [20.0]}
    trainer, loop, writer = make(FakeLoop(returns=returns), target_return=10.0, target_window=4, epoch_length=1)
    result = trainer.run()
    assert result.stop_reason == "target_return"
    assert loop.updates() == 3 and result.env_steps == 30
    assert result.return_window_mean == 10.0
    assert [row["train/return_window_mean"] for row in writer.rows] == [0.0, 5.0, 10.0]
    assert [row["train/return_window_std"] for row in writer.rows] == [0.0, pytest.approx(75 ** 0.5), 10.0]  # its spread, for PBT


def test_target_return_waits_for_a_full_window():
    returns = {i: [100.0] for i in range(1, 10)}  # one excellent episode per update
    trainer, loop, writer = make(FakeLoop(returns=returns), target_return=50.0, target_window=5, epoch_length=1)
    result = trainer.run()
    assert result.stop_reason == "target_return" and loop.updates() == 5
    assert ["train/return_window_mean" in row for row in writer.rows] == [False] * 4 + [True]
    assert trainer.window_mean() == 100.0


def test_target_return_stops_mid_epoch():
    returns = {i: [100.0] for i in range(1, 10)}
    trainer, loop, writer = make(FakeLoop(returns=returns), target_return=50.0, target_window=3, epoch_length=10)
    result = trainer.run()
    assert result.stop_reason == "target_return" and loop.updates() == 3
    assert len(writer.rows) == 1 and writer.rows[0]["env_steps"] == 30


def test_window_spans_epochs():
    returns = {1: [10.0], 2: [10.0], 3: [10.0]}  # one episode per epoch; the window of 3 fills at epoch 3
    trainer, loop, _ = make(FakeLoop(returns=returns), target_return=10.0, target_window=3, epoch_length=1)
    assert trainer.run().stop_reason == "target_return" and loop.updates() == 3


def test_target_below_the_window_mean_never_stops_on_target():
    returns = {i: [5.0] for i in range(1, 20)}
    trainer, _, _ = make(FakeLoop(returns=returns), max_env_steps=100, target_return=5.5, target_window=2)
    result = trainer.run()
    assert result.stop_reason == "max_env_steps" and result.return_window_mean == 5.0


# ----------------------------------------------------------------------------------------- evaluation


def test_with_evaluation_the_target_is_judged_on_eval_and_best_is_tracked():
    returns = {i: [1000.0] for i in range(1, 50)}  # the training window is far above target all along
    evaluate = ScriptedEval([1.0, 5.0, 3.0, 12.0, 0.0])
    trainer, loop, writer = make(
        FakeLoop(returns=returns), target_return=10.0, target_window=1, epoch_length=1, evaluate=evaluate, eval_interval=2
    )
    result = trainer.run()
    assert result.stop_reason == "target_return" and result.epochs == 8 and evaluate.calls == 4
    evaluated = {row["epoch"]: row for row in writer.rows if "eval/return_mean" in row}
    assert list(evaluated) == [2, 4, 6, 8]
    assert [row["eval/return_mean"] for row in evaluated.values()] == [1.0, 5.0, 3.0, 12.0]
    assert [row["eval/best_return_mean"] for row in evaluated.values()] == [1.0, 5.0, 5.0, 12.0]
    assert all(row["eval/episodes"] == 3 and row["time/eval_s"] >= 0 for row in evaluated.values())
    assert not any("eval/best_return_mean" in row for row in writer.rows if row["epoch"] % 2)
    assert trainer.best_eval == 12.0


def test_the_last_epoch_is_evaluated_whatever_the_interval():
    evaluate = ScriptedEval([1.0, 20.0])
    trainer, _, writer = make(max_env_steps=30, epoch_length=1, target_return=10.0, evaluate=evaluate, eval_interval=2)
    result = trainer.run()
    assert [row["epoch"] for row in writer.rows if "eval/return_mean" in row] == [2, 3]
    # A budget already spent keeps its reason, even where the final evaluation reached the target.
    assert result.stop_reason == "max_env_steps"


def test_without_an_interval_evaluate_is_not_called():
    evaluate = ScriptedEval([])
    trainer, _, writer = make(max_env_steps=30, epoch_length=1, evaluate=evaluate, eval_interval=0)
    trainer.run()
    assert evaluate.calls == 0 and not any("eval/return_mean" in row for row in writer.rows)


def test_a_failing_evaluation_is_skipped_and_training_goes_on(caplog):
    evaluate = ScriptedEval([4.0, RuntimeError("env crashed"), 2.0, 6.0])
    trainer, loop, writer = make(max_env_steps=40, epoch_length=1, target_return=100.0, evaluate=evaluate, eval_interval=1)
    with caplog.at_level("WARNING", logger="maze_cli"):
        result = trainer.run()
    assert result.stop_reason == "max_env_steps" and result.epochs == 4 and loop.updates() == 4
    failed = writer.rows[1]
    assert failed["eval/failures"] == 1
    assert "eval/return_mean" not in failed and "eval/best_return_mean" not in failed and "time/eval_s" not in failed
    assert [row.get("eval/best_return_mean") for row in writer.rows] == [4.0, None, 4.0, 6.0]
    assert not any("eval/failures" in row for i, row in enumerate(writer.rows) if i != 1)
    assert "evaluation in epoch 2 failed (RuntimeError: env crashed)" in caplog.text


def test_a_failing_final_evaluation_keeps_the_stop_reason():
    evaluate = ScriptedEval([ValueError("boom")])
    trainer, _, writer = make(max_env_steps=10, epoch_length=5, evaluate=evaluate, eval_interval=3)
    result = trainer.run()
    assert result.stop_reason == "max_env_steps" and writer.rows[-1]["eval/failures"] == 1


def test_an_env_step_cadence_evaluates_at_the_first_epoch_past_it_whatever_the_epoch_length():
    # 10 env steps an update; every 25 env steps: after updates 3 (30), 6 (60), 9 (90) with epochs of one update
    for epoch_length, expected in [(1, [30, 60, 90, 100]), (2, [40, 80, 100]), (4, [40, 80, 100])]:
        evaluate = ScriptedEval([1.0] * 10)
        trainer, _, writer = make(max_env_steps=100, epoch_length=epoch_length, evaluate=evaluate, eval_interval=1,
                                  eval_interval_env_steps=25)
        trainer.run()
        assert [row["env_steps"] for row in writer.rows if "eval/return_mean" in row] == expected, epoch_length


def test_a_seconds_cadence_evaluates_once_that_much_training_time_has_passed(clock):
    evaluate = ScriptedEval([1.0] * 40)
    trainer, _, writer = make(FakeLoop(sleep_s=0.25, sleep=clock.sleep), max_env_steps=200, epoch_length=1,
                              evaluate=evaluate, eval_interval=1, eval_interval_s=1.0)
    trainer.run()
    evaluated = [row["epoch"] for row in writer.rows if "eval/return_mean" in row]
    assert evaluated == [4, 8, 12, 16, 20]  # epochs of 0.25 s: one evaluation a second of training, and the last


def test_each_evaluation_reports_the_share_of_the_run_spent_evaluating(clock):
    class SlowEval(ScriptedEval):
        def __call__(self):
            clock.sleep(3.0)
            return super().__call__()

    trainer, _, writer = make(FakeLoop(sleep_s=1.0, sleep=clock.sleep), max_env_steps=40, epoch_length=1,
                              evaluate=SlowEval([1.0] * 4), eval_interval=1)
    trainer.run()
    shares = [row["time/eval_share"] for row in writer.rows]
    assert shares == pytest.approx([0.75] * 4), shares  # 3 s of evaluation to each 1 s of training


def test_a_resumed_run_keeps_the_evaluation_cadence():
    first, _, _ = make(max_env_steps=30, epoch_length=1, evaluate=ScriptedEval([1.0] * 5), eval_interval=1,
                       eval_interval_env_steps=25)
    first.run()  # evaluated at 30 (the budget's end), the cadence counts from there
    second, _, writer = make(max_env_steps=80, epoch_length=1, evaluate=ScriptedEval([1.0] * 5), eval_interval=1,
                             eval_interval_env_steps=25)
    second.load_state_dict(first.state_dict())
    second.run()
    assert [row["env_steps"] for row in writer.rows if "eval/return_mean" in row] == [60, 80]


# ---------------------------------------------------------------------------------------------- time


def test_max_time_stops_the_run(clock):
    trainer, loop, writer = make(FakeLoop(sleep_s=2.0, sleep=clock.sleep), max_time_s=15.0, epoch_length=3)
    result = trainer.run()
    assert result.stop_reason == "max_time_s"
    assert loop.updates() == 8 and result.time_s == pytest.approx(16.0)  # the first iteration past 15 s ends it
    assert result.epochs == math.ceil(loop.updates() / 3) == len(writer.rows)
    assert writer.rows[-1]["time_s"] == pytest.approx(16.0)


def test_time_trained_before_a_resume_counts_against_max_time(clock):
    trainer, loop, writer = make(FakeLoop(sleep_s=0.06, sleep=clock.sleep), max_time_s=100.0)
    trainer.load_state_dict({"env_steps": 500, "epoch": 4, "window": [], "best_eval": None, "time_s": 99.95})
    result = trainer.run()
    assert result.stop_reason == "max_time_s" and loop.updates() == 1
    assert len(writer.rows) == 1 and writer.rows[0]["epoch"] == 5
    assert writer.rows[0]["env_steps"] == 510 and writer.rows[0]["time_s"] >= 100.0


def test_state_dict_time_stops_when_the_run_stops(clock):
    """The final checkpoint is written after the runner shuts down; that wait is not training time."""
    trainer, _, _ = make(max_env_steps=10)
    trainer.run()
    before = trainer.state_dict()["time_s"]
    clock.sleep(5.0)
    assert trainer.state_dict()["time_s"] == before

# -------------------------------------------------------------------------------------------- resume


def test_state_dict_round_trip_continues_the_counters():
    first, _, first_writer = make(max_env_steps=50, epoch_length=2)
    first.run()
    state = first.state_dict()
    assert (state["env_steps"], state["epoch"]) == (50, 3)
    json.dumps(state, allow_nan=False)  # checkpoints hold plain data

    second, loop, writer = make(max_env_steps=100, epoch_length=2)
    second.load_state_dict(state)
    result = second.run()
    assert loop.updates() == 5  # only the remaining 50 steps
    assert result.env_steps == 100 and result.epochs == 6
    assert [row["epoch"] for row in writer.rows] == [4, 5, 6]
    assert [row["env_steps"] for row in writer.rows] == [70, 90, 100]
    assert writer.rows[0]["time_s"] >= round(state["time_s"], 3)  # the rows round to ms


def test_resumed_window_counts_towards_the_target():
    returns = {i: [50.0] for i in range(1, 10)}
    first, _, _ = make(FakeLoop(returns=returns), max_env_steps=30, target_return=1000.0, target_window=3)
    assert first.run().stop_reason == "max_env_steps"
    state = first.state_dict()
    assert state["window"] == [50.0, 50.0, 50.0]

    fresh, fresh_loop, _ = make(FakeLoop(returns=returns), target_return=40.0, target_window=3)
    assert fresh.run().stop_reason == "target_return" and fresh_loop.updates() == 3  # must fill its window
    resumed, loop, _ = make(FakeLoop(returns=returns), target_return=40.0, target_window=3)
    resumed.load_state_dict(state)
    assert resumed.window_mean() == 50.0
    assert resumed.run().stop_reason == "target_return" and loop.updates() == 1


def test_resumed_best_eval_is_kept():
    first, _, _ = make(max_env_steps=20, epoch_length=1, evaluate=ScriptedEval([7.0, 2.0]), eval_interval=1)
    first.run()
    state = first.state_dict()
    assert state["best_eval"] == 7.0
    second, _, writer = make(max_env_steps=40, epoch_length=1, evaluate=ScriptedEval([3.0, 8.0]), eval_interval=1)
    second.load_state_dict(state)
    second.run()
    assert [row["eval/best_return_mean"] for row in writer.rows] == [7.0, 8.0]


def test_the_trainer_knows_the_env_steps_an_update_brings(clock):
    """What a population's member ranked by training returns turns an evaluation schedule by epochs into
    (maze_cli.cli.member): env steps of the run's own epochs."""
    loop = FakeLoop(steps=10, sleep_s=1.0, sleep=clock.sleep)
    trainer, _, _ = make(loop, max_env_steps=100, epoch_length=4)
    assert trainer.update_env_steps is None
    trainer.run(pause_at=25)
    assert trainer.update_env_steps == 10.0 and trainer.updates == 3


def test_a_paused_run_closes_its_epoch_at_the_pause_and_the_next_call_goes_on_with_its_counters_and_clock(clock):
    """`run(pause_at=...)` (a population's member between two reports) returns at the first update that
    reaches the pause, its epoch closed there (a shorter row), without a closing line; the next call goes
    on, epochs and time_s counted on from where the first call ended, no epoch written twice."""
    loop = FakeLoop(steps=10, sleep_s=1.0, sleep=clock.sleep)
    trainer, _, writer = make(loop, max_env_steps=100, epoch_length=4)
    first = trainer.run(pause_at=25)
    assert (first.stop_reason, trainer.env_steps, trainer.epoch) == (training.PAUSED, 30, 1)
    second = trainer.run(pause_at=55)
    assert (second.stop_reason, trainer.env_steps) == (training.PAUSED, 60)
    last = trainer.run()
    assert last.stop_reason == "max_env_steps" and trainer.env_steps == 100
    assert [(row["epoch"], row["env_steps"], row["time_s"]) for row in writer.rows] == [(1, 30, 3.0), (2, 60, 6.0), (3, 100, 10.0)]
    assert trainer.state_dict()["time_s"] == 10.0
