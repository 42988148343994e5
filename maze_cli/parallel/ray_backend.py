"""Actors as Ray actors, on one machine or a cluster: `runner=ray`.

The same actor loop runs inside each Ray actor. Rollouts come back as object refs and the learner
takes whichever are ready first (`ray.wait`); each actor has at most `max_in_flight_per_actor`
rollouts requested, which bounds staleness. Weights travel as one `ray.put` per broadcast plus a
version number; an actor fetches them only when the version moved.

Failures are handled by DistributedActors, not by Ray's own actor restarts, so that every backend
restarts the same way: an exception in an actor, a dead actor process (or node), and an actor
silent for `rollout_timeout_s` all kill the Ray actor and start a fresh one with seeds derived from
its seed and restart count, within `max_restarts` per run; its rollouts in flight are dropped.
This module only tells which of Ray's errors means which failure, and how to replace a Ray actor.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import gymnasium as gym
import torch
from torch import nn

from maze_cli.errors import MazeCliError, first_line
from maze_cli.envs.mujoco import quiet_env_library_warnings
from maze_cli.envs.source import EnvSource
from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.distributed_actors import DistributedActors, takes_actor_options
from maze_cli.parallel.ray_cluster import connect, died_reason, import_ray, kill, shortfall
from maze_cli.parallel.requests import OpenRequests
from maze_cli.parallel.schedule import Job
from maze_cli.records import Rollout, RolloutInfo

log = logging.getLogger("maze_cli")

_POLL_S = 1.0
_PLACEMENT_LOG_S = 10.0  # while actors wait for resources, say so this often
_START_S = 60.0  # how long actors the cluster has room for may take to start, whatever runner.rollout_timeout_s says


class ActorsNotPlaced(MazeCliError, RuntimeError):
    """The cluster lacks the resources for some actors; waiting longer would be a hang."""


class RayActorBody:
    """What runs inside one Ray actor: an `Actor` and a record it refills for every request."""

    def __init__(self, index: int, env_seed: int, agent_seed: int, shared: tuple, snapshot: bytes | None = None,
                 run_envs: tuple[range, int] | None = None):
        """`shared` is (env_factory, policy, rollout spec, initial policy), the same for every actor;
        `snapshot`, a resumed run's saved state of this actor (`Actor.snapshot`); `run_envs`, where
        its envs sit among the run's (`Actor`)."""
        env_factory, policy, spec, initial_policy = shared
        quiet_env_library_warnings()  # the learner's process shows them, once
        torch.set_num_threads(1)
        self.actor = Actor(index, env_factory, policy, spec.n_envs, spec.n_steps, env_seed, agent_seed, initial_policy, snapshot, run_envs)
        self.record = spec.allocate()
        self._last_end: float | None = None  # when the previous rollout was done: idle time is measured from it

    def placement(self) -> dict[str, Any]:
        import os

        import ray

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def snapshot(self) -> bytes:
        return self.actor.snapshot()

    def collect(self, weights: list) -> tuple[Rollout, RolloutInfo]:
        """`weights` is [version, ref] (in a list, so Ray does not fetch the ref unless we ask)."""
        version, ref = weights
        idle = 0.0 if self._last_end is None else time.perf_counter() - self._last_end
        if version != self.actor.policy_version:
            import ray

            self.actor.load_policy(ray.get(ref), version)
        info = self.actor.collect(self.record)
        info.timings["actor_wait_s"] = idle
        self._last_end = time.perf_counter()
        return self.record, info


