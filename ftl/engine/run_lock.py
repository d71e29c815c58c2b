"""The repository's run lock: one driver per repository, and who holds it now.

A run holds an exclusive ``flock`` on ``.ftl/run.lock`` for its whole drive (a second process
gets ``conflict``). flock, not a pid file alone, because the kernel drops it when the process
dies, ``kill -9`` included, so a crashed run never leaves a stale lock behind. The file also
holds the owner's pid, for the ``conflict`` message.

`holder` answers "is a run driving this repository now?" without taking the lock: a status
call that took it, even for a moment, could make a run starting at that moment fail with
``conflict``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunLock", "holder"]

LOCK_FILE = "run.lock"


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``path`` holding the owner's pid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, campaign: Callable[[], str]) -> None:
        """Take the lock or raise FtlError(conflict) naming ``campaign()`` and the holder's pid."""
        if fcntl is None:  # pragma: no cover - not POSIX
            import logging

            logging.getLogger("ftl.engine.runner").warning(
                "no flock on this platform: runs are not locked against each other")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EWOULDBLOCK: held by another open file (another process or Runner)
            from ftl.errors import FtlError  # here: `holder` serves the light status command

            try:
                owner = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise FtlError("conflict", {"what": f"campaign {campaign()} is being run by another ftl "
                                                f"process (pid {owner})"}) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor drops the flock


def holder(path: Path, locks: Path = Path("/proc/locks")) -> int | None:
    """The pid of the process that holds the run lock at ``path`` now; 0 when it is held by a
    process not visible here (another pid namespace); None when nobody holds it.

    Read from the kernel's table of file locks (``/proc/locks``, Linux: ``FLOCK ... WRITE <pid>
    <major>:<minor>:<inode>``), matched by the lock file's device and inode; nothing is locked
    or written. Where that table cannot be read, the pid the holder wrote into the file is
    checked for a live process (a pid reused after a crash then reads as held).

    Args:
        path: the lock file (``<repo>/.ftl/run.lock``).
        locks: the lock table to read (a parameter for tests).

    Returns:
        a pid, 0, or None (also when ``path`` does not exist).
    """
    try:
        stat = os.stat(path)
    except OSError:
        return None
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        table = locks.read_text(encoding="ascii", errors="replace")
    except OSError:
        return _written_pid(path)
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter queued behind a lock, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE" \
                and fields[5] == device:
            return int(fields[4]) if fields[4].isdigit() else 0
    return None


def _written_pid(path: Path) -> int | None:
    """The pid in the lock file when that process is alive, else None."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, someone else's
        pass
    return int(text)
