"""Where the memory the learner and its actor processes share lives: /dev/shm, or a file.

The rollout slots and the published weights are tensors every actor process maps. torch puts them
in POSIX shared memory (/dev/shm), which a container often caps at 64 MiB (Docker's default): a
pixel env's slots need more, and torch then fails deep inside an allocation. So before any actor
starts, the run computes what it needs and, where /dev/shm cannot hold it (`runner.shared_memory=auto`),
maps one file in the temp dir instead (`TMPDIR`, else /tmp), shared the same way (MAP_SHARED), with
one warning saying what was needed, what /dev/shm has, and the fix.

The file is unlinked as soon as it is created: it has no name, only the descriptor the learner
holds (each actor maps it through a copy of it), so it disappears with the last process that maps
it, however the run ends (a crash, a kill of the learner: nothing is left to clean up).
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import tempfile
from multiprocessing import reduction
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import torch

from maze_cli.disk import format_bytes
from maze_cli.errors import ConfigError, MazeCliError

log = logging.getLogger("maze_cli")

SHM_DIR = Path("/dev/shm")
CHOICES = ("auto", "shm", "file")
_ALIGN = 64  # bytes: every tensor of a file starts at a multiple of it (any dtype's alignment)
_MARGIN = 1.1  # /dev/shm must have this x what is needed, plus _SPARE: torch, semaphores and others use it too
_SPARE = 8 * 2**20


class SharedMemoryError(MazeCliError):
    """Neither /dev/shm nor the temp dir can hold what the actors share: one line with the fix."""


class Memory(Protocol):
    """Allocates the tensors that the learner and its actor processes map."""

    in_file: bool

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float | int | bool) -> torch.Tensor: ...


class ShmMemory:
    """torch's shared memory (/dev/shm); the tensors cross a process boundary as torch pickles them."""

    in_file = False

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float | int | bool) -> torch.Tensor:
        return torch.full(shape, fill, dtype=dtype).share_memory_()


class SizeOnly:
    """Counts the bytes a sequence of tensors takes in a file (meta tensors, nothing allocated)."""

    in_file = True

    def __init__(self) -> None:
        self.nbytes = 0

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float | int | bool) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype, device="meta")
        self.nbytes = _aligned(self.nbytes) + tensor.element_size() * tensor.nelement()
        return tensor


