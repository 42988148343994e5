"""Versioned policy weights in shared memory: published once per update, copied by an actor only
when the version changed."""

from __future__ import annotations

import functools
import multiprocessing as mp

import torch
from torch import nn

from maze_cli.parallel.shared_memory import Memory, SharedTensors, ShmMemory, size_in_file


def _allocate(layout: list[tuple[str, tuple[int, ...], torch.dtype]], memory: Memory) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The weights' tensors (zeros) and the sequence counter, in `memory`."""
    tensors = {key: memory.tensor(shape, dtype, 0) for key, shape, dtype in layout}
    return tensors, memory.tensor((1,), torch.int64, 0)


def _check_writer_alive() -> None:
    """A reader that finds a publish under way: the writer (this process's parent) may have been
    killed in the middle of it, and the counter then stays odd; stop retrying in that case."""
    parent = mp.parent_process()
    if parent is not None and not parent.is_alive():
        raise RuntimeError("the learner died while publishing weights")


class SharedWeights:
    """A shared-memory copy of a module's state_dict guarded by a sequence counter (a seqlock).

    The learner is the only writer: it makes the counter odd, copies, makes it even again. A reader
    copies and retries if the counter was odd or moved meanwhile. No lock is ever held, so an actor
    killed in the middle of a read cannot block the learner. The policy version is counter / 2.
    """

    def __init__(self, module: nn.Module, memory: Memory | None = None) -> None:
        """In /dev/shm, or in `memory` (a file: see maze_cli.parallel.shared_memory)."""
        state = module.state_dict()
        layout = [(k, tuple(v.shape), v.dtype) for k, v in state.items()]
        self._shared = SharedTensors(functools.partial(_allocate, layout), memory or ShmMemory())
        self.tensors, self._sequence = self._shared.value
        for key, tensor in self.tensors.items():
            tensor.copy_(state[key].detach())

    @staticmethod
    def size_in_file(module: nn.Module) -> int:
        """Bytes the weights of `module` take in a file."""
        layout = [(k, tuple(v.shape), v.dtype) for k, v in module.state_dict().items()]
        return size_in_file([functools.partial(_allocate, layout)])

    def __getstate__(self) -> dict:
        return {"_shared": self._shared}

    def __setstate__(self, state: dict) -> None:
        self._shared = state["_shared"]
        self.tensors, self._sequence = self._shared.value

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
            if before % 2 == 1:
                _check_writer_alive()
            else:
                with torch.no_grad():
                    for key, tensor in self.tensors.items():
                        targets[key].copy_(tensor)
                if int(self._sequence[0]) == before:
                    return before // 2
