"""Run one external command for a tool: bounded time, bounded output, no stray processes.

Every subprocess ftl starts (builders, verify commands, planner and builder agents, git) goes
through `run_command`. The command runs in its own session (so its process group id is its pid);
on a timeout or a cancel the whole group is stopped (SIGTERM, a short grace, SIGKILL), and when the
command exits normally any background process it left in its group is stopped the same way, so
nothing a step started outlives the step.

Linux only: the child asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be killed when its
parent goes away, so a ``kill -9`` of ftl does not leave builds running. Two caveats:

* the signal fires when the *thread* that spawned the child exits, not the process. Spawn from
  long-lived threads (the scheduler's workers, the server's request threads), never from a
  short-lived helper thread. `run_command` holds its thread until the child is gone, so it is
  safe from any thread; the caveat matters for code that passes `_child_setup` to Popen itself;
* it reaches only the direct child. Grandchildren (what ``/bin/sh -c`` starts) are in the child's
  process group and are stopped by the timeout/cancel path, but not by the kernel after a
  ``kill -9`` of ftl.

Also here: `git_status`, the parsed ``git status --porcelain`` of a work tree, and `snapshot_tree`
/ `changed_paths`, used by builders to see which files a step changed (FTL §8.3 item 7).
"""

from __future__ import annotations

import functools
import hashlib
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from ftl.errors import FtlError
from ftl.processes import LedgerEntry, parent_death_setup, pid_stat, record, release

__all__ = ["CommandResult", "run_command", "git_status", "snapshot_tree", "changed_paths",
           "SKIP_DIRS", "EXIT_NOT_FOUND", "EXIT_NOT_EXECUTABLE"]

EXIT_NOT_FOUND = 127  # shell convention: command not found
EXIT_NOT_EXECUTABLE = 126  # shell convention: found but not executable
_POLL_S = 0.05  # how often the wait loop looks at the cancel flag and the deadline
_READ_CHUNK = 65536
_DRAIN_LIMIT_S = 2.0  # after the group is stopped, how long to wait for pipes to close

