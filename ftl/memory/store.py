"""Memory's SQL: failures and patterns that outlive campaigns, their relationship graph, an FTS5
index for text relevance, feedback and pruning (FTL ``lib/memory.py``, commit 89a2f8e, read for
behaviour; the rules are in `ftl.memory.scoring`).

Tables (created on first use in the store's file, ``CREATE ... IF NOT EXISTS``, so they need no
slot in ``ftl.store.MIGRATIONS``):

* ``memory_entry``: one row per ``(name, type)``: trigger, resolution (a failure's fix, a
  pattern's insight), match regex, cost (a pattern's saved tokens), source workspace ids, extra
  keys, importance, access / help / fail counters, timestamps, ``related_typed`` and
  ``cross_relationships`` (``{rel_type: [names]}``).
* ``memory_edge``: directed, typed, weighted edges between entries of one type (both directions
  are stored, the reverse with the inverse type); deleted with their entries.
* ``memory_fts``: an external-content FTS5 index over trigger and resolution, kept in step by
  triggers; ``bm25`` orders matches.

Rows written by ftl before this room existed (the store's ``memory`` table) are copied in once.
Timestamps are the store's RFC 3339 UTC strings.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from typing import Any, Iterable

from ftl.errors import FtlError
from ftl.memory import scoring

__all__ = ["MemoryStore", "MEMORY_TYPES"]

MEMORY_TYPES = ("failure", "pattern")

_SCHEMA = (
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

_CORE_KEYS = frozenset({"name", "type", "trigger", "fix", "insight", "match", "cost", "saved",
                        "source", "campaign_id", "occurrences", "created_at", "updated_at",
                        "last_accessed", "access_count", "times_helped", "times_failed",
                        "importance", "related_typed", "cross_relationships", "related"})


def _violation(path: str, message: str, fix: str) -> FtlError:
    return FtlError("schema_invalid", {"count": 1, "violations": [
        {"path": path, "message": message, "fix": fix}]}, message=f"Invalid {path}: {message}.")


def _check_type(entry_type: str) -> str:
    if entry_type not in MEMORY_TYPES:
        raise _violation("type", f"must be failure or pattern, got {entry_type!r}",
                         "pass --type failure or --type pattern")
    return entry_type


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _violation(path, "must be a number", f"give {path} as a number of tokens")
    return value


def _int_if_whole(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


class MemoryStore:
    """The memory of one `ftl.store.Store` (same file, same lock, same clock).

    Args:
        store: the `ftl.store.Store` whose file holds the memory tables; used through its API
            for rooms with their own tables (`Store.session`, `clock`, `now`, `prepared`).
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        store.prepared("memory", self._ensure_schema)

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _ensure_schema(conn: sqlite3.Connection) -> None:
        fresh = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_entry'").fetchone() is None
        for statement in _SCHEMA:
            conn.execute(statement)
        legacy = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory' AND type = 'table'").fetchone()
        if fresh and legacy:
            for row in conn.execute("SELECT * FROM memory ORDER BY id").fetchall():
                body = json.loads(row["entry"] or "{}")
                resolution = body.pop("fix", None) if row["type"] == "failure" else body.pop("insight", None)
                conn.execute(
                    "INSERT OR IGNORE INTO memory_entry (name, type, trigger, resolution, source, extra, "
                    "campaign_id, occurrences, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (row["name"], row["type"], row["trigger"], resolution or "", row["source"],
                     json.dumps(body), row["campaign_id"], row["occurrences"], row["created_at"],
                     row["updated_at"]))

    def _now(self) -> datetime:
        moment = self._store.clock()
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

    def _ts(self) -> str:
        return self._store.now()

    @staticmethod
    def _entry(row: sqlite3.Row) -> dict[str, Any]:
        """A row as FTL's memory dict (``fix``/``match``/``cost`` for failures, ``insight``/
        ``saved`` for patterns) plus ftl's extra keys (campaign_id, occurrences, updated_at, ...)."""
        entry: dict[str, Any] = {
            "name": row["name"], "type": row["type"], "trigger": row["trigger"],
            "source": json.loads(row["source"] or "[]"), "access_count": row["access_count"],
            "last_accessed": row["last_accessed"], "times_helped": row["times_helped"],
            "times_failed": row["times_failed"], "importance": row["importance"],
            "created_at": row["created_at"]}
        if row["type"] == "failure":
            entry.update(fix=row["resolution"], match=row["match"], cost=_int_if_whole(row["cost"]))
        else:
            entry.update(insight=row["resolution"], saved=_int_if_whole(row["cost"]))
        entry["related_typed"] = json.loads(row["related_typed"] or "{}")
        entry["cross_relationships"] = json.loads(row["cross_relationships"] or "{}")
        extra = json.loads(row["extra"] or "{}")
        for key, value in extra.items():
            entry.setdefault(key, value)
        entry.update(campaign_id=row["campaign_id"], occurrences=row["occurrences"],
                     updated_at=row["updated_at"])
        return entry

    @staticmethod
    def ftl_view(entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with only FTL's keys (what FTL's memory.py prints for an entry)."""
        keys = ["name", "type", "trigger", "source", "access_count", "last_accessed",
                "times_helped", "times_failed", "importance", "created_at"]
        keys += ["fix", "match", "cost"] if entry["type"] == "failure" else ["insight", "saved"]
        keys += ["related_typed", "cross_relationships"]
        view = {k: entry.get(k) for k in keys}
        for key in ("_relevance", "_score", "_tier", "_expanded", "_expanded_from"):
            if key in entry:
                view[key] = entry[key]
        return view

    def _row(self, conn: sqlite3.Connection, name: str, entry_type: str) -> sqlite3.Row | None:
        return conn.execute("SELECT * FROM memory_entry WHERE name = ? AND type = ?",
                            (name, entry_type)).fetchone()

    # ------------------------------------------------------------------ writing entries

    def add(self, entry: dict[str, Any], *, validate: bool = True) -> str:
        """Add a failure or pattern with FTL's merge rules (FTL ``add_failure`` / ``add_pattern``).

        ``entry``: ``{name, type: failure|pattern, trigger, fix | insight, cost | saved (tokens),
        match?, source?: [ids], campaign_id?, ...}``; other keys are kept as extra fields.

        Returns FTL's status text: ``added``; for a failure ``merged:<name>`` (same name, or a
        trigger more than 85 % similar: sources united, the higher cost kept, occurrences + 1); for
        a pattern ``duplicate:<name>`` (left unchanged); ``rejected:<reason>`` when ``validate``
        and the quality gate refuses it (`scoring.quality_problem`).

        Raises: FtlError(schema_invalid) naming a missing or malformed key.
        """
        if not isinstance(entry, dict):
            raise _violation("memory", "must be a JSON object", "pass a JSON object")
        entry_type = _check_type(entry.get("type", "failure"))
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _violation("name", "must be a non-empty string", "give the entry a kebab-case name")
        trigger = entry.get("trigger", "")
        if not isinstance(trigger, str):
            raise _violation("trigger", "must be a string", "give the error text or condition")
        text_key, value_key = ("fix", "cost") if entry_type == "failure" else ("insight", "saved")
        resolution = entry.get(text_key, "")
        if resolution is None:
            resolution = ""
        if not isinstance(resolution, str):
            raise _violation(text_key, "must be a string", f"give the {text_key} as text")
        value = _number(entry.get(value_key, entry.get("cost", 0)) or 0, value_key)
        source = entry.get("source") or []
        if isinstance(source, str):
            source = [source]
        if not isinstance(source, list):
            raise _violation("source", "must be a list of workspace ids", "pass a JSON array")
        if validate:
            problem = scoring.quality_problem({**entry, "cost": value} if entry_type == "failure"
                                              else entry, entry_type)
            if problem:
                return f"rejected:{problem}"
        extra = {k: v for k, v in entry.items() if k not in _CORE_KEYS}
        with self._store.session(write=True) as conn:
            existing = self._row(conn, name, entry_type)
            if existing is None and trigger:
                for row in conn.execute("SELECT * FROM memory_entry WHERE type = ? ORDER BY id",
                                        (entry_type,)).fetchall():
                    if scoring.is_near_duplicate(trigger, row["trigger"]):
                        existing = row
                        break
            if existing is not None:
                if entry_type == "pattern":
                    return f"duplicate:{existing['name']}"
                merged = json.loads(existing["source"] or "[]")
                merged += [s for s in source if s not in merged]
                conn.execute("UPDATE memory_entry SET source = ?, cost = MAX(cost, ?), "
                             "occurrences = occurrences + 1, updated_at = ? WHERE id = ?",
                             (json.dumps(merged), value, self._ts(), existing["id"]))
                return f"merged:{existing['name']}"
            created = entry.get("created_at") if isinstance(entry.get("created_at"), str) else self._ts()
            weight = scoring.importance(value, 0, 0, 0, created, self._now())
            conn.execute(
                "INSERT INTO memory_entry (name, type, trigger, resolution, match, cost, source, extra, "
                "campaign_id, created_at, updated_at, importance, related_typed, cross_relationships) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, entry_type, trigger, resolution,
                 entry.get("match") if entry_type == "failure" else None, value,
                 json.dumps(source), json.dumps(extra, default=str), entry.get("campaign_id"),
                 created, self._ts(), weight,
                 json.dumps(entry.get("related_typed") or {}),
                 json.dumps(entry.get("cross_relationships") or {})))
        return "added"

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Store an entry the runner extracted (no quality gate): like `add`, but an entry already
        known by ``(name, type)`` of either type gets its sources united and occurrences + 1.
        Returns the stored entry (`_entry` shape)."""
        entry_type = _check_type(entry.get("type", "failure"))
        status = self.add(entry, validate=False)
        name = status.split(":", 1)[1] if ":" in status else entry["name"]
        if status.startswith("duplicate:"):
            source = entry.get("source") or []
            with self._store.session(write=True) as conn:
                row = self._row(conn, name, entry_type)
                merged = json.loads(row["source"] or "[]")
                merged += [s for s in source if s not in merged]
                conn.execute("UPDATE memory_entry SET source = ?, occurrences = occurrences + 1, "
                             "updated_at = ? WHERE id = ?", (json.dumps(merged), self._ts(), row["id"]))
        return self.get(name, entry_type)

    def get(self, name: str, entry_type: str = "failure") -> dict[str, Any] | None:
        """One entry by name and type, or None."""
        with self._store.session() as conn:
            row = self._row(conn, name, _check_type(entry_type))
        return None if row is None else self._entry(row)

    def entries(self, entry_type: str | None = None, limit: int | None = None,
                order: str = "importance") -> list[dict[str, Any]]:
        """Entries of one type (or both), most important first (``order="importance"``), or by
        value (``"value"``: cost / saved), or by frequency (``"occurrences"``); at most ``limit``."""
        by = {"importance": "importance DESC, id", "value": "cost DESC, id",
              "occurrences": "occurrences DESC, updated_at DESC, id DESC", "id": "id"}[order]
        query, args = "SELECT * FROM memory_entry", []
        if entry_type is not None:
            query += " WHERE type = ?"
            args.append(_check_type(entry_type))
        query += f" ORDER BY {by}"
        if limit is not None:
            query += " LIMIT ?"
            args.append(limit)
        with self._store.session() as conn:
            return [self._entry(r) for r in conn.execute(query, args).fetchall()]

    # ------------------------------------------------------------------ retrieval

    def _matches(self, conn: sqlite3.Connection, text: str, entry_type: str | None) -> dict[int, float]:
        """Entry id -> relevance in [0, 1] for ``text`` (FTS5 bm25 relative to the best match of
        the same type, times the share of the query's words matched; `scoring.relevance`)."""
        expression = scoring.fts_query(text)
        if expression is None:
            return {}
        query = ("SELECT e.id, e.type, bm25(memory_fts) AS rank FROM memory_fts "
                 "JOIN memory_entry e ON e.id = memory_fts.rowid WHERE memory_fts MATCH ?")
        args: list[Any] = [expression]
        if entry_type is not None:
            query += " AND e.type = ?"
            args.append(entry_type)
        rows = conn.execute(query, args).fetchall()
        if not rows:
            return {}
        best: dict[str, float] = {}  # per type: failures and patterns are ranked apart
        for r in rows:
            best[r["type"]] = min(best.get(r["type"], 0.0), r["rank"])
        words = scoring.tokens(text)
        # Which query words each entry matches, by the same (Porter-stemmed) index.
        hits: dict[int, int] = {}
        for word in words:
            for (rowid,) in conn.execute("SELECT rowid FROM memory_fts WHERE memory_fts MATCH ?",
                                         (f'"{word}"',)):
                hits[rowid] = hits.get(rowid, 0) + 1
        return {r["id"]: scoring.relevance(r["rank"], best[r["type"]], hits.get(r["id"], 0) / len(words))
                for r in rows}

    def context(self, *, objective: str | None = None, max_failures: int = 5, max_patterns: int = 3,
                relevance_threshold: float = 0.5, min_results: int = 1, expand_related: bool = False,
                track_access: bool = True, include_tiers: bool = False) -> dict[str, list[dict]]:
        """Failures and patterns to inject into a builder's workspace (FTL ``get_context``).

        With an ``objective``: each entry gets ``_relevance`` (bm25-derived, [0, 1]) and
        ``_score`` (`scoring.hybrid_score`: relevance x log2(value + 1) x help ratio x decay);
        entries at or above ``relevance_threshold`` come first by score, then, if fewer than
        ``min_results``, the most valuable of the rest. Without one: by value (cost / saved).
        ``include_tiers`` adds ``_tier``. ``track_access`` counts the returned entries as read
        (access_count + 1, last_accessed). Returns ``{"failures": [...], "patterns": [...]}``.
        """
        now = self._now()
        out: dict[str, list[dict]] = {}
        with self._store.session() as conn:
            matches = self._matches(conn, objective, None) if objective else {}
            for entry_type, limit in (("failure", max_failures), ("pattern", max_patterns)):
                rows = conn.execute("SELECT * FROM memory_entry WHERE type = ? ORDER BY id",
                                    (entry_type,)).fetchall()
                value_key = "cost" if entry_type == "failure" else "saved"
                if objective:
                    scored = []
                    for row in rows:
                        entry = self._entry(row)
                        rel = matches.get(row["id"], 0.0)
                        score = scoring.hybrid_score(rel, row["cost"], row["times_helped"],
                                                     row["times_failed"], row["created_at"], now)
                        entry["_relevance"], entry["_score"] = round(rel, 3), round(score, 3)
                        if include_tiers:
                            entry["_tier"] = scoring.tier(rel)
                        scored.append((entry, rel, score))
                    relevant = sorted((s for s in scored if s[1] >= relevance_threshold), key=lambda s: -s[2])
                    rest = sorted((s for s in scored if s[1] < relevance_threshold),
                                  key=lambda s: -(s[0].get(value_key) or 0))
                    chosen = [s[0] for s in relevant[:limit]]
                    if len(chosen) < min_results:
                        chosen += [s[0] for s in rest[:min_results - len(chosen)]]
                    chosen = chosen[:limit]
                else:
                    entries = [self._entry(r) for r in rows]
                    chosen = sorted(entries, key=lambda e: -(e.get(value_key) or 0))[:limit]
                    if include_tiers:
                        for entry in chosen:
                            entry["_tier"] = scoring.tier(0.0)
                out[entry_type] = chosen
        if expand_related:
            for entry_type, limit in (("failure", max_failures), ("pattern", max_patterns)):
                chosen = out[entry_type]
                names = {e["name"] for e in chosen}
                extra = []
                for entry in list(chosen):
                    for hop in self.related(entry["name"], entry_type, max_hops=1):
                        other = hop["entry"]
                        if other["name"] not in names:
                            other.update(_expanded=True, _expanded_from=entry["name"])
                            extra.append(other)
                            names.add(other["name"])
                chosen.extend(extra[:max(0, limit - len(chosen))])
        if track_access:
            for entry_type in MEMORY_TYPES:
                self.track_access([e["name"] for e in out[entry_type]], entry_type)
        return {"failures": out["failure"], "patterns": out["pattern"]}

    def query(self, topic: str, threshold: float = 0.3) -> list[dict[str, Any]]:
        """Entries whose relevance to ``topic`` is above ``threshold``, best first, each with
        ``score`` (bm25-derived relevance, 3 decimals) (FTL ``query``)."""
        with self._store.session() as conn:
            matches = self._matches(conn, topic, None)
            rows = conn.execute("SELECT * FROM memory_entry ORDER BY id").fetchall()
        results = []
        for row in rows:
            score = matches.get(row["id"], 0.0)
            if score > threshold:
                entry = self._entry(row)
                entry["score"] = round(score, 3)
                results.append(entry)
        return sorted(results, key=lambda e: -e["score"])

    def track_access(self, names: Iterable[str], entry_type: str = "failure") -> None:
        """access_count + 1 and last_accessed = now for each named entry of ``entry_type``."""
        names = [n for n in names if n]
        if not names:
            return
        with self._store.session(write=True) as conn:
            now = self._ts()
            conn.executemany("UPDATE memory_entry SET access_count = access_count + 1, last_accessed = ? "
                             "WHERE name = ? AND type = ?", [(now, n, entry_type) for n in names])

    # ------------------------------------------------------------------ feedback and pruning

    def feedback(self, name: str, entry_type: str = "failure", helped: bool = True) -> str:
        """Count one injection of the entry as helpful (``helped``) or not and recompute its
        importance (`scoring.feedback_importance`). Returns ``updated`` or ``not_found``."""
        entry_type = _check_type(entry_type)
        column = "times_helped" if helped else "times_failed"
        with self._store.session(write=True) as conn:
            row = self._row(conn, name, entry_type)
            if row is None:
                return "not_found"
            conn.execute(f"UPDATE memory_entry SET {column} = {column} + 1 WHERE id = ?", (row["id"],))
            row = conn.execute("SELECT * FROM memory_entry WHERE id = ?", (row["id"],)).fetchone()
            conn.execute("UPDATE memory_entry SET importance = ? WHERE id = ?", (
                scoring.feedback_importance(row["cost"], row["times_helped"], row["times_failed"],
                                            row["access_count"]), row["id"]))
        return "updated"

    def feedback_batch(self, utilized: list[dict], injected: list[dict], *,
                       once_key: str | None = None) -> dict[str, int]:
        """Every injected ``{name, type}`` counts as helped when it is also in ``utilized``, else
        as not helped (FTL ``record_feedback_batch``). Returns ``{"helped": n, "not_helped": m}``
        (entries that no longer exist are not counted). With ``once_key`` (e.g. a workspace
        attempt id) a second batch under the same key counts nothing.

        Raises: FtlError(schema_invalid) when an item is not ``{name, type}``.
        """
        def pairs(items: list, label: str) -> set[tuple[str, str]]:
            if not isinstance(items, list):
                raise _violation(label, "must be a JSON array of {name, type}", "pass a JSON array")
            out = set()
            for index, item in enumerate(items):
                if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                        or item.get("type") not in MEMORY_TYPES:
                    raise _violation(f"{label}[{index}]", "must be {\"name\": str, \"type\": failure|pattern}",
                                     "give each memory as {name, type}")
                out.add((item["name"], item["type"]))
            return out

        used, shown = pairs(utilized, "utilized"), pairs(injected, "injected")
        result = {"helped": 0, "not_helped": 0}
        if once_key is not None:
            with self._store.session(write=True) as conn:
                if conn.execute("INSERT OR IGNORE INTO memory_feedback_seen (key, created_at) VALUES (?, ?)",
                                (once_key, self._ts())).rowcount == 0:
                    return result
        for name, entry_type in sorted(shown):
            helped = (name, entry_type) in used
            if self.feedback(name, entry_type, helped) == "updated":
                result["helped" if helped else "not_helped"] += 1
        return result

    def prune(self, *, max_failures: int = scoring.DEFAULT_MAX_FAILURES,
              max_patterns: int = scoring.DEFAULT_MAX_PATTERNS,
              min_importance: float = scoring.DEFAULT_MIN_IMPORTANCE,
              half_life_days: float = scoring.DEFAULT_HALF_LIFE_DAYS) -> dict[str, int]:
        """Delete the least useful entries: importance recomputed with decay (`scoring.importance`);
        entries below ``min_importance`` go, then all but the ``max_*`` most important per type.
        Edges of deleted entries go with them. Returns ``{pruned_failures, pruned_patterns,
        remaining_failures, remaining_patterns, orphaned_edges_removed}``."""
        if half_life_days <= 0:
            raise _violation("--half-life", "must be > 0", "give a half-life in days, e.g. 30")
        now = self._now()
        result: dict[str, int] = {}
        with self._store.session(write=True) as conn:
            edges_before = conn.execute("SELECT COUNT(*) FROM memory_edge").fetchone()[0]
            for entry_type, limit in (("failure", max_failures), ("pattern", max_patterns)):
                rows = conn.execute("SELECT * FROM memory_entry WHERE type = ? ORDER BY id",
                                    (entry_type,)).fetchall()
                scored = [(r["id"], scoring.importance(r["cost"], r["times_helped"], r["times_failed"],
                                                       r["access_count"], r["created_at"], now,
                                                       half_life_days)) for r in rows]
                kept = sorted((s for s in scored if s[1] >= min_importance), key=lambda s: -s[1])
                keep = {i for i, _ in kept[:max(0, limit)]}
                doomed = [(i,) for i, _ in scored if i not in keep]
                conn.executemany("DELETE FROM memory_edge WHERE from_id = ? OR to_id = ?",
                                 [(i, i) for (i,) in doomed])
                conn.executemany("DELETE FROM memory_entry WHERE id = ?", doomed)
                plural = f"{entry_type}s"
                result[f"pruned_{plural}"] = len(doomed)
                result[f"remaining_{plural}"] = len(keep)
            edges_after = conn.execute("SELECT COUNT(*) FROM memory_edge").fetchone()[0]
        return {"pruned_failures": result["pruned_failures"], "pruned_patterns": result["pruned_patterns"],
                "remaining_failures": result["remaining_failures"],
                "remaining_patterns": result["remaining_patterns"],
                "orphaned_edges_removed": edges_before - edges_after}

    # ------------------------------------------------------------------ relationships

    def add_relationship(self, source: str, target: str, entry_type: str = "failure",
                         rel_type: str = "co_occurs") -> str:
        """Link two entries of one type both ways (the reverse with the inverse type) and list the
        names in their ``related_typed``. Returns ``added``, ``exists``, ``not_found:<name>`` or
        ``invalid_type:<rel_type>`` (FTL ``add_relationship``)."""
        if rel_type not in scoring.RELATIONSHIP_TYPES:
            return f"invalid_type:{rel_type}"
        entry_type = "failure" if entry_type == "failure" else "pattern"
        with self._store.session(write=True) as conn:
            src, dst = self._row(conn, source, entry_type), self._row(conn, target, entry_type)
            if src is None:
                return f"not_found:{source}"
            if dst is None:
                return f"not_found:{target}"
            if conn.execute("SELECT 1 FROM memory_edge WHERE from_id = ? AND to_id = ? AND rel_type = ?",
                            (src["id"], dst["id"], rel_type)).fetchone():
                return "exists"
            weight, now = scoring.RELATIONSHIP_WEIGHTS.get(rel_type, 0.8), self._ts()
            inverse = scoring.inverse_relationship(rel_type)
            conn.execute("INSERT OR IGNORE INTO memory_edge (from_id, to_id, rel_type, weight, created_at) "
                         "VALUES (?, ?, ?, ?, ?)", (src["id"], dst["id"], rel_type, weight, now))
            conn.execute("INSERT OR IGNORE INTO memory_edge (from_id, to_id, rel_type, weight, created_at) "
                         "VALUES (?, ?, ?, ?, ?)", (dst["id"], src["id"], inverse, weight, now))
            for row, kind, other in ((src, rel_type, target), (dst, inverse, source)):
                fresh = conn.execute("SELECT related_typed FROM memory_entry WHERE id = ?", (row["id"],)).fetchone()
                typed = json.loads(fresh[0] or "{}")
                names = typed.setdefault(kind, [])
                if other not in names:
                    names.append(other)
                conn.execute("UPDATE memory_entry SET related_typed = ? WHERE id = ?",
                             (json.dumps(typed), row["id"]))
        return "added"

    def related(self, name: str, entry_type: str = "failure", max_hops: int = 2,
                weights: dict[str, float] | None = None,
                min_weight_product: float = scoring.MIN_WEIGHT_PRODUCT) -> list[dict[str, Any]]:
        """Entries reachable from ``name`` within ``max_hops`` edges whose product of relationship
        weights stays >= ``min_weight_product``: ``[{entry, hops, weight, via}]``, heaviest first
        (FTL ``get_related_entries``, breadth first)."""
        weights = weights or scoring.RELATIONSHIP_WEIGHTS
        entry_type = "failure" if entry_type == "failure" else "pattern"
        with self._store.session() as conn:
            start = self._row(conn, name, entry_type)
            if start is None:
                return []
            entries = {r["id"]: r for r in conn.execute("SELECT * FROM memory_entry WHERE type = ?",
                                                        (entry_type,)).fetchall()}
            edges: dict[int, list[sqlite3.Row]] = {}
            for edge in conn.execute("SELECT * FROM memory_edge ORDER BY id").fetchall():
                edges.setdefault(edge["from_id"], []).append(edge)
        visited = {start["id"]: 1.0}
        level = [(start["id"], 1.0)]
        found = []
        for hop in range(1, max_hops + 1):
            following = []
            for node, weight in level:
                for edge in edges.get(node, []):
                    product = weight * weights.get(edge["rel_type"], 0.8)
                    target = edge["to_id"]
                    if product < min_weight_product or target not in entries:
                        continue
                    if target not in visited or visited[target] < product:
                        visited[target] = product
                        following.append((target, product))
                        found.append({"entry": self._entry(entries[target]), "hops": hop,
                                      "weight": round(product, 3), "via": edge["rel_type"]})
            level = following
            if not level:
                break
        found.sort(key=lambda item: (-item["weight"], item["hops"]))
        return found

    def add_cross_relationship(self, failure: str, pattern: str, rel_type: str = "solves") -> str:
        """Link a failure to a pattern (``solves`` or ``causes``; the pattern gets ``solved_by`` /
        ``caused_by``). Returns ``added``, ``exists``, ``not_found:failure:<n>``,
        ``not_found:pattern:<n>`` or ``invalid_type:<t>`` (FTL ``add_cross_relationship``)."""
        if rel_type not in scoring.CROSS_RELATIONSHIP_TYPES:
            return f"invalid_type:{rel_type}"
        with self._store.session(write=True) as conn:
            frow, prow = self._row(conn, failure, "failure"), self._row(conn, pattern, "pattern")
            if frow is None:
                return f"not_found:failure:{failure}"
            if prow is None:
                return f"not_found:pattern:{pattern}"
            fcross = json.loads(frow["cross_relationships"] or "{}")
            names = fcross.setdefault(rel_type, [])
            if pattern in names:
                return "exists"
            names.append(pattern)
            conn.execute("UPDATE memory_entry SET cross_relationships = ? WHERE id = ?",
                         (json.dumps(fcross), frow["id"]))
            inverse = "solved_by" if rel_type == "solves" else "caused_by"
            pcross = json.loads(prow["cross_relationships"] or "{}")
            pcross.setdefault(inverse, []).append(failure)
            conn.execute("UPDATE memory_entry SET cross_relationships = ? WHERE id = ?",
                         (json.dumps(pcross), prow["id"]))
        return "added"

    def solutions(self, failure: str) -> list[dict[str, Any]]:
        """Patterns listed as solving ``failure`` (FTL ``get_solutions``); [] if unknown."""
        with self._store.session() as conn:
            frow = self._row(conn, failure, "failure")
            if frow is None:
                return []
            names = json.loads(frow["cross_relationships"] or "{}").get("solves", [])
            rows = [self._row(conn, n, "pattern") for n in names]
        return [self._entry(r) for r in rows if r is not None]

    # ------------------------------------------------------------------ statistics

    def stats(self) -> dict[str, Any]:
        """Per type: ``{count, avg_importance, avg_age_days, total_access_count,
        with_relationships, health: {stale_ratio, untested_ratio, orphan_count,
        tier_distribution}}`` (FTL ``get_stats``; tiers by access count 5/2/1)."""
        now = self._now()
        with self._store.session() as conn:
            rows = conn.execute("SELECT * FROM memory_entry ORDER BY id").fetchall()
        out = {}
        for entry_type in MEMORY_TYPES:
            group = [r for r in rows if r["type"] == entry_type]
            if not group:
                out[f"{entry_type}s"] = {"count": 0, "avg_importance": 0, "avg_age_days": 0,
                                         "total_access_count": 0, "with_relationships": 0,
                                         "health": {"stale_ratio": 0, "untested_ratio": 0,
                                                    "orphan_count": 0, "tier_distribution": {}}}
                continue
            ages, stale, untested, orphans = [], 0, 0, 0
            tiers = {"critical": 0, "productive": 0, "exploration": 0, "archive": 0}
            for r in group:
                days = scoring.age_days(r["created_at"], now)
                if days is not None:
                    ages.append(days)
                    if days > 90 and r["access_count"] == 0:
                        stale += 1
                if r["times_helped"] == 0 and r["times_failed"] == 0:
                    untested += 1
                if json.loads(r["related_typed"] or "{}") == {} and json.loads(r["cross_relationships"] or "{}") == {}:
                    orphans += 1
                access = r["access_count"]
                tiers["critical" if access >= 5 else "productive" if access >= 2
                      else "exploration" if access >= 1 else "archive"] += 1
            n = len(group)
            out[f"{entry_type}s"] = {
                "count": n,
                "avg_importance": round(sum(r["importance"] for r in group) / n, 3),
                "avg_age_days": round(sum(ages) / len(ages)) if ages else 0,
                "total_access_count": sum(r["access_count"] for r in group),
                "with_relationships": sum(1 for r in group if json.loads(r["related_typed"] or "{}")),
                "health": {"stale_ratio": round(stale / n, 3), "untested_ratio": round(untested / n, 3),
                           "orphan_count": orphans, "tier_distribution": tiers}}
        return out

    def feedback_totals(self) -> dict[str, Any]:
        """``{total, with_feedback: [names], helped, failed}`` over every entry (for verify-loop)."""
        with self._store.session() as conn:
            rows = conn.execute("SELECT name, times_helped, times_failed FROM memory_entry ORDER BY id").fetchall()
        with_feedback = [r["name"] for r in rows if r["times_helped"] > 0 or r["times_failed"] > 0]
        return {"total": len(rows), "with_feedback": with_feedback,
                "helped": sum(r["times_helped"] for r in rows),
                "failed": sum(r["times_failed"] for r in rows)}
