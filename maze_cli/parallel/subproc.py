"""Actors in subprocesses: rollouts cross the process boundary through preallocated shared memory.

Only a slot index and small metadata travel through the queue. The pool holds
`queue_size + n_actors` slots: each actor fills one slot at a time, and at most `queue_size`
filled slots wait for the learner, which bounds how stale a rollout can be (see
`queue_out_of_sync_factor`).
"""

from __future__ import annotations

import copy
import logging
import multiprocessing as mp
import multiprocessing.connection

import queue
import time
import traceback
from typing import Callable

import gymnasium as gym
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory pickling)
from torch import nn

from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.distributed_actors import DistributedActors
from maze_cli.parallel.shared_weights import SharedWeights
from maze_cli.records import Rollout, RolloutSpec
from maze_cli.start_methods import default_start_method, warm_up_start_method

log = logging.getLogger("maze_cli")
_POLL_S = 0.2
_JOIN_TIMEOUT_S = 5.0


def _put(q, item, stop_event) -> bool:
    """Put unless the run is stopping or the parent is gone; True if put."""
    parent = mp.parent_process()
    while not stop_event.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            if parent is not None and not parent.is_alive():
                return False
    return False


def _get(q, stop_event):
    """Get unless the run is stopping or the parent is gone; None then."""
    parent = mp.parent_process()
    while not stop_event.is_set():
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None
    return None


def actor_process(
    index: int,
    env_factory: Callable[[], gym.Env],
    policy: nn.Module,
    spec: RolloutSpec,
    slots: Rollout,
    free_slots,
    filled_slots,
    weights: SharedWeights,
    stop_event,
    env_seed: int,
    agent_seed: int,
    initial_policy: nn.Module | None,
    generation: int,
) -> None:
    """The body of one actor subprocess: take a free slot, pull weights if newer, fill it, hand it over.

    `generation` counts the actor's restarts; its error report carries it, so that a report from a
    process the learner already replaced is not counted twice."""
    torch.set_num_threads(1)
    actor = None
    slot = None  # the slot this actor holds, handed back with an error report
    try:
        actor = Actor(index, env_factory, policy, spec.n_envs, spec.n_steps, env_seed, agent_seed, initial_policy)
        while not stop_event.is_set():
            t0 = time.perf_counter()
            slot = _get(free_slots, stop_event)
            if slot is None:
                break
            wait = time.perf_counter() - t0
            # After taking the slot: an on-policy learner publishes before it hands out slots.
            if weights.version != actor.policy_version:
                actor.policy_version = weights.pull(actor.policy)
            info = actor.collect(slots.slot(slot))
            info.timings["actor_wait_s"] = wait
            if not _put(filled_slots, ("rollout", slot, info, generation), stop_event):
                break
            slot = None
    except KeyboardInterrupt:
        pass
    except Exception:
        _put(filled_slots, ("error", index, generation, slot, traceback.format_exc()), stop_event)
    finally:
        if actor is not None:
            actor.close()


