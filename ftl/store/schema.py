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
    # 5: the memory room's tables (`ftl.store.memory_tables`), which ftl created on first use
    # before this migration: ``IF NOT EXISTS`` keeps the ones a file has, and the rows of the
    # first memory table (``memory``, migration 1) are copied in only when ``memory_entry`` is
    # new, as that first use did (an entry pruned since must not come back).
    (
        """CREATE TEMP TABLE migration_5 AS SELECT NOT EXISTS (
            SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memory_entry') AS fresh""",
        """CREATE TABLE IF NOT EXISTS memory_entry (
            id                  INTEGER PRIMARY KEY AUTOINCREMENT,
            name                TEXT NOT NULL,
            type                TEXT NOT NULL CHECK (type IN ('failure', 'pattern')),
            trigger             TEXT NOT NULL,
            resolution          TEXT NOT NULL DEFAULT '',
            match               TEXT,
            cost                REAL NOT NULL DEFAULT 0,
            source              TEXT NOT NULL DEFAULT '[]',
            extra               TEXT NOT NULL DEFAULT '{}',
            campaign_id         TEXT,
            occurrences         INTEGER NOT NULL DEFAULT 1,
            created_at          TEXT NOT NULL,
            updated_at          TEXT NOT NULL,
            last_accessed       TEXT NOT NULL DEFAULT '',
            access_count        INTEGER NOT NULL DEFAULT 0,
            times_helped        INTEGER NOT NULL DEFAULT 0,
            times_failed        INTEGER NOT NULL DEFAULT 0,
            importance          REAL NOT NULL DEFAULT 0,
            related_typed       TEXT NOT NULL DEFAULT '{}',
            cross_relationships TEXT NOT NULL DEFAULT '{}',
            UNIQUE (name, type)
        )""",
        "CREATE INDEX IF NOT EXISTS memory_entry_type_importance ON memory_entry (type, importance DESC)",
        """CREATE TABLE IF NOT EXISTS memory_edge (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            from_id    INTEGER NOT NULL REFERENCES memory_entry (id) ON DELETE CASCADE,
            to_id      INTEGER NOT NULL REFERENCES memory_entry (id) ON DELETE CASCADE,
            rel_type   TEXT NOT NULL,
            weight     REAL NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (from_id, to_id, rel_type)
        )""",
        "CREATE INDEX IF NOT EXISTS memory_edge_to ON memory_edge (to_id)",
        # Workspace attempts whose builder feedback was counted (an OBSERVE re-run must not recount).
        "CREATE TABLE IF NOT EXISTS memory_feedback_seen (key TEXT PRIMARY KEY, created_at TEXT NOT NULL)",
        # External-content FTS5 index over trigger and resolution, kept in step by the triggers.
        """CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(
            trigger, resolution, content='memory_entry', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2')""",
        """CREATE TRIGGER IF NOT EXISTS memory_entry_ai AFTER INSERT ON memory_entry BEGIN
            INSERT INTO memory_fts (rowid, trigger, resolution) VALUES (new.id, new.trigger, new.resolution);
        END""",
        """CREATE TRIGGER IF NOT EXISTS memory_entry_ad AFTER DELETE ON memory_entry BEGIN
            INSERT INTO memory_fts (memory_fts, rowid, trigger, resolution)
            VALUES ('delete', old.id, old.trigger, old.resolution);
        END""",
        """CREATE TRIGGER IF NOT EXISTS memory_entry_au AFTER UPDATE OF trigger, resolution ON memory_entry BEGIN
            INSERT INTO memory_fts (memory_fts, rowid, trigger, resolution)
            VALUES ('delete', old.id, old.trigger, old.resolution);
            INSERT INTO memory_fts (rowid, trigger, resolution) VALUES (new.id, new.trigger, new.resolution);
        END""",
        # A ``memory`` row's ``entry`` object holds the text (a failure's fix, a pattern's
        # insight), which becomes ``resolution``, and the other keys, kept as ``extra``.
        """INSERT OR IGNORE INTO memory_entry (name, type, trigger, resolution, source, extra,
                                               campaign_id, occurrences, created_at, updated_at)
           SELECT name, type, trigger,
                  CASE WHEN json_valid(entry)
                       THEN COALESCE(json_extract(entry, CASE type WHEN 'failure' THEN '$.fix'
                                                                   ELSE '$.insight' END), '')
                       ELSE '' END,
                  source,
                  -- text older code wrote with NaN in it is no JSON to SQLite: kept as text
                  CASE WHEN json_valid(entry)
                       THEN json_remove(entry, CASE type WHEN 'failure' THEN '$.fix'
                                                         ELSE '$.insight' END)
                       ELSE json_object('unreadable_entry', entry) END,
                  campaign_id, occurrences, created_at, updated_at
           FROM memory WHERE (SELECT fresh FROM temp.migration_5) ORDER BY id""",
        "DROP TABLE temp.migration_5",
    ),
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