class RayDistributedActors(DistributedActors):
    """Each actor a Ray actor; Ray is started locally when `address` is None, else joined.

    :param address: None (start a local Ray), "auto", or "host:port" of a running cluster.
    :param num_cpus_per_actor, num_gpus_per_actor, resources: what each Ray actor reserves.
    :param max_restarts: failed actors restarted per run (a fresh Ray actor, derived seeds, its
        rollouts in flight dropped); one more failure ends the run.
    :param max_in_flight_per_actor: rollouts requested ahead from each actor.
    :param options: DistributedActors' (`rollout_timeout_s` is also how long actors may wait to be
        placed). On-policy, the learner requests `batch_size` rollouts after each broadcast (spread
        over the actors, each request carrying that version's weights) and none in between.
    """

    @takes_actor_options
    def __init__(
        self,
        env_factory: EnvSource | Callable[[], gym.Env],
        policy: nn.Module,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        address: str | None = None,
        num_cpus_per_actor: float = 1.0,
        num_gpus_per_actor: float = 0.0,
        resources: dict[str, float] | None = None,
        max_restarts: int = 3,
        max_in_flight_per_actor: int = 2,
        **options: Any,
    ):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size, max_restarts=max_restarts, **options)
        self.address = address
        # Ray itself never restarts or retries: a failure is ours to count and to recover from.
        self.actor_options = {
            "num_cpus": num_cpus_per_actor, "num_gpus": num_gpus_per_actor, "resources": dict(resources or {}),
            "max_restarts": 0, "max_task_retries": 0, "scheduling_strategy": "SPREAD",
        }
        self.max_in_flight = max_in_flight_per_actor
        self.handles: list = []
        self.pending: dict = {}  # rollout ref -> actor index
        self._open = OpenRequests(n_actors)  # the same refs, per actor, with the version and time of the request
        self._jobs: dict = {}  # reproducible mode: rollout ref -> its scheduled job
        self._arrived: dict[Job, tuple[Rollout, RolloutInfo]] = {}  # and the rollouts in, by job
        self._weight_refs: dict[int, Any] = {}  # reproducible mode: the versions open requests may name
        self.placements: list[dict[str, Any]] = []
        self._connected = False

    # -- lifecycle -----------------------------------------------------------------------------
    def _start_actors(self) -> None:
        ray = import_ray()
        self._connected = connect(self.address, self.n_actors * self.actor_options["num_cpus"], f"{self.n_actors} actors x "
                                  f"runner.num_cpus_per_actor={self.actor_options['num_cpus']:g}")
        try:
            self._remote = ray.remote(**self.actor_options)(RayActorBody)
            # Put once: every (re)started actor gets the same objects without pickling them again.
            self._actor_args = ray.put((self.env_factory, self.policy, self.rollout_spec, self.initial_policy))
            self.handles = [self._new_actor(i) for i in range(self.n_actors)]
            self.placements = self._await_placement(ray)
        except BaseException:
            self.stop()  # the caller's `with` never reaches __exit__ when start fails
            raise
        self._weights = [0, ray.put({k: v.detach().cpu() for k, v in self.policy.state_dict().items()})]
        self._weight_refs = {0: self._weights[1]}
        if self.schedule:  # requested as the schedule says, when the learner collects
            if self._resume is not None:  # the rollouts a resumed run's checkpoint collected ahead of its learner
                self._arrived = {job: (rollout, info) for job, rollout, info in self._resume["arrived"]}
                self._resume = None
            return
        if self.on_policy:
            self._request_batch(0)
        else:
            for i in range(self.n_actors):
                self._request_all(i)

    def _new_actor(self, index: int):
        env_seed, agent_seed = self.supervisor.seeds(index)
        return self._remote.remote(index, env_seed, agent_seed, self._actor_args, self._resume_snapshot(index), self.run_envs(index))

    def stop(self) -> None:
        """Kill this run's Ray actors; shut Ray down if this object started or joined it."""
        if not self.handles and not self._connected:
            return
        ray = import_ray()
        for handle in self.handles:
            kill(ray, handle)
        self.handles, self.pending, self._open, self._jobs = [], {}, OpenRequests(self.n_actors), {}
        if self._connected:
            ray.shutdown()
            self._connected = False

    def nodes(self) -> set[str]:
        """Ids of the nodes the actors were placed on."""
        return {p["node_id"] for p in self.placements if p}

    def _await_placement(self, ray) -> list[dict[str, Any]]:
        """Where each actor runs, logged; an empty dict for one that failed to start (its first
        rollout request meets the failure and recovers from it). Actors the cluster cannot place
        within `rollout_timeout_s` (or `_START_S`, where it has the resources for them all) end the
        run with what they need and what the cluster has."""
        from ray.exceptions import RayError

        refs = [handle.placement.remote() for handle in self.handles]
        waited, limit = 0.0, self.rollout_timeout_s
        while True:
            step = _PLACEMENT_LOG_S if limit is None else min(_PLACEMENT_LOG_S, max(limit - waited, 0.0))
            ready, unplaced = ray.wait(refs, num_returns=len(refs), timeout=step)
            waited += step
            if not unplaced:
                break
            missing = sorted(refs.index(ref) for ref in unplaced)
            if limit is not None and waited >= limit:
                if limit >= _START_S or not self._cluster_holds(ray, len(refs)):
                    raise ActorsNotPlaced(self._not_placed_message(ray, missing, waited))
                limit = _START_S  # the cluster has room for them all: they are starting
            log.info(f"waiting for Ray to place actors {_indices(missing)} ({waited:.0f} s; {self._needs()} each)")
        placements = []
        for index, ref in enumerate(refs):
            try:
                where = ray.get(ref)
            except RayError:
                placements.append({})
                continue
            log.info(f"ray actor {index} on node {where['ip']} ({where['node_id'][:12]}), pid {where['pid']}")
            placements.append(where)
        return placements

    def _cluster_holds(self, ray, n: int) -> bool:
        """Whether the cluster's resources, in all, hold `n` actors' needs: if so, actors not placed yet
        are most likely still starting (a process importing torch on a busy machine), and are given
        up to `_START_S` before the run ends."""
        o = self.actor_options
        return not shortfall(ray.cluster_resources(), {"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]}, n)

    def _needs(self) -> str:
        o = self.actor_options
        needs = {"CPU": o["num_cpus"], "GPU": o["num_gpus"], **o["resources"]}
        return ", ".join(f"{k} {v:g}" for k, v in needs.items() if v)

    def _not_placed_message(self, ray, missing: list[int], waited: float) -> str:
        total = {k: v for k, v in ray.cluster_resources().items() if not k.startswith(("node:", "memory", "object_store"))}
        have = ", ".join(f"{k} {v:g}" for k, v in sorted(total.items())) or "nothing"
        return (f"Ray could not place actors {_indices(missing)} of {self.n_actors} within {waited:.0f} s "
                f"(runner.rollout_timeout_s): each needs {self._needs()}; the cluster has {have} in all. "
                f"Lower runner.n_actors or runner.num_cpus_per_actor (e.g. 0.5), or add nodes.")

    # -- data flow -----------------------------------------------------------------------------
    def _request(self, index: int) -> None:
        ref = self.handles[index].collect.remote(self._weights)
        self.pending[ref] = index
        self._open.add(index, ref, self.policy_version)

    def _request_all(self, index: int) -> None:
        if self.on_policy:
            return  # requests are made per batch (_request_batch)
        for _ in range(self.max_in_flight - self._open.count(index)):
            self._request(index)

    def _request_batch(self, received: int) -> None:
        """On-policy: request what this version's batch still lacks (`received` rollouts are in),
        each from the actor with the fewest requests open."""
        for _ in range(self._open.lacking(self.batch_size, received, self.policy_version)):
            self._request(self._open.least_busy(self.policy_version))

    def _owes_rollout_since(self, index: int) -> float | None:
        """Off-policy, every actor always has requests open (the base rule); on-policy, see
        OpenRequests.owed_since."""
        if not self.on_policy:
            return super()._owes_rollout_since(index)
        return self._open.owed_since(index, self.supervisor.last_seen[index])

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        ray = import_ray()
        self.policy_version += 1
        self._weights = [self.policy_version, ray.put({k: v.detach().cpu() for k, v in state_dict.items()})]
        if self.schedule:  # kept while a request may still name it
            self._weight_refs[self.policy_version] = self._weights[1]
            self._weight_refs.pop(self.policy_version - self.schedule.versions_kept, None)
        elif self.on_policy:
            self._request_batch(0)

    def _ready_count(self) -> int:
        ray = import_ray()
        return len(ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)[0]) if self.pending else 0

    def _check_actors(self) -> None:
        self._check_silent()  # the others may keep serving while one actor hangs

    def _queue_size(self) -> int:
        return self._ready_count()

    def _next_rollout(self, received: int) -> tuple[Rollout, RolloutInfo] | None:
        """The first rollout ready (on-policy, after asking for what this batch still lacks); off-policy
        its actor is asked for the next one at once."""
        ray = import_ray()
        if self.on_policy:
            self._request_batch(received)  # again after a failure lost a request
        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=_POLL_S)
        if not ready:
            self._check_silent()
            return None
        index = self.pending.pop(ready[0])
        self._open.close(index, ready[0])
        arrived = self._receive(ray, ready[0], index)
        if arrived is not None and not self.on_policy:
            self._request(index)
        return arrived

    # -- reproducible mode ---------------------------------------------------------------------
    def _request_job(self, job: Job) -> None:
        """Ask the job's actor for its rollout with the job's policy version (Ray runs one caller's
        calls to an actor in the order they were made, so each actor's rollouts follow the schedule)."""
        ref = self.handles[job.actor].collect.remote([job.version, self._weight_refs[job.version]])
        self.pending[ref] = job.actor
        self._jobs[ref] = job
        self._open.add(job.actor, ref, job.version)

    def _wait_for_next_batch(self) -> None:
        ray = import_ray()
        batch = self.schedule.next_batch
        while sum(job.batch == batch for job in self._arrived) < self.batch_size:
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=_POLL_S)
            if not ready:
                self._check_silent()
                continue
            ref = ready[0]
            job = self._jobs[ref]
            received = self._receive(ray, ref, job.actor, job)
            if received is not None:  # else recovered: the job was asked for again (a restart asks for all the actor's)
                del self.pending[ref], self._jobs[ref]
                self._open.close(job.actor, ref)
                self._arrived[job] = received

    def _actor_snapshots(self) -> list[bytes]:
        ray = import_ray()
        from ray.exceptions import RayTaskError

        try:
            return ray.get([handle.snapshot.remote() for handle in self.handles])
        except RayTaskError as err:  # the pickle error, raised in the actor
            raise RuntimeError(first_line(getattr(err, "cause", None) or err)) from None

    def _receive(self, ray, ref, index: int, job: Job | None = None) -> tuple[Rollout, RolloutInfo] | None:
        """The rollout behind `ref`, or None after recovering from its actor's failure (reproducible
        mode: `job` is the rollout's place in the schedule, asked for again)."""
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        try:
            return ray.get(ref)
        except RayTaskError as err:  # raised inside the actor: its traceback is in the message
            self._actor_failed(index, str(err))
        except ActorUnavailableError:  # unreachable for a moment, not dead: ask again
            time.sleep(_POLL_S / 10)
            if job is None:
                self._request(index)
            else:
                del self.pending[ref], self._jobs[ref]
                self._open.close(index, ref)
                self._request_job(job)
        except RayActorError as err:  # the process or its node is gone (or its __init__ raised)
            self._actor_failed(index, f"ray actor died: {died_reason(err)}")
        return None

    # -- failures ------------------------------------------------------------------------------
    def _restart_actor(self, index: int) -> None:
        """Kill actor `index` (it may be hung, not dead), forget its rollouts in flight, start a fresh one."""
        ray = import_ray()
        kill(ray, self.handles[index])
        dropped = self._open.drop(index)
        for ref in dropped:
            self.pending.pop(ref, None)
        self.handles[index] = self._new_actor(index)
        if self.schedule:  # the lost requests again, in their order, from the new actor
            for job in sorted((self._jobs.pop(ref) for ref in dropped), key=lambda j: (j.batch, j.index)):
                self._request_job(job)
        else:
            self._request_all(index)


def _indices(indices: list[int]) -> str:
    return ", ".join(map(str, indices))