# Directories no tool looks into: VCS data, ftl's own state, environments and caches.
SKIP_DIRS = frozenset({".git", ".ftl", ".venv", "venv", "node_modules", "__pycache__", ".tox",
                       ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"})



@dataclass
class CommandResult:
    """Outcome of one command. A non-zero exit, a timeout or a cancel is data, not an exception.

    Attributes:
        exit_code: the exit status; negative ``-N`` when a signal N not sent by ftl ended it;
            None when ftl stopped it (``timed_out`` or ``cancelled``); 127 when the program was
            not found and 126 when it could not be executed (shell conventions).
        output: the tail of stdout and stderr interleaved in arrival order, at most
            ``output_limit_bytes`` bytes before decoding (UTF-8, ``errors="replace"``).
        stdout: the tail of stdout alone (same limit).
        stderr: the tail of stderr alone (same limit).
        timed_out: the command ran past ``timeout_s`` and was stopped.
        cancelled: the cancel event was set and the command was stopped.
        duration_ms: wall-clock run time (monotonic clock), in ms.
        truncated: some output was dropped to keep the tail within the limit.
        idle_timed_out: the command wrote nothing on stdout for ``idle_timeout_s`` and was
            stopped (``timed_out`` stays False; ``exit_code`` is None).
    """

    exit_code: int | None
    output: str
    stdout: str
    stderr: str
    timed_out: bool
    cancelled: bool
    duration_ms: int
    truncated: bool = False
    idle_timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True when the command ran to the end and exited 0."""
        return self.exit_code == 0 and not self.timed_out and not self.cancelled

    def to_dict(self) -> dict:
        return asdict(self)


class _Tail:
    """Keeps the last ``limit`` bytes written to it."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.buf = bytearray()
        self.dropped = False

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]
            self.dropped = True

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


_child_setup = parent_death_setup  # the preexec_fn of every command (parent-death signal)


_EXIT = object()  # the selector key of a leader's pidfd


def _pidfd(pid: int) -> int | None:
    """A pidfd of child ``pid`` (Linux >= 5.3), readable once it exits; None where there is
    none (the wait loop then polls with a growing sleep)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pid: int) -> bool:
    """True once ``pid`` has exited; leaves it a zombie so its pid (= the pgid) cannot be reused."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


_RESERVED_PIDS = 300  # Linux's pid allocation wraps to 300, not 1 (kernel/pid.c RESERVED_PIDS)


_PROC_BUFFER = threading.local()  # a reused read buffer per thread (see `_read_proc`)
_PROC_CHUNK = 1 << 16


def _read_proc(path: str) -> bytes | None:
    """The whole of a /proc file, or None when it cannot be read. Read into this thread's
    64 KiB buffer, allocated once (a fresh 1 MiB bytes object per read cost three memory system
    calls: map, shrink, unmap; this runs four times per command); a file that fills it (a
    /proc/stat with thousands of interrupt counters) is read on to its end."""
    buffer = getattr(_PROC_BUFFER, "value", None)
    if buffer is None:
        buffer = _PROC_BUFFER.value = bytearray(_PROC_CHUNK)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.readv(fd, [buffer])
            if size < _PROC_CHUNK:
                return bytes(memoryview(buffer)[:size])
            parts = [bytes(buffer)]
            while chunk := os.read(fd, _PROC_CHUNK):
                parts.append(chunk)
            return b"".join(parts)
        finally:
            os.close(fd)
    except OSError:
        return None


def pid_counters() -> tuple[int, int] | None:
    """(pids allocated since boot, threads alive now): ``processes`` of /proc/stat (every fork
    and thread takes a pid) and the total of /proc/loadavg; None when unreadable. Taken before a
    command starts, it lets `_group_members` look only at the pids allocated since."""
    found = _counters()
    return None if found is None else found[:2]


def _counters() -> tuple[int, int, int] | None:
    """`pid_counters` and the latest pid allocated in our pid namespace (/proc/loadavg's last
    field, the value /proc/sys/kernel/ns_last_pid gives, from the same read); None when
    unreadable."""
    stat, load = _read_proc("/proc/stat"), _read_proc("/proc/loadavg")
    try:
        assert stat is not None and load is not None
        forks = int(stat[stat.index(b"\nprocesses ") + 11:].split(None, 1)[0])
        fields = load.split()
        return forks, int(fields[3].split(b"/")[1]), int(fields[4])
    except (AssertionError, ValueError, IndexError):
        return None


def pid_window(pgid: int, before: tuple[int, int], forks_now: int, last_pid: int,
               pid_max: int) -> Callable[[int], bool] | None:
    """Which pids can belong to process group ``pgid``, or None when any can (scan them all).

    Every member of the group descends from its leader (pid ``pgid``, made a session leader),
    so its pid was allocated after the leader's, and Linux allocates pids cyclically: while the
    allocation cursor has not gone once round since the leader (from 300 to ``pid_max``), those
    pids lie between ``pgid`` and ``last_pid`` (the latest allocated), across the wrap if
    ``last_pid < pgid``. The cursor moves one step per allocation plus one per pid it skips as
    in use, so it travels at most 2 x allocations + threads alive before (``before`` =
    `pid_counters` taken before the leader started; ``forks_now`` from one taken now). Numbers
    held only as the id of a group or session whose leader is gone are in use too and counted
    nowhere: half a round is the margin for them.
    """
    forks_before, alive_before = before
    travel = 2 * (forks_now - forks_before) + alive_before
    if travel >= (pid_max - _RESERVED_PIDS) // 2:
        return None
    if last_pid >= pgid:
        return lambda pid: pgid <= pid <= last_pid
    return lambda pid: pid >= pgid or pid <= last_pid


_SPAN_PROBE = 256  # up to this many pids in the window are read one by one, without a listdir


@functools.cache
def _pid_max() -> int | None:
    """/proc/sys/kernel/pid_max, read once per process (a sysctl that is set at boot in practice)."""
    limit = _read_proc("/proc/sys/kernel/pid_max")
    return int(limit) if limit is not None and limit.strip().isdigit() else None


def _window(pgid: int, before: tuple[int, int] | None) -> tuple[Callable[[int], bool] | None, range | None]:
    """`pid_window` for ``pgid`` now, and the window as a short range of pids when it is one
    (no wrap, at most `_SPAN_PROBE` pids: the usual case, a few pids since the leader)."""
    if before is None:
        return None, None
    now, limit = _counters(), _pid_max()
    if now is None or limit is None:
        return None, None
    last_pid = now[2]
    if last_pid < 1:  # a /proc that fills in placeholders (gVisor's reads 0): no window
        return None, None
    window = pid_window(pgid, before, now[0], last_pid, limit)
    span = (range(pgid, last_pid + 1) if window is not None and pgid <= last_pid < pgid + _SPAN_PROBE
            else None)
    return window, span


def _group_members(pgid: int, before: tuple[int, int] | None = None,
                   leader_exited: bool = False) -> list[int] | None:
    """Live (non-zombie) pids in process group ``pgid``, from /proc; None if /proc is unreadable.

    ``before``: `pid_counters` taken before the group's leader started; then only the pids
    allocated since are read (`pid_window`), not every process of the machine (a /proc/<pid>/stat
    read each, about 7 ms per command on a machine with 150 processes; issue 11 item 3).
    ``leader_exited``: the leader (pid ``pgid``) is known to be a zombie, not read.
    """
    window, span = _window(pgid, before)
    if span is not None:  # a few pids since the leader: read just those
        entries: Iterable[str] = map(str, span)
    else:
        try:
            entries = os.listdir("/proc")
        except OSError:
            return None
    members = []
    for entry in entries:
        if not entry.isdigit() or (window is not None and not window(int(entry))):
            continue
        pid = int(entry)
        if leader_exited and pid == pgid:
            continue
        try:  # one syscall (~1 us) rules out most pids before a /proc read (~30 us)
            if os.getpgid(pid) != pgid:
                continue
        except ProcessLookupError:  # gone
            continue
        except OSError:  # refused (a security module): let /proc say
            pass
        found = pid_stat(pid)  # None: gone, a zombie, or unreadable
        if found is not None and found[0] == pgid:
            members.append(pid)
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(pgid: int, grace_s: float, sleep: Callable[[float], None] = time.sleep,
                before: tuple[int, int] | None = None, leader_exited: bool = False) -> None:
    """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL what is left.
    ``before``: `pid_counters` taken before the leader started (see `_group_members`);
    ``leader_exited``: the leader is a zombie (exited, not reaped yet), known to the caller."""
    members = _group_members(pgid, before, leader_exited)
    if members == []:
        return
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        members = _group_members(pgid, before)
        if members == [] or (members is None and _exited(pgid)):
            break
        sleep(_POLL_S)
    _signal_group(pgid, signal.SIGKILL)  # no-op for an empty group; catches late forks


def _close_fds(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


#: The task's identifiers a build gets (`ftl.server.tools.builders`), in this order: workspace
#: id, seq, attempt, campaign id. Ids the build's own command line shows anyway (its checkpoint
#: path), never a secret.
TASK_ID_VARIABLES = ("FTL_WORKSPACE_ID", "FTL_TASK_SEQ", "FTL_ATTEMPT", "FTL_CAMPAIGN_ID")
_EXPORT_LIMIT = 4096  # bytes of exports; far below Linux's 128 KiB for one argument


def _exported(env: Mapping[str, str], command: str) -> str | None:
    """``command`` preceded by an ``export`` of ``env`` on its first line, or None (then the
    caller passes ``env`` to the child the usual way).

    A child given ``env=`` gets a copy of the whole environment, which Popen copies and encodes
    variable by variable (about 0.1 ms for a build's four variables, issue 11 item 3); the shell
    exporting them itself is the same for the command and what it starts, and the line numbers
    of the command's own error messages do not move. Only the task's identifiers
    (`TASK_ID_VARIABLES`): a command line is readable by every user of the machine, where an
    environment is not, and a shell reads some variables at its start (``ENV``, ``IFS``...),
    before an export. Exports past `_EXPORT_LIMIT` bytes, and values with a newline, go the
    usual way too.
    """
    if not env.keys() <= set(TASK_ID_VARIABLES):
        return None
    import shlex

    values = [str(value) for value in env.values()]
    if any("\n" in value for value in values):  # a quoted newline would move the line numbers
        return None
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in zip(env, values))
    return f"export {exports}; {command}" if len(exports) <= _EXPORT_LIMIT else None


def run_command(command: str | Sequence[str], *, cwd: Path, timeout_s: float,
                cancel: threading.Event | None = None, stdin: bytes | None = None,
                env: Mapping[str, str] | None = None, output_limit_bytes: int = 65536,
                grace_s: float = 2.0, ledger: Path | None = None,
                on_stdout_line: Callable[[bytes], None] | None = None,
                idle_timeout_s: float | None = None) -> CommandResult:
    """Run ``command`` in ``cwd`` and return its `CommandResult`; never raises for its outcome.

    Args:
        command: a string runs through ``/bin/sh -c``; a list runs the program directly.
        cwd: working directory; must exist.
        timeout_s: wall-clock limit in s; past it the process group is stopped.
        cancel: when set (polled every 50 ms) the process group is stopped.
        stdin: bytes written to the command's stdin, which is then closed; None gives it an
            empty stdin (EOF at once), never the caller's terminal.
        env: variables added to (and overriding) the inherited environment. For a string
            command given only the task's identifiers (a build's ``FTL_`` ids), the script
            exports them itself (`_exported`) instead of the child getting a copy of the
            environment.
        output_limit_bytes: how many bytes of output tail to keep, per stream and combined.
        grace_s: time between SIGTERM and SIGKILL when stopping the group, in s.
        ledger: a folder in which the running group is recorded, with its deadline, until it
            is reaped (`ftl.processes`). Such a command gets no parent-death signal:
            if ftl dies it runs to its end (or its deadline) and records its own completion
            (a build's checkpoint), and the next resume waits for it before anything runs
            again, so a finished build is never run twice and no orphan outlives the wait.
        on_stdout_line: called in this thread with each complete stdout line (bytes, without
            its newline) as it arrives, and with a last unterminated line at the end; for
            line-delimited event streams (Claude Code's stream-json). An exception it raises
            stops the command's group and propagates.
        idle_timeout_s: when stdout stays silent this long (s, monotonic), the group is stopped
            and the result says ``idle_timed_out`` (a stalled agent).

    Output is read while the command runs (no pipe deadlock whatever its size). If a process
    outside the group (one that called setsid) keeps the pipes open, reading stops 2 s after the
    group is gone.

    Raises:
        FtlError(not_found): ``cwd`` is not a directory.
        FtlError(invalid_params): ``command`` is empty.
    """
    cwd = Path(cwd)
    if not cwd.is_dir():
        raise FtlError("not_found", {"what": f"working directory {cwd}"})
    child_env = None
    if isinstance(command, str):
        if not command.strip():
            raise FtlError("invalid_params", {"schema_errors": ["command is empty"]})
        what = command
        script = _exported(env, command) if env else None
        if script is not None:
            command, env = script, None
        argv: list[str] = ["/bin/sh", "-c", command]
    else:
        argv = [str(part) for part in command]
        if not argv:
            raise FtlError("invalid_params", {"schema_errors": ["command is empty"]})
        what = argv[-1]
    if env:
        child_env = dict(os.environ)
        child_env.update({str(k): str(v) for k, v in env.items()})

    out, err, both = (_Tail(output_limit_bytes) for _ in range(3))
    started = time.monotonic()
    if cancel is not None and cancel.is_set():  # cancelled before it began: do not start it
        return CommandResult(None, "", "", "", False, True, 0)
    pending_in = memoryview(stdin or b"")  # a stdin that is not bytes fails before anything starts
    selector = selectors.DefaultSelector()  # made first: nothing is left to undo if it fails
    counters = pid_counters()  # before the leader's pid is allocated
    # Plain pipe descriptors, not Popen's file objects (each costs three system calls to make:
    # fstat, isatty, tell; the output is read with os.read anyway): the child's ends, then ours.
    child_ends: list[int] = []
    ours: list[int] = []
    try:
        for index in range(3):  # stdin, stdout, stderr
            read_end, write_end = os.pipe()  # close-on-exec; Popen gives the child its copies
            child_ends.append(read_end if index == 0 else write_end)
            ours.append(write_end if index == 0 else read_end)
        proc = subprocess.Popen(argv, cwd=cwd, env=child_env, stdin=child_ends[0],
                                stdout=child_ends[1], stderr=child_ends[2],
                                start_new_session=True,
                                # A recorded command outlives a dead ftl to record its own end
                                # (checkpoint); the next resume waits for it (ledger deadline).
                                preexec_fn=None if ledger is not None else _child_setup(os.getpid()))
    except BaseException as exc:
        _close_fds(ours)
        selector.close()
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            message = f"{argv[0]}: command not found\n"
            return CommandResult(EXIT_NOT_FOUND, message, "", message, False, False,
                                 int((time.monotonic() - started) * 1000))
        if isinstance(exc, PermissionError):
            message = f"{argv[0]}: permission denied\n"
            return CommandResult(EXIT_NOT_EXECUTABLE, message, "", message, False, False,
                                 int((time.monotonic() - started) * 1000))
        raise
    finally:
        _close_fds(child_ends)
    stdin_fd, stdout_fd, stderr_fd = ours
    open_fds = set(ours)

    def close_fd(fd: int) -> None:
        if fd in open_fds:
            open_fds.discard(fd)
            _close_fds([fd])

    timed_out = cancelled = idle_timed_out = False
    partial_line = bytearray()
    last_stdout = time.monotonic()

    def take_stdout(data: bytes) -> None:
        nonlocal last_stdout
        last_stdout = time.monotonic()
        if on_stdout_line is None:
            return
        partial_line.extend(data)
        while (newline := partial_line.find(b"\n")) != -1:
            line = bytes(partial_line[:newline])
            del partial_line[:newline + 1]
            on_stdout_line(line)

    entry: LedgerEntry | None = None
    exit_fd: int | None = None
    try:  # from here on, whatever is raised, the finally closes and reaps what was made
        if ledger is not None:
            entry = record(ledger, proc.pid, what, deadline_s=time.time() + timeout_s)
        exit_fd = _pidfd(proc.pid)
        for fd, tail in ((stdout_fd, out), (stderr_fd, err)):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, tail)
        if exit_fd is not None:  # readable once the leader exits: the wait wakes at once
            selector.register(exit_fd, selectors.EVENT_READ, _EXIT)
        if pending_in:
            os.set_blocking(stdin_fd, False)
            selector.register(stdin_fd, selectors.EVENT_WRITE, None)
        else:
            close_fd(stdin_fd)

        def pump(wait_s: float) -> None:
            nonlocal pending_in
            for key, _ in selector.select(wait_s):
                if key.data is _EXIT:
                    continue
                if key.data is None:  # stdin writable
                    try:
                        written = os.write(key.fd, pending_in[:_READ_CHUNK])
                        pending_in = pending_in[written:]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pending_in = pending_in[:0]
                    if not pending_in:
                        selector.unregister(key.fileobj)
                        close_fd(key.fd)
                    continue
                try:
                    data = os.read(key.fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if data:
                    key.data.add(data)
                    both.add(data)
                    if key.data is out:
                        take_stdout(data)
                else:
                    selector.unregister(key.fileobj)

        def reading() -> bool:
            return any(key.data is not None and key.data is not _EXIT
                       for key in selector.get_map().values())

        deadline = started + timeout_s
        idle_s = 0.001  # once the pipes are closed, poll for the exit with a growing interval
        leader_exited = False
        while not (leader_exited := _exited(proc.pid)):
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            if idle_timeout_s is not None and time.monotonic() - last_stdout >= idle_timeout_s:
                idle_timed_out = True
                break
            if reading() or pending_in or exit_fd is not None:
                pump(min(_POLL_S, max(0.0, deadline - time.monotonic())))
            else:
                time.sleep(min(idle_s, max(0.0, deadline - time.monotonic())))
                idle_s = min(idle_s * 2, _POLL_S)
        # The leader is done or must stop: either way nothing of its group may stay behind.
        if exit_fd is not None:
            selector.unregister(exit_fd)
            os.close(exit_fd)
            exit_fd = None
        _stop_group(proc.pid, grace_s, before=counters, leader_exited=leader_exited)
        drain_until = time.monotonic() + _DRAIN_LIMIT_S
        while reading() and time.monotonic() < drain_until:
            pump(_POLL_S)
        if on_stdout_line is not None and partial_line:
            on_stdout_line(bytes(partial_line))
        proc.wait()
    finally:
        selector.close()
        if exit_fd is not None:
            os.close(exit_fd)
        for fd in list(open_fds):
            close_fd(fd)
        if proc.returncode is None:  # an exception escaped the loop: do not leak the group
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        release(entry)  # the group was stopped above: nothing of it is left to reap

    exit_code = None if (timed_out or cancelled or idle_timed_out) else proc.returncode
    return CommandResult(exit_code=exit_code, output=both.text(), stdout=out.text(),
                         stderr=err.text(), timed_out=timed_out, cancelled=cancelled,
                         duration_ms=int((time.monotonic() - started) * 1000),
                         truncated=out.dropped or err.dropped or both.dropped,
                         idle_timed_out=idle_timed_out)


# --------------------------------------------------------------------------- change detection

# Directory -> its path inside its git work tree. A directory's place in its work tree does not
# change while ftl runs, and every build takes two snapshots: one git process less each time.
_git_prefixes: dict[str, str] = {}


def git_status(repo: Path, *, cancel: threading.Event | None = None,
               timeout_s: float = 30.0) -> dict[str, str] | None:
    """Paths that differ from HEAD in ``repo``'s work tree, with their two-letter porcelain code.

    Uses ``git status --porcelain=v1 -z --untracked-files=all`` (renames give the new path;
    ignored files are not listed). Paths are repository-relative with ``/`` separators and are
    relative to ``repo`` when ``repo`` is a sub-directory of the work tree.

    An uncancellable call (the builder's two snapshots per task) asks libgit2 in process first
    (`ftl.vcs.libgit.status`: 0.05 ms instead of a 2.5 ms git process on a small repository),
    and git where libgit2 cannot answer like git.

    Returns:
        ``{path: "XY"}``, or None when ``repo`` is not in a git work tree or git is unavailable.
    """
    if cancel is None:
        from ftl.vcs import libgit

        found = libgit.status(repo)
        if found is not None:
            return found
    strip = _git_prefixes.get(str(repo))
    if strip is None:
        prefix = _git(["rev-parse", "--show-prefix"], repo, timeout_s, cancel)
        if prefix is None:
            return None
        strip = _git_prefixes[str(repo)] = prefix.strip()
    status = _git(["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--", "."],
                  repo, timeout_s, cancel)
    if status is None:
        return None
    changes: dict[str, str] = {}
    for record in status.split("\0"):
        if len(record) > 3 and record[3:].startswith(strip):
            changes[record[3:][len(strip):]] = record[:2]
    return changes


def _git(args: list[str], repo: Path, timeout_s: float, cancel: threading.Event | None) -> str | None:
    """``git ARGS`` in ``repo``: its stdout, or None when it fails or git is missing.

    A cancellable call goes through `run_command`. An uncancellable one (the builder's two
    snapshots per task) is a plain child process: git is ftl's own short command that leaves
    nothing behind, so it needs neither a process group to sweep nor the parent-death hook,
    whose Python ``preexec_fn`` makes every spawn fork the whole server (5-10 ms each, plus a
    /proc scan; issue 11 item 3).
    """
    if cancel is not None:
        result = run_command(["git", *args], cwd=repo, timeout_s=timeout_s, cancel=cancel,
                             output_limit_bytes=64 * 1024 * 1024)
        return result.stdout if result.ok else None
    try:
        done = subprocess.run(["git", *args], cwd=repo, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", errors="replace")


def _fingerprint(path: Path) -> str:
    """Content hash of a file ("-" when absent, "d" for a directory or other non-file)."""
    try:
        if not path.is_file():
            return "-" if not path.exists() else "d"
        digest = hashlib.sha1()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except OSError:
        return "?"


def _walk_files(repo: Path) -> dict[str, str]:
    """Every file under ``repo`` outside `SKIP_DIRS`, as ``{path: "size:mtime_ns"}``."""
    files: dict[str, str] = {}
    for root, dirs, names in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not (Path(root, d) / "pyvenv.cfg").exists()]
        for name in names:
            full = Path(root, name)
            try:
                stat = full.stat()
            except OSError:
                continue
            files[full.relative_to(repo).as_posix()] = f"{stat.st_size}:{stat.st_mtime_ns}"
    return files


def snapshot_tree(repo: Path, method: str | None = None) -> tuple[str, dict[str, str]]:
    """A cheap picture of ``repo``'s files to diff after a step (see `changed_paths`).

    In a git work tree (method ``"git"``): the paths `git_status` lists, each with its status
    code and content hash (a path not listed equals HEAD). Elsewhere (method ``"walk"``): every
    file outside `SKIP_DIRS` with its size and mtime. Paths under ``.ftl/`` (ftl's own store and
    logs) are left out. Not cancellable on purpose: a scope check must run even after a cancel.

    Args:
        method: force ``"git"`` or ``"walk"`` (use the first snapshot's method for the second);
            None detects.

    Returns:
        ``(method, {path: fingerprint})``; method ``"unavailable"`` (and no paths) when ``"git"``
        was forced and git failed.
    """
    status = git_status(repo) if method in (None, "git") else None
    if status is None:
        if method == "git":
            return "unavailable", {}
        return "walk", _walk_files(repo)
    return "git", {path: f"{code}:{_fingerprint(repo / path)}" for path, code in status.items()
                   if not path.startswith(".ftl/")}


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths whose fingerprint differs between two `snapshot_tree` pictures, sorted."""
    return sorted(path for path in before.keys() | after.keys()
                  if before.get(path) != after.get(path) and not path.startswith(".ftl/"))
