"""All actors in the learner's process, one after another: the debugging backend."""

from __future__ import annotations

import time
import traceback

import torch

from maze_cli.parallel.actor_loop import Actor
from maze_cli.parallel.distributed_actors import ActorFailure, DistributedActors
from maze_cli.records import Rollout


class SequentialDistributedActors(DistributedActors):
    """Runs the same actor loop as the other backends, in process, round robin over the actors.

    Deterministic: the same seeds give the same rollouts and the same learning run.
    """

    def _make_actor(self, index: int) -> Actor:
        env_seed, agent_seed = self.restart_seeds(index)
        return Actor(index, self.env_factory, self.policy, self.envs_per_actor, self.n_rollout_steps, env_seed, agent_seed,
                     self.initial_policy)

    def start(self) -> None:
        self.actors = [self._make_actor(i) for i in range(self.n_actors)]
        self._records = [self.rollout_spec.allocate() for _ in range(self.batch_size)]
        self._next_actor = 0

    def stop(self) -> None:
        for actor in getattr(self, "actors", []):
            actor.close()
        self.actors = []

    def broadcast_updated_policy(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.policy_version += 1
        self._latest = state_dict
        for actor in self.actors:
            actor.load_policy(state_dict, self.policy_version)

    def _restart_actor(self, index: int) -> None:
        self.actors[index].close()
        self.actors[index] = self._make_actor(index)
        if self.policy_version:
            self.actors[index].load_policy(self._latest, self.policy_version)

    def collect_outputs(self, learner_device: str) -> tuple[Rollout, float, float, float]:
        start = time.perf_counter()
        for record in self._records:
            while True:
                actor = self.actors[self._next_actor]
                self._next_actor = (self._next_actor + 1) % self.n_actors
                try:
                    info = actor.collect(record)
                    break
                except Exception:
                    self._recover(ActorFailure(actor.index, actor.env_seed, actor.agent_seed, traceback.format_exc()))
            self._record_rollout(info)
        batch = Rollout.cat(self._records).to(learner_device)
        return batch, 0.0, 0.0, time.perf_counter() - start
