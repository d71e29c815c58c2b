"""The SQLite store (``<repo>/.ftl/ftl.db``): campaigns, plan versions, tasks, workspaces,
explorer results, explorations and memory. The only module in ftl that writes SQL.

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

Plan versions: a version is the plan's JSON text (``Plan.model_dump_json(by_alias=True)``),
read back byte for byte. The version add-tasks saves is not written whole: its task list is the
task rows' specs, so the row keeps the text with an empty task list plus where the specs go
(``tasks_at``) and their seqs in plan order (``task_seqs``), and `_plan_text` puts them back.
A 10,000-task plan then writes its 2.5 MB of specs once instead of twice (issue 11 item 4: the
second copy cost about 15 ms of add-tasks' commit). That holds while the task rows keep the
specs they were registered with, so everything that changes a spec or the task set
(`merge_revised_plan`) first writes such versions out whole (`_materialise_plans`), in the same
transaction.

Rows come back as plain dicts with JSON columns decoded. Timestamps are RFC 3339 UTC strings with
millisecond precision and a ``Z`` suffix. Seqs are canonical (`ftl.models.normalize_seq`); callers
may pass ``1``, ``"1"`` or ``"001"``.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timezone
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import orjson

from ftl import dag
from ftl.errors import FtlError

if TYPE_CHECKING:  # the models (pydantic) load only where a plan or task is parsed or written
    from ftl.models import Plan, Task, TaskStatus
    from ftl.plan_rows import PlanRows, TaskRow



def _log() -> Any:
    """The ``ftl.store`` logger; `logging` loads only when the store has something to report
    (reading commands such as ``ftl campaign status`` start faster without it)."""
    import logging

    return logging.getLogger("ftl.store")

BUSY_TIMEOUT_MS = 10_000
#: Page size (bytes) of a store file ftl creates; an existing file keeps its own. See the module
#: docstring (Durability and concurrency choices).
PAGE_SIZE = 8192
CAMPAIGN_STATUSES = ("active", "complete", "returned", "cancelled")
FINISHED_STATUSES = ("complete", "returned", "cancelled")
FLOWS = ("campaign", "task")
WORKSPACE_END_STATUSES = ("complete", "blocked", "cancelled", "abandoned")
#: Workspace attempt lifecycle: active -> built (build done, verify pending; a resume re-verifies
#: instead of rebuilding) -> an end status; or active -> an end status directly.
WORKSPACE_TRANSITIONS: dict[str, tuple[str, ...]] = {
    "active": ("built",) + WORKSPACE_END_STATUSES,
    "built": WORKSPACE_END_STATUSES,
}
MEMORY_TYPES = ("failure", "pattern")
_LONG_DIGITS = re.compile(r"\d{19}")
_SQL_BATCH = 500  # bound parameters per IN (...) query, far below SQLite's limit
#: Task rows per INSERT statement in add-tasks: 7 parameters each stay within 999, the lowest
#: limit a SQLite build may have (SQLITE_MAX_VARIABLE_NUMBER before 3.32).
_INSERT_BATCH = 140
_TASKS_KEY = ',"tasks":['  # where a plan text's task list starts (its header fields come first)
_PLAN_TEXT_COLUMNS = "plan, tasks_at, task_seqs"  # what `Store._plan_text` reads

# Status texts (`ftl.models.TaskStatus` values): reading rows never needs the models.
_P, _R, _C, _B = dag.PENDING, dag.RUNNING, dag.COMPLETE, dag.BLOCKED

#: Legal task transitions (status texts) -> the ``reason`` they require (None: any reason).
#: Everything else is ``invalid_state``. Source: ftl design (§8.3 item 11 of the FTL reference); FTL's update-task
#: accepted any status string (§8.2 item 11).
_TRANSITIONS: dict[tuple[str, str], str | None] = {
    (_P, _R): None,        # the scheduler starts a ready task
    (_R, _C): None,        # verified
    (_R, _B): None,        # the attempt failed structurally
    (_P, _B): None,        # cascade propagation: a dependency is blocked
    (_B, _P): "replan",    # re-opened by a re-plan merge
    (_R, _P): "resume",    # in-flight attempt discarded after a crash
}


def __getattr__(name: str) -> Any:
    """``TRANSITIONS``: the `_TRANSITIONS` table keyed by `ftl.models.TaskStatus` members, as
    before; built on first use so that reading the store never imports the models (pydantic)."""
    if name == "TRANSITIONS":
        from ftl.models import TaskStatus

        table = {(TaskStatus(a), TaskStatus(b)): reason for (a, b), reason in _TRANSITIONS.items()}
        globals()["TRANSITIONS"] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Migration n (1-based) brings the schema from user_version n-1 to n. Append, never edit.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE campaign (
            campaign_id   TEXT PRIMARY KEY,
            objective     TEXT NOT NULL,
            flow          TEXT NOT NULL CHECK (flow IN ('campaign', 'task')),
            status        TEXT NOT NULL
                          CHECK (status IN ('active', 'complete', 'returned', 'cancelled')),
            framework     TEXT,
            machine_state TEXT,
            tracked       TEXT NOT NULL DEFAULT '{}',
            error         TEXT,
            inputs        TEXT,
            summary       TEXT,
            created_at    TEXT NOT NULL,
            updated_at    TEXT NOT NULL,
            finished_at   TEXT
        )""",
        # At most one active campaign (FTL idx_campaign_singleton_active).
        "CREATE UNIQUE INDEX campaign_one_active ON campaign (status) WHERE status = 'active'",
        """CREATE TABLE plan (
            campaign_id TEXT NOT NULL REFERENCES campaign (campaign_id),
            version     INTEGER NOT NULL CHECK (version >= 1),
            plan        TEXT NOT NULL,
            created_at  TEXT NOT NULL,
            PRIMARY KEY (campaign_id, version)
        )""",
        """CREATE TABLE task (
            campaign_id  TEXT NOT NULL REFERENCES campaign (campaign_id),
            seq          TEXT NOT NULL,
            slug         TEXT NOT NULL,
            type         TEXT NOT NULL,
            depends      TEXT NOT NULL DEFAULT '[]',
            status       TEXT NOT NULL
                         CHECK (status IN ('pending', 'running', 'complete', 'blocked')),
            attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            blocked_by   TEXT NOT NULL DEFAULT '[]',
            block_reason TEXT,
            delivered    TEXT,
            spec         TEXT NOT NULL,
            worker       TEXT,
            started_at   TEXT,
            finished_at  TEXT,
            revised_at   TEXT,
            updated_at   TEXT NOT NULL,
            PRIMARY KEY (campaign_id, seq)
        )""",
        """CREATE TABLE workspace (
            campaign_id  TEXT NOT NULL REFERENCES campaign (campaign_id),
            workspace_id TEXT NOT NULL,
            seq          TEXT NOT NULL,
            attempt      INTEGER NOT NULL CHECK (attempt >= 1),
            status       TEXT NOT NULL CHECK (status IN
                         ('active', 'built', 'complete', 'blocked', 'cancelled', 'abandoned')),
            spec         TEXT NOT NULL,
            result       TEXT,
            created_at   TEXT NOT NULL,
            finished_at  TEXT,
            PRIMARY KEY (campaign_id, workspace_id, attempt)
        )""",
        "CREATE INDEX workspace_seq ON workspace (campaign_id, seq, attempt)",
        """CREATE TABLE explorer_result (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            campaign_id TEXT NOT NULL REFERENCES campaign (campaign_id),
            mode        TEXT NOT NULL,
            status      TEXT,
            result      TEXT NOT NULL,
            created_at  TEXT NOT NULL
        )""",
        "CREATE INDEX explorer_result_campaign ON explorer_result (campaign_id, id)",
        """CREATE TABLE exploration (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            campaign_id TEXT NOT NULL REFERENCES campaign (campaign_id),
            exploration TEXT NOT NULL,
            created_at  TEXT NOT NULL
        )""",
        "CREATE INDEX exploration_campaign ON exploration (campaign_id, id)",
        # Memory outlives campaigns, so campaign_id is a plain column, not a foreign key.
        """CREATE TABLE memory (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            name        TEXT NOT NULL,
            type        TEXT NOT NULL CHECK (type IN ('failure', 'pattern')),
            trigger     TEXT NOT NULL,
            entry       TEXT NOT NULL,
            source      TEXT NOT NULL DEFAULT '[]',
            campaign_id TEXT,
            occurrences INTEGER NOT NULL DEFAULT 1 CHECK (occurrences >= 1),
            created_at  TEXT NOT NULL,
            updated_at  TEXT NOT NULL,
            UNIQUE (name, type)
        )""",
    ),
    # 2: FTL's `plan.py mark-executed` (a plan version marked executed while its campaign runs).
    ("ALTER TABLE plan ADD COLUMN executed_at TEXT",),
    # 3: a plan version saved by add-tasks shares its tasks with the task rows (see "Plan
    # versions" in the module docstring): ``tasks_at`` is where the specs go in ``plan``, whose
    # task list is stored empty, and ``task_seqs`` their order; both NULL when ``plan`` is whole.
    ("ALTER TABLE plan ADD COLUMN tasks_at INTEGER", "ALTER TABLE plan ADD COLUMN task_seqs TEXT"),
    # 4: the blocked tasks, which every task's workspace lists (sibling failures), read without
    # a pass over the campaign's rows; a partial index, so pending rows never enter it.
    ("CREATE INDEX task_blocked ON task (campaign_id, seq) WHERE status = 'blocked'",),
)
SCHEMA_VERSION = len(MIGRATIONS)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def format_ts(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds and ``Z``: ``2026-11-21T04:15:03.120Z`` (sorts as text)."""
    utc = moment.astimezone(timezone.utc) if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _violation(path: str, message: str) -> FtlError:
    return FtlError("schema_invalid", {"count": 1, "violations": [{"path": path, "message": message}]})


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise _violation(what, f"must be JSON-serialisable ({exc})") from None


def _loads(text: str | None) -> Any:
    """A JSON column's value. orjson parses 3-4x faster than ``json`` (reading 10,000 tasks
    decodes 30,000 columns); text it refuses (NaN) or would change (an integer of 19 or more
    digits, which orjson turns into a float) goes to ``json``, so every value ``_dumps`` wrote
    reads back the same."""
    if text is None:
        return None
    if text == "[]":  # depends and blocked_by of most tasks
        return []
    # A run of 19 digits needs 19 digits: counting them (ten C passes) is several times cheaper
    # than the regex, which a 10,000-task read would otherwise run on every spec.
    if len(text) >= 19 and sum(map(text.count, "0123456789")) >= 19 and _LONG_DIGITS.search(text):
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _seqs_json(seqs: Sequence[str]) -> str:
    """``_dumps(list(seqs))`` for canonical seqs (digits only: nothing to escape, already sorted),
    joined rather than encoded (10,000 rows: 15 ms less)."""
    return '["' + '","'.join(seqs) + '"]' if seqs else "[]"


def _seq(value: Any, what: str = "seq") -> str:
    try:
        from ftl.models import normalize_seq
        return normalize_seq(value)
    except ValueError as exc:
        raise _violation(what, str(exc)) from None


def check_plan_graph(tasks: Sequence[Task] | Sequence[TaskRow]) -> None:
    """Reject a task list (`ftl.models.Task`s or `ftl.plan_rows.TaskRow`s: their ``seq`` and
    ``depends``) that is not a DAG over its own seqs.

    Order of checks (FTL add-tasks/merge, reference §6.3-6.4, plus duplicate seqs which FTL
    accepted, §8.2 item 12): duplicate seqs, then cycles, then dependencies on seqs outside the list.

    Raises:
        FtlError(schema_invalid): duplicate seqs or dangling dependencies; ``details.violations``
            names each task and dependency and the valid seqs.
        FtlError(cycle_detected): ``details.cycle`` is the path, e.g. ``"001 -> 002 -> 001"``
            (each task depends on the next).
    """
    seqs = [t.seq for t in tasks]
    graph = dict(zip(seqs, (t.depends for t in tasks)))
    if len(graph) != len(seqs):
        duplicates = sorted((seq for seq, n in Counter(seqs).items() if n > 1), key=int)
        raise FtlError("schema_invalid", {"count": len(duplicates), "violations": [
            {"path": f"tasks[seq={seq}].seq", "message": f"seq {seq} is used by more than one task"}
            for seq in duplicates]})
    cycle = dag.find_cycle(graph)
    if cycle:
        text = dag.format_cycle(cycle)
        raise FtlError("cycle_detected", {"cycle": text, "violations": [
            {"path": "tasks", "message": f"dependency cycle {text}"}]})
    missing = dag.dangling(graph)
    if missing:
        valid = ", ".join(sorted(graph, key=int))
        raise FtlError("schema_invalid", {"count": len(missing), "violations": [
            {"path": f"tasks[seq={seq}].depends",
             "message": f"task {seq} depends on {dep}, which is not in the plan (valid seqs: {valid})"}
            for seq, dep in missing]})


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema of ``conn`` up to `SCHEMA_VERSION` (``PRAGMA user_version``); return it.

    Runs the missing `MIGRATIONS` in one ``BEGIN IMMEDIATE`` transaction, re-reading the version
    under the lock so two processes opening a new file do not both create the tables. The
    connection must be in autocommit mode (``isolation_level=None``).

    Raises:
        FtlError(conflict): the file was written by a newer ftl (a higher schema version).
        sqlite3.Error: the file is unreadable (`Store` translates it).
    """
    def version() -> int:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def too_new(found: int) -> FtlError:
        return FtlError("conflict", {"what": f"The store has schema version {found}, newer than this "
                                             f"ftl supports ({SCHEMA_VERSION}); upgrade ftl."})

    current = version()
    if current > SCHEMA_VERSION:
        raise too_new(current)
    if current == SCHEMA_VERSION:
        return current
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = version()
        if current > SCHEMA_VERSION:
            raise too_new(current)
        for number in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[number - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION


class Store:
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

    # ------------------------------------------------------------------ campaigns

    @staticmethod
    def _campaign_dict(row: sqlite3.Row) -> dict:
        return {
            "campaign_id": row["campaign_id"], "id": row["campaign_id"], "objective": row["objective"],
            "flow": row["flow"], "status": row["status"], "framework": row["framework"],
            "machine_state": row["machine_state"], "tracked": _loads(row["tracked"]) or {},
            "error": _loads(row["error"]), "inputs": _loads(row["inputs"]) or {},
            "summary": _loads(row["summary"]), "created_at": row["created_at"],
            "updated_at": row["updated_at"], "finished_at": row["finished_at"],
        }

    def _campaign_row(self, conn: sqlite3.Connection, campaign_id: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM campaign WHERE campaign_id = ?", (campaign_id,)).fetchone()
        if row is None:
            raise FtlError("not_found", {"what": f"campaign {campaign_id}"})
        return row

    def _active_row(self, conn: sqlite3.Connection, campaign_id: str, action: str) -> sqlite3.Row:
        row = self._campaign_row(conn, campaign_id)
        if row["status"] != "active":
            raise FtlError("conflict", {"what": f"Cannot {action}: campaign {campaign_id} is "
                                                f"{row['status']}, not active."})
        return row

    def _new_campaign_id(self, moment: datetime) -> str:
        utc = moment.astimezone(timezone.utc) if moment.tzinfo else moment
        import secrets

        return f"c-{utc:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"

    def create_campaign(self, objective: str, *, flow: str = "campaign", plan: Plan | None = None,
                        framework: str | None = None, inputs: dict | None = None) -> dict:
        """Create the active campaign; with ``plan``, also save it as plan version 1.

        The id is ``c-YYYYMMDD-HHMMSS-xxxx`` (UTC time, 4 random hex digits), so ids sort by
        creation time. ``framework`` defaults to the plan's. ``inputs`` (what the run was started
        with, see `save_inputs`) is written in the same transaction, so no crash can leave an
        active campaign that a resume cannot rebuild.

        Returns: the campaign dict (`get_campaign`).
        Raises:
            FtlError(conflict): another campaign is active (FTL allowed one active campaign but
                crashed on the second create, §8.2 item 2; here the message names the active one).
            FtlError(schema_invalid): empty objective, unknown flow (campaign|task), or
                ``inputs`` that is not a JSON object.
        """
        if not objective or not objective.strip():
            raise _violation("objective", "must be a non-empty string")
        if flow not in FLOWS:
            raise _violation("flow", f"must be one of {', '.join(FLOWS)}, got {flow!r}")
        if inputs is not None and not isinstance(inputs, dict):
            raise _violation("inputs", "must be a JSON object")
        encoded_inputs = None if inputs is None else _dumps(inputs, "inputs")
        if framework is None and plan is not None:
            framework = plan.framework
        with self._session(write=True) as conn:
            active = conn.execute("SELECT campaign_id FROM campaign WHERE status = 'active'").fetchone()
            if active is not None:
                raise FtlError("conflict", {"what": f"Campaign {active[0]} is still active; finish or "
                                                    "cancel it before starting another."})
            moment = self._clock()
            now = format_ts(moment)
            for _ in range(8):  # random suffix collision within one second: draw again
                campaign_id = self._new_campaign_id(moment)
                if conn.execute("SELECT 1 FROM campaign WHERE campaign_id = ?", (campaign_id,)).fetchone() is None:
                    break
            conn.execute(
                "INSERT INTO campaign (campaign_id, objective, flow, status, framework, tracked, "
                "inputs, created_at, updated_at) VALUES (?, ?, ?, 'active', ?, '{}', ?, ?, ?)",
                (campaign_id, objective, flow, framework, encoded_inputs, now, now))
            if plan is not None:
                self._insert_plan(conn, campaign_id, plan, now)
            return self._campaign_dict(self._campaign_row(conn, campaign_id))

    def get_campaign(self, campaign_id: str) -> dict:
        """The campaign dict: ``{campaign_id, id (= campaign_id), objective, flow, status,
        framework, machine_state, tracked, error, inputs, summary, created_at, updated_at,
        finished_at}``.

        Raises: FtlError(not_found) ``{"what": "campaign <id>"}``.
        """
        with self._session() as conn:
            return self._campaign_dict(self._campaign_row(conn, campaign_id))

    def active_campaign(self) -> dict | None:
        """The campaign with status ``active``, or None."""
        with self._session() as conn:
            row = conn.execute("SELECT * FROM campaign WHERE status = 'active'").fetchone()
        return None if row is None else self._campaign_dict(row)

    def latest_campaign(self) -> dict | None:
        """The newest campaign of any status, or None."""
        found = self.list_campaigns()
        return found[0] if found else None

    def list_campaigns(self, status: str | None = None) -> list[dict]:
        """Campaigns, newest first, optionally only those with ``status``.

        Raises: FtlError(schema_invalid) for a status outside active|complete|returned|cancelled.
        """
        if status is not None and status not in CAMPAIGN_STATUSES:
            raise _violation("status", f"must be one of {', '.join(CAMPAIGN_STATUSES)}, got {status!r}")
        query = "SELECT * FROM campaign"
        args: tuple = ()
        if status is not None:
            query += " WHERE status = ?"
            args = (status,)
        with self._session() as conn:
            rows = conn.execute(query + " ORDER BY created_at DESC, rowid DESC", args).fetchall()
        return [self._campaign_dict(r) for r in rows]

    def save_machine(self, campaign_id: str, state: str, tracked: dict, *,
                     error: dict | None = None) -> None:
        """Persist the machine's current state, tracked variables (clarify_count,
        iteration_count, prior_ready_count, replan_count, ...) and pending error in one write
        (FTL kept them only in the model's context, §8.3 item 1). ``tracked`` and ``error``
        (``{error_type, details}`` or None) replace the previous values.

        Raises: FtlError(not_found); FtlError(schema_invalid) when either is not a JSON object.
        """
        if not isinstance(tracked, dict):
            raise _violation("tracked", "must be a JSON object")
        if error is not None and not isinstance(error, dict):
            raise _violation("error", "must be a JSON object or None")
        encoded = _dumps(tracked, "tracked")
        encoded_error = None if error is None else _dumps(error, "error")
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            conn.execute("UPDATE campaign SET machine_state = ?, tracked = ?, error = ?, updated_at = ? "
                         "WHERE campaign_id = ?", (state, encoded, encoded_error, self._now(), campaign_id))

    def save_inputs(self, campaign_id: str, inputs: dict) -> None:
        """Keep what the run was started with (e.g. ``{plan_input, revised_plan_input}``) so a
        resume can rebuild it; replaces the previous dict.

        Raises: FtlError(not_found); FtlError(schema_invalid) when ``inputs`` is not a JSON object.
        """
        if not isinstance(inputs, dict):
            raise _violation("inputs", "must be a JSON object")
        encoded = _dumps(inputs, "inputs")
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            conn.execute("UPDATE campaign SET inputs = ?, updated_at = ? WHERE campaign_id = ?",
                         (encoded, self._now(), campaign_id))

    def set_framework(self, campaign_id: str, framework: str | None) -> None:
        """Set the campaign's framework (from exploration or the plan). Raises: FtlError(not_found)."""
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            conn.execute("UPDATE campaign SET framework = ?, updated_at = ? WHERE campaign_id = ?",
                         (framework, self._now(), campaign_id))

    def finish_campaign(self, campaign_id: str, status: str, summary: dict) -> dict:
        """End the active campaign with ``status`` complete|returned|cancelled and its summary.

        The row is the archive: it leaves the active slot and keeps its tasks, plans and summary
        (FTL copied it to an ``archive`` table, §5.6). Returns the campaign dict.

        Raises:
            FtlError(schema_invalid): unknown status or a summary that is not a JSON object.
            FtlError(not_found): unknown campaign.
            FtlError(invalid_state): the campaign is already finished.
        """
        if status not in FINISHED_STATUSES:
            raise _violation("status", f"must be one of {', '.join(FINISHED_STATUSES)}, got {status!r}")
        if not isinstance(summary, dict):
            raise _violation("summary", "must be a JSON object")
        encoded = _dumps(summary, "summary")
        with self._session(write=True) as conn:
            row = self._campaign_row(conn, campaign_id)
            if row["status"] != "active":
                raise FtlError("invalid_state", {"trigger": f"finish:{status}", "state": row["status"]})
            now = self._now()
            conn.execute("UPDATE campaign SET status = ?, summary = ?, finished_at = ?, updated_at = ? "
                         "WHERE campaign_id = ?", (status, encoded, now, now, campaign_id))
            return self._campaign_dict(self._campaign_row(conn, campaign_id))

    # ------------------------------------------------------------------ plans

    def _insert_plan(self, conn: sqlite3.Connection, campaign_id: str, plan: Plan, now: str) -> int:
        return self._insert_plan_json(conn, campaign_id, plan.model_dump_json(by_alias=True), now)

    @staticmethod
    def _next_plan_version(conn: sqlite3.Connection, campaign_id: str) -> int:
        last = conn.execute("SELECT MAX(version) FROM plan WHERE campaign_id = ?", (campaign_id,)).fetchone()[0]
        return (last or 0) + 1

    def _insert_plan_json(self, conn: sqlite3.Connection, campaign_id: str, plan_json: str, now: str) -> int:
        version = self._next_plan_version(conn, campaign_id)
        conn.execute("INSERT INTO plan (campaign_id, version, plan, created_at) VALUES (?, ?, ?, ?)",
                     (campaign_id, version, plan_json, now))
        return version

    #: Whether add-tasks saves its plan version sharing the task rows' specs (module docstring,
    #: "Plan versions"). A store with False writes every version whole, as schema 2 did; the
    #: tests compare the two.
    share_registered_tasks = True

    def _insert_registered_plan(self, conn: sqlite3.Connection, campaign_id: str, rows: PlanRows,
                                now: str) -> int:
        """Save ``rows.plan_json`` as the next version, its task list shared with the task rows
        add-tasks writes in the same transaction when the text's task list is exactly their
        specs, comma-joined, in plan order (checked here on the text itself, so `_plan_text`
        gives back these bytes whatever produced them); whole otherwise."""
        text = rows.plan_json
        start = text.find(_TASKS_KEY) + len(_TASKS_KEY)
        joined = ",".join([t.spec for t in rows.tasks])
        end = start + len(joined)
        if not (self.share_registered_tasks and rows.tasks and start >= len(_TASKS_KEY)
                and text.startswith(joined, start) and text.startswith("]", end)):
            return self._insert_plan_json(conn, campaign_id, text, now)
        version = self._next_plan_version(conn, campaign_id)
        conn.execute("INSERT INTO plan (campaign_id, version, plan, created_at, tasks_at, task_seqs) "
                     "VALUES (?, ?, ?, ?, ?, ?)",
                     (campaign_id, version, text[:start] + text[end:], now, start,
                      _seqs_json([t.seq for t in rows.tasks])))
        return version

    @staticmethod
    def _plan_text(conn: sqlite3.Connection, campaign_id: str, row: Sequence[Any]) -> str:
        """The plan text of a ``(plan, tasks_at, task_seqs)`` row: ``plan`` itself, or with the
        task rows' specs put back in `task_seqs` order (module docstring, "Plan versions").

        Raises: FtlError(conflict) when a shared task row is missing (a store changed by hand).
        """
        text, start, seqs = row[0], row[1], row[2]
        if start is None:
            return text
        specs = dict(conn.execute("SELECT seq, spec FROM task WHERE campaign_id = ?", (campaign_id,)))
        try:
            joined = ",".join([specs[seq] for seq in _loads(seqs)])
        except KeyError as exc:
            raise FtlError("conflict", {"what": f"A plan version of campaign {campaign_id} names task "
                                                f"{exc.args[0]}, which the store no longer has; restore "
                                                "a backup of the store."}) from None
        return text[:start] + joined + text[start:]

    def _materialise_plans(self, conn: sqlite3.Connection, campaign_id: str) -> None:
        """Write every plan version of the campaign that shares its tasks with the task rows out
        whole; called in the transaction of any change to a task's spec or to the task set,
        before the change (copy-on-write), so each version keeps reading back as saved."""
        shared = conn.execute("SELECT version, plan, tasks_at, task_seqs FROM plan WHERE campaign_id = ? "
                              "AND tasks_at IS NOT NULL", (campaign_id,)).fetchall()
        for row in shared:
            conn.execute("UPDATE plan SET plan = ?, tasks_at = NULL, task_seqs = NULL "
                         "WHERE campaign_id = ? AND version = ?",
                         (self._plan_text(conn, campaign_id, row[1:]), campaign_id, row[0]))

    def _is_latest_plan(self, conn: sqlite3.Connection, campaign_id: str, plan_json: str) -> bool:
        """Whether the campaign's latest plan version equals the plan ``plan_json`` (both are
        ``Plan.model_dump_json`` texts). Equal text is the common case; otherwise the decoded
        values are compared, which is `Plan` equality (fields and extras, extras in any order)
        without loading pydantic or building 10,000 models."""
        row = conn.execute(f"SELECT {_PLAN_TEXT_COLUMNS} FROM plan WHERE campaign_id = ? "
                           "ORDER BY version DESC LIMIT 1", (campaign_id,)).fetchone()
        if row is None:
            return False
        saved = self._plan_text(conn, campaign_id, row)
        return saved == plan_json or _loads(saved) == _loads(plan_json)

    def save_plan(self, campaign_id: str, plan: Plan) -> int:
        """Save ``plan`` as the campaign's next plan version; return it (1, 2, ...).

        Raises: FtlError(not_found) for an unknown campaign.
        """
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            return self._insert_plan(conn, campaign_id, plan, self._now())

    def get_plan(self, campaign_id: str, version: int | None = None) -> Plan:
        """Plan ``version`` of the campaign (the latest by default).

        Raises: FtlError(not_found) naming the campaign or the missing version.
        """
        from ftl.models import Plan
        return Plan.model_validate_json(self.plan_text(campaign_id, version))

    def plan_text(self, campaign_id: str, version: int | None = None) -> str:
        """The JSON text of plan ``version`` of the campaign (the latest by default), exactly as
        it was saved (``Plan.model_dump_json(by_alias=True)`` of the saved plan).

        Raises: FtlError(not_found) naming the campaign or the missing version.
        """
        # One snapshot: a shared version and the task rows' specs must be read from the same
        # state, or a merge committed in between would mix the old row with the new specs.
        with self._session(snapshot=True) as conn:
            self._campaign_row(conn, campaign_id)
            if version is None:
                row = conn.execute(f"SELECT {_PLAN_TEXT_COLUMNS} FROM plan WHERE campaign_id = ? "
                                   "ORDER BY version DESC LIMIT 1", (campaign_id,)).fetchone()
            else:
                row = conn.execute(f"SELECT {_PLAN_TEXT_COLUMNS} FROM plan WHERE campaign_id = ? "
                                   "AND version = ?", (campaign_id, version)).fetchone()
            if row is None:
                what = "any plan" if version is None else f"plan version {version}"
                raise FtlError("not_found", {"what": f"{what} of campaign {campaign_id}"})
            return self._plan_text(conn, campaign_id, row)

    def plan_saved_at(self, campaign_id: str, version: int) -> str | None:
        """When plan ``version`` of the campaign was saved (RFC 3339 UTC), or None if unknown."""
        with self._session() as conn:
            row = conn.execute("SELECT created_at FROM plan WHERE campaign_id = ? AND version = ?",
                               (campaign_id, version)).fetchone()
        return None if row is None else row[0]

    def mark_plan_executed(self, campaign_id: str, version: int) -> str:
        """Mark plan ``version`` of the campaign executed (FTL ``plan.py mark-executed``); return
        when it was first marked (RFC 3339 UTC; marking again keeps the first time).

        Raises: FtlError(not_found) for an unknown campaign or version.
        """
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            conn.execute("UPDATE plan SET executed_at = COALESCE(executed_at, ?) WHERE campaign_id = ? "
                         "AND version = ?", (self._now(), campaign_id, version))
            row = conn.execute("SELECT executed_at FROM plan WHERE campaign_id = ? AND version = ?",
                               (campaign_id, version)).fetchone()
        if row is None:
            raise FtlError("not_found", {"what": f"plan version {version} of campaign {campaign_id}"})
        return row[0]

    def executed_plan_versions(self, campaign_id: str) -> set[int]:
        """The campaign's plan versions marked executed (`mark_plan_executed`)."""
        with self._session() as conn:
            return {r[0] for r in conn.execute("SELECT version FROM plan WHERE campaign_id = ? AND "
                                               "executed_at IS NOT NULL", (campaign_id,))}

    def plan_versions(self, campaign_id: str) -> list[int]:
        """The campaign's saved plan versions, ascending."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            return [r[0] for r in conn.execute(
                "SELECT version FROM plan WHERE campaign_id = ? ORDER BY version", (campaign_id,))]

    # ------------------------------------------------------------------ tasks

    @staticmethod
    def _task_dict(row: sqlite3.Row) -> dict:
        return {
            "seq": row["seq"], "slug": row["slug"], "type": row["type"],
            "depends": _loads(row["depends"]), "status": row["status"], "attempts": row["attempts"],
            "blocked_by": _loads(row["blocked_by"]), "block_reason": row["block_reason"],
            "delivered": row["delivered"], "spec": _loads(row["spec"]),
            "started_at": row["started_at"], "finished_at": row["finished_at"],
            "updated_at": row["updated_at"], "revised_at": row["revised_at"], "worker": row["worker"],
        }

    @staticmethod
    def _task_rows(conn: sqlite3.Connection, campaign_id: str) -> list[sqlite3.Row]:
        return conn.execute("SELECT * FROM task WHERE campaign_id = ? ORDER BY CAST(seq AS INTEGER)",
                            (campaign_id,)).fetchall()

    def _task_row(self, conn: sqlite3.Connection, campaign_id: str, seq: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM task WHERE campaign_id = ? AND seq = ?",
                           (campaign_id, seq)).fetchone()
        if row is None:
            self._campaign_row(conn, campaign_id)
            raise FtlError("not_found", {"what": f"task {seq} of campaign {campaign_id}"})
        return row

    @staticmethod
    def _insert_task(conn: sqlite3.Connection, campaign_id: str, task: Task, now: str) -> None:
        conn.execute(
            "INSERT INTO task (campaign_id, seq, slug, type, depends, status, spec, updated_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
            (campaign_id, task.seq, task.slug, task.type.value, _dumps(task.depends, "depends"),
             task.model_dump_json(), now))

    @staticmethod
    def _insert_task_rows(conn: sqlite3.Connection, campaign_id: str, tasks: Sequence[TaskRow],
                          now: str) -> None:
        """Insert ``tasks`` as pending rows, `_INSERT_BATCH` rows per statement.

        A multi-row ``INSERT ... VALUES`` binds and steps once per batch instead of once per row
        (executemany: 10,000 rows in 31-37 ms of CPU, batches: 25-30). The parameters come from
        C-level iterators over the rows' fields (no Python frame per row); orjson writes a depends
        tuple as `_seqs_json` does (canonical seqs are digits: nothing to escape).
        """
        values = list(chain.from_iterable(zip(
            repeat(campaign_id), map(attrgetter("seq"), tasks), map(attrgetter("slug"), tasks),
            map(attrgetter("type"), tasks), map(bytes.decode, map(orjson.dumps, map(attrgetter("depends"), tasks))),
            map(attrgetter("spec"), tasks), repeat(now))))
        width = 7 * _INSERT_BATCH

        def statement(count: int) -> str:
            return ("INSERT INTO task (campaign_id, seq, slug, type, depends, status, spec, updated_at) VALUES "
                    + ",".join(["(?, ?, ?, ?, ?, 'pending', ?, ?)"] * count))

        full = statement(_INSERT_BATCH)  # one text: prepared once, then from the statement cache
        for start in range(0, len(values), width):
            batch = values[start:start + width]
            conn.execute(full if len(batch) == width else statement(len(batch) // 7), batch)

    def add_tasks(self, campaign_id: str, plan: Plan | PlanRows) -> list[str]:
        """Register the plan's tasks as pending rows (REGISTER); return their seqs in seq order.

        ``plan`` is a `ftl.models.Plan` or, for big plans, the `ftl.plan_rows.PlanRows` of
        `ftl.plan_rows.plan_rows` (a 10,000-task plan then registers in under 40 MiB, issue 11
        item 4). The plan is saved as a new version unless it equals the latest saved one, and
        becomes the campaign's framework if the campaign has none. Unlike FTL add-tasks, which
        replaced the task list and so reset progress (§8.2 item 12), a second call is refused.

        Raises:
            FtlError(conflict): the campaign already has tasks, or is not active.
            FtlError(schema_invalid): duplicate seqs or dangling dependencies (nothing saved).
            FtlError(cycle_detected): the dependencies form a cycle (nothing saved).
            FtlError(not_found): unknown campaign.
        """
        from ftl.plan_rows import PlanRows

        rows = plan if isinstance(plan, PlanRows) else PlanRows.from_plan(plan)
        if not rows.graph_checked:  # the lean validation checked it already (10,000 tasks: 15 ms)
            check_plan_graph(rows.tasks)
        with self._foreign_keys_unchecked(), self._session(write=True) as conn:
            campaign = self._active_row(conn, campaign_id, "add tasks")
            count = conn.execute("SELECT COUNT(*) FROM task WHERE campaign_id = ?", (campaign_id,)).fetchone()[0]
            if count:
                raise FtlError("conflict", {"what": f"Campaign {campaign_id} already has {count} tasks; "
                                                    "change them with a re-plan merge, not add-tasks."})
            now = self._now()
            if not self._is_latest_plan(conn, campaign_id, rows.plan_json):
                self._insert_registered_plan(conn, campaign_id, rows, now)
            if campaign["framework"] is None and rows.framework is not None:
                conn.execute("UPDATE campaign SET framework = ?, updated_at = ? WHERE campaign_id = ?",
                             (rows.framework, now, campaign_id))
            # The rows' status is the literal 'pending' and attempts takes its default 0, so the
            # table's CHECKs hold by construction; SQLite would still evaluate `status IN (...)`
            # per row, half of this insert's time (10,000 rows: 18 of 38 ms).
            conn.execute("PRAGMA ignore_check_constraints = ON")
            try:
                self._insert_task_rows(conn, campaign_id, rows.tasks, now)
            finally:
                conn.execute("PRAGMA ignore_check_constraints = OFF")
        return sorted(map(attrgetter("seq"), rows.tasks), key=int)

    def latest_plan_fields(self, campaign_id: str, names: Sequence[str]) -> dict[str, Any]:
        """Top-level fields of the campaign's latest plan version, read by SQLite's JSON
        functions without decoding the plan (a 10,000-task plan is megabytes of JSON).

        Args:
            names: top-level field names of the stored plan (its ``by_alias`` JSON keys) whose
                values are scalars (an object or array would come back as JSON text); not
                ``tasks``, which a version shared with the task rows stores empty.

        Returns:
            ``{name: value}`` for every name (None when the field is null or absent); {} when
            the campaign has no plan.

        Raises: FtlError(not_found) for an unknown campaign.
        """
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            row = conn.execute(
                f"SELECT {', '.join('json_extract(plan, ?)' for _ in names)} FROM plan "
                "WHERE campaign_id = ? ORDER BY version DESC LIMIT 1",
                (*(f'$."{name}"' for name in names), campaign_id)).fetchone()
        return {} if row is None else dict(zip(names, row))

    def tasks(self, campaign_id: str, seqs: Sequence[str] | None = None) -> list[dict]:
        """Task dicts of the campaign in seq order: ``{seq, slug, type, depends, status,
        attempts, blocked_by, block_reason, delivered, spec, started_at, finished_at, updated_at,
        revised_at, worker}`` (``spec`` is the Task as JSON); all of them, or only ``seqs``
        (canonical seqs; unknown ones are skipped). Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            if seqs is None:
                return [self._task_dict(r) for r in self._task_rows(conn, campaign_id)]
            wanted = list(dict.fromkeys(seqs))  # the rows are sorted below, once
            rows: list[dict] = []
            for start in range(0, len(wanted), _SQL_BATCH):
                batch = wanted[start:start + _SQL_BATCH]
                rows += [self._task_dict(r) for r in conn.execute(
                    f"SELECT * FROM task WHERE campaign_id = ? AND seq IN ({','.join('?' * len(batch))})",
                    (campaign_id, *batch))]
            rows.sort(key=lambda r: dag.seq_key(r["seq"]))
            return rows

    def ready_tasks(self, campaign_id: str) -> list[dict]:
        """The ready set as task dicts (see `tasks`), in seq order: pending tasks whose every
        dependency is complete (`ftl.dag.ready_set`; a dependency that is not a task of the
        campaign is never complete). Computed by SQLite, which reads each pending task's
        dependencies through the primary key: no Python pass over the whole DAG (a
        10,000-task plan: one query instead of the graph, a Python pass and a second read).
        Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            rows = conn.execute(
                "SELECT * FROM task AS t WHERE t.campaign_id = ? AND t.status = 'pending' "
                "AND NOT EXISTS (SELECT 1 FROM json_each(t.depends) AS d "
                "LEFT JOIN task AS u ON u.campaign_id = t.campaign_id AND u.seq = d.value "
                "WHERE u.status IS NOT 'complete') ORDER BY CAST(t.seq AS INTEGER)",
                (campaign_id,)).fetchall()
        return [self._task_dict(r) for r in rows]

    def task_graph(self, campaign_id: str) -> tuple[dict[str, list[str]], dict[str, str]]:
        """``(depends, status)``: seq -> its dependencies and seq -> its status, the input of
        every `ftl.dag` function, read without the task specs (a 10,000-task plan: 3 columns
        instead of 15, no spec JSON decoded). Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            rows = conn.execute("SELECT seq, depends, status FROM task WHERE campaign_id = ? "
                                "ORDER BY CAST(seq AS INTEGER)", (campaign_id,)).fetchall()
        return {r[0]: _loads(r[1]) for r in rows}, {r[0]: r[2] for r in rows}

    def blocked_seqs(self, campaign_id: str) -> list[str]:
        """Seqs of the campaign's blocked tasks, in seq order, from the ``task_blocked`` index
        (its size is the number of blocked tasks, not of all tasks: BUILD asks for every task).
        Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            rows = conn.execute("SELECT seq FROM task INDEXED BY task_blocked WHERE campaign_id = ? "
                                "AND status = 'blocked'", (campaign_id,)).fetchall()
        return sorted((r[0] for r in rows), key=dag.seq_key)

    def task(self, campaign_id: str, seq: str) -> dict:
        """One task dict (see `tasks`). Raises: FtlError(not_found) for the campaign or seq."""
        wanted = _seq(seq)
        with self._session() as conn:
            return self._task_dict(self._task_row(conn, campaign_id, wanted))

    def counts(self, campaign_id: str) -> dict[str, int]:
        """Number of tasks per status: ``{pending, running, complete, blocked, total}``."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            rows = conn.execute("SELECT status, COUNT(*) FROM task WHERE campaign_id = ? GROUP BY status",
                                (campaign_id,)).fetchall()
        result = dict.fromkeys(dag.STATUSES, 0)
        result.update({r[0]: r[1] for r in rows})
        result["total"] = sum(r[1] for r in rows)
        return result

    def place_task(self, campaign_id: str, seq: str, worker: str) -> bool:
        """Say where a running task's attempt runs (its ``worker``, e.g. ``"w2 @ node
        8242c3f210a1 (pid 4242 on host)"``, once a cluster placed it; issue 14).

        Returns:
            True when the task was running and its row now says so; False otherwise (the
            task ended meanwhile: nothing changes).
        """
        with self._session(write=True) as conn:
            return conn.execute(
                "UPDATE task SET worker = ? WHERE campaign_id = ? AND seq = ? AND status = 'running'",
                (worker, campaign_id, _seq(seq))).rowcount == 1

    def transition_task(self, campaign_id: str, seq: str, to: TaskStatus | str, *,
                        reason: str | None = None, blocked_by: list[str] | None = None,
                        delivered: str | None = None, worker: str | None = None) -> dict:
        """Move one task along a legal transition (`TRANSITIONS`) atomically; return the new dict.

        Effects: pending->running increments ``attempts``, sets ``started_at`` and ``worker`` and
        needs every dependency complete; ->complete and ->blocked set ``finished_at`` and
        ``delivered``; ->blocked records ``reason`` as ``block_reason`` and ``blocked_by``
        (canonical seqs); blocked->pending (``reason="replan"``) clears the block;
        running->pending (``reason="resume"``) clears the worker. The read and the write share
        one BEGIN IMMEDIATE transaction, so of two processes starting the same task exactly one
        succeeds.

        Raises:
            FtlError(invalid_state): ``{"trigger": "<from>-><to>", "state": "<from>"}`` for an
                illegal transition, a missing required reason, an unknown target status, or a
                start whose dependencies are not all complete.
            FtlError(not_found): unknown campaign or seq.
            FtlError(schema_invalid): a ``blocked_by`` entry that is not a seq.
        """
        wanted = _seq(seq)
        parents = [_seq(s, "blocked_by") for s in blocked_by or []]
        with self._session(write=True) as conn:
            row = self._task_row(conn, campaign_id, wanted)
            current = row["status"]
            target = str(getattr(to, "value", to))  # a TaskStatus member or its text
            trigger = {"trigger": f"{current}->{target}", "state": current}
            if target not in dag.STATUSES:
                raise FtlError("invalid_state", trigger)
            if (current, target) not in _TRANSITIONS:
                raise FtlError("invalid_state", trigger)
            needed = _TRANSITIONS[(current, target)]
            if needed is not None and reason != needed:
                raise FtlError("invalid_state", trigger, message=(
                    f"Task {wanted} may go {current} -> {target} only with reason "
                    f"'{needed}'."))
            now = self._now()
            if target == _R:
                deps = _loads(row["depends"])
                open_deps = [d for d in deps if (conn.execute(
                    "SELECT status FROM task WHERE campaign_id = ? AND seq = ?", (campaign_id, d)).fetchone()
                    or ["missing"])[0] != "complete"]
                if open_deps:
                    raise FtlError("invalid_state", trigger, message=(
                        f"Task {wanted} cannot start: dependencies {', '.join(open_deps)} are not complete."))
                conn.execute("UPDATE task SET status = 'running', attempts = attempts + 1, started_at = ?, "
                             "finished_at = NULL, worker = ?, blocked_by = '[]', block_reason = NULL, "
                             "delivered = NULL, updated_at = ? WHERE campaign_id = ? AND seq = ?",
                             (now, worker, now, campaign_id, wanted))
            elif target == _C:
                conn.execute("UPDATE task SET status = 'complete', finished_at = ?, delivered = ?, "
                             "updated_at = ? WHERE campaign_id = ? AND seq = ?",
                             (now, delivered, now, campaign_id, wanted))
            elif target == _B:
                conn.execute("UPDATE task SET status = 'blocked', finished_at = ?, delivered = ?, "
                             "block_reason = ?, blocked_by = ?, updated_at = ? WHERE campaign_id = ? AND seq = ?",
                             (now, delivered, reason, _dumps(parents, "blocked_by"), now, campaign_id, wanted))
            elif current == _B:  # replan
                conn.execute("UPDATE task SET status = 'pending', blocked_by = '[]', block_reason = NULL, "
                             "finished_at = NULL, delivered = NULL, updated_at = ? "
                             "WHERE campaign_id = ? AND seq = ?", (now, campaign_id, wanted))
            else:  # resume
                conn.execute("UPDATE task SET status = 'pending', worker = NULL, started_at = NULL, "
                             "updated_at = ? WHERE campaign_id = ? AND seq = ?", (now, campaign_id, wanted))
            return self._task_dict(self._task_row(conn, campaign_id, wanted))

    def reset_running(self, campaign_id: str) -> list[str]:
        """Resume after a crash: every running task goes back to pending (``reason="resume"``) and
        every still-active workspace of the campaign becomes ``abandoned``, in one transaction.
        ``built`` workspaces are kept, so the resumed attempt can verify instead of rebuilding.

        Returns: the seqs that were running, in seq order. Raises: FtlError(not_found).
        """
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            seqs = [r[0] for r in conn.execute(
                "SELECT seq FROM task WHERE campaign_id = ? AND status = 'running' ORDER BY CAST(seq AS INTEGER)",
                (campaign_id,))]
            now = self._now()
            conn.execute("UPDATE task SET status = 'pending', worker = NULL, started_at = NULL, updated_at = ? "
                         "WHERE campaign_id = ? AND status = 'running'", (now, campaign_id))
            conn.execute("UPDATE workspace SET status = 'abandoned', finished_at = ?, result = ? "
                         "WHERE campaign_id = ? AND status = 'active'",
                         (now, _dumps({"reason": "resume"}, "result"), campaign_id))
        return seqs

    def merge_revised_plan(self, campaign_id: str, revised: Plan, *, max_new_tasks: int,
                           tracked: dict | None = None) -> dict:
        """Merge a re-plan into the campaign's tasks and save the result as a new plan version.

        Rules (FTL merge-revised-plan §6.8, with §8.2 item 8 fixed): complete and running tasks
        never change; a blocked task present in the revision takes its revised spec (every field)
        and becomes pending; a pending task present in the revision takes the revised spec (counted
        as merged only if it differs); tasks absent from the revision are unchanged; seqs new to
        the campaign are added as pending, at most ``max_new_tasks`` (config
        ``max_replan_new_tasks``). The merged graph is checked before anything is written. The
        saved plan has the revision's header (objective, framework, idioms) and the merged tasks
        (existing in seq order, then new ones in revision order).

        ``tracked``, when given, replaces the campaign's tracked variables in the same
        transaction (`save_machine`'s ``tracked``): the runner records the re-plan count and that
        a merge is waiting to be executed together with the merge, so a crash right after it
        cannot lose the outcome.

        Returns: ``{"merged": n, "unchanged": m, "added": k, "plan_version": v}``.
        Raises:
            FtlError(schema_invalid): too many new tasks, duplicate seqs in the revision, a
                dependency on a seq that is in neither, or ``tracked`` that is not a JSON object
                (nothing saved).
            FtlError(cycle_detected): the merged graph has a cycle (nothing saved).
            FtlError(conflict): the campaign is not active or has no tasks yet.
            FtlError(not_found): unknown campaign.
        """
        if tracked is not None and not isinstance(tracked, dict):
            raise _violation("tracked", "must be a JSON object")
        encoded_tracked = None if tracked is None else _dumps(tracked, "tracked")
        from ftl.models import Task as task_model
        by_seq: dict[str, Task] = {}
        for task in revised.tasks:
            if task.seq in by_seq:
                raise _violation(f"tasks[seq={task.seq}].seq", f"seq {task.seq} is used by more than one task")
            by_seq[task.seq] = task
        with self._session(write=True) as conn:
            self._active_row(conn, campaign_id, "merge a revised plan")
            rows = self._task_rows(conn, campaign_id)
            if not rows:
                raise FtlError("conflict", {"what": f"Campaign {campaign_id} has no tasks to merge into; "
                                                    "register the plan first."})
            self._materialise_plans(conn, campaign_id)  # before any spec or the task set changes
            merged_tasks: list[Task] = []
            reopened: list[tuple[Task, bool]] = []  # (revised task, was blocked)
            unchanged = 0
            for row in rows:
                current = task_model.model_validate_json(row["spec"])
                new = by_seq.get(row["seq"])
                status = row["status"]
                if new is None or status in (_C, _R) or (status == _P and new == current):
                    unchanged += 1
                    merged_tasks.append(current)
                    continue
                reopened.append((new, status == _B))
                merged_tasks.append(new)
            existing = {row["seq"] for row in rows}
            added = [t for t in revised.tasks if t.seq not in existing]
            if len(added) > max_new_tasks:
                raise _violation("tasks", f"the revision adds {len(added)} new tasks; the limit is "
                                          f"{max_new_tasks} (max_replan_new_tasks)")
            merged_tasks.extend(added)
            check_plan_graph(merged_tasks)
            now = self._now()
            version = self._insert_plan(conn, campaign_id, revised.model_copy(update={"tasks": merged_tasks}), now)
            for task, was_blocked in reopened:
                clear = ", finished_at = NULL, delivered = NULL" if was_blocked else ""
                conn.execute(
                    "UPDATE task SET slug = ?, type = ?, depends = ?, spec = ?, status = 'pending', "
                    f"blocked_by = '[]', block_reason = NULL{clear}, revised_at = ?, updated_at = ? "
                    "WHERE campaign_id = ? AND seq = ?",
                    (task.slug, task.type.value, _dumps(task.depends, "depends"), task.model_dump_json(),
                     now, now, campaign_id, task.seq))
            for task in added:
                self._insert_task(conn, campaign_id, task, now)
            if encoded_tracked is not None:
                conn.execute("UPDATE campaign SET tracked = ?, updated_at = ? WHERE campaign_id = ?",
                             (encoded_tracked, now, campaign_id))
        return {"merged": len(reopened), "unchanged": unchanged, "added": len(added), "plan_version": version}

    # ------------------------------------------------------------------ workspaces

    @staticmethod
    def _workspace_dict(row: sqlite3.Row) -> dict:
        return {
            "campaign_id": row["campaign_id"], "workspace_id": row["workspace_id"], "seq": row["seq"],
            "attempt": row["attempt"], "status": row["status"], "spec": _loads(row["spec"]),
            "result": _loads(row["result"]), "created_at": row["created_at"],
            "finished_at": row["finished_at"],
        }

    def record_workspace(self, campaign_id: str, workspace: dict, *, built: dict | None = None) -> None:
        """Record one attempt's workspace as ``active``. ``workspace`` needs ``workspace_id``,
        ``seq`` and ``attempt`` (int >= 1); the whole dict is kept as ``spec``. Ids are unique per
        campaign and attempt (FTL's were global and re-used across attempts, §8.2 item 14).

        ``built``: record the attempt directly as ``built`` with this result (an attempt that
        reuses an earlier attempt's finished build), in the same statement, so no crash leaves
        it ``active`` and the checkpoint lost.

        Raises:
            FtlError(schema_invalid): a required key is missing or malformed, or ``built`` is
                not a JSON object.
            FtlError(conflict): this (workspace_id, attempt) is already recorded.
            FtlError(not_found): unknown campaign.
        """
        if not isinstance(workspace, dict):
            raise _violation("workspace", "must be a JSON object")
        workspace_id = workspace.get("workspace_id")
        if not isinstance(workspace_id, str) or not workspace_id:
            raise _violation("workspace.workspace_id", "must be a non-empty string")
        if "seq" not in workspace:
            raise _violation("workspace.seq", "is required")
        seq = _seq(workspace["seq"], "workspace.seq")
        attempt = workspace.get("attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise _violation("workspace.attempt", "must be an integer >= 1")
        status = workspace.get("status", "active")
        if status != "active":
            raise _violation("workspace.status", f"a new workspace is 'active', got {status!r}")
        if built is not None and not isinstance(built, dict):
            raise _violation("built", "must be a JSON object or None")
        spec = {k: v for k, v in workspace.items() if k != "status"}
        encoded = _dumps(spec, "workspace")
        status, result = ("active", None) if built is None else ("built", _dumps(built, "built"))
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            if conn.execute("SELECT 1 FROM workspace WHERE campaign_id = ? AND workspace_id = ? AND attempt = ?",
                            (campaign_id, workspace_id, attempt)).fetchone():
                raise FtlError("conflict", {"what": f"Workspace {workspace_id} attempt {attempt} of campaign "
                                                    f"{campaign_id} is already recorded."})
            now = self._now()
            conn.execute("INSERT INTO workspace (campaign_id, workspace_id, seq, attempt, status, spec, "
                         "result, created_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (campaign_id, workspace_id, seq, attempt, status, encoded, result, now,
                          None if built is None else now))

    def finish_workspace(self, campaign_id: str, workspace_id: str, attempt: int, status: str,
                         result: dict) -> None:
        """Move a workspace attempt along `WORKSPACE_TRANSITIONS` and store its ``result``
        (build/verify outcome): ``built`` checkpoints a finished build before verify; complete,
        blocked, cancelled and abandoned end the attempt. FTL accepted any order (§5.3).

        Raises:
            FtlError(schema_invalid): unknown status or non-JSON result.
            FtlError(not_found): unknown campaign or workspace attempt.
            FtlError(invalid_state): ``{"trigger": "<from>-><to>", "state": "<from>"}`` when the
                attempt already ended (or is already built and ``status`` is built).
        """
        allowed = ("built",) + WORKSPACE_END_STATUSES
        if status not in allowed:
            raise _violation("status", f"must be one of {', '.join(allowed)}, got {status!r}")
        encoded = _dumps(result, "result")
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            row = conn.execute("SELECT status FROM workspace WHERE campaign_id = ? AND workspace_id = ? "
                               "AND attempt = ?", (campaign_id, workspace_id, attempt)).fetchone()
            if row is None:
                raise FtlError("not_found", {"what": f"workspace {workspace_id} attempt {attempt} of "
                                                     f"campaign {campaign_id}"})
            if status not in WORKSPACE_TRANSITIONS.get(row[0], ()):
                raise FtlError("invalid_state", {"trigger": f"{row[0]}->{status}", "state": row[0]})
            conn.execute("UPDATE workspace SET status = ?, result = ?, finished_at = ? WHERE campaign_id = ? "
                         "AND workspace_id = ? AND attempt = ?",
                         (status, encoded, self._now(), campaign_id, workspace_id, attempt))

    def workspaces(self, campaign_id: str, seq: str | None = None) -> list[dict]:
        """Workspace attempts ``{campaign_id, workspace_id, seq, attempt, status, spec, result,
        created_at, finished_at}`` in seq then attempt order, optionally for one seq."""
        query = "SELECT * FROM workspace WHERE campaign_id = ?"
        args: tuple = (campaign_id,)
        if seq is not None:
            query += " AND seq = ?"
            args += (_seq(seq),)
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            rows = conn.execute(query + " ORDER BY CAST(seq AS INTEGER), attempt, workspace_id", args).fetchall()
        return [self._workspace_dict(r) for r in rows]

    # ------------------------------------------------------------------ exploration

    def record_explorer_result(self, campaign_id: str, mode: str, result: dict) -> None:
        """Keep one explorer's raw result (FTL explorer_result row, §5.5); duplicates are kept and
        resolved by aggregation. Raises: FtlError(schema_invalid) for an unknown mode or non-JSON
        result; FtlError(not_found)."""
        try:
            from ftl.models import ExplorerMode
            mode = ExplorerMode(mode).value
        except ValueError:
            raise _violation("mode", f"must be one of {', '.join(m.value for m in ExplorerMode)}, "
                                     f"got {mode!r}") from None
        if not isinstance(result, dict):
            raise _violation("result", "must be a JSON object")
        encoded = _dumps(result, "result")
        status = result.get("status")
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            conn.execute("INSERT INTO explorer_result (campaign_id, mode, status, result, created_at) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (campaign_id, mode, status if isinstance(status, str) else None, encoded, self._now()))

    def explorer_results(self, campaign_id: str) -> list[dict]:
        """The campaign's explorer results, oldest first: ``{mode, status, result, created_at}``."""
        with self._session() as conn:
            self._campaign_row(conn, campaign_id)
            rows = conn.execute("SELECT mode, status, result, created_at FROM explorer_result "
                                "WHERE campaign_id = ? ORDER BY id", (campaign_id,)).fetchall()
        return [{"mode": r[0], "status": r[1], "result": _loads(r[2]), "created_at": r[3]} for r in rows]

    def save_exploration(self, campaign_id: str, exploration: dict) -> int:
        """Save an aggregated exploration (FTL exploration row: ``{_meta, structure, pattern,
        memory, delta}``); return its row id (FTL ``write``'s id). Raises:
        FtlError(schema_invalid) for non-JSON; FtlError(not_found)."""
        if not isinstance(exploration, dict):
            raise _violation("exploration", "must be a JSON object")
        encoded = _dumps(exploration, "exploration")
        with self._session(write=True) as conn:
            self._campaign_row(conn, campaign_id)
            return conn.execute("INSERT INTO exploration (campaign_id, exploration, created_at) VALUES (?, ?, ?)",
                                (campaign_id, encoded, self._now())).lastrowid

    def clear_explorer_results(self, campaign_id: str) -> int:
        """Delete the campaign's explorer results (FTL clear-session); return how many."""
        with self._session(write=True) as conn:
            return conn.execute("DELETE FROM explorer_result WHERE campaign_id = ?", (campaign_id,)).rowcount

    def clear_explorations(self) -> int:
        """Delete every aggregated exploration (FTL exploration.py clear); return how many."""
        with self._session(write=True) as conn:
            return conn.execute("DELETE FROM exploration").rowcount

    def exploration(self, campaign_id: str | None = None) -> dict | None:
        """The newest exploration of ``campaign_id`` (or of any campaign when None), or None."""
        with self._session() as conn:
            if campaign_id is None:
                row = conn.execute("SELECT exploration FROM exploration ORDER BY id DESC LIMIT 1").fetchone()
            else:
                row = conn.execute("SELECT exploration FROM exploration WHERE campaign_id = ? "
                                   "ORDER BY id DESC LIMIT 1", (campaign_id,)).fetchone()
        return None if row is None else _loads(row[0])

    # ------------------------------------------------------------------ memory

    def memory_store(self):
        """This store's `ftl.memory.MemoryStore` (failures and patterns across campaigns; its SQL
        lives in ``ftl/memory/store.py``)."""
        if getattr(self, "_memory", None) is None:
            from ftl.memory import MemoryStore

            self._memory = MemoryStore(self)
        return self._memory

    def add_memory(self, entry: dict) -> dict:
        """Record a failure or success pattern the runner extracted (no quality gate).

        ``entry``: ``{name, type: failure|pattern, trigger, fix (failure) | insight (pattern),
        cost | saved?, source: [..], campaign_id, ...}``; extra keys are kept. An entry with the
        same ``(name, type)`` (or, for failures, a trigger more than 85 % similar) is not
        duplicated: its ``occurrences`` goes up by one and the sources are united. Returns the
        stored entry (`ftl.memory.MemoryStore.get` shape).

        Raises: FtlError(schema_invalid) naming the missing or malformed key.
        """
        if not isinstance(entry, dict):
            raise _violation("memory", "must be a JSON object")
        name, kind, trigger = entry.get("name"), entry.get("type"), entry.get("trigger")
        if not isinstance(name, str) or not name.strip():
            raise _violation("memory.name", "must be a non-empty string")
        if kind not in MEMORY_TYPES:
            raise _violation("memory.type", f"must be one of {', '.join(MEMORY_TYPES)}, got {kind!r}")
        if not isinstance(trigger, str) or not trigger.strip():
            raise _violation("memory.trigger", "must be a non-empty string")
        text_key = "fix" if kind == "failure" else "insight"
        if not isinstance(entry.get(text_key), str):
            raise _violation(f"memory.{text_key}", f"a {kind} entry needs a {text_key} string")
        return self.memory_store().record(entry)

    def memory(self, type: str | None = None, limit: int = 50, objective: str | None = None) -> list[dict]:
        """Memory entries, most important first, at most ``limit``; with ``objective``, the
        entries ranked for it (`ftl.memory.MemoryStore.context`, which also counts them as read).

        Raises: FtlError(schema_invalid) for an unknown type or a negative limit.
        """
        if type is not None and type not in MEMORY_TYPES:
            raise _violation("type", f"must be one of {', '.join(MEMORY_TYPES)}, got {type!r}")
        if limit < 0:
            raise _violation("limit", "must be >= 0")
        memory = self.memory_store()
        if objective:
            found = memory.context(objective=objective, max_failures=limit if type != "pattern" else 0,
                                   max_patterns=limit if type != "failure" else 0)
            return (found["failures"] + found["patterns"])[:limit]
        return memory.entries(type, limit)
