"""The learners beside learner 0 (`learner.num_learners=N`): processes of this machine, or Ray actors.

Learner 0 is the `train` process itself. It starts learners 1..N-1 with the run's resolved config;
each builds its own run from it (its share of the actors, seeds of its own), joins the group at
learner 0's rendezvous store, takes learner 0's learner state (weights, optimizer moments,
statistics: a fresh start, a resume and a warm start alike) and then follows (`training.follow`).

Whatever ends a run, learner 0 stops the others on its way out (`stop`), so no learner outlives it;
they stop their own actors as they go. A learner that fails reports why before it exits, so the one
line that ends the run can name it (`failure`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from maze_cli.distributed import GroupSpec, LearnerFailure
from maze_cli.errors import MazeCliError, first_line

log = logging.getLogger("maze_cli")
_STOP_GRACE_S = 10.0  # a learner told to stop has this long to stop its actors before it is killed


@dataclass(frozen=True)
class LearnerTask:
    """What a learner other than learner 0 needs to start (plain data)."""

    config: dict[str, Any]  # the run's resolved config
    group: GroupSpec
    log_level: int = logging.WARNING


def run_learner(task: LearnerTask, ready: Callable[[], None]) -> None:
    """The life of learner `task.group.rank` > 0: build its run, join the group, follow learner 0."""
    import torch
    from omegaconf import OmegaConf

    from maze_cli.cli.build import build_run, check_env, trusted_targets
    from maze_cli.config.schema import register_configs, validate
    from maze_cli.distributed import LearnerGroup
    from maze_cli.seeding import derive_seed, seed_everything
    from maze_cli.training import follow

    register_configs()
    settings = validate(OmegaConf.create(task.config), [])
    torch.set_num_threads(settings.train.torch_threads)
    env_factory, observation_space, action_space = check_env(settings)
    seed_everything(derive_seed(settings.train.seed, f"learner/{task.group.rank}"))
    ready()
    group = LearnerGroup(task.group)
    try:
        run = build_run(settings, env_factory, observation_space, action_space, trusted_targets(task.config),
                        settings.train.trust_checkpoint, group)
        run.learner.load_state_dict(group.broadcast_object())
        with run.runner:
            run.runner.broadcast_updated_policy(run.learner.policy.state_dict())
            follow(run.loop, group)
    finally:
        group.close()


def _learner_process(task: LearnerTask, reports) -> None:
    """The body of a learner subprocess: `run_learner`, its failure reported in one line."""
    rank = task.group.rank
    logging.basicConfig(level=task.log_level, format=f"[learner {rank}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _exit_with_parent()
    try:
        run_learner(task, lambda: reports.send(("ready", rank)))
    except (KeyboardInterrupt, LearnerFailure, FloatingPointError):
        pass  # stopped by learner 0, learner 0 is gone, or a non-finite loss all learners saw: learner 0 tells the user
    except MazeCliError as err:
        _report(reports, rank, str(err))
        os._exit(1)
    except BaseException as err:  # noqa: BLE001 - anything else: its place in the code helps
        _report(reports, rank, f"{type(err).__name__}: {first_line(err)}\n{traceback.format_exc()}")
        os._exit(1)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt()


def _report(reports, rank: int, message: str) -> None:
    try:
        reports.send(("error", rank, message))
    except (BrokenPipeError, OSError):
        pass


def _exit_with_parent() -> None:
    """Stop (as on SIGTERM: actors stopped on the way out) if learner 0's process is gone, also
    while this learner is not waiting in a collective that would notice."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="watch-learner-0").start()


class LearnerProcesses:
    """Learners 1..N-1 as subprocesses of this machine, on loopback."""

    def __init__(self, config: dict[str, Any], world_size: int, timeout_s: float, backend: str, start_method: str):
        from maze_cli.distributed import main_store

        self.world_size = world_size
        self.store = main_store("127.0.0.1", world_size, timeout_s)
        self.spec = GroupSpec(0, world_size, "127.0.0.1", self.store.port, timeout_s, backend)
        context = mp.get_context(start_method)
        self.processes: list[Any] = []
        self.reports: list[Any] = []
        self.errors: dict[int, str] = {}
        for rank in range(1, world_size):
            receive, send = context.Pipe(duplex=False)
            task = LearnerTask(config, GroupSpec(rank, world_size, "127.0.0.1", self.store.port, timeout_s, backend),
                               logging.getLogger("maze_cli").getEffectiveLevel() if log.isEnabledFor(logging.DEBUG) else logging.WARNING)
            process = context.Process(target=_learner_process, args=(task, send), name=f"maze-learner-{rank}")
            process.start()
            send.close()
            self.processes.append(process)
            self.reports.append(receive)

    def wait_ready(self, timeout_s: float) -> None:
        """Until every learner has built its env and is joining; LearnerFailure if one failed first."""
        waiting = set(range(1, self.world_size))
        deadline = time.monotonic() + timeout_s
        while waiting:
            for rank in list(waiting):
                message = self._receive(rank, 0.05)
                if message is not None and message[0] == "ready":
                    waiting.discard(rank)
                elif rank in self.errors or not self.processes[rank - 1].is_alive():
                    raise LearnerFailure(f"learner {rank} failed while starting: {self._reason(rank)}")
            if time.monotonic() > deadline:
                raise LearnerFailure(f"learners {', '.join(map(str, sorted(waiting)))} did not start within {timeout_s:.0f} s")

    def _receive(self, rank: int, timeout_s: float):
        connection = self.reports[rank - 1]
        try:
            if not connection.poll(timeout_s):
                return None
            message = connection.recv()
        except (EOFError, OSError):
            return None
        if message[0] == "error":
            self.errors[rank] = message[2]
        return message

    def _reason(self, rank: int) -> str:
        if rank in self.errors:
            return self.errors[rank]
        process = self.processes[rank - 1]
        process.join(2.0)
        code = process.exitcode
        if code is None:
            return "it stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            return f"its process (pid {process.pid}) was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        return f"its process (pid {process.pid}) exited with code {code}"

    def failure(self, err: Exception) -> str:
        """Why a collective failed: the learner that reported an error or died (waiting a moment
        for its report), else the collective's own error."""
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            for rank in range(1, self.world_size):
                self._receive(rank, 0.0)
                if rank in self.errors or not self.processes[rank - 1].is_alive():
                    return f"learner {rank} failed: {self._reason(rank)}"
            time.sleep(0.05)
        return f"a collective of the learners failed ({first_line(err)})"

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop every learner: after `wait_s` for those that were told to stop (a finished run),
        SIGTERM (each stops its actors), then SIGKILL after a grace period."""
        deadline = time.monotonic() + wait_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(2.0)
        for connection in self.reports:
            connection.close()

    def __enter__(self) -> "LearnerProcesses":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop(wait_s=_STOP_GRACE_S if exc_type is None else 0.0)
