"""Memory's tables: failures and patterns that outlive campaigns (``memory_entry``), the typed
edges between entries (``memory_edge``), an FTS5 index over their text (``memory_fts``, kept in
step by triggers) and the builder feedback already counted (``memory_feedback_seen``). Migration
5 (`ftl.store.schema`) creates them.

Table-level operations only: each method is one statement or one transaction. The rules (the
quality gate, which trigger is a near-duplicate, importance, ranking, relationship walks, FTL's
status texts) belong to the memory room (`ftl.memory`), which passes a rule in as a function
where it must run inside a write transaction (`add_memory_entry`, `count_memory_feedback`,
`prune_memory`), so that two processes cannot interleave a read and the write it decides.

Entries come back as dicts in the memory room's shape: FTL's keys (``fix``, ``match``, ``cost``
for a failure; ``insight``, ``saved`` for a pattern), the counters and relationship maps, the
extra keys the entry was given, then ftl's ``campaign_id``, ``occurrences`` and ``updated_at``.
The JSON columns are written by ``json.dumps`` with its defaults, which keeps the order of an
entry's extra keys (the store's `_dumps` sorts keys).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable

from ftl.errors import FtlError


MEMORY_TYPES = ("failure", "pattern")

#: The keys of an entry stored in columns of their own (`extra_fields` keeps the others).
_CORE_KEYS = frozenset({"name", "type", "trigger", "fix", "insight", "match", "cost", "saved",
                        "source", "campaign_id", "occurrences", "created_at", "updated_at",
                        "last_accessed", "access_count", "times_helped", "times_failed",
                        "importance", "related_typed", "cross_relationships", "related"})

# `memory_entries` orders; each ends on a unique key so the order is total.
_ORDERS = {"importance": "importance DESC, id", "value": "cost DESC, id",
           "occurrences": "occurrences DESC, updated_at DESC, id DESC", "id": "id"}


def extra_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``entry`` that have no column of their own: stored as the entry's ``extra``
    and given back with it."""
    return {k: v for k, v in entry.items() if k not in _CORE_KEYS}


def _int_if_whole(value: float) -> int | float:
    if not math.isfinite(value):  # stored before ftl refused NaN and infinities: no value
        return 0
    return int(value) if float(value).is_integer() else value


def _entry(row: Any) -> dict[str, Any]:
    """A ``memory_entry`` row as an entry (the shape the module docstring describes)."""
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
    entry["related_typed"] = _relationships(row["related_typed"])
    entry["cross_relationships"] = _relationships(row["cross_relationships"])
    for key, value in json.loads(row["extra"] or "{}").items():
        entry.setdefault(key, value)
    entry.update(campaign_id=row["campaign_id"], occurrences=row["occurrences"],
                 updated_at=row["updated_at"])
    return entry


def _relationships(text: str | None) -> dict[str, list[str]]:
    """A stored ``related_typed`` / ``cross_relationships`` column as ``{type: [names]}``.

    Rows written before ftl checked these maps may hold another shape (a list, a type mapped to
    a bare name or to a number, text that is not JSON): what is a name is kept (a bare name as a
    one-name list), the rest is left out, so reading or linking such an entry never fails."""
    try:
        value = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    found: dict[str, list[str]] = {}
    for kind, names in value.items():
        items = names if isinstance(names, list) else [names]
        found[str(kind)] = [name for name in items if isinstance(name, str)]
    return found


