"""Actors as Ray actors, on one machine or a cluster: `runner=ray`.

The same actor loop runs inside each Ray actor. Rollouts come back as object refs and the learner
takes whichever are ready first (`ray.wait`); each actor has at most `max_in_flight_per_actor`
rollouts requested, which bounds staleness. Weights travel as one `ray.put` per broadcast plus a
version number; an actor fetches them only when the version moved.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import gymnasium as gym
import torch
from torch import nn

from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.distributed_actors import ActorFailure, DistributedActors
from maze_cli.records import Rollout, RolloutInfo, RolloutSpec

log = logging.getLogger("maze_cli")

RAY_MISSING = "runner=ray needs Ray, an optional extra: pip install 'maze_cli[ray]' (or pip install ray)"
_POLL_S = 1.0


def import_ray():
    """Ray, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


class RayActorBody:
    """What runs inside one Ray actor: an `Actor` and a record it refills for every request."""

    def __init__(self, index: int, env_factory, policy: nn.Module, spec: RolloutSpec, env_seed: int, agent_seed: int,
                 initial_policy: nn.Module | None):
        import ray

        torch.set_num_threads(1)
        self.actor = Actor(index, env_factory, policy, spec.n_envs, spec.n_steps, env_seed, agent_seed, initial_policy)
        self.record = spec.allocate()
        # True in a process Ray started to replace a dead one: reported with the next rollout.
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed

    def placement(self) -> dict[str, Any]:
        import os

        import ray

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def collect(self, weights: list) -> tuple[Rollout, RolloutInfo, bool]:
        """`weights` is [version, ref] (in a list, so Ray does not fetch the ref unless we ask).
        Returns the rollout, its metadata, and whether this actor is a restarted one (once)."""
        version, ref = weights
        if version != self.actor.policy_version:
            import ray

            self.actor.load_policy(ray.get(ref), version)
        info = self.actor.collect(self.record)
        restarted, self.restarted = self.restarted, False
        return self.record, info, restarted


class RayDistributedActors(DistributedActors):
    """Each actor a Ray actor; Ray is started locally when `address` is None, else joined.

    :param address: None (start a local Ray), "auto", or "host:port" of a running cluster.
    :param num_cpus_per_actor, num_gpus_per_actor, resources: what each Ray actor reserves.
    :param max_restarts: actor failures tolerated per run (Ray restarts the actor; its rollout is dropped).
    :param max_in_flight_per_actor: rollouts requested ahead from each actor.
    """

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
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
        actor_env_seeds: list[int] | None = None,
        actor_agent_seeds: list[int] | None = None,
        envs_per_actor: int = 1,
        initial_policy: nn.Module | None = None,
    ):
        super().__init__(
            env_factory, policy, n_rollout_steps, n_actors, batch_size, envs_per_actor, actor_env_seeds, actor_agent_seeds,
            initial_policy,
        )
        self.address = address
        self.actor_options = {
            "num_cpus": num_cpus_per_actor, "num_gpus": num_gpus_per_actor, "resources": dict(resources or {}),
            "max_restarts": max_restarts, "max_task_retries": 0, "scheduling_strategy": "SPREAD",
        }
        self.max_restarts = max_restarts
        self.max_in_flight = max_in_flight_per_actor
        self.restarts = 0
        self.failures_in_a_row: dict[int, int] = {}
        self.handles: list = []
        self.pending: dict = {}
        self.placements: list[dict[str, Any]] = []
        self._started_ray = False
        self._connected = False

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            # "local" always starts a fresh Ray here, never an accidental join of some running cluster.
            ray.init(address=self.address or "local", include_dashboard=False, logging_level=logging.WARNING,
                     configure_logging=False)
            self._connected = True
            self._started_ray = self.address is None
        remote = ray.remote(**self.actor_options)(RayActorBody)
        self.handles = [
            remote.remote(i, self.env_factory, self.policy, self.rollout_spec, env_seed, agent_seed, self.initial_policy)
            for i, (env_seed, agent_seed) in enumerate(zip(self.actor_env_seeds, self.actor_agent_seeds))
        ]
        self.placements = ray.get([h.placement.remote() for h in self.handles])
        for i, where in enumerate(self.placements):
            log.info(f"ray actor {i} on node {where['ip']} ({where['node_id'][:12]}), pid {where['pid']}")
        self._weights = [0, ray.put({k: v.detach().cpu() for k, v in self.policy.state_dict().items()})]
        for i in range(self.n_actors):
            for _ in range(self.max_in_flight):
                self._request(i)

    def stop(self) -> None:
        """Kill this run's Ray actors; shut Ray down if this object started or joined it."""
        if not self.handles and not self._connected:
            return
        ray = import_ray()
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already gone
                pass
        self.handles, self.pending = [], {}
        if self._connected:
            ray.shutdown()
            self._connected = False

    def nodes(self) -> set[str]:
        """Ids of the nodes the actors were placed on."""
        return {p["node_id"] for p in self.placements}

    # -- data flow -----------------------------------------------------------------------------
    def _request(self, index: int) -> None:
        self.pending[self.handles[index].collect.remote(self._weights)] = index

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        ray = import_ray()
        self.policy_version += 1
        self._weights = [self.policy_version, ray.put({k: v.detach().cpu() for k, v in state_dict.items()})]

    def _ready_count(self) -> int:
        ray = import_ray()
        return len(ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)[0]) if self.pending else 0

    def collect_outputs(self, learner_device: str) -> tuple[Rollout, float, float, float]:
        ray = import_ray()
        from ray.exceptions import RayActorError, RayTaskError

        queue_before = self._ready_count()
        start = time.perf_counter()
        rollouts: list[Rollout] = []
        while len(rollouts) < self.batch_size:
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=_POLL_S)
            if not ready:
                continue
            index = self.pending.pop(ready[0])
            try:
                record, info, restarted = ray.get(ready[0])
            except RayTaskError as err:
                raise ActorFailure(index, self.actor_env_seeds[index], self.actor_agent_seeds[index], str(err)) from None
            except RayActorError as err:
                self._lost_rollout(index, err)
                continue
            self.failures_in_a_row[index] = 0
            if restarted:
                self._count_restart(index)
            self._record_rollout(info)
            rollouts.append(record)
            self._request(index)
        dequeue_time = time.perf_counter() - start
        batch = Rollout.cat(rollouts).to(learner_device)
        return batch, float(queue_before), float(self._ready_count()), dequeue_time

    def _failure(self, index: int, details: str) -> ActorFailure:
        return ActorFailure(index, self.actor_env_seeds[index], self.actor_agent_seeds[index], details)

    def _lost_rollout(self, index: int, err: Exception) -> None:
        """An actor died with rollouts in flight: drop them and ask again (Ray restarts the actor,
        within `max_restarts`). An actor that keeps failing without a rollout is dead for good."""
        self.failures_in_a_row[index] = self.failures_in_a_row.get(index, 0) + 1
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if self.failures_in_a_row[index] > self.max_in_flight + 2:
            raise self._failure(index, f"ray actor died and was not restarted ({reason}); runner.max_restarts={self.max_restarts}")
        log.warning(f"ray actor {index} lost a rollout ({reason}); asking again")
        time.sleep(0.05)
        self._request(index)

    def _count_restart(self, index: int) -> None:
        self.restarts += 1
        self.epoch_stats.add("actor_restarts", 1)
        if self.restarts > self.max_restarts:
            raise self._failure(index, f"ray actor restarted {self.restarts} times, more than runner.max_restarts={self.max_restarts}")
        log.warning(f"ray actor {index} was restarted: restart {self.restarts} of {self.max_restarts}")
