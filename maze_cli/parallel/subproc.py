"""Actors in subprocesses: rollouts cross the process boundary through preallocated shared memory.

Only a slot index and small metadata travel through the queue. The pool holds
`queue_size + n_actors` slots: each actor fills one slot at a time, and at most `queue_size`
filled slots wait for the learner, which bounds how stale a rollout can be.
"""

from __future__ import annotations

import copy
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
from maze_cli.parallel.distributed_actors import ActorFailure, DistributedActors
from maze_cli.parallel.shared_weights import SharedWeights
from maze_cli.records import Rollout, RolloutSpec
from maze_cli.start_methods import default_start_method, warm_up_start_method

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
) -> None:
    """The body of one actor subprocess: pull weights if newer, take a free slot, fill it, hand it over."""
    torch.set_num_threads(1)
    actor = None
    try:
        actor = Actor(index, env_factory, policy, spec.n_envs, spec.n_steps, env_seed, agent_seed, initial_policy)
        while not stop_event.is_set():
            if weights.version != actor.policy_version:
                actor.policy_version = weights.pull(actor.policy)
            t0 = time.perf_counter()
            slot = _get(free_slots, stop_event)
            if slot is None:
                break
            wait = time.perf_counter() - t0
            info = actor.collect(slots.slot(slot))
            info.timings["actor_wait_s"] = wait
            if not _put(filled_slots, ("rollout", slot, info), stop_event):
                break
    except KeyboardInterrupt:
        pass
    except Exception:
        _put(filled_slots, ("error", index, traceback.format_exc()), stop_event)
    finally:
        if actor is not None:
            actor.close()


class SubprocDistributedActors(DistributedActors):
    """Each actor in its own process (multiprocessing), fed weights and drained through shared memory.

    :param queue_out_of_sync_factor: the queue holds at most `factor * batch_size` rollouts, so a
        rollout is at most that many rollouts (plus one per actor in flight) behind the learner.
    :param start_method: one of `multiprocessing.get_all_start_methods()`; forkserver by default.
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
    ):
        super().__init__(
            env_factory, policy, n_rollout_steps, n_actors, batch_size, envs_per_actor, actor_env_seeds, actor_agent_seeds,
            initial_policy,
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

    def start(self) -> None:
        ctx = mp.get_context(self.start_method)
        warm_up_start_method(self.start_method)
        self.slots = self.rollout_spec.allocate(shared=True, n_slots=self.queue_size + self.n_actors)
        self.free_slots = ctx.Queue()
        for slot in range(self.queue_size + self.n_actors):
            self.free_slots.put(slot)
        self.filled_slots = ctx.Queue(maxsize=self.queue_size)
        self.weights = SharedWeights(self.policy, ctx.Lock())
        self.stop_event = ctx.Event()
        policy_copy = copy.deepcopy(self.policy)
        self._stopped = False
        for i in range(self.n_actors):
            process = ctx.Process(
                target=actor_process,
                name=f"maze-actor-{i}",
                args=(
                    i, self.env_factory, policy_copy, self.rollout_spec, self.slots, self.free_slots, self.filled_slots,
                    self.weights, self.stop_event, self.actor_env_seeds[i], self.actor_agent_seeds[i], self.initial_policy,
                ),
                daemon=True,
            )
            process.start()
            self.processes.append(process)

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
        for q in (self.free_slots, self.filled_slots):
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

    def _check_alive(self) -> None:
        """Raise ActorFailure if any actor process is gone (one poll over the process sentinels)."""
        dead = mp.connection.wait([p.sentinel for p in self.processes], timeout=0)
        for i, process in enumerate(self.processes):
            if process.sentinel in dead:
                process.join(timeout=0)
                raise ActorFailure(
                    i, self.actor_env_seeds[i], self.actor_agent_seeds[i],
                    f"process {process.pid} exited with code {process.exitcode}",
                )

    def _next_message(self) -> tuple:
        """The next queue message; raises ActorFailure as soon as an actor process is gone."""
        while True:
            try:
                return self.filled_slots.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_alive()

    def collect_outputs(self, learner_device: str) -> tuple[Rollout, float, float, float]:
        self._check_alive()
        queue_before = self.filled_slots.qsize()
        start = time.perf_counter()
        taken: list[int] = []
        while len(taken) < self.batch_size:
            kind, *payload = self._next_message()
            if kind == "error":
                index, details = payload
                raise ActorFailure(index, self.actor_env_seeds[index], self.actor_agent_seeds[index], details)
            slot, info = payload
            self._record_rollout(info)
            taken.append(slot)
        dequeue_time = time.perf_counter() - start
        batch = Rollout.cat([self.slots.slot(s) for s in taken]).to(learner_device)
        for slot in taken:
            self.free_slots.put(slot)
        return batch, float(queue_before), float(self.filled_slots.qsize()), dequeue_time

    def alive_pids(self) -> list[int]:
        """PIDs of actor processes still running (for checks that nothing outlives the run)."""
        return [p.pid for p in self.processes if p.is_alive()]
