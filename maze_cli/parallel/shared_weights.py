"""Versioned policy weights in shared memory: published once per update, copied by an actor only
when the version changed."""

from __future__ import annotations

import torch
from torch import nn


class SharedWeights:
    """A shared-memory copy of a module's state_dict guarded by a sequence counter (a seqlock).

    The learner is the only writer: it makes the counter odd, copies, makes it even again. A reader
    copies and retries if the counter was odd or moved meanwhile. No lock is ever held, so an actor
    killed in the middle of a read cannot block the learner. The policy version is counter / 2.
    """

    def __init__(self, module: nn.Module) -> None:
        self.tensors = {k: v.detach().clone().share_memory_() for k, v in module.state_dict().items()}
        self._sequence = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def version(self) -> int:
        return int(self._sequence[0]) // 2

    def publish(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy `state_dict` in and bump the version; returns the new version."""
        self._sequence += 1  # odd: writing
        for key, tensor in self.tensors.items():
            tensor.copy_(state_dict[key].detach())
        self._sequence += 1  # even: done
        return self.version

    def pull(self, module: nn.Module) -> int:
        """Copy a consistent version of the weights into `module`'s own tensors; returns that version.

        A copy per tensor into the module's state: what `load_state_dict` does, without its per-call
        bookkeeping (an actor pays it once per rollout)."""
        targets = module.state_dict(keep_vars=True)
        if targets.keys() != self.tensors.keys() or any(targets[k].shape != t.shape for k, t in self.tensors.items()):
            module.load_state_dict(self.tensors)  # raises, naming the keys or shapes that differ
        while True:
            before = int(self._sequence[0])
            if before % 2 == 0:
                with torch.no_grad():
                    for key, tensor in self.tensors.items():
                        targets[key].copy_(tensor)
                if int(self._sequence[0]) == before:
                    return before // 2
