"""Build checkpoints: a shell build records its own completion, so that it runs at most once.

A shell build's command is wrapped (`wrap`) so that the shell itself appends the build's marker
(``<workspace_id>-<attempt>``, ``-r2`` for a merge conflict's re-run) as one line to the
campaign's journal, ``.ftl/checkpoints/<campaign_id>.built``, the moment the command exits 0.
The shell writes it, not ftl: a command that finishes after ftl died still records that it
did, and the resume takes the build as done (`ftl.states.build`, module docstring).

One journal per campaign, appended to, instead of one empty file per build: creating a file
took 0.7-1.0 ms of every build on ext4 (the 2-core VM ftl is benchmarked on), an append to an
existing file 0.05 ms (issue 11 item 3). ftl makes the journal (`prepare`), so no build's
``umask`` decides its mode. Each marker is written by one ``printf`` (one ``write``,
``O_APPEND``), so markers of parallel builds never interleave, as a line of its own between two
newlines, ending with `` .``: a write cut short (a full disk) leaves a line without that end,
which counts for nothing and cannot swallow the next build's line. A reader (`written`) reads
only what the journal gained since its last look (it only grows): a stat and a short read,
however long the campaign.

Checkpoints of an earlier ftl (one ``<marker>.built`` file per build in
``.ftl/checkpoints/<campaign_id>/``) still count, so a campaign it left can be resumed.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import threading
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger("ftl.engine.checkpoints")

__all__ = ["Checkpoint", "checkpoint_for", "prepare", "written", "wrap", "OWNS_THE_SHELL",
           "sh_is_dash"]


class Checkpoint(NamedTuple):
    """Where a build's completion is recorded: ``journal`` (an absolute path: the wrapped
    command may ``cd``) and the build's ``marker`` line in it."""

    journal: Path
    marker: str


def checkpoint_for(repo: Path, campaign_id: str, workspace_id: str, attempt: int,
                   round_: int = 1) -> Checkpoint:
    """The checkpoint of one build: attempt ``attempt`` of ``workspace_id``, round ``round_``
    (2: the re-run after a merge conflict)."""
    suffix = "" if round_ == 1 else f"-r{round_}"
    journal = Path(os.path.abspath(Path(repo) / ".ftl" / "checkpoints" / f"{campaign_id}.built"))
    # Workspace ids are seq-slug (kebab-case); a line break would split the marker.
    return Checkpoint(journal, f"{workspace_id}-{attempt}{suffix}".replace("\n", " "))


