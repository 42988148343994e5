"""The rollouts a learner has asked its actors for and not yet received.

Subprocess and Ray actors collect only on request (a slot to fill, a remote call). On-policy, the
learner asks for one batch per policy version, spread over the actors; and an actor owes the
learner a rollout only while it holds a request, so the silence clock behind `rollout_timeout_s`
runs only then. Both backends keep their requests here, so both decide these the same way.
"""

from __future__ import annotations

import time
from collections.abc import Hashable


class OpenRequests:
    """Per actor, each open request (a slot index, an object ref) -> (policy version, time asked)."""

    def __init__(self, n_actors: int):
        self.by_actor: list[dict[Hashable, tuple[int, float]]] = [{} for _ in range(n_actors)]

    def add(self, index: int, request: Hashable, policy_version: int) -> None:
        """Actor `index` was asked for a rollout of `policy_version` just now."""
        self.by_actor[index][request] = (policy_version, time.monotonic())

    def close(self, index: int, request: Hashable) -> None:
        """The rollout of `request` arrived."""
        del self.by_actor[index][request]

    def drop(self, index: int) -> list[Hashable]:
        """Forget actor `index`'s requests (it failed), returning them."""
        dropped = list(self.by_actor[index])
        self.by_actor[index] = {}
        return dropped

    def count(self, index: int) -> int:
        return len(self.by_actor[index])

    def lacking(self, batch_size: int, received: int, policy_version: int) -> int:
        """On-policy: rollouts of `policy_version` its batch still lacks that no open request will
        bring, with `received` of them in."""
        asked = sum(1 for requests in self.by_actor for version, _ in requests.values() if version == policy_version)
        return batch_size - received - asked

    def least_busy(self, policy_version: int) -> int:
        """The actor to ask next: the one with the fewest open requests; among equals, the first
        from a start that moves on with the policy version, so no actor is always asked first."""
        n = len(self.by_actor)
        return min(range(n), key=lambda i: (len(self.by_actor[i]), (i - policy_version) % n))

    def owed_since(self, index: int, last_seen: float) -> float | None:
        """Since when actor `index` owes a rollout: since it got its oldest open request, or its
        last delivery (`last_seen`) if that is later. None without open requests: it waits on the
        learner, on purpose."""
        asked = [when for _, when in self.by_actor[index].values()]
        return max(min(asked), last_seen) if asked else None
