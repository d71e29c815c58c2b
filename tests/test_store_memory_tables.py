"""The memory room's tables in the store (`ftl.store.memory_tables`, migration 5): a store file
written before the tables moved keeps its entries, edges, text index and counted feedback; the
table operations run a memory rule inside their own write transaction."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.memory import MemoryStore
from ftl.store import SCHEMA_VERSION, Store
from store_files import store_file_at

NOW = "2026-11-20T10:00:00.000Z"

# The memory room's tables as ftl created them on first use, before migration 5 (ftl/memory/store.py
# at commit 2aaf242, ``_SCHEMA``). Copied, not imported from migration 5: these are files older
# code wrote, and must stay what they were when migration 5 changes.
OLD_ROOM_DDL = (
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
    "CREATE TABLE IF NOT EXISTS memory_feedback_seen (key TEXT PRIMARY KEY, created_at TEXT NOT NULL)",
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
)


def schema_4_file(path: Path) -> sqlite3.Connection:
    """A store file at schema version 4 (the last before the memory tables moved), still open."""
    return store_file_at(path, 4)


def legacy_row(conn: sqlite3.Connection, name: str, kind: str, body: dict, source: list[str]) -> None:
    """A row of the first memory table as the store wrote it before the memory room existed."""
    conn.execute("INSERT INTO memory (name, type, trigger, entry, source, campaign_id, occurrences, "
                 "created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'c-old', 2, ?, ?)",
                 (name, kind, f"{name} trigger text", json.dumps(body, sort_keys=True, separators=(",", ":")),
                  json.dumps(source), NOW, NOW))


def fixed_clock() -> datetime:
    return datetime(2026, 11, 26, tzinfo=timezone.utc)


def test_a_store_whose_memory_room_was_used_keeps_entries_edges_index_and_feedback(tmp_path: Path) -> None:
    db = tmp_path / "ftl.db"
    conn = schema_4_file(db)
    for statement in OLD_ROOM_DDL:
        conn.execute(statement)
    for name, trigger, cost in (("jwt", "JWT token expired during the login test", 2000.0),
                                ("css", "grid layout broke on small screens", 8000.0)):
        conn.execute("INSERT INTO memory_entry (name, type, trigger, resolution, match, cost, source, extra, "
                     "campaign_id, created_at, updated_at, importance, related_typed, cross_relationships) "
                     "VALUES (?, 'failure', ?, ?, NULL, ?, '[\"c/001-a/1\"]', '{\"notes\": \"kept\"}', 'c-1', "
                     "?, ?, 1.5, ?, '{}')",
                     (name, trigger, f"fix {name}", cost, NOW, NOW,
                      json.dumps({"co_occurs": ["css" if name == "jwt" else "jwt"]})))
    conn.execute(f"INSERT INTO memory_edge (from_id, to_id, rel_type, weight, created_at) VALUES "
                 f"(1, 2, 'co_occurs', 0.8, '{NOW}'), (2, 1, 'co_occurs', 0.8, '{NOW}')")
    conn.execute(f"INSERT INTO memory_feedback_seen VALUES ('c-1/001-a/1', '{NOW}')")
    conn.close()

    with Store(db, clock=fixed_clock) as store:
        assert store.schema_version() == SCHEMA_VERSION and store.integrity_check() == "ok"
        memory = MemoryStore(store)
        jwt = memory.get("jwt")
        assert (jwt["fix"], jwt["cost"], jwt["notes"], jwt["source"], jwt["importance"]) == (
            "fix jwt", 2000, "kept", ["c/001-a/1"], 1.5)
        assert jwt["related_typed"] == {"co_occurs": ["css"]}
        found = memory.context(objective="login token refresh", track_access=False)
        assert [f["name"] for f in found["failures"]] == ["jwt"]  # the old text index answers
        assert [(hop["entry"]["name"], hop["via"]) for hop in memory.related("jwt")] == [("css", "co_occurs")]
        assert memory.feedback_batch([], [{"name": "jwt", "type": "failure"}], once_key="c-1/001-a/1") == {
            "helped": 0, "not_helped": 0}
    check = sqlite3.connect(db)
    assert check.execute("SELECT COUNT(*) FROM memory_entry").fetchone()[0] == 2
    assert check.execute("SELECT COUNT(*) FROM memory_fts WHERE memory_fts MATCH 'token'").fetchone()[0] == 1
    check.close()


def test_rows_of_the_first_memory_table_are_copied_once(tmp_path: Path) -> None:
    db = tmp_path / "ftl.db"
    conn = schema_4_file(db)
    legacy_row(conn, "import-cycle", "failure", {"fix": "move the import", "cost": 500, "notes": "n"}, ["001-a"])
    legacy_row(conn, "lazy", "pattern", {"insight": "import lazily", "extra": [1]}, [])
    conn.close()
    with Store(db) as store:
        memory = MemoryStore(store)
        failure = memory.get("import-cycle")
        assert (failure["fix"], failure["notes"], failure["source"], failure["campaign_id"]) == (
            "move the import", "n", ["001-a"], "c-old")
        assert failure["cost"] == 0  # the column; the old entry's cost stays in its extra keys
        assert (failure["occurrences"], failure["created_at"], failure["updated_at"]) == (2, NOW, NOW)
        pattern = memory.get("lazy", "pattern")
        assert (pattern["insight"], pattern["extra"]) == ("import lazily", [1])
        assert [e["name"] for e in memory.query("import", threshold=0.0)] == ["import-cycle", "lazy"]
        assert memory.prune(max_failures=0, max_patterns=10, min_importance=0)["pruned_failures"] == 1
    with Store(db) as store:  # reopened: no migration runs, the pruned entry stays gone
        assert [e["name"] for e in store.memory_entries()] == ["lazy"]


def test_an_old_entry_holding_nan_migrates_and_new_nan_is_refused(tmp_path: Path) -> None:
    # Older code wrote JSON text with NaN in it, which SQLite's JSON functions call malformed:
    # the migration kept failing and the store read as corrupt. Such an entry now migrates
    # (its text kept), and no new column text can hold NaN.
    db = tmp_path / "ftl.db"
    conn = schema_4_file(db)
    legacy_row(conn, "nan-cost", "failure", {"fix": "retry", "cost": float("nan")}, [])
    legacy_row(conn, "fine", "failure", {"fix": "ok"}, [])
    conn.close()
    with Store(db) as store:
        assert store.integrity_check() == "ok"
        memory = MemoryStore(store)
        assert memory.get("fine")["fix"] == "ok"
        kept = memory.get("nan-cost")
        assert kept["fix"] == "" and "NaN" in kept["unreadable_entry"]
        with pytest.raises(FtlError) as refused:
            store.add_memory_entry({**row("x", "t"), "extra": {"cost": float("nan")}})
        assert refused.value.error_type == "schema_invalid"


def test_entries_pruned_before_the_migration_do_not_come_back(tmp_path: Path) -> None:
    # The memory room copied the first table when it created its own, then an entry was pruned.
    db = tmp_path / "ftl.db"
    conn = schema_4_file(db)
    legacy_row(conn, "gone", "failure", {"fix": "f"}, [])
    legacy_row(conn, "kept", "failure", {"fix": "f"}, [])
    for statement in OLD_ROOM_DDL:
        conn.execute(statement)
    conn.execute("INSERT INTO memory_entry (name, type, trigger, resolution, created_at, updated_at) "
                 f"VALUES ('kept', 'failure', 'kept trigger text', 'f', '{NOW}', '{NOW}')")
    conn.close()
    with Store(db) as store:
        assert [e["name"] for e in store.memory_entries()] == ["kept"]


def test_a_new_store_has_the_memory_tables_at_once(tmp_path: Path) -> None:
    with Store(tmp_path / "ftl.db") as store:
        assert store.memory_entries() == [] and store.memory_edges() == []
    names = {r[0] for r in sqlite3.connect(tmp_path / "ftl.db").execute("SELECT name FROM sqlite_master")}
    assert {"memory_entry", "memory_edge", "memory_fts", "memory_feedback_seen"} <= names
    assert "migration_5" not in names


def row(name: str, trigger: str, cost: float = 0, kind: str = "failure") -> dict:
    return {"name": name, "type": kind, "trigger": trigger, "resolution": "r", "match": None, "cost": cost,
            "source": ["s1"], "extra": {}, "campaign_id": None, "created_at": NOW, "importance": 0.5,
            "related_typed": {}, "cross_relationships": {}}


def test_the_repeat_rule_is_asked_oldest_first_and_only_without_a_name_match(tmp_path: Path) -> None:
    asked: list[str] = []

    def similar(trigger: str) -> bool:
        asked.append(trigger)
        return trigger.startswith("b")

    with Store(tmp_path / "ftl.db") as store:
        store.add_memory_entry(row("a", "a text"))
        store.add_memory_entry(row("b", "b text", cost=10))
        store.add_memory_entry(row("p", "b pattern", kind="pattern"))
        assert store.add_memory_entry(row("a", "other"), similar=similar) == (False, "a") and asked == []
        assert store.add_memory_entry({**row("c", "c", cost=99), "source": ["s2"]}, similar=similar,
                                      keep_higher_cost=True) == (False, "b")
        assert asked == ["a text", "b text"]  # failures only, oldest first, stopping at the repeat
        b = store.memory_entry("b", "failure")
        assert (b["source"], b["occurrences"], b["cost"]) == (["s1", "s2"], 2, 99)
        assert store.memory_entry("a", "failure")["occurrences"] == 2  # the name match merged
        assert store.add_memory_entry(row("a", "x"), merge=False) == (False, "a")
        assert store.memory_entry("a", "failure")["occurrences"] == 2


def test_a_rule_that_fails_inside_a_write_leaves_the_rows_as_they_were(tmp_path: Path) -> None:
    def broken(_: object) -> float:
        raise ValueError("the rule's own bug")

    with Store(tmp_path / "ftl.db") as store:
        store.add_memory_entry(row("a", "a text"))
        with pytest.raises(ValueError):
            store.count_memory_feedback("a", "failure", True, broken)
        with pytest.raises(ValueError):
            store.prune_memory(lambda kind, rows: broken(rows))
        entry = store.memory_entry("a", "failure")
        assert (entry["times_helped"], entry["importance"]) == (0, 0.5)
        assert store.count_memory_feedback("nope", "failure", True, broken) is False


def test_a_feedback_batch_and_its_once_mark_are_one_write(tmp_path: Path) -> None:
    # A failure part-way through (here the rule's own bug on the second entry; a kill in real
    # life) keeps neither the mark nor the first count, so the batch is counted again, whole.
    calls: list[dict] = []

    def second_fails(counters: dict) -> float:
        calls.append(counters)
        if len(calls) == 2:
            raise ValueError("the rule's own bug")
        return 0.75

    with Store(tmp_path / "ftl.db") as store:
        store.add_memory_entry(row("a", "a text"))
        store.add_memory_entry(row("b", "b text"))
        counts = [("a", "failure", True), ("b", "failure", False), ("gone", "failure", True)]
        with pytest.raises(ValueError):
            store.count_memory_feedback_batch(counts, second_fails, once_key="c-1/001-a/1")
        assert store.memory_entry("a", "failure")["times_helped"] == 0
        assert store.count_memory_feedback_batch(counts, lambda c: 0.75,
                                                 once_key="c-1/001-a/1") == [True, True, False]
        assert store.count_memory_feedback_batch(counts, lambda c: 0.75, once_key="c-1/001-a/1") is None
        a, b = store.memory_entry("a", "failure"), store.memory_entry("b", "failure")
        assert (a["times_helped"], b["times_failed"], a["importance"]) == (1, 1, 0.75)


def test_prune_deletes_the_named_entries_of_each_type_and_their_edges(tmp_path: Path) -> None:
    with Store(tmp_path / "ftl.db") as store:
        for name in ("a", "b", "c"):
            store.add_memory_entry(row(name, f"{name} text"))
        store.add_memory_entry(row("p", "p text", kind="pattern"))
        assert store.link_memory_entries("failure", "a", "b", "causes", "caused_by", 1.0) == "added"
        assert store.link_memory_entries("failure", "a", "b", "causes", "caused_by", 1.0) == "exists"
        assert store.link_memory_entries("failure", "a", "zz", "causes", "caused_by", 1.0) == "no_target"
        seen: dict[str, list[int]] = {}

        def doomed(kind: str, rows: list[dict]) -> list[int]:
            seen[kind] = [r["id"] for r in rows]
            return [rows[1]["id"], 999] if kind == "failure" else []  # 999 is no entry of the type

        assert store.prune_memory(doomed) == {"failure": {"deleted": 1, "remaining": 2},
                                              "pattern": {"deleted": 0, "remaining": 1}, "edges_removed": 2}
        assert seen == {"failure": [1, 2, 3], "pattern": [4]}
        assert [e["name"] for e in store.memory_entries(order="id")] == ["a", "c", "p"]