class SubprocDistributedActors(DistributedActors):
    """Each actor in its own process (multiprocessing), fed weights and drained through shared memory.

    :param queue_out_of_sync_factor: the queue holds at most `queue_size = max(1, round(factor *
        batch_size))` finished rollouts; an actor whose rollout finds it full waits. Ahead of a
        rollout, when its actor reads the weights, are then at most the queue and one rollout per
        actor, so its policy lag (the learner's broadcasts between that read and the collect that
        takes it) is at most `ceil((queue_size + n_actors) / batch_size)` versions, if the learner
        broadcasts once per collect. That holds while the actors keep pace with each other: one much
        slower than the rest (e.g. descheduled on a busy machine) can be overtaken and lag more.
        Policy lag is measured per rollout (the `policy_lag` epoch stat).
    :param on_policy: see DistributedActors. Free slots are then the learner's requests: after each
        broadcast it hands out `batch_size` of them, each into the own queue of the actor with the
        fewest open requests, so an actor waits for the next broadcast once its requests are done.
        The learner knows which actor holds which request: a restarted actor's requests go to the
        others, and an actor killed while waiting on its queue blocks no other actor.
    :param start_method: one of `multiprocessing.get_all_start_methods()`; forkserver by default.
    :param max_restarts: see DistributedActors; a dead process may take its slot with it, so the
        pool holds one spare slot per allowed restart.
    :param rollout_timeout_s: see DistributedActors.
    """

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        policy: nn.Module,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        queue_out_of_sync_factor: float = 1.0,
        start_method: str | None = None,
        actor_env_seeds: list[int] | None = None,
        actor_agent_seeds: list[int] | None = None,
        envs_per_actor: int = 1,
        initial_policy: nn.Module | None = None,
        max_restarts: int = 0,
        rollout_timeout_s: float | None = None,
        max_policy_lag: int | None = None,
        on_policy: bool = False,
    ):
        super().__init__(
            env_factory, policy, n_rollout_steps, n_actors, batch_size, envs_per_actor, actor_env_seeds, actor_agent_seeds,
            initial_policy, max_restarts, rollout_timeout_s, max_policy_lag, on_policy,
        )
        if queue_out_of_sync_factor <= 0:
            raise ValueError("queue_out_of_sync_factor must be positive")
        self.start_method = start_method or default_start_method()
        if self.start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"start_method '{self.start_method}' is not available here; use one of {', '.join(mp.get_all_start_methods())}"
            )
        self.queue_size = max(1, round(queue_out_of_sync_factor * batch_size))
        self.processes: list[mp.Process] = []
        self._stopped = True

    def _start_actors(self) -> None:
        self._ctx = mp.get_context(self.start_method)
        warm_up_start_method(self.start_method)
        if self.on_policy:  # one batch requested at a time
            n_slots = self.batch_size + self.n_actors
        else:
            n_slots = self.queue_size + self.n_actors + self.max_restarts
        self.slots = self.rollout_spec.allocate(shared=True, n_slots=n_slots)
        total = self.slots.nbytes
        log.info(f"shared memory: {total / n_slots / 2**20:.2f} MiB per rollout slot, {n_slots} slots, {total / 2**20:.1f} MiB in all")
        self.free_slots = self._ctx.Queue()
        # on-policy: one request queue per actor, the slots not handed out, and each actor's open
        # requests (slot -> policy version and time of the request)
        self._requests = [self._ctx.Queue() for _ in range(self.n_actors)] if self.on_policy else []
        self._idle_slots = list(range(n_slots)) if self.on_policy else []
        self._open: list[dict[int, tuple[int, float]]] = [{} for _ in range(self.n_actors)]
        if not self.on_policy:
            for slot in range(n_slots):
                self.free_slots.put(slot)
        self.filled_slots = self._ctx.Queue(maxsize=n_slots if self.on_policy else self.queue_size)
        self.weights = SharedWeights(self.policy)
        self.stop_event = self._ctx.Event()
        self._policy_copy = copy.deepcopy(self.policy)
        self._stopped = False
        self.processes = [None] * self.n_actors
        for i in range(self.n_actors):
            self._spawn(i)
        if self.on_policy:
            self._request_batch(0)

    def _spawn(self, index: int) -> None:
        env_seed, agent_seed = self.restart_seeds(index)
        process = self._ctx.Process(
            target=actor_process,
            name=f"maze-actor-{index}",
            args=(
                index, self.env_factory, self._policy_copy, self.rollout_spec, self.slots,
                self._requests[index] if self.on_policy else self.free_slots, self.filled_slots,
                self.weights, self.stop_event, env_seed, agent_seed, self.initial_policy, self.actor_restarts[index],
            ),
            daemon=True,
        )
        process.start()
        self.processes[index] = process

    def _request_batch(self, received: int) -> None:
        """On-policy: request what this version's batch still lacks (`received` rollouts are in),
        each from the actor with the fewest open requests."""
        current = sum(1 for open_ in self._open for version, _ in open_.values() if version == self.policy_version)
        for _ in range(self.batch_size - received - current):
            index = min(range(self.n_actors), key=lambda i: (len(self._open[i]), (i - self.policy_version) % self.n_actors))
            slot = self._idle_slots.pop()
            self._open[index][slot] = (self.policy_version, time.monotonic())
            self._requests[index].put(slot)

    def _restart_actor(self, index: int) -> None:
        old = self.processes[index]
        if old.is_alive():
            old.kill()
        old.join(timeout=_JOIN_TIMEOUT_S)
        if self.on_policy:  # its requests died with it: the queue (its lock too) and the slots
            self._requests[index].cancel_join_thread()
            self._requests[index].close()
            self._requests[index] = self._ctx.Queue()
            self._idle_slots += list(self._open[index])
            self._open[index] = {}
        self._spawn(index)

    def stop(self) -> None:
        """Signal the actors, drain the queue so none blocks, join them, and kill any that linger."""
        if self._stopped:
            return
        self._stopped = True
        self.stop_event.set()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for process in self.processes:
            while process.is_alive() and time.monotonic() < deadline:
                self._drain()
                process.join(timeout=0.05)
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=_JOIN_TIMEOUT_S)
        for q in (self.free_slots, self.filled_slots, *self._requests):
            q.cancel_join_thread()
            q.close()
        self.processes = []

    def _drain(self) -> None:
        try:
            while True:
                self.filled_slots.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.policy_version = self.weights.publish(state_dict)
        if self.on_policy:
            self._request_batch(0)  # after publishing: these rollouts use the new version

    def _check_alive(self) -> None:
        """Recover any actor whose process is gone (one poll over the process sentinels)."""
        dead = mp.connection.wait([p.sentinel for p in self.processes], timeout=0)
        for i, process in enumerate(self.processes):
            if process.sentinel in dead:
                process.join(timeout=0)
                if process.exitcode == 0:
                    # An actor exits cleanly only after putting its error report in the queue
                    # (a process flushes its queue before exiting): recover when that arrives.
                    continue
                self._actor_failed(i, f"process {process.pid} exited with code {process.exitcode}")

    def _next_message(self, received: int) -> tuple:
        """The next queue message, recovering dead or silent actors while waiting (and, on-policy,
        handing a restarted actor's requests to the others; `received` rollouts are in)."""
        while True:
            if self.on_policy:
                self._request_batch(received)
            try:
                return self.filled_slots.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_alive()
                self._check_silent()

    def collect_outputs(self, learner_device: str) -> tuple[Rollout, float, float, float]:
        self._check_alive()
        self._check_silent()  # the others may keep the queue full while one actor hangs
        queue_before = self.filled_slots.qsize()
        start = time.perf_counter()
        taken: list[int] = []
        while len(taken) < self.batch_size:
            kind, *payload = self._next_message(len(taken))
            if kind == "error":
                index, generation, slot, details = payload
                if slot is not None and not self.on_policy:
                    self.free_slots.put(slot)  # on-policy: the restart takes back all its requests
                if generation != self.actor_restarts[index]:
                    continue  # from a process already replaced (e.g. killed as silent after it reported)
                self.processes[index].join(timeout=_JOIN_TIMEOUT_S)  # it exits after reporting
                self._actor_failed(index, details)
                continue
            slot, info, generation = payload
            if self.on_policy:
                if generation != self.actor_restarts[info.actor_index]:
                    continue  # a replaced process's request: taken back, and maybe handed out again
                self._open[info.actor_index].pop(slot)
            if self._record_rollout(info):
                taken.append(slot)
            else:
                self._release(slot)
        dequeue_time = time.perf_counter() - start
        batch = Rollout.cat([self.slots.slot(s) for s in taken]).to(learner_device)
        for slot in taken:
            self._release(slot)
        return batch, float(queue_before), float(self.filled_slots.qsize()), dequeue_time

    def _owes_rollout_since(self, index: int) -> float | None:
        if not self.on_policy:
            return super()._owes_rollout_since(index)
        asked = [when for _, when in self._open[index].values()]
        return max(min(asked), self.last_seen[index]) if asked else None

    def _release(self, slot: int) -> None:
        """A slot the learner is done with: free again, or (on-policy) kept for the next request."""
        if self.on_policy:
            self._idle_slots.append(slot)
        else:
            self.free_slots.put(slot)

    def alive_pids(self) -> list[int]:
        """PIDs of actor processes still running (for checks that nothing outlives the run)."""
        return [p.pid for p in self.processes if p.is_alive()]
