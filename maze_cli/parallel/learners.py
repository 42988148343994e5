"""The learners beside learner 0 (`learner.num_learners=N`): processes of this machine, or Ray actors.

Learner 0 is the `train` process itself. It starts learners 1..N-1 with the run's resolved config;
each builds its own run from it (its share of the actors, seeds of its own), joins the group at
learner 0's rendezvous store, takes learner 0's learner state (weights, optimizer moments,
statistics: a fresh start, a resume and a warm start alike; a reproducible run's resume also hands each
learner its own saved actors and RNG) and then follows (`cli.learners.follow`).

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

from maze_cli.distributed import GroupSpec, LearnerFailure, main_store, silent_learners
from maze_cli.errors import ConfigError, MazeCliError, first_line
from maze_cli.parallel.ray_cluster import died_reason, shortfall

log = logging.getLogger("maze_cli")
_STOP_GRACE_S = 10.0  # a learner told to stop has this long to stop its actors before it is killed


@dataclass(frozen=True)
class LearnerTask:
    """What a learner other than learner 0 needs to start (plain data)."""

    config: dict[str, Any]  # the run's resolved config
    group: GroupSpec
    log_level: int = logging.WARNING


@dataclass(frozen=True)
class LearnerBody:
    """What a learner other than learner 0 runs, given by the layer that builds runs (maze_cli.cli.learners):
    module-level functions, so that a learner's process or Ray actor receives them by name."""

    prepare: Callable[[LearnerTask], Any]  # its settings and env, before it joins the group
    follow: Callable[[Any], None]  # join the group, build its run, follow learner 0 until it says stop


def run_learner(task: LearnerTask, body: LearnerBody, ready: Callable[[], None]) -> None:
    """The life of learner `task.group.rank` > 0 in a process of its own: prepare, say so, follow."""
    prepared = body.prepare(task)
    ready()
    body.follow(prepared)


