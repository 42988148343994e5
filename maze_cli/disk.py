"""Faults of the machine's storage, said in one line: a full disk, a dir that cannot be written.

A full disk is no fault of the run: what the run wrote before it is sound, and `train resume=`
continues once space is freed. So a write that finds the disk full raises `DiskFull`, naming the
filesystem and the file, and the trainer stops the run cleanly (see docs/runs.md). Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from pathlib import Path
from typing import Iterator

from maze_cli.errors import ConfigError, MazeCliError

_FULL = {errno.ENOSPC, errno.EDQUOT}
_NEARLY_FULL = 256 * 1024  # bytes: a write that fails with less free than this failed on a full disk
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR}
# The dir names of this process's sweep jobs that a full disk stopped: `train` records them, the sweep
# summary leaves them out, and `train -m` exits non-zero for them.
STOPPED_BY_FULL_DISK: set[str] = set()


class DiskFull(MazeCliError):
    """A write found its filesystem full; `path` is the file, the message names its filesystem."""

    def __init__(self, path: Path | str, message: str | None = None):
        self.path = Path(path)
        super().__init__(message or f"no space left on {describe_filesystem(self.path)} while writing {self.path}")


def is_disk_full(err: BaseException) -> bool:
    """Whether `err` (or what caused it) is ENOSPC or EDQUOT, whatever library wrapped it."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, DiskFull) or (isinstance(err, OSError) and err.errno in _FULL):
            return True
        if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Around a write to `path`: a full disk comes out as `DiskFull` naming `path` and its filesystem.

    Some writers lose the errno on the way (torch's zip writer says "unexpected pos"), so a write
    that fails while its filesystem has (nearly) no space left counts as a full disk too; the
    check runs before any clean-up of a partial file frees that space again."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as err:
        if is_disk_full(err) or _nearly_full(Path(path)):
            raise DiskFull(path) from None
        raise


def _nearly_full(path: Path) -> bool:
    try:
        return free_bytes(path) < _NEARLY_FULL
    except OSError:
        return False


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds `path` (or would hold it, if it does not exist yet)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def free_bytes(path: Path | str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `path`."""
    stats = os.statvfs(mount_point(Path(path)))
    return stats.f_bavail * stats.f_frsize


def describe_filesystem(path: Path) -> str:
    """E.g. "the filesystem at /data (ext4 on /dev/sdb1, 0 B free of 2.0 GiB)"."""
    mount = mount_point(path)
    kind = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            device, where, fs_type = line.split()[:3]
            if where == str(mount):
                kind = f"{fs_type} on {device}, " if device != fs_type else f"{fs_type}, "
    stats = os.statvfs(mount)
    return (f"the filesystem at {mount} ({kind}{format_bytes(stats.f_bavail * stats.f_frsize)} free of "
            f"{format_bytes(stats.f_blocks * stats.f_frsize)})")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def is_unwritable(err: BaseException) -> OSError | None:
    """The OSError in `err`'s chain that says a path cannot be created or written (permission, a
    read-only filesystem, a file where a dir should be), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _UNWRITABLE and err.filename:
            return err
        err = err.__cause__ or err.__context__
    return None


def unwritable_message(what: str, err: OSError, fix: str) -> str:
    """One line: which path cannot be written, why, and what to do."""
    return f"{what} cannot be written: {err.filename}: {err.strerror}; {fix}"


def check_writable_dir(directory: Path, what: str, fix: str) -> None:
    """Create `directory` (and its parents) and write a probe file in it, so that a place that cannot
    be written fails at once, in one line, before anything starts (root passes permission bits, so
    only a real write tells)."""
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with writing(probe):
            probe.write_bytes(b"")
        probe.unlink()
    except DiskFull as err:
        raise ConfigError(f"{what} cannot be written: {err}; free space there or {fix}") from None
    except OSError as err:
        if err.filename is None:
            err.filename = str(directory)
        raise ConfigError(unwritable_message(what, err, fix)) from None


def quiet_full_disk_in_log_files(logger: logging.Logger | None = None) -> None:
    """A log file on a full disk fails every record, and `logging` prints a traceback for each;
    the run's next write of its own (a stats row, a checkpoint) reports the full disk in one line
    and stops, so the log files' handlers skip that error silently (any other is reported as before)."""
    for handler in (logger or logging.getLogger()).handlers:
        if isinstance(handler, logging.FileHandler) and not getattr(handler, "_quiet_full_disk", False):
            default = handler.handleError

            def handle_error(record: logging.LogRecord, default=default) -> None:
                if not is_disk_full(sys.exc_info()[1]):
                    default(record)

            handler.handleError = handle_error
            handler._quiet_full_disk = True