def prepare(checkpoint: Checkpoint) -> Checkpoint | None:
    """Make the journal (and its folder) unless it is there; return ``checkpoint``, or None
    when it cannot be made (a read-only or full disk): the build then runs without a
    checkpoint, as one whose shell could not write it did before (at least once, not lost)."""
    try:
        if not checkpoint.journal.is_file():
            checkpoint.journal.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(checkpoint.journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    except OSError as exc:
        log.warning("no build checkpoint: the journal %s cannot be made (%s)",
                    checkpoint.journal.name, exc.strerror or type(exc).__name__)
        return None
    return checkpoint


def written(checkpoint: Checkpoint) -> bool:
    """Whether the build's command completed (exit 0): its marker is a whole line of the
    journal, or an earlier ftl's checkpoint file of it exists. A journal that cannot be read
    counts as holding nothing (the build may then run again: at least once, never lost)."""
    if _reader(checkpoint.journal).has(checkpoint.marker):
        return True
    legacy = checkpoint.journal.with_suffix("") / f"{checkpoint.marker}.built"
    try:
        return legacy.exists()
    except OSError:
        return False


_END = b" ."  # the end of a whole marker line


class _JournalReader:
    """The markers of one journal, read incrementally; thread-safe. It keeps the journal open,
    so a journal removed and made again (a new inode; the number of the old one cannot be
    reused while it is held) is told apart and read again from its start, as is one found
    shorter than what was read. (A journal emptied in place and written past that point
    between two looks is not told apart: ftl never empties one.) `close` releases it; a
    reader closed while a caller still held it answers that caller and closes again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._offset = 0
        self._partial = b""
        self._markers: set[str] = set()
        self._closed = False

    def has(self, marker: str) -> bool:
        """Whether ``marker`` is a whole line of the journal (read up to now)."""
        with self._lock:
            try:
                self._catch_up()
            except OSError:  # gone, or unreadable: nothing counts
                self._reopen(None)
                return False
            found = marker in self._markers
            if self._closed:  # evicted meanwhile: keep no file open for nobody
                self._reopen(None)
            return found

    def _catch_up(self) -> None:
        found = os.stat(self.path)
        held = os.fstat(self._fd) if self._fd is not None else None
        if held is None or (held.st_dev, held.st_ino) != (found.st_dev, found.st_ino):
            self._reopen(os.open(self.path, os.O_RDONLY))
        size = os.fstat(self._fd).st_size  # type: ignore[arg-type]
        if size < self._offset:  # cut shorter: read it again from its start
            self._forget()
        while size > self._offset:
            data = os.pread(self._fd, size - self._offset, self._offset)  # type: ignore[arg-type]
            if not data:
                break
            self._offset += len(data)
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()  # no newline yet: not a line (yet)
            self._markers.update(line[:-len(_END)].decode("utf-8", "replace")
                                 for line in lines if line.endswith(_END))

    def _reopen(self, fd: int | None) -> None:
        """Hold ``fd`` (None: nothing) instead of the journal held so far, read from its start."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._forget()

    def _forget(self) -> None:
        self._offset, self._partial, self._markers = 0, b"", set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._reopen(None)


_READERS: OrderedDict[Path, _JournalReader] = OrderedDict()  # most recently used last
_READERS_LOCK = threading.Lock()
_READERS_KEPT = 16  # journals are per campaign: a long-lived process moves on to new ones


def _reader(path: Path) -> _JournalReader:
    with _READERS_LOCK:
        reader = _READERS.pop(path, None) or _JournalReader(path)
        _READERS[path] = reader
        evicted = [_READERS.popitem(last=False)[1] for _ in range(len(_READERS) - _READERS_KEPT)]
    for old in evicted:  # outside the lock: a read in progress must not stall every lookup
        old.close()
    return reader


# Words after which the command may replace the shell (exec) or its EXIT trap (trap), itself or
# in code it runs in the same shell (eval, source, "."), touch the wrapper's own names, define
# the one function the wrapper's write could call (command), or set what would stop that write
# (ulimit -f: the shell is killed by SIGXFSZ): such a command keeps the subshell wrapper.
OWNS_THE_SHELL = re.compile(r"\b(?:trap|exec|eval|source|ulimit|ftl_checkpoint|ftl_status)\b"
                            r"|(?:^|[\s;&|(`])\.\s"
                            r"|\bcommand\s*\(\s*\)|\bfunction\s+command\b")


@functools.cache
def sh_is_dash() -> bool:
    """Whether ``/bin/sh`` (which runs shell commands, `ftl.server.tools.proc.run_command`) is
    dash. bash, as ``/bin/sh`` on Fedora, RHEL or Arch, runs an EXIT trap when a signal kills it
    (a timeout's SIGTERM, a SIGPIPE after ftl died), with ``$?`` of the last command that
    finished: the EXIT-trap wrapper would then record a killed build as built. dash does not."""
    return os.path.basename(os.path.realpath("/bin/sh")) == "dash"


def wrap(command: str, checkpoint: Checkpoint, *, trap: bool | None = None) -> str:
    """``command`` wrapped so that the shell appends the checkpoint's marker to its journal
    (builtins only: ``command printf``, which no function of the command can stand in for)
    when it exits 0.

    Where ``/bin/sh`` is dash, an EXIT trap does it without a second process: the command runs
    in the wrapper's own shell, and ``exit 0`` anywhere in it still reaches the trap, while a
    signal that kills the shell does not. Elsewhere (``trap`` False; None: `sh_is_dash`), and
    for a command that could replace the shell or the trap (`OWNS_THE_SHELL`), the command runs
    in a subshell (one fork more, about 0.3 ms) and the wrapper checks its status. Newlines
    separate the parts, so a trailing ``# comment`` in the command cannot swallow the wrapper;
    the command's exit status is the wrapper's.
    """
    # `case` on the quoted status: in the trap form the command runs in this shell, and an IFS
    # it set must not split the status.
    write = (f'case "$ftl_status" in 0) command printf \'\\n%s .\\n\' {shlex.quote(checkpoint.marker)} '
             f'>> {shlex.quote(str(checkpoint.journal))};; esac')
    if not (sh_is_dash() if trap is None else trap) or OWNS_THE_SHELL.search(command):
        return f'(\n{command}\n)\nftl_status=$?\n{write}\nexit "$ftl_status"'
    return f"ftl_checkpoint() {{ ftl_status=$?; {write}; }}\ntrap ftl_checkpoint EXIT\n{command}\n"
