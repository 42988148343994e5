"""Versioned policy weights in shared memory: published once per update, copied by an actor only
when the version changed."""

from __future__ import annotations

import torch
from torch import nn


class SharedWeights:
    """A shared-memory copy of a module's state_dict plus a version counter.

    The learner `publish`es under a lock; an actor checks `version` (a plain shared int read, no
    lock) before each rollout and `pull`s only when it moved on.
    """

    def __init__(self, module: nn.Module, lock) -> None:
        self.tensors = {k: v.detach().clone().share_memory_() for k, v in module.state_dict().items()}
        self._version = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._lock = lock

    @property
    def version(self) -> int:
        return int(self._version[0])

    def publish(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy `state_dict` in and bump the version; returns the new version."""
        with self._lock:
            for key, tensor in self.tensors.items():
                tensor.copy_(state_dict[key].detach())
            self._version += 1
            return int(self._version[0])

    def pull(self, module: nn.Module) -> int:
        """Copy the current weights into `module`; returns their version."""
        with self._lock:
            module.load_state_dict(self.tensors)
            return int(self._version[0])
