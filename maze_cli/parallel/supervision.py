"""Who decides what happens to a failed actor: the restart budget, each actor's restarts and
seeds, and the silence clock behind `rollout_timeout_s`. Every backend shares one; a backend only
notices failures and knows how to replace one actor."""

from __future__ import annotations

import logging
import time

from maze_cli.errors import MazeCliError
from maze_cli.seeding import derive_seed

log = logging.getLogger("maze_cli")


class ActorFailure(MazeCliError, RuntimeError):
    """An actor raised, died or hung; carries its index, the seeds it ran with and the traceback
    from where it ran. A MazeCliError: `train` prints it without a traceback of its own."""

    def __init__(self, actor_index: int, env_seed: int, agent_seed: int, details: str):
        self.actor_index = actor_index
        self.env_seed = env_seed
        self.agent_seed = agent_seed
        self.details = details
        super().__init__(f"actor {actor_index} (env seed {env_seed}, agent seed {agent_seed}) failed:\n{details}")


class ActorSupervisor:
    """The restart budget of a run's actors and what each one has been through.

    :param env_seeds: each actor's first env seed.
    :param agent_seeds: each actor's first sampling seed.
    :param max_restarts: failed actors restarted per run; one more failure ends the run.
    :param rollout_timeout_s: an actor that owes a rollout for longer is failed (None: never).
    """

    def __init__(self, env_seeds: list[int], agent_seeds: list[int], max_restarts: int, rollout_timeout_s: float | None):
        if rollout_timeout_s is not None and rollout_timeout_s <= 0:
            raise ValueError("rollout_timeout_s must be positive (or None: no timeout)")
        self.env_seeds = env_seeds
        self.agent_seeds = agent_seeds
        self.max_restarts = max_restarts
        self.rollout_timeout_s = rollout_timeout_s
        self.restarts = 0
        # Each actor's restarts so far: its generation, by which messages of a replaced process are told apart.
        self.actor_restarts = [0] * len(env_seeds)
        # When each actor last delivered a rollout (or was started): the silence clock.
        self.last_seen = [time.monotonic()] * len(env_seeds)

    def started(self) -> None:
        """Every actor is up: their silence clocks start now."""
        self.last_seen = [time.monotonic()] * len(self.last_seen)

    def heard_from(self, index: int) -> None:
        """Actor `index` delivered a rollout (or was just replaced)."""
        self.last_seen[index] = time.monotonic()

    def seeds(self, index: int) -> tuple[int, int]:
        """Env and agent seeds of actor `index` after its restarts so far (the originals before any):
        a restarted actor must not replay the episodes that made it fail."""
        k = self.actor_restarts[index]
        env_seed, agent_seed = self.env_seeds[index], self.agent_seeds[index]
        if k == 0:
            return env_seed, agent_seed
        return derive_seed(env_seed, f"restart-{k}"), derive_seed(agent_seed, f"restart-{k}")

    def failure(self, index: int, details: str) -> ActorFailure:
        """The report of actor `index`'s failure, with the seeds it ran with."""
        env_seed, agent_seed = self.seeds(index)
        return ActorFailure(index, env_seed, agent_seed, details)

    def silent_failure(self, index: int, seconds: float) -> ActorFailure:
        return self.failure(index, f"silent: no rollout for {seconds:.0f} s (runner.rollout_timeout_s={self.rollout_timeout_s})")

    def silent(self, owed_since: list[float | None]) -> list[ActorFailure]:
        """The actors that owe a rollout (since `owed_since[i]`; None: owing none) for longer than the timeout."""
        if self.rollout_timeout_s is None:
            return []
        now = time.monotonic()
        return [self.silent_failure(i, now - since) for i, since in enumerate(owed_since)
                if since is not None and now - since > self.rollout_timeout_s]

    def admit(self, failure: ActorFailure) -> None:
        """Count a restart of the failed actor, or raise the failure once the budget is used."""
        if self.restarts >= self.max_restarts:
            budget = (f"all {self.max_restarts} restarts of runner.max_restarts used" if self.max_restarts
                      else "runner.max_restarts=0: failed actors are not restarted")
            failure.args = (f"{failure.args[0]}\n({budget})",)
            raise failure
        self.restarts += 1
        self.actor_restarts[failure.actor_index] += 1
        reason = failure.details.strip().splitlines()[-1] if failure.details.strip() else "unknown error"
        log.warning(f"actor {failure.actor_index} failed ({reason}); restarting it: restart {self.restarts} of {self.max_restarts}")