def _json(value: Any, what: str) -> str:
    """``value`` as a column's JSON text (key order kept). Raises FtlError(schema_invalid) for
    NaN or an infinity, which SQLite's JSON functions reject as malformed."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError as exc:
        raise FtlError("schema_invalid", {"count": 1, "violations": [{
            "path": what, "message": f"must be JSON without NaN or infinity ({exc})"}]}) from None


def _united(stored: str | None, source: Iterable[Any]) -> str:
    """The JSON list ``stored`` with the items of ``source`` it lacks appended."""
    merged = json.loads(stored or "[]")
    merged += [s for s in source if s not in merged]
    return json.dumps(merged)


class MemoryTablesMixin:
    """`ftl.store.Store`'s memory tables. Uses the store's ``_session`` and ``_now``."""

    # ------------------------------------------------------------------ reading entries

    def memory_entry(self, name: str, entry_type: str) -> dict[str, Any] | None:
        """The entry ``(name, entry_type)``, or None."""
        with self._session() as conn:
            row = conn.execute("SELECT * FROM memory_entry WHERE name = ? AND type = ?",
                               (name, entry_type)).fetchone()
        return None if row is None else _entry(row)

    def memory_entries(self, entry_type: str | None = None, *, order: str = "importance",
                       limit: int | None = None) -> list[dict[str, Any]]:
        """Entries of one type (None: both), at most ``limit``, ordered by ``order``:
        ``importance`` (highest first), ``value`` (cost / saved, highest first), ``occurrences``
        (most first, then most recently updated) or ``id`` (oldest first).

        Raises: KeyError for another ``order`` (a caller's bug, not input).
        """
        query, args = "SELECT * FROM memory_entry", []
        if entry_type is not None:
            query += " WHERE type = ?"
            args.append(entry_type)
        query += f" ORDER BY {_ORDERS[order]}"
        if limit is not None:
            query += " LIMIT ?"
            args.append(limit)
        with self._session() as conn:
            rows = conn.execute(query, args).fetchall()
        return [_entry(r) for r in rows]

    def memory_entries_by_id(self, entry_type: str | None = None,
                             ids: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
        """Row id -> entry for the entries of one type (None: both), only those in ``ids`` if
        given, oldest first. The ids are what `memory_names`, `memory_text_ranks`,
        `memory_term_hits` and `memory_edges` name entries by."""
        query, where, args = "SELECT * FROM memory_entry", [], []
        if entry_type is not None:
            where.append("type = ?")
            args.append(entry_type)
        if ids is not None:
            where.append("id IN (SELECT value FROM json_each(?))")  # one parameter, any count
            args.append(json.dumps(list(ids)))
        if where:
            query += " WHERE " + " AND ".join(where)
        with self._session() as conn:
            rows = conn.execute(query + " ORDER BY id", args).fetchall()
        return {r["id"]: _entry(r) for r in rows}

    def memory_names(self, entry_type: str) -> dict[int, str]:
        """Row id -> name of the entries of ``entry_type``, oldest first (no entry is decoded)."""
        with self._session() as conn:
            return {r[0]: r[1] for r in conn.execute(
                "SELECT id, name FROM memory_entry WHERE type = ? ORDER BY id", (entry_type,))}

    def memory_text_ranks(self, expression: str, entry_type: str | None = None) -> list[tuple[int, str, float]]:
        """``(id, type, bm25)`` of every entry whose trigger or resolution matches the FTS5 MATCH
        ``expression``; bm25 is negative, lower is a better match (SQLite FTS5 ``bm25()``).

        Raises: FtlError(internal_error) for an expression FTS5 cannot parse (the memory room
        quotes every term, `ftl.memory.scoring.fts_query`).
        """
        query = ("SELECT e.id, e.type, bm25(memory_fts) FROM memory_fts "
                 "JOIN memory_entry e ON e.id = memory_fts.rowid WHERE memory_fts MATCH ?")
        args: list[Any] = [expression]
        if entry_type is not None:
            query += " AND e.type = ?"
            args.append(entry_type)
        with self._session() as conn:
            return [(r[0], r[1], r[2]) for r in conn.execute(query, args)]

    def memory_term_hits(self, terms: Iterable[str]) -> dict[int, int]:
        """Entry id -> how many of ``terms`` (FTS5 MATCH expressions, one per term) it matches."""
        hits: dict[int, int] = {}
        with self._session() as conn:
            for term in terms:
                for (rowid,) in conn.execute("SELECT rowid FROM memory_fts WHERE memory_fts MATCH ?", (term,)):
                    hits[rowid] = hits.get(rowid, 0) + 1
        return hits

    def memory_edges(self) -> list[tuple[int, int, str]]:
        """Every relationship edge as ``(from_id, to_id, rel_type)``, oldest first."""
        with self._session() as conn:
            return [(r[0], r[1], r[2]) for r in
                    conn.execute("SELECT from_id, to_id, rel_type FROM memory_edge ORDER BY id")]

    def memory_stat_rows(self) -> list[dict[str, Any]]:
        """What statistics need of every entry, oldest first: ``{type, created_at, access_count,
        times_helped, times_failed, importance, related_typed: {..}, cross_relationships: {..}}``."""
        with self._session() as conn:
            rows = conn.execute("SELECT type, created_at, access_count, times_helped, times_failed, "
                                "importance, related_typed, cross_relationships FROM memory_entry "
                                "ORDER BY id").fetchall()
        return [{"type": r[0], "created_at": r[1], "access_count": r[2], "times_helped": r[3],
                 "times_failed": r[4], "importance": r[5], "related_typed": _relationships(r[6]),
                 "cross_relationships": _relationships(r[7])} for r in rows]

    def memory_feedback_counts(self) -> list[tuple[str, int, int]]:
        """``(name, times_helped, times_failed)`` of every entry, oldest first."""
        with self._session() as conn:
            return [(r[0], r[1], r[2]) for r in conn.execute(
                "SELECT name, times_helped, times_failed FROM memory_entry ORDER BY id")]

    # ------------------------------------------------------------------ writing entries

    def add_memory_entry(self, entry: dict[str, Any], *, similar: Callable[[str], bool] | None = None,
                         merge: bool = True, keep_higher_cost: bool = False) -> tuple[bool, str]:
        """Insert an entry, or find the one it repeats, in one write transaction.

        Args:
            entry: the columns: ``{name, type, trigger, resolution, match, cost, source: [..],
                extra: {..}, campaign_id, created_at, importance, related_typed: {..},
                cross_relationships: {..}}``; ``updated_at`` is now.
            similar: given the trigger of a stored entry of the same type, is ``entry`` a repeat
                of it? Asked, oldest entry first, only when no entry has the same name and type.
            merge: a repeat unites its sources into the stored entry and counts one more
                occurrence; without ``merge`` the stored entry is left unchanged.
            keep_higher_cost: merging also raises the stored cost to ``entry["cost"]``.

        Returns: ``(True, name)`` when inserted, else ``(False, name of the stored entry)``.
        """
        entry_type = entry["type"]
        with self._session(write=True) as conn:
            found = conn.execute("SELECT id, name, source FROM memory_entry WHERE name = ? AND type = ?",
                                 (entry["name"], entry_type)).fetchone()
            if found is None and similar is not None:
                for row in conn.execute("SELECT id, name, source, trigger FROM memory_entry "
                                        "WHERE type = ? ORDER BY id", (entry_type,)).fetchall():
                    if similar(row["trigger"]):
                        found = row
                        break
            if found is not None:
                if merge:
                    conn.execute("UPDATE memory_entry SET source = ?, occurrences = occurrences + 1, "
                                 "updated_at = ? WHERE id = ?",
                                 (_united(found["source"], entry["source"]), self._now(), found["id"]))
                    if keep_higher_cost:
                        conn.execute("UPDATE memory_entry SET cost = MAX(cost, ?) WHERE id = ?",
                                     (entry["cost"], found["id"]))
                return False, found["name"]
            conn.execute(
                "INSERT INTO memory_entry (name, type, trigger, resolution, match, cost, source, extra, "
                "campaign_id, created_at, updated_at, importance, related_typed, cross_relationships) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry["name"], entry_type, entry["trigger"], entry["resolution"], entry["match"],
                 entry["cost"], _json(entry["source"], "source"), _json(entry["extra"], "extra"),
                 entry["campaign_id"], entry["created_at"], self._now(), entry["importance"],
                 _json(entry["related_typed"], "related_typed"),
                 _json(entry["cross_relationships"], "cross_relationships")))
        return True, entry["name"]

    def count_memory_access(self, names: list[str], entry_type: str) -> None:
        """``access_count + 1`` and ``last_accessed`` = now for each named entry of ``entry_type``."""
        with self._session(write=True) as conn:
            now = self._now()
            conn.executemany("UPDATE memory_entry SET access_count = access_count + 1, last_accessed = ? "
                             "WHERE name = ? AND type = ?", [(now, n, entry_type) for n in names])

    def count_memory_feedback(self, name: str, entry_type: str, helped: bool,
                              importance: Callable[[dict[str, Any]], float]) -> bool:
        """Count one injection of the entry as helpful or not, then store
        ``importance(counters)``, ``counters`` being ``{cost, times_helped, times_failed,
        access_count}`` after the count; one write transaction. Returns False for an unknown entry."""
        with self._session(write=True) as conn:
            return _count_feedback(conn, name, entry_type, helped, importance)

    def count_memory_feedback_batch(self, counts: list[tuple[str, str, bool]],
                                    importance: Callable[[dict[str, Any]], float], *,
                                    once_key: str | None = None) -> list[bool] | None:
        """`count_memory_feedback` for each ``(name, entry_type, helped)`` of ``counts``, and the
        mark that the batch under ``once_key`` was counted, all in one write transaction: a
        crash cannot keep the mark and lose the counts. Returns each count's result, or None
        when ``once_key`` was already counted (nothing is counted again)."""
        with self._session(write=True) as conn:
            if once_key is not None and conn.execute(
                    "INSERT OR IGNORE INTO memory_feedback_seen (key, created_at) VALUES (?, ?)",
                    (once_key, self._now())).rowcount != 1:
                return None
            return [_count_feedback(conn, name, entry_type, helped, importance)
                    for name, entry_type, helped in counts]

    def prune_memory(self, doomed: Callable[[str, list[dict[str, Any]]], Iterable[int]]) -> dict[str, Any]:
        """Delete the entries ``doomed(entry_type, rows)`` names, per type, with their edges, in
        one write transaction. ``rows``: ``[{id, cost, times_helped, times_failed, access_count,
        created_at}]``, oldest first; ``doomed`` returns ids among them.

        Returns: ``{"failure": {"deleted": n, "remaining": m}, "pattern": {...},
        "edges_removed": k}``.
        """
        result: dict[str, Any] = {}
        with self._session(write=True) as conn:
            edges_before = conn.execute("SELECT COUNT(*) FROM memory_edge").fetchone()[0]
            for entry_type in MEMORY_TYPES:
                rows = [dict(r) for r in conn.execute(
                    "SELECT id, cost, times_helped, times_failed, access_count, created_at FROM memory_entry "
                    "WHERE type = ? ORDER BY id", (entry_type,))]
                ids = {r["id"] for r in rows}
                gone = [i for i in dict.fromkeys(doomed(entry_type, rows)) if i in ids]
                conn.executemany("DELETE FROM memory_edge WHERE from_id = ? OR to_id = ?", [(i, i) for i in gone])
                conn.executemany("DELETE FROM memory_entry WHERE id = ?", [(i,) for i in gone])
                result[entry_type] = {"deleted": len(gone), "remaining": len(rows) - len(gone)}
            result["edges_removed"] = edges_before - conn.execute("SELECT COUNT(*) FROM memory_edge").fetchone()[0]
        return result

    # ------------------------------------------------------------------ relationships

    def link_memory_entries(self, entry_type: str, source: str, target: str, rel_type: str,
                            inverse: str, weight: float) -> str:
        """Edges ``source -rel_type-> target`` and ``target -inverse-> source`` (both entries of
        ``entry_type``), each name listed under its edge's type in the other's ``related_typed``;
        one write transaction. Returns ``added``, ``exists`` (the forward edge was there: nothing
        written), ``no_source`` or ``no_target``."""
        with self._session(write=True) as conn:
            ids = []
            for missing, name in (("no_source", source), ("no_target", target)):
                row = conn.execute("SELECT id FROM memory_entry WHERE name = ? AND type = ?",
                                   (name, entry_type)).fetchone()
                if row is None:
                    return missing
                ids.append(row[0])
            src, dst = ids
            if conn.execute("SELECT 1 FROM memory_edge WHERE from_id = ? AND to_id = ? AND rel_type = ?",
                            (src, dst, rel_type)).fetchone():
                return "exists"
            now = self._now()
            for a, b, kind in ((src, dst, rel_type), (dst, src, inverse)):
                conn.execute("INSERT OR IGNORE INTO memory_edge (from_id, to_id, rel_type, weight, created_at) "
                             "VALUES (?, ?, ?, ?, ?)", (a, b, kind, weight, now))
            for row_id, kind, other in ((src, rel_type, target), (dst, inverse, source)):
                typed = _relationships(conn.execute("SELECT related_typed FROM memory_entry WHERE id = ?",
                                                    (row_id,)).fetchone()[0])
                names = typed.setdefault(kind, [])
                if other not in names:
                    names.append(other)
                conn.execute("UPDATE memory_entry SET related_typed = ? WHERE id = ?", (json.dumps(typed), row_id))
        return "added"

    def link_memory_cross(self, failure: str, pattern: str, rel_type: str, inverse: str) -> str:
        """List ``pattern`` under ``rel_type`` in the failure's ``cross_relationships`` and
        ``failure`` under ``inverse`` in the pattern's; one write transaction. Returns ``added``,
        ``exists`` (the failure lists the pattern already: nothing written), ``no_failure`` or
        ``no_pattern``."""
        with self._session(write=True) as conn:
            rows = {}
            for name, entry_type in ((failure, "failure"), (pattern, "pattern")):
                row = conn.execute("SELECT id, cross_relationships FROM memory_entry WHERE name = ? AND type = ?",
                                   (name, entry_type)).fetchone()
                if row is None:
                    return f"no_{entry_type}"
                rows[entry_type] = (row[0], _relationships(row[1]))
            (fid, fcross), (pid, pcross) = rows["failure"], rows["pattern"]
            names = fcross.setdefault(rel_type, [])
            if pattern in names:
                return "exists"
            names.append(pattern)
            pcross.setdefault(inverse, []).append(failure)
            conn.executemany("UPDATE memory_entry SET cross_relationships = ? WHERE id = ?",
                             [(json.dumps(fcross), fid), (json.dumps(pcross), pid)])
        return "added"


def _count_feedback(conn: Any, name: str, entry_type: str, helped: bool,
                    importance: Callable[[dict[str, Any]], float]) -> bool:
    """One feedback count inside the caller's write transaction (`count_memory_feedback`)."""
    column = "times_helped" if helped else "times_failed"
    row = conn.execute("SELECT id FROM memory_entry WHERE name = ? AND type = ?",
                       (name, entry_type)).fetchone()
    if row is None:
        return False
    conn.execute(f"UPDATE memory_entry SET {column} = {column} + 1 WHERE id = ?", (row[0],))
    counters = conn.execute("SELECT cost, times_helped, times_failed, access_count FROM memory_entry "
                            "WHERE id = ?", (row[0],)).fetchone()
    conn.execute("UPDATE memory_entry SET importance = ? WHERE id = ?",
                 (importance(dict(counters)), row[0]))
    return True
