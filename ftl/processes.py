"""Processes that must not outlive ftl: parent-death signals and a ledger of running groups.

Two defences against orphans (issue "crash safety", item 3), Linux only:

* `parent_death_setup` (a ``preexec_fn``) asks the kernel to SIGKILL a child when the thread
  that spawned it exits (``prctl(PR_SET_PDEATHSIG)``): the tool server dies with ftl, and so do
  the short commands it runs (explorers, git, planners). It reaches the direct child only.
* the **ledger**: each build or verify command's process group (pid = pgid, its start time in
  clock ticks, its deadline) is recorded while it runs and released when it is reaped. These
  commands get no parent-death signal: killing one after its work is done but before its
  wrapper wrote the checkpoint is exactly how a finished build ran twice (issue "crash
  safety", item 1). Instead, when ftl dies, such a command runs to its end and records its own
  completion; `reap`, called by the resume before anything runs again, waits for every
  recorded group to end, up to its deadline (the task's timeout), and kills what is left then.
  So no orphan changes the repository while a resume runs, and a finished build is never
  repeated. The leader's start time tells our group from a later one that reused the number.

The ledger is a folder of journals, ``.ftl/procs/<pid>-<start ticks>.log``, one per ftl
process, appended to: a record is the line ``+ <pgid> <ticks> <deadline>
<what as JSON> .``, a release ``- <pgid> <ticks> .``. An append costs a few us where creating,
renaming or removing a file costs 0.1-0.3 ms (ext4 on the 2-core VM ftl is benchmarked on),
and every build and verify command records and releases once (issue 11 item 3). A line counts
only when it is whole (ends with `` .``); each append starts with its own newline, so a write
cut short by a kill or a full disk is skipped by readers without swallowing the next line. Past
`COMPACT_BYTES` a journal starts again with only its open records. `reap` ends the groups of
processes that are gone (and this one's), never those of another live process.

A process that left its group (``setsid``) is out of reach of both; say so where it matters.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import json
import os
import signal
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, NamedTuple

__all__ = ["parent_death_setup", "record", "release", "recorded", "forget", "reap", "start_ticks",
           "pid_stat", "LedgerEntry", "LEDGER_DIR"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LEDGER_DIR = Path(".ftl") / "procs"

COMPACT_BYTES = 64 * 1024  # past this size a journal starts again with its open records only
_KEEP_OPEN = 4  # journals (one per ledger folder) whose descriptor a process keeps


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


class LedgerEntry(NamedTuple):
    """A recorded group: what `release` needs to take it out of its journal again."""

    journal: "_Journal"
    pgid: int
    ticks: int


class _Journal:
    """This process's journal in one ledger folder: an ``O_APPEND`` descriptor (closed while
    idle past `_KEEP_OPEN`, opened again on the next append), the lines of the records still
    open, and the bytes written (for `COMPACT_BYTES`). One object per folder and process, for
    the life of the process; thread-safe."""

    def __init__(self, ledger: Path, owner: str) -> None:
        self.ledger = ledger
        self.path = ledger / f"{owner}.log"
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.held: dict[tuple[int, int], bytes] = {}  # (pgid, ticks) -> its record line
        self.fd: int | None = None
        self.size = 0

    def append(self, key: tuple[int, int], line: bytes | None) -> bool:
        """Record ``key`` with its ``line``, or release it (``line`` None). False when the
        line could not be written (a record: the caller's command runs unrecorded)."""
        with self.lock:
            try:
                fd = self._descriptor()
                if line is None:
                    self.held.pop(key, None)
                    if self.size >= COMPACT_BYTES:
                        self._compact(fd)
                        return True
                    line = b"\n- %d %d ." % key
                self._write(fd, line)
            except OSError:
                return False
            if line[1:2] == b"+":
                self.held[key] = line
            return True

    def _compact(self, fd: int) -> None:
        """Start the journal again with only the records still open: emptied in place when
        there are none, else replaced whole by a file that holds them (`_rewrite`)."""
        if not self.held:
            os.ftruncate(fd, 0)
            self.size = 0
            return
        self._rewrite()

    def _rewrite(self) -> int:
        """Replace the journal by a file holding just the open records, written under another
        name first and renamed over it (a kill at any moment leaves the old journal or the new
        one, never a record lost); hold it. Returns its descriptor. Raises OSError, leaving
        the descriptor closed so that the next append tries again."""
        partial = self.path.with_suffix(".tmp")
        self.close()
        new = os.open(partial, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self.size = 0
            self._write(new, b"".join(self.held.values()))
            os.replace(partial, self.path)
        except OSError:
            os.close(new)
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        self.fd = new
        return new

    def _write(self, fd: int, data: bytes) -> None:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        self.size += written

    def _descriptor(self) -> int:
        """The journal's descriptor. A journal removed under this process (by hand, or by a
        reap that could not see this process alive) is made again with the records still
        open; so is one whose last rewrite failed."""
        if self.fd is not None and os.fstat(self.fd).st_nlink > 0:
            return self.fd
        self.close()
        self.ledger.mkdir(parents=True, exist_ok=True)
        if self.held:
            return self._rewrite()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.fd, self.size = fd, os.fstat(fd).st_size
        return fd

    def close(self) -> None:
        """Close the descriptor (the next append opens it again)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


_journals: dict[Path, _Journal] = {}
_recent: "OrderedDict[Path, None]" = OrderedDict()  # journals with a descriptor, most recent last
_journals_lock = threading.Lock()


def _journal(ledger: Path) -> _Journal:
    """This process's journal in ``ledger``: one object per folder for the life of the
    process (a fork's child makes its own)."""
    with _journals_lock:
        journal = _journals.get(ledger)
        if journal is None or journal.pid != os.getpid():
            journal = _journals[ledger] = _Journal(ledger, _owner())
        return journal


def _keep_open(journal: _Journal) -> None:
    """After an append: ``journal`` is the most recently used; past `_KEEP_OPEN` journals
    with a descriptor, the least recently used ones with nothing open close theirs (a test
    suite makes a ledger per temporary repository). Called with no journal's lock held."""
    with _journals_lock:
        if journal.fd is not None:
            _recent[journal.ledger] = None
            _recent.move_to_end(journal.ledger)
        for key in list(_recent)[:-_KEEP_OPEN]:
            idle = _journals.get(key)
            if idle is None:
                del _recent[key]
                continue
            with idle.lock:
                if not idle.held:
                    idle.close()
                    del _recent[key]


def _after_fork_in_child() -> None:
    """A child of a fork starts with no journal: the parent's locks may have been held at the
    fork, and its records are the parent's."""
    global _journals, _recent, _journals_lock
    _journals, _recent, _journals_lock = {}, OrderedDict(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.cache
def _owner_of(pid: int) -> str:
    return f"{pid}-{start_ticks(pid) or 0}"


def _owner() -> str:
    """This process's journal name: its pid and start ticks (a later process with the same
    pid writes to a journal of its own)."""
    return _owner_of(os.getpid())


def _owner_alive(path: Path) -> bool:
    """Whether the process named by journal ``path`` (``<pid>-<ticks>.log``) still runs."""
    pid, _, ticks = path.stem.partition("-")
    try:
        return start_ticks(int(pid)) == int(ticks)
    except ValueError:
        return False


@atexit.register
def _close_journals() -> None:
    """At a normal exit, close this process's journals and remove those that hold no open
    record. The objects stay: a daemon thread still running commands appends to the same one."""
    with _journals_lock:
        for journal in _journals.values():
            with journal.lock:
                journal.close()
                if not journal.held:
                    with contextlib.suppress(OSError):
                        journal.path.unlink()
        _recent.clear()


def record(ledger: Path, pid: int, what: str, deadline_s: float) -> LedgerEntry | None:
    """Record the group led by ``pid`` in this process's journal in ``ledger``, with its
    deadline (``deadline_s``, epoch seconds) and ``what`` (the command, cut to 200 characters).

    Returns:
        The entry for `release`, or None when it could not be written (the command still runs).
    """
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    journal = _journal(ledger)
    line = f"\n+ {pid} {ticks} {deadline_s!r} {json.dumps(what[:200])} .".encode()
    written = journal.append((pid, ticks), line)
    _keep_open(journal)
    return LedgerEntry(journal, pid, ticks) if written else None


def release(entry: LedgerEntry | None) -> None:
    """Take a recorded group out of the ledger once it is gone. A release that cannot be
    written leaves the record open: `reap` then finds the group gone and only drops it."""
    if entry is not None and entry.journal.pid == os.getpid():  # not a fork's inherited entry
        entry.journal.append((entry.pgid, entry.ticks), None)
        _keep_open(entry.journal)


def forget(path: Path) -> None:
    """Remove a ledger file (a journal, or an earlier ftl's entry). Idempotent."""
    with contextlib.suppress(OSError):
        path.unlink()


def recorded(ledger: Path) -> list[dict]:
    """The groups the journals in ``ledger`` hold open: ``[{"pgid", "start_ticks", "what",
    "deadline_s", "journal": Path}]``, in the order they were recorded per journal. Lines that
    are not whole (a cut write) are skipped, and so are the ``*.json`` entries of an earlier
    ftl (one file per group; see `reap`)."""
    found: list[dict] = []
    try:
        journals = sorted(ledger.glob("*.log"))
    except OSError:
        return found
    for path in journals:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        held: dict[tuple[int, int], dict] = {}
        for line in data.split(b"\n"):
            parsed = _parse(line)
            if parsed is None:
                continue
            key = (parsed["pgid"], parsed["start_ticks"])
            if parsed.pop("open"):
                held[key] = {**parsed, "journal": path}
            else:
                held.pop(key, None)
        found.extend(held.values())
    return found


def _parse(line: bytes) -> dict | None:
    """One whole journal line as ``{"open", "pgid", "start_ticks"[, "deadline_s", "what"]}``,
    or None."""
    if not line.endswith(b" .") or len(line) < 7:
        return None
    try:
        kind, pgid, ticks, rest = (line[:-2].split(b" ", 3) + [b""])[:4]
        if kind == b"-" and not rest:
            return {"open": False, "pgid": int(pgid), "start_ticks": int(ticks)}
        if kind == b"+":
            deadline, what = rest.split(b" ", 1)
            return {"open": True, "pgid": int(pgid), "start_ticks": int(ticks),
                    "deadline_s": float(deadline), "what": str(json.loads(what))}
    except (ValueError, TypeError):
        pass
    return None


def _legacy_entries(ledger: Path) -> list[dict]:
    """The ``<pid>.json`` entries an earlier ftl wrote, one file per group (read once, by the
    resume after an upgrade); its released ``spare-*`` files are dropped."""
    found = []
    for spare in ledger.glob("spare-*"):
        forget(spare)
    for path in sorted(ledger.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            found.append({"pgid": int(data["pgid"]), "start_ticks": int(data["start_ticks"]),
                          "what": str(data.get("what", "")),
                          "deadline_s": float(data.get("deadline_s") or 0), "journal": path})
        except (OSError, ValueError, KeyError, TypeError):
            forget(path)  # unreadable: nothing can be matched against it
    return found


def reap(ledger: Path, *, wait: bool = True, poll_s: float = 0.1,
         on_wait: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """End every group recorded in ``ledger`` by a process that is gone (a crashed ftl), or by
    this one (a command an abandoned drain left running), and remove the journals of the
    processes that are gone. Another live process's records are its own running commands
    (a server working on the same repository): left alone. A process in another pid
    namespace sharing the repository (a container) cannot be seen and counts as gone.

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
    mine = ledger / f"{_owner()}.log"
    for partial in ledger.glob("*.tmp"):  # a compaction a kill cut short
        if not _owner_alive(partial):
            forget(partial)
    gone = {path for path in ledger.glob("*.log") if path != mine and not _owner_alive(path)}
    entries = [entry for entry in recorded(ledger) if entry["journal"] in gone or entry["journal"] == mine]
    entries += _legacy_entries(ledger)
    live = [entry for entry in entries if _members(entry["pgid"], entry["start_ticks"])]
    if live and on_wait is not None and wait:
        on_wait([{"pgid": entry["pgid"], "what": entry["what"], "deadline_s": entry["deadline_s"]}
                 for entry in live])
    started = time.monotonic()
    reaped = []
    for entry in live:
        pgid, ticks = entry["pgid"], entry["start_ticks"]
        while wait and time.time() < entry["deadline_s"] and _members(pgid, ticks):
            time.sleep(poll_s)
        alive = _members(pgid, ticks)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reaped.append({"pgid": pgid, "what": entry["what"], "finished": not alive,
                       "killed": alive, "waited_ms": int((time.monotonic() - started) * 1000)})
    # Every group they held has ended: the journals of processes that are gone (which write no
    # more) and an earlier ftl's entries go; this process's own journal stays.
    for path in gone | {entry["journal"] for entry in entries if entry["journal"].suffix == ".json"}:
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