class FileMemory:
    """Tensors carved one after another out of one unlinked file, mapped MAP_SHARED.

    It pickles as its file descriptor (multiprocessing passes a copy to the child) and its size; the
    child maps the same file and its owner carves the same tensors again in the same order (see
    `SharedTensors`), so both see the same bytes. Only the creator fills them."""

    in_file = True

    def __init__(self, nbytes: int, directory: Path) -> None:
        fd, name = tempfile.mkstemp(prefix="maze_cli-shared-", dir=directory)
        os.unlink(name)  # nameless from the start: nothing to clean up after a crash or a kill
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))  # the space now, not a SIGBUS on a full disk later
        except OSError:
            os.close(fd)
            raise
        self.fd, self.nbytes, self.directory = fd, max(nbytes, 1), directory
        self._map(fill=True)

    def _map(self, fill: bool) -> None:
        self._mmap = mmap.mmap(self.fd, self.nbytes)
        self._bytes = torch.frombuffer(self._mmap, dtype=torch.uint8)
        self._offset, self._fill = 0, fill

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, fill: float | int | bool) -> torch.Tensor:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        start = _aligned(self._offset)
        if start + size > self.nbytes:
            raise ValueError(f"the shared file holds {self.nbytes} bytes, {start + size} asked for")
        self._offset = start + size
        tensor = self._bytes[start:start + size].view(dtype).view(shape)
        if self._fill:
            tensor.fill_(fill)
        return tensor

    def reopened(self) -> "FileMemory":
        """The same file from its first byte, carving the tensors again without filling them."""
        self._offset, self._fill = 0, False
        return self

    def __reduce__(self):
        return _attach, (reduction.DupFd(self.fd), self.nbytes, str(self.directory))

    def close(self) -> None:
        """Release this process's descriptor (the mapping lives as long as its tensors)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _attach(dup_fd: Any, nbytes: int, directory: str) -> FileMemory:
    memory = FileMemory.__new__(FileMemory)
    memory.fd, memory.nbytes, memory.directory = dup_fd.detach(), nbytes, Path(directory)
    memory._map(fill=False)
    return memory


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class SharedTensors:
    """A structure of tensors (built by `build(memory)`) that another process maps: in /dev/shm it
    pickles as torch pickles its tensors; in a file it pickles as the file and `build`, which the
    child runs again on the same file (same calls, same order: the same tensors, not filled again)."""

    def __init__(self, build: Callable[[Memory], Any], memory: Memory) -> None:
        self.build, self.memory = build, memory
        self.value = build(memory)

    def __getstate__(self) -> dict[str, Any]:
        if not self.memory.in_file:
            return {"value": self.value, "memory": self.memory, "build": None}
        return {"value": None, "memory": self.memory, "build": self.build}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.value is None:
            self.value = self.build(self.memory.reopened())


def free_shm_bytes(shm_dir: Path = SHM_DIR) -> int | None:
    """Bytes free in /dev/shm, or None where there is none (not Linux)."""
    try:
        stats = os.statvfs(shm_dir)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def place(choice: str, needed: int, fix: str, shm_dir: Path = SHM_DIR) -> Path | None:
    """Where `needed` bytes of shared tensors go: None for /dev/shm, or the dir of the file.

    `choice` is `runner.shared_memory`: `shm` or `file` as said; `auto` takes /dev/shm when it has
    the room (with a margin: others use it too), else a file with one warning. `fix` names the
    config keys that shrink what is needed."""
    if choice not in CHOICES:
        raise ConfigError(f"runner.shared_memory={choice}: expected one of {', '.join(CHOICES)}")
    free = free_shm_bytes(shm_dir)
    if choice == "file" or (choice == "auto" and free is None):
        return Path(tempfile.gettempdir())
    fits = free is None or needed * _MARGIN + _SPARE <= free
    if fits:
        return None
    what = (f"the actors' shared memory (rollout slots and weights) needs {format_bytes(needed)} and {shm_dir} has "
            f"{format_bytes(free)} free")
    size = f"docker run --shm-size={_suggested_size(needed)}"
    if choice == "shm":
        raise SharedMemoryError(f"runner.shared_memory=shm: {what}; give it more room ({size}), use fewer {fix}, or "
                                f"runner.shared_memory=auto (a file in the temp dir when it is too small)")
    directory = Path(tempfile.gettempdir())
    log.warning(f"{what}: it is in a file under {directory} instead (docs/scaling.md). To use {shm_dir}: "
                f"{size}, or fewer {fix}; runner.shared_memory=file makes this choice without the warning")
    return directory


def _suggested_size(needed: int) -> str:
    """A --shm-size that holds `needed` with room to spare, in whole 256 MiB steps (e.g. "1g", "768m")."""
    mib = math.ceil((needed * _MARGIN + _SPARE) / 2**20 / 256) * 256
    return f"{mib // 1024}g" if mib % 1024 == 0 else f"{mib}m"


def memory_for(directory: Path | None, nbytes: int) -> Memory:
    """The Memory `place` chose: /dev/shm (None) or a file of `nbytes` in `directory`."""
    if directory is None:
        return ShmMemory()
    try:
        return FileMemory(nbytes, directory)
    except OSError as err:
        raise SharedMemoryError(f"the actors' shared memory ({format_bytes(nbytes)}) fits neither {SHM_DIR} nor a file in "
                                f"{directory} ({err.strerror}); free space there, or set TMPDIR to a dir with room") from None


def size_in_file(builds: Iterable[Callable[[Memory], Any]]) -> int:
    """Bytes the structures `builds` make take in a file, each in a file of its own (nothing allocated)."""
    total = 0
    for build in builds:
        counter = SizeOnly()
        build(counter)
        total += counter.nbytes
    return total
