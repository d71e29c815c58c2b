"""Store files as an older ftl wrote them, for the migration tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ftl.store import MIGRATIONS


def store_file_at(path: Path, version: int) -> sqlite3.Connection:
    """A store file at schema ``version`` (its first ``version`` migrations, WAL), left open
    for the caller to add rows as that version's code would have."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for migration in MIGRATIONS[:version]:
        for statement in migration:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {version}")
    return conn
