"""Processes that must not outlive ftl: parent-death signals and a ledger of running groups.

Two defences against orphans (issue "crash safety", item 3), Linux only:

* `parent_death_setup` (a ``preexec_fn``) asks the kernel to SIGKILL a child when the thread
  that spawned it exits (``prctl(PR_SET_PDEATHSIG)``): the tool server dies with ftl, and a
  builder's shell with the tool server. It reaches the direct child only.
* the **ledger**: each build or verify command's process group is recorded in
  ``.ftl/procs/<pid>.json`` (pid = pgid, its start time in clock ticks) while it runs and
  forgotten when it is reaped. What a ``kill -9`` of ftl leaves behind (the grandchildren a
  shell started, still in that group, still changing the repository) is found there by `reap`
  when the campaign resumes, and killed before any task runs again. The leader's start time
  tells our group from a later one that reused the number.

A process that left its group (``setsid``) is out of reach of both; say so where it matters.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
from pathlib import Path
from typing import Callable

__all__ = ["parent_death_setup", "record", "forget", "reap", "start_ticks", "LEDGER_DIR"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LEDGER_DIR = Path(".ftl") / "procs"

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


def _stat(pid: int) -> tuple[int, int] | None:
    """(process group, start time in clock ticks) of a live, non-zombie ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # after "(comm)": state ppid pgrp ...
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[2]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    found = _stat(pid)
    return found[1] if found else None


def record(ledger: Path, pid: int, what: str) -> Path | None:
    """Write ``ledger/<pid>.json`` for the group led by ``pid`` (atomic rename). Returns the
    entry's path, or None when it could not be written (the command still runs)."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    entry = ledger / f"{pid}.json"
    try:
        ledger.mkdir(parents=True, exist_ok=True)
        partial = entry.with_suffix(".tmp")
        partial.write_text(json.dumps({"pgid": pid, "start_ticks": ticks, "what": what[:200]}))
        os.replace(partial, entry)
    except OSError:
        return None
    return entry


def forget(entry: Path | None) -> None:
    """Remove a ledger entry once its group is gone. Idempotent."""
    if entry is not None:
        with contextlib.suppress(OSError):
            entry.unlink()


def reap(ledger: Path) -> list[dict]:
    """Kill (SIGKILL) what is left of every group in ``ledger`` and empty it.

    Returns:
        ``[{"pgid", "what", "killed": [pids]}]`` for the groups that still had members.
    """
    if not ledger.is_dir():
        return []
    entries = []
    for path in sorted(ledger.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            entries.append((path, int(data["pgid"]), int(data["start_ticks"]), str(data.get("what", ""))))
        except (OSError, ValueError, KeyError, TypeError):
            forget(path)  # unreadable: nothing can be matched against it
    if not entries:
        return []
    members: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                members.setdefault(found[0], []).append((int(name), found[1]))
    reaped = []
    for path, pgid, ticks, what in entries:
        group = members.get(pgid, [])
        # The kernel reuses a number as a pid only once no group uses it: a leader with this
        # pid but another start time means our group is gone and a new one took the number.
        if any(pid == pgid and started != ticks for pid, started in group):
            forget(path)
            continue
        alive = [pid for pid, _ in group if pid != os.getpid()]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if alive:
            reaped.append({"pgid": pgid, "what": what, "killed": sorted(alive)})
        forget(path)
    return reaped
