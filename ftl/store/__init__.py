"""The SQLite store (``<repo>/.ftl/ftl.db``): campaigns, plan versions, tasks, workspaces,
explorer results, explorations and memory's tables. The only package in ftl that writes SQL.

What it fixes from FTL's store (``shared/reference/ftl-behaviour.md`` §5.6, §8.2 items 11-14,
§8.3 item 11): one row per task instead of one JSON column per campaign; a single table of legal
task transitions (`TRANSITIONS`), checked and written in one ``BEGIN IMMEDIATE`` transaction so
two processes can neither lose an update nor both start the same task; add-tasks refuses to
overwrite progress; a re-plan merge keeps complete tasks, takes the revised spec for the others,
adds new tasks and saves a new plan version.

Durability and concurrency choices:

* WAL journal, ``synchronous=NORMAL`` by default: a commit survives ``kill -9`` of the process
  (the WAL is in the OS page cache; SQLite docs, "WAL mode ... synchronous=NORMAL"), and the
  database stays consistent on power loss or an OS crash, which may roll back the last commits.
  That is the durability of the rest of ftl's records (the event log and the build ledger are
  not fsynced per write either), and an fsync per commit cost 20-30 ms per task on a disk with
  slow flushes (issue 11 item 3). ``Store(durable=True)`` selects ``synchronous=FULL``: the WAL is
  fsynced on every commit, so a commit ftl has acted on (a task marked running or complete) is
  never rolled back, even by a power loss.
* Pages of `PAGE_SIZE` (8 KiB) in a new file, not SQLite's default 4 KiB: registering a
  10,000-task plan writes about 4 MB of task rows, which then take half the WAL frames (two
  writes each), half the checkpoint reads and writes and fewer B-tree pages, and stay under
  the 1,000-frame autocheckpoint, so the one checkpoint runs at close instead of inside the
  commit (add-tasks' store work: 51-53 ms instead of 57-59, issue 11 item 4). A small
  transaction writes 8 KiB frames instead of 4 KiB, a few microseconds more.
* ``busy_timeout`` of `BUSY_TIMEOUT_MS`: a writer in another process makes us wait, not fail; a lock
  held longer than that becomes the transient ``lock_contention`` error.
* One connection per `Store`, opened with ``check_same_thread=False`` and serialised by an
  ``RLock``. SQLite has one writer at a time anyway and every statement here is short, so a
  connection per thread would add no write parallelism, only connections to track and close.
* Read-modify-write goes through ``BEGIN IMMEDIATE``: the write lock is taken before the read, so
  the check and the write see the same state in every process.

Plan versions share a registered plan's task specs with the task rows (migration 3): see
`ftl.store.plans`.

Rows come back as plain dicts with JSON columns decoded. Timestamps are RFC 3339 UTC strings with
millisecond precision and a ``Z`` suffix. Seqs are canonical (`ftl.models.normalize_seq`); callers
may pass ``1``, ``"1"`` or ``"001"``.

The package, one module per concern (each imports only the ones listed before it):

* `ftl.store.codec`: JSON columns, timestamps, canonical seqs, the ``schema_invalid`` error.
* `ftl.store.schema`: `MIGRATIONS`, `SCHEMA_VERSION`, `migrate`, the connection settings.
* `ftl.store.campaigns`, `ftl.store.plans`, `ftl.store.tasks` (rows and the status machine),
  `ftl.store.task_set` (add-tasks and the re-plan merge), `ftl.store.workspaces`,
  `ftl.store.explorations`, `ftl.store.memory_tables` (the memory room's tables; its rules are
  in `ftl.memory`): the rows of each table, as mixins.
* this module: `Store`, which composes the mixins and owns the connection, its sessions and the
  translation of SQLite errors; and the names above, re-exported (``from ftl.store import ...``
  keeps working for every name the single module had).
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

from ftl.errors import FtlError
from ftl.store.campaigns import CAMPAIGN_STATUSES, FINISHED_STATUSES, FLOWS, CampaignsMixin
from ftl.store.codec import _LONG_DIGITS, _dumps, _loads, _seq, _seqs_json, _utc_now, _violation, format_ts
from ftl.store.explorations import ExplorationsMixin
from ftl.store.memory_tables import MEMORY_TYPES, MemoryTablesMixin
from ftl.store.plans import _PLAN_TEXT_COLUMNS, _TASKS_KEY, PlanVersionsMixin
from ftl.store.schema import BUSY_TIMEOUT_MS, MIGRATIONS, PAGE_SIZE, SCHEMA_VERSION, migrate
from ftl.store.task_set import _INSERT_BATCH, TaskSetMixin, check_plan_graph
from ftl.store.tasks import _B, _C, _P, _R, _SQL_BATCH, _TRANSITIONS, TasksMixin
from ftl.store.workspaces import WORKSPACE_END_STATUSES, WORKSPACE_TRANSITIONS, WorkspacesMixin

# Every module-level name of the former single module ftl/store.py, private ones included (tests
# import some). TRANSITIONS is left out: it is built on first use (`__getattr__`), and a star
# import would load the models.
__all__ = [
    "Store", "migrate", "check_plan_graph", "format_ts", "MIGRATIONS", "SCHEMA_VERSION",
    "BUSY_TIMEOUT_MS", "PAGE_SIZE", "CAMPAIGN_STATUSES", "FINISHED_STATUSES", "FLOWS",
    "WORKSPACE_END_STATUSES", "WORKSPACE_TRANSITIONS", "MEMORY_TYPES",
    "_LONG_DIGITS", "_SQL_BATCH", "_INSERT_BATCH", "_TASKS_KEY", "_PLAN_TEXT_COLUMNS",
    "_P", "_R", "_C", "_B", "_TRANSITIONS", "_utc_now", "_violation", "_dumps", "_loads",
    "_seqs_json", "_seq", "_log",
]

def _log() -> Any:
    """The ``ftl.store`` logger; `logging` loads only when the store has something to report
    (reading commands such as ``ftl campaign status`` start faster without it)."""
    import logging

    return logging.getLogger("ftl.store")


def __getattr__(name: str) -> Any:
    """``TRANSITIONS``: the `_TRANSITIONS` table keyed by `ftl.models.TaskStatus` members, as
    before; built on first use so that reading the store never imports the models (pydantic)."""
    if name == "TRANSITIONS":
        from ftl.models import TaskStatus

        table = {(TaskStatus(a), TaskStatus(b)): reason for (a, b), reason in _TRANSITIONS.items()}
        globals()["TRANSITIONS"] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Store(CampaignsMixin, PlanVersionsMixin, TasksMixin, TaskSetMixin, WorkspacesMixin,
            ExplorationsMixin, MemoryTablesMixin):
    """Campaign state in SQLite, safe to share between threads and processes.

    Args:
        path: the database file; its parent directory is created.
        clock: returns the current time (aware or naive-UTC ``datetime``); injected by tests.
        durable: fsync every commit (``synchronous=FULL``) so that it survives power loss too;
            by default commits survive a killed process (see the module docstring).

    Raises:
        FtlError(conflict): the file is not a readable SQLite database, is newer than this ftl,
            or cannot be created. Messages name the file relative to the repo (``.ftl/ftl.db``).
    """

    def __init__(self, path: Path, *, clock: Callable[[], datetime] | None = None,
                 durable: bool = False) -> None:
        self.path = Path(path)
        self._label = f"{self.path.parent.name}/{self.path.name}" if self.path.parent.name else self.path.name
        self._clock = clock or _utc_now
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._campaigns_seen: set[str] = set()  # `_require_campaign`
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FtlError("conflict", {"what": f"Cannot create the store directory for {self._label} "
                                                f"({exc.strerror or 'OS error'}); check permissions."}) from None
        conn = None
        try:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # takes effect only on a new file
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                _log().warning("store %s: journal_mode is %s, not wal", self._label, mode)
            conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn)
        except FtlError:
            if conn is not None:
                conn.close()
            raise
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise self._translate(exc) from None
        self._conn = conn

    @classmethod
    def for_repo(cls, repo: Path, **kwargs: Any) -> "Store":
        """The store of a repository: ``<repo>/.ftl/ftl.db`` (created if missing)."""
        return cls(Path(repo) / ".ftl" / "ftl.db", **kwargs)

    def close(self) -> None:
        """Close the connection; later calls raise ``invalid_state``. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the clock, for other rooms

    def clock(self) -> datetime:
        """The store's notion of now (its injected clock: tests use a fake one), for a room whose
        rules depend on the time of the rows (`ftl.memory`: importance decays with age)."""
        return self._clock()

    def now(self) -> str:
        """`clock` as the RFC 3339 text every row's timestamps use (`format_ts`)."""
        return self._now()

    # ------------------------------------------------------------------ plumbing

    def _now(self) -> str:
        return format_ts(self._clock())

    def _translate(self, exc: sqlite3.Error) -> FtlError:
        """A sqlite3 error as a safe FtlError; internals go to the log under a correlation id."""
        text = str(exc).lower()
        if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
            return FtlError("lock_contention", {"resource": f"store {self._label}"},
                            message=f"The store {self._label} is locked by another process "
                                    f"(waited up to {BUSY_TIMEOUT_MS // 1000} s).")
        if any(word in text for word in ("not a database", "malformed", "corrupt", "unable to open")):
            _log().error("store %s unreadable: %r", self.path, exc)
            return FtlError("conflict", {"what": f"The store {self._label} is unreadable or corrupt. "
                                                 "Move it aside (ftl creates a new one) or restore a backup."})
        if isinstance(exc, sqlite3.IntegrityError):
            _log().error("store %s constraint: %r", self.path, exc)
            return FtlError("conflict", {"what": "The change violates a store constraint; "
                                                 "re-read the current state and try again."})
        import uuid

        correlation_id = uuid.uuid4().hex[:12]
        _log().error("store %s error [%s]: %r", self.path, correlation_id, exc)
        return FtlError("internal_error", {"correlation_id": correlation_id})

    @contextmanager
    def _session(self, write: bool = False, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        """Hold the lock; for writes, wrap the body in BEGIN IMMEDIATE ... COMMIT (ROLLBACK on
        error); with ``snapshot``, a read in BEGIN ... COMMIT, so that its statements see one
        state of the file (WAL: another process's commit in between is not seen)."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise FtlError("invalid_state", {"trigger": "query", "state": "closed"},
                               message="The store is closed.")
            try:
                if write or snapshot:
                    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield conn
                if write or snapshot:
                    conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        _log().exception("store %s: rollback failed", self.path)
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc) from None
                raise

    @contextmanager
    def _foreign_keys_unchecked(self) -> Iterator[None]:
        """Hold the lock with foreign keys unchecked, for a session that writes only rows of a
        campaign it read in the same transaction (the keys hold by construction; 10,000 task
        rows: 1.5-2.5 ms of per-row parent look-ups saved). ``PRAGMA foreign_keys`` is a no-op
        inside a transaction, so this wraps the session; the check is back on when it ends."""
        with self._lock:
            conn = self._conn
            if conn is None:  # the session says the store is closed
                yield
                return
            try:
                conn.execute("PRAGMA foreign_keys = OFF")
                yield
            except sqlite3.Error as exc:
                raise self._translate(exc) from None
            finally:
                if self._conn is conn:
                    conn.execute("PRAGMA foreign_keys = ON")

    def integrity_check(self) -> str:
        """``"ok"``, or the problems SQLite's integrity and foreign-key checks report, one per line."""
        with self._session() as conn:
            rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
            fk = [f"foreign key: {r[0]} row {r[1]} -> {r[2]}" for r in conn.execute("PRAGMA foreign_key_check")]
        problems = [r for r in rows if r != "ok"] + fk
        return "ok" if not problems else "\n".join(problems)

    def schema_version(self) -> int:
        """The file's ``PRAGMA user_version`` (equals `SCHEMA_VERSION` once opened)."""
        with self._session() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
