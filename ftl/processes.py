"""Processes that must not outlive ftl: parent-death signals and a ledger of running groups.

Two defences against orphans (issue "crash safety", item 3), Linux only:

* `parent_death_setup` (a ``preexec_fn``) asks the kernel to SIGKILL a child when the thread
  that spawned it exits (``prctl(PR_SET_PDEATHSIG)``): the tool server dies with ftl, and so do
  the short commands it runs (explorers, git, planners). It reaches the direct child only.
* the **ledger**: each build or verify command's process group is recorded in
  ``.ftl/procs/<pid>.json`` (pid = pgid, its start time in clock ticks, its deadline) while it
  runs and forgotten when it is reaped. These commands get no parent-death signal: killing one
  after its work is done but before its wrapper wrote the checkpoint is exactly how a finished
  build ran twice (issue "crash safety", item 1). Instead, when ftl dies, such a command runs
  to its end and records its own completion; `reap`, called by the resume before anything
  runs again, waits for every recorded group to end, up to its deadline (the task's timeout),
  and kills what is left then. So no orphan changes the repository while a resume runs, and a
  finished build is never repeated. The leader's start time tells our group from a later one
  that reused the number.

A process that left its group (``setsid``) is out of reach of both; say so where it matters.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["parent_death_setup", "record", "release", "forget", "reap", "start_ticks", "pid_stat",
           "LEDGER_DIR"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LEDGER_DIR = Path(".ftl") / "procs"

# Every entry is padded to this size, so a released entry's file can be rewritten in place for
# the next command. Creating (or truncating) a file costs 0.2-0.3 ms on some file systems (ext4
# on the 2-core VM ftl is benchmarked on), rewriting one in place a few us, and every build and
# verify command writes one entry and removes it (issue 11 item 3). ``what`` is cut to 200
# characters, and shorter when they take more than this as JSON (12 bytes for an emoji).
ENTRY_BYTES = 2048
_SPARE_PREFIX = "spare-"  # a released entry, kept for its thread's next command; not *.json

try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not glibc/musl Linux: no parent-death signal
    _PRCTL = None


def parent_death_setup(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGKILL this child when its parent thread dies, and close the race
    where the parent died between fork and prctl."""

    def setup() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def pid_stat(pid: int) -> tuple[int, int] | None:
    """(process group, start time in clock ticks) of a live, non-zombie ``pid``, or None
    (gone, a zombie, or unreadable), from ``/proc/<pid>/stat``."""
    try:  # os.open/os.read: a third of open()'s cost; this runs for every recorded command
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # after "(comm)": state ppid pgrp ...
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[2]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    found = pid_stat(pid)
    return found[1] if found else None


def _spare(ledger: Path) -> Path:
    """This thread's released entry file in ``ledger`` (it may not exist)."""
    return ledger / f"{_SPARE_PREFIX}{os.getpid()}-{threading.get_ident()}"


def record(ledger: Path, pid: int, what: str, deadline_s: float) -> Path | None:
    """Write ``ledger/<pid>.json`` for the group led by ``pid`` (atomic rename), with its
    deadline (``deadline_s``, epoch seconds). The content is written in full under another name
    first: this thread's released entry (`release`) when there is one, else a new ``.tmp``.

    Returns:
        The entry's path, or None when it could not be written (the command still runs).
    """
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    entry = ledger / f"{pid}.json"
    what = what[:200]
    while True:  # an astral character is 12 bytes as JSON: cut until the entry fits its size
        data = json.dumps({"pgid": pid, "start_ticks": ticks, "what": what,
                           "deadline_s": deadline_s}).encode()
        if len(data) <= ENTRY_BYTES:
            break
        what = what[:len(what) // 2]
    data = data.ljust(ENTRY_BYTES)
    spare = _spare(ledger)
    try:
        fd = os.open(spare, os.O_WRONLY)  # no O_CREAT: only a file this thread released
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], written)
        finally:
            os.close(fd)
        os.replace(spare, entry)
        return entry
    except OSError:  # no spare, or it went away meanwhile: write a new file instead
        pass
    try:
        ledger.mkdir(parents=True, exist_ok=True)
        partial = entry.with_suffix(".tmp")
        partial.write_bytes(data)
        os.replace(partial, entry)
    except OSError:
        return None
    return entry


def release(entry: Path | None) -> None:
    """Take a ledger entry out of the ledger once its group is gone, keeping its file for this
    thread's next `record` (a rename; readers look at ``*.json`` only). Idempotent."""
    if entry is None:
        return
    try:
        os.replace(entry, _spare(entry.parent))
    except OSError:
        forget(entry)


def forget(entry: Path | None) -> None:
    """Remove a ledger entry once its group is gone. Idempotent."""
    if entry is not None:
        with contextlib.suppress(OSError):
            entry.unlink()


def reap(ledger: Path, *, wait: bool = True, poll_s: float = 0.1,
         on_wait: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """End every group recorded in ``ledger`` and empty it.

    Args:
        wait: let each group run to its end, up to its deadline, before killing (SIGKILL) what
            is left; False kills at once.
        poll_s: how often the waiting looks at /proc, s.
        on_wait: called once with the groups about to be waited for (a progress line).

    Returns:
        ``[{"pgid", "what", "waited_ms", "finished": bool (ended by itself), "killed": [pids]}]``
        for the groups that still had members.
    """
    if not ledger.is_dir():
        return []
    mine = f"{_SPARE_PREFIX}{os.getpid()}-"
    for spare in ledger.glob(f"{_SPARE_PREFIX}*"):  # released entries of processes gone (or others')
        if not spare.name.startswith(mine):
            forget(spare)
    entries = []
    for path in sorted(ledger.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            entries.append((path, int(data["pgid"]), int(data["start_ticks"]),
                            str(data.get("what", "")), float(data.get("deadline_s") or 0)))
        except (OSError, ValueError, KeyError, TypeError):
            forget(path)  # unreadable: nothing can be matched against it
    live = [(path, pgid, ticks, what, deadline) for path, pgid, ticks, what, deadline in entries
            if _members(pgid, ticks)]
    for path, *_ in entries:
        if all(path != item[0] for item in live):
            forget(path)
    if not live:
        return []
    if on_wait is not None and wait:
        on_wait([{"pgid": pgid, "what": what, "deadline_s": deadline}
                 for _, pgid, _, what, deadline in live])
    started = time.monotonic()
    reaped = []
    for path, pgid, ticks, what, deadline in live:
        while wait and time.time() < deadline and _members(pgid, ticks):
            time.sleep(poll_s)
        alive = _members(pgid, ticks)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reaped.append({"pgid": pgid, "what": what, "finished": not alive, "killed": alive,
                       "waited_ms": int((time.monotonic() - started) * 1000)})
        forget(path)
    return reaped


def _members(pgid: int, ticks: int) -> list[int]:
    """Live pids of our group ``pgid`` (its leader started at ``ticks``), sorted; [] when the
    group is gone or the number now names a newer group."""
    group = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = pid_stat(int(name))
            if found is not None and found[0] == pgid:
                group.append((int(name), found[1]))
    # The kernel reuses a number as a pid only once no group uses it: a leader with this
    # pid but another start time means our group is gone and a new one took the number.
    if any(pid == pgid and started != ticks for pid, started in group):
        return []
    return sorted(pid for pid, _ in group if pid != os.getpid())
