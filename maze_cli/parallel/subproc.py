"""Actors in subprocesses: rollouts cross the process boundary through preallocated shared memory.

Only a slot index and small metadata travel between the processes, and every actor has channels
of its own: a pipe of slots to fill (the learner's requests) and a pipe back to the learner. An
actor killed anywhere, inside a pipe operation too, thus breaks only its own channels,
which its restart replaces; no lock is shared that a dead actor could hold (the run's stop is a
shared flag, not a multiprocessing Event: its every `is_set` takes a lock shared by all processes,
and an actor killed inside one would block every other actor and the learner's stop). The learner owns the
pool of `queue_size + n_actors` slots and hands each free slot to the actor with the fewest open
ones, which bounds how stale a rollout can be (see `queue_out_of_sync_factor`); the slots of a
failed actor come back to the pool when it is restarted.
"""

from __future__ import annotations

import collections
import copy
import ctypes
import functools
import logging
import multiprocessing as mp
import multiprocessing.connection
import time
from typing import Any, Callable

import gymnasium as gym
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory pickling)
from torch import nn

from maze_cli.envs.source import EnvSource
from maze_cli.parallel.distributed_actors import DistributedActors, takes_actor_options
from maze_cli.parallel.requests import OpenRequests
from maze_cli.parallel.schedule import Job
from maze_cli.parallel.shared_memory import CHOICES, SharedTensors, memory_for, place, size_in_file
from maze_cli.parallel.shared_weights import SharedWeights
from maze_cli.parallel.subproc_actor import POLL_S, actor_process, allocate_slots
from maze_cli.records import Rollout
from maze_cli.start_methods import check_start_method, warm_up_start_method

log = logging.getLogger("maze_cli")
_JOIN_TIMEOUT_S = 5.0