def _learner_process(task: LearnerTask, body: LearnerBody, reports) -> None:
    """The body of a learner subprocess: `run_learner`, its failure reported in one line."""
    rank = task.group.rank
    logging.basicConfig(level=task.log_level, format=f"[learner {rank}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _exit_with_parent()
    try:
        run_learner(task, body, lambda: reports.send(("ready", rank)))
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

    def __init__(self, config: dict[str, Any], body: LearnerBody, world_size: int, timeout_s: float, backend: str,
                 start_method: str):
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
            process = context.Process(target=_learner_process, args=(task, body, send), name=f"maze-learner-{rank}")
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
        return _silent_learners(self.store, self.world_size, err)

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

    def describe(self) -> list[str]:
        """Each learner and where it runs, for the log."""
        return [f"learner {rank} (pid {process.pid})" for rank, process in enumerate(self.processes, start=1)]

    def __enter__(self) -> "LearnerProcesses":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop(wait_s=_STOP_GRACE_S if exc_type is None else 0.0)


# -- on a Ray cluster ---------------------------------------------------------------------------------
class RayLearnerBody:
    """What runs inside the Ray actor of one learner: `prepare` (returns where it runs), then `run`,
    which lasts as long as the run."""

    def __init__(self, task: LearnerTask, body: LearnerBody):
        self.task, self.body = task, body
        self.prepared: Any = None
        logging.basicConfig(level=task.log_level, format=f"[learner {task.group.rank}] %(levelname)s %(message)s")

    def prepare(self) -> dict[str, Any]:
        import ray

        self.prepared = self.body.prepare(self.task)
        return {"pid": os.getpid(), "ip": ray.util.get_node_ip_address()}

    def run(self) -> None:
        try:
            self.body.follow(self.prepared)
        except (LearnerFailure, FloatingPointError):
            pass  # learner 0 is gone, or a non-finite loss that all learners saw: learner 0 tells the user


class RayLearners:
    """Learners 1..N-1 as Ray actors, placed together by a placement group of one bundle each
    (`learner.num_cpus_per_learner`, `learner.num_gpus_per_learner`), reachable across nodes: they
    join learner 0's rendezvous store at this node's address. Killing a learner's Ray actor kills the
    Ray actors it owns (its actors) with it."""

    def __init__(self, config: dict[str, Any], body: LearnerBody, world_size: int, timeout_s: float, backend: str,
                 num_cpus: float, num_gpus: float, placement_timeout_s: float = 120.0):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world_size = world_size
        self.handles: list[Any] = []
        self.runs: list[Any] = []
        self.where: list[dict[str, Any]] = []
        self._remove_group = remove_placement_group
        bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        _check_cluster_holds(ray.cluster_resources(), bundle, world_size)
        self.group = placement_group([bundle] * (world_size - 1), strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            have = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
            raise LearnerFailure(
                f"learner.num_learners={world_size}: Ray could not place {world_size - 1} learners with "
                f"{', '.join(f'{k} {v:g}' for k, v in bundle.items())} each within {placement_timeout_s:.0f} s; the "
                f"cluster has {', '.join(f'{k} {v:g}' for k, v in have.items())} in all. Lower learner.num_learners or "
                f"learner.num_cpus_per_learner / num_gpus_per_learner, or add nodes") from None
        host = ray.util.get_node_ip_address()
        self.store = main_store(host, world_size, timeout_s)
        self.spec = GroupSpec(0, world_size, host, self.store.port, timeout_s, backend)
        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)(RayLearnerBody)
        level = logging.getLogger("maze_cli").getEffectiveLevel() if log.isEnabledFor(logging.DEBUG) else logging.WARNING
        for rank in range(1, world_size):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=rank - 1)
            task = LearnerTask(config, GroupSpec(rank, world_size, host, self.store.port, timeout_s, backend), level)
            self.handles.append(remote.options(scheduling_strategy=strategy, name=None).remote(task, body))

    def wait_ready(self, timeout_s: float) -> None:
        """Until every learner has built its env; then each starts following. LearnerFailure naming
        the first learner that failed while starting."""
        import ray

        refs = [handle.prepare.remote() for handle in self.handles]
        try:
            ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            if waiting:
                raise LearnerFailure(f"learners {', '.join(str(refs.index(r) + 1) for r in waiting)} did not start within {timeout_s:.0f} s")
            for rank, ref in enumerate(refs, start=1):
                try:
                    self.where.append(ray.get(ref))
                except ray.exceptions.RayError as err:
                    raise LearnerFailure(f"learner {rank} failed while starting: {_ray_reason(err)}") from None
        except BaseException:
            self.stop()
            raise
        self.runs = [handle.run.remote() for handle in self.handles]

    def describe(self) -> list[str]:
        return [f"learner {rank} (pid {w['pid']} on {w['ip']})" for rank, w in enumerate(self.where, start=1)]

    def failure(self, err: Exception) -> str:
        """Why a collective failed: the learner whose Ray actor died or raised (waiting a moment for
        Ray to tell), else the collective's own error."""
        import ray

        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and self.runs:
            done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0.2)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as failure:
                    return f"learner {self.runs.index(ref) + 1} failed: {_ray_reason(failure)}"
        return _silent_learners(self.store, self.world_size, err)

    def stop(self, wait_s: float = 0.0) -> None:
        """After `wait_s` for learners told to stop (a finished run), kill every learner's Ray actor
        (and with it the actors it owns), and give the placement group back."""
        import ray

        if self.runs and wait_s:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=wait_s)
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.handles, self.runs = [], []
        try:
            self._remove_group(self.group)
        except Exception:  # noqa: BLE001 - Ray already shut down
            pass

    def __enter__(self) -> "RayLearners":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop(wait_s=_STOP_GRACE_S if exc_type is None else 0.0)


def _silent_learners(store: Any, world_size: int, err: Exception) -> str:
    """Why a collective failed when no learner died or raised: the learners that stopped answering
    (their heartbeat stood still), else the collective's own error."""
    try:
        silent = silent_learners(store, world_size)
    except RuntimeError:
        silent = []
    if silent:
        names = ", ".join(f"learner {rank}" for rank in silent)
        return (f"{names} stopped answering (alive, but {'its' if len(silent) == 1 else 'their'} heartbeat stood still) and "
                f"{'was' if len(silent) == 1 else 'were'} given up after learner.collective_timeout_s; a stopped (SIGSTOP) "
                f"or swapping process is the usual cause")
    return f"a collective of the learners failed ({first_line(err)})"


def _check_cluster_holds(total: dict[str, float], bundle: dict[str, float], world_size: int) -> None:
    """One line before anything starts where the whole cluster lacks what the learners need."""
    n = world_size - 1
    short = shortfall(total, bundle, n)
    if short:
        key = "num_gpus_per_learner" if "GPU" in short else "num_cpus_per_learner"
        have = ", ".join(f"{k} {total.get(k, 0.0):g}" for k in bundle)
        raise ConfigError(f"learner.num_learners={world_size}: the {n} learner{'s' if n > 1 else ''} beside this one need "
                          f"{', '.join(f'{k} {v:g}' for k, v in short.items())} in all and the Ray cluster has {have}; "
                          f"lower learner.num_learners or learner.{key}, or add nodes")


def _ray_reason(err: Exception) -> str:
    """A learner's error from Ray's, short: the learner's own message where it raised one (a
    MazeCliError is the user's to read), else how its actor process died."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, MazeCliError):
        return str(cause)
    if cause is not None:
        return f"{type(cause).__name__}: {first_line(cause)}"
    return died_reason(err)
