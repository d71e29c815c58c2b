"""The store's schema and the settings of its connection.

`MIGRATIONS` is append-only: migration n brings ``PRAGMA user_version`` from n-1 to n, and
`migrate` runs the missing ones in one transaction. `BUSY_TIMEOUT_MS` and `PAGE_SIZE` are what
`ftl.store.Store` opens a file with; why these values: "Durability and concurrency choices" in
`ftl.store`'s docstring.
"""

from __future__ import annotations

import sqlite3

from ftl.errors import FtlError

BUSY_TIMEOUT_MS = 10_000
#: Page size (bytes) of a store file ftl creates; an existing file keeps its own. See `ftl.store`'s
#: docstring (Durability and concurrency choices).
PAGE_SIZE = 8192

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
    # versions" in `ftl.store.plans`' docstring): ``tasks_at`` is where the specs go in ``plan``, whose
    # task list is stored empty, and ``task_seqs`` their order; both NULL when ``plan`` is whole.
    ("ALTER TABLE plan ADD COLUMN tasks_at INTEGER", "ALTER TABLE plan ADD COLUMN task_seqs TEXT"),
    # 4: the blocked tasks, which every task's workspace lists (sibling failures), read without
    # a pass over the campaign's rows; a partial index, so pending rows never enter it.
    ("CREATE INDEX task_blocked ON task (campaign_id, seq) WHERE status = 'blocked'",),
)
SCHEMA_VERSION = len(MIGRATIONS)


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