class SubprocDistributedActors(DistributedActors):
    """Each actor in its own process (multiprocessing), fed weights and drained through shared memory.

    :param queue_out_of_sync_factor: the learner circulates `queue_size + n_actors` slots, with
        `queue_size = max(1, round(factor * batch_size))`: at most that many rollouts are filled or
        being filled ahead of the learner, and an actor without a free slot waits. A rollout's policy
        lag (the learner's broadcasts between its actor reading the weights and the collect that
        takes it) is then at most `ceil((queue_size + n_actors) / batch_size)` versions, if the
        learner broadcasts once per collect and the actors keep pace with each other (one much
        slower than the rest, e.g. descheduled on a busy machine, can be overtaken and lag more).
        Policy lag is measured per rollout (the `policy_lag` epoch stat).
    :param on_policy: see DistributedActors. The slots are then the learner's requests: after each
        broadcast it hands out `batch_size` of them, so an actor waits for the next broadcast once
        its requests are done, and a restarted actor's requests go to the others.
    :param start_method: one of `multiprocessing.get_all_start_methods()`; forkserver by default.
    :param shared_memory: where the rollout slots and weights live: `shm` (/dev/shm), `file` (a file in
        the temp dir, mapped by every process), or `auto`: /dev/shm if it has the room, else a file
        with a warning (see maze_cli.parallel.shared_memory).
    :param options: DistributedActors' (`max_restarts`: a failed actor's slots come back to the pool).
    """

    @takes_actor_options
    def __init__(
        self,
        env_factory: EnvSource | Callable[[], gym.Env],
        policy: nn.Module,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        queue_out_of_sync_factor: float = 1.0,
        start_method: str | None = None,
        shared_memory: str = "auto",
        **options: Any,
    ):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size, **options)
        if queue_out_of_sync_factor <= 0:
            raise ValueError("queue_out_of_sync_factor must be positive")
        self.start_method = check_start_method(start_method)
        if shared_memory not in CHOICES:
            raise ValueError(f"shared_memory must be one of {', '.join(CHOICES)}, not {shared_memory!r}")
        self.shared_memory = shared_memory
        self.queue_size = max(1, round(queue_out_of_sync_factor * batch_size))
        self.processes: list[mp.Process] = []
        self._stopped = True

    def _start_actors(self) -> None:
        self._ctx = mp.get_context(self.start_method)
        warm_up_start_method(self.start_method)
        # on-policy: one batch requested at a time; else the queue bound plus one being filled per actor;
        # reproducible: the batches the schedule requests ahead of the learner
        if self.schedule:
            n_slots = (self.schedule.lag + 1) * self.batch_size
        else:
            n_slots = self.batch_size + self.n_actors if self.on_policy else self.queue_size + self.n_actors
        allocate = functools.partial(allocate_slots, self.rollout_spec, n_slots)
        slots_bytes, weights_bytes = size_in_file([allocate]), SharedWeights.size_in_file(self.policy)
        n_weights = self.schedule.versions_kept if self.schedule else 1
        needed = slots_bytes + n_weights * weights_bytes
        directory = place(self.shared_memory, needed, "runner.envs_per_actor, algorithm.n_rollout_steps or runner.n_actors")
        self._memories = [memory_for(directory, slots_bytes)] + [memory_for(directory, weights_bytes) for _ in range(n_weights)]
        self._slots = SharedTensors(allocate, self._memories[0])
        self.slots = self._slots.value
        total = self.slots.nbytes
        log.info(f"shared memory{'' if directory is None else f' (a file in {directory})'}: {total / n_slots / 2**20:.2f} MiB per "
                 f"rollout slot, {n_slots} slots, {total / 2**20:.1f} MiB in all")
        # Each actor's own channels: its requests (slots to fill) and its pipe back; the learner's
        # bookkeeping: slots not handed out, each actor's open requests (slot -> policy version and
        # time of the request), and messages received but not yet taken.
        self._requests: list = [None] * self.n_actors
        self._request_readers: list = [None] * self.n_actors
        self._inboxes: list = [None] * self.n_actors
        self._idle_slots = list(range(n_slots))
        self._open = OpenRequests(self.n_actors)
        self._received: collections.deque = collections.deque()
        self._jobs: dict[int, Job] = {}  # reproducible mode: slot -> the scheduled rollout it was requested for
        self._arrived: dict[Job, tuple[int, Any]] = {}  # and the rollouts in, by job: (slot, info)
        self.weights = [SharedWeights(self.policy, memory) for memory in self._memories[1:]]
        self._stopping = self._ctx.RawValue(ctypes.c_bool, False)
        self._policy_copy = copy.deepcopy(self.policy)
        self._stopped = False
        self.processes = [None] * self.n_actors
        for i in range(self.n_actors):
            self._spawn(i)
        if self._resume is not None:  # the rollouts a resumed run's checkpoint collected ahead of its learner
            for job, rollout, info in self._resume["arrived"]:
                slot = self._idle_slots.pop()
                self.slots.slot(slot).copy_(rollout)
                self._arrived[job] = (slot, info)
            self._resume = None
        if not self.schedule:  # reproducible: requested as the schedule says, when the learner collects
            self._hand_out(0)

    def _spawn(self, index: int) -> None:
        """Start actor `index` with fresh channels of its own."""
        # Requests travel through a pipe the learner writes itself: an mp.Queue's feeder thread would
        # contend for the learner's GIL after every slot handed out, which costs most when the actors
        # keep every core busy (benchmarks/ACTING.md). The learner keeps its copy of the reading end
        # open, so a write to a dead actor's pipe never fails (a few bytes a slot, at most the pool's
        # slots: it never fills); a restart replaces the pipe.
        self._request_readers[index], self._requests[index] = self._ctx.Pipe(duplex=False)
        inbox, outbox = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(target=actor_process, name=f"maze-actor-{index}", args=self._actor_args(index, outbox), daemon=True)
        process.start()
        outbox.close()  # the child holds the only sending end: its death reads as the end of the pipe
        self._inboxes[index] = inbox
        self.processes[index] = process

    def _actor_args(self, index: int, outbox) -> tuple:
        """What actor process `index` is given: everything it shares with the learner and the others."""
        env_seed, agent_seed = self.supervisor.seeds(index)
        return (index, self.env_factory, self._policy_copy, self.rollout_spec, self._slots, self._request_readers[index], outbox,
                self.weights, self._stopping, env_seed, agent_seed, self.initial_policy, self.supervisor.actor_restarts[index],
                self._resume_snapshot(index), self.run_envs(index))

    def _hand_out(self, received: int) -> None:
        """Give slots to the actors, each to the one with the fewest open requests: on-policy, what
        this version's batch still lacks (`received` rollouts are in); else every free slot."""
        wanted = self._open.lacking(self.batch_size, received, self.policy_version) if self.on_policy else len(self._idle_slots)
        for _ in range(min(wanted, len(self._idle_slots))):
            index = self._open.least_busy(self.policy_version)
            slot = self._idle_slots.pop()
            self._open.add(index, slot, self.policy_version)
            self._requests[index].send(slot)

    def _restart_actor(self, index: int) -> None:
        """Replace actor `index`: its channels die with it, its open slots come back to the pool."""
        old = self.processes[index]
        if old.is_alive():
            old.kill()
        old.join(timeout=_JOIN_TIMEOUT_S)
        self._close_channels(index)
        dropped = self._open.drop(index)
        self._idle_slots += dropped
        self._spawn(index)
        if self.schedule:  # the lost requests again, in their order, from the new actor
            for job in sorted((self._jobs.pop(slot) for slot in dropped), key=lambda j: (j.batch, j.index)):
                self._request_job(job)
        elif not self.on_policy:  # on-policy, _next_message re-requests what the batch still lacks
            self._hand_out(0)

    def _close_channels(self, index: int) -> None:
        self._requests[index].close()
        self._request_readers[index].close()
        self._inboxes[index].close()

    def stop(self) -> None:
        """Signal the actors, join them (none can block on a full channel), and kill any that linger."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping.value = True
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for process in self.processes:
            while process.is_alive() and time.monotonic() < deadline:
                self._receive(timeout=0)  # keep the pipes flowing while actors finish a send
                process.join(timeout=0.05)
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=_JOIN_TIMEOUT_S)
        for index in range(self.n_actors):
            self._close_channels(index)
        self.processes = []
        for memory in self._memories:  # a file's descriptor; its mapping lives on in the learner's tensors
            getattr(memory, "close", lambda: None)()

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        if self.schedule:  # into the ring, over the oldest version, which no open request needs
            self.policy_version += 1
            self.weights[self.policy_version % len(self.weights)].publish(state_dict)
            return
        self.policy_version = self.weights[0].publish(state_dict)
        if self.on_policy:
            self._hand_out(0)  # after publishing: these rollouts use the new version

    def _receive(self, timeout: float) -> None:
        """Move every message that has arrived (waiting up to `timeout` for one) into `_received`,
        tagged with its actor. A pipe whose actor died reads as ended; `_check_alive` restarts it."""
        inboxes = {inbox: i for i, inbox in enumerate(self._inboxes) if not inbox.closed}
        for inbox in mp.connection.wait(list(inboxes), timeout=timeout):
            try:
                while inbox.poll(0):
                    self._received.append(inbox.recv())
            except (EOFError, OSError):
                pass  # the actor is gone; its sentinel says so to _check_alive

    def _check_alive(self) -> None:
        """Recover any actor whose process is gone (one poll over the process sentinels)."""
        dead = mp.connection.wait([p.sentinel for p in self.processes], timeout=0)
        for i, process in enumerate(self.processes):
            if process.sentinel in dead:
                process.join(timeout=0)
                self._receive(timeout=0)  # what it sent before dying, its error report included
                if process.exitcode == 0 and any(m[0] == "error" and m[1] == i and m[2] == self.supervisor.actor_restarts[i] for m in self._received):
                    continue  # it reported its error and exited: recover when that report is taken
                self._actor_failed(i, f"process {process.pid} exited with code {process.exitcode}")

    def _next_message(self, received: int) -> tuple:
        """The next message, recovering dead or silent actors while waiting (and, on-policy,
        handing a restarted actor's requests to the others; `received` rollouts are in)."""
        while not self._received:
            if self.on_policy and not self.schedule:
                self._hand_out(received)
            self._receive(timeout=POLL_S)
            if not self._received:
                self._check_alive()
                self._check_silent()
        return self._received.popleft()

    def _check_actors(self) -> None:
        self._check_alive()
        self._check_silent()  # the others may keep delivering while one actor hangs

    def _queue_size(self) -> int:
        self._receive(timeout=0)
        return len(self._received)

    def _next_rollout(self, received: int) -> tuple[int, Any] | None:
        """The next rollout in, as (slot, info); None after a message that brought none (an actor's
        error, recovered from here, or a message of a process already replaced)."""
        kind, *payload = self._next_message(received)
        if kind == "snapshot":
            return None  # (a reply to a snapshot request the learner no longer waits for)
        if kind == "error":
            index, generation, slot, details = payload
            if generation == self.supervisor.actor_restarts[index]:  # else from a process already replaced
                self.processes[index].join(timeout=_JOIN_TIMEOUT_S)  # it exits after reporting
                self._actor_failed(index, details)  # the restart takes back its slots
            return None
        slot, info, generation = payload
        if generation != self.supervisor.actor_restarts[info.actor_index]:
            return None  # sent by a replaced process: its slots were taken back, maybe handed out again
        self._open.close(info.actor_index, slot)
        return slot, info

    # -- reproducible mode ---------------------------------------------------------------------
    def _request_job(self, job: Job) -> None:
        """Ask the job's actor for its rollout, with the job's policy version (kept in the ring)."""
        slot = self._idle_slots.pop()
        self._jobs[slot] = job
        self._open.add(job.actor, slot, job.version)
        self._requests[job.actor].send((slot, job.version))

    def _batch_in(self) -> bool:
        batch = self.schedule.next_batch
        return sum(job.batch == batch for job in self._arrived) == self.batch_size

    def _wait_for_next_batch(self) -> None:
        while not self._batch_in():
            rollout = self._next_rollout(0)
            if rollout is not None:
                slot, info = rollout
                self._arrived[self._jobs.pop(slot)] = (slot, info)

    def _actor_snapshots(self) -> list[bytes]:
        for requests in self._requests:
            requests.send("snapshot")
        snapshots: dict[int, bytes | str] = {}
        while len(snapshots) < self.n_actors:
            if not self._received:
                self._receive(timeout=POLL_S)
                self._check_alive()  # one that died is restarted: the run is then no longer reproducible
            if self._diverged:
                raise RuntimeError("an actor failed while its state was saved")
            if not self._received:
                continue
            kind, *payload = message = self._received.popleft()
            if kind != "snapshot":  # an actor's error report: recovered there
                self._received.appendleft(message)
                self._next_rollout(0)
                continue
            index, snapshot, generation = payload
            if generation == self.supervisor.actor_restarts[index]:
                snapshots[index] = snapshot
        errors = [s for s in snapshots.values() if isinstance(s, str)]
        if errors:
            raise RuntimeError(errors[0])
        return [snapshots[i] for i in range(self.n_actors)]

    def _rollout_of(self, slot: int) -> Rollout:
        return self.slots.slot(slot)

    def _owes_rollout_since(self, index: int) -> float | None:
        """An actor owes a rollout while it holds a requested slot (without one it waits on the
        learner, on purpose): see OpenRequests.owed_since."""
        return self._open.owed_since(index, self.supervisor.last_seen[index])

    def _release(self, slot: int) -> None:
        """A slot the learner is done with: back to the pool; off-policy, handed out again at once
        (on-policy it waits for the next version's requests)."""
        self._idle_slots.append(slot)
        if not self.on_policy and not self.schedule:
            self._hand_out(0)

    def alive_pids(self) -> list[int]:
        """PIDs of actor processes still running (for checks that nothing outlives the run)."""
        return [p.pid for p in self.processes if p.is_alive()]
