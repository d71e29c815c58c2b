"""Memory's rules over the store's memory tables: failures and patterns that outlive campaigns,
with FTL's quality gate and merge rules, bm25 relevance and hybrid ranking for an objective,
typed relationships and their walks, feedback and pruning (FTL ``lib/memory.py``, commit 89a2f8e,
read for behaviour; the formulas are in `ftl.memory.scoring`).

No SQL here: the tables and every statement on them are the store's
(`ftl.store.memory_tables`, created by migration 5 of ``ftl.store.MIGRATIONS``). Where a rule
decides a write (is this trigger a repeat? which entries does prune delete? what is an entry's
importance after feedback?), `MemoryStore` hands the rule to the store's method, which applies
it inside its write transaction. Entries are dicts in the store's entry shape
(``Store.memory_entry``); `MemoryStore.ftl_view` narrows one to FTL's keys.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Iterable

from ftl.errors import FtlError
from ftl.memory import scoring
from ftl.store.memory_tables import MEMORY_TYPES, extra_fields

__all__ = ["MemoryStore", "MEMORY_TYPES"]


def _violation(path: str, message: str, fix: str) -> FtlError:
    return FtlError("schema_invalid", {"count": 1, "violations": [
        {"path": path, "message": message, "fix": fix}]}, message=f"Invalid {path}: {message}.")


def _check_type(entry_type: str) -> str:
    if entry_type not in MEMORY_TYPES:
        raise _violation("type", f"must be failure or pattern, got {entry_type!r}",
                         "pass --type failure or --type pattern")
    return entry_type


def _number(value: Any, path: str) -> float:
    """``value`` when it is a finite int or float (not a bool).

    Raises: FtlError(schema_invalid) at ``path`` otherwise: NaN and the infinities too, which
    ``json.loads`` accepts but SQLite stores as NULL and importance cannot rank.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _violation(path, "must be a number", f"give {path} as a number of tokens")
    if not math.isfinite(value):
        raise _violation(path, f"must be a finite number, got {value!r}",
                         f"give {path} as a finite number of tokens")
    return value


def _name_lists(value: Any, path: str) -> dict[str, list[str]]:
    """``value`` as a relationship map: a JSON object from relationship type to a list of entry
    names, the shape `add_relationship`, `add_cross_relationship` and `solutions` read and
    extend; None (or a missing key) is the empty map.

    Raises: FtlError(schema_invalid) at ``path`` (or ``path.<type>``) for any other shape.
    """
    if value is None:
        return {}
    fix = f'give {path} as {{"<relationship type>": ["<entry name>", ...]}}, or leave it out'
    if not isinstance(value, dict):
        raise _violation(path, f"must be a JSON object, got {type(value).__name__}", fix)
    for key, names in value.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _violation(f"{path}.{key}", "must be a list of entry names (strings)", fix)
    return value


class MemoryStore:
    """The memory of one `ftl.store.Store` (its file, its lock, its clock). Cheap to build:
    callers make one where they need it, ``MemoryStore(store)``.

    Args:
        store: the `ftl.store.Store` whose memory tables hold the entries.
    """

    def __init__(self, store: Any) -> None:
        self._store = store

    def _now(self) -> datetime:
        moment = self._store.clock()
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

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

    # ------------------------------------------------------------------ writing entries

    def _columns(self, entry: Any) -> tuple[dict[str, Any], float]:
        """``entry`` checked and put in the store's columns (`Store.add_memory_entry`), and its
        value (a failure's cost, a pattern's saved tokens) as a number.

        Raises: FtlError(schema_invalid) naming a missing or malformed key: a value that is not
        a finite number, or a ``related_typed`` / ``cross_relationships`` that is not an object
        of lists of names.
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
        created = entry.get("created_at") if isinstance(entry.get("created_at"), str) else self._store.now()
        return {
            "name": name, "type": entry_type, "trigger": trigger, "resolution": resolution,
            "match": entry.get("match") if entry_type == "failure" else None, "cost": value,
            "source": source, "extra": extra_fields(entry), "campaign_id": entry.get("campaign_id"),
            "created_at": created, "importance": scoring.importance(value, 0, 0, 0, created, self._now()),
            "related_typed": _name_lists(entry.get("related_typed"), "related_typed"),
            "cross_relationships": _name_lists(entry.get("cross_relationships"),
                                               "cross_relationships")}, value

    @staticmethod
    def _repeats(trigger: str) -> Any:
        """The near-duplicate rule for a new entry's trigger (`scoring.is_near_duplicate`); None
        for an empty trigger, which repeats nothing."""
        if not trigger:
            return None
        return lambda stored: scoring.is_near_duplicate(trigger, stored)

    def add(self, entry: dict[str, Any], *, validate: bool = True) -> str:
        """Add a failure or pattern with FTL's merge rules (FTL ``add_failure`` / ``add_pattern``).

        ``entry``: ``{name, type: failure|pattern, trigger, fix | insight, cost | saved (tokens,
        a finite number), match?, source?: [ids], campaign_id?, related_typed?,
        cross_relationships?, ...}``, the two maps as ``{relationship type: [entry names]}``;
        other keys are kept as extra fields.

        Returns FTL's status text: ``added``; for a failure ``merged:<name>`` (same name, or a
        trigger more than 85 % similar: sources united, the higher cost kept, occurrences + 1); for
        a pattern ``duplicate:<name>`` (left unchanged); ``rejected:<reason>`` when ``validate``
        and the quality gate refuses it (`scoring.quality_problem`).

        Raises: FtlError(schema_invalid) naming a missing or malformed key.
        """
        columns, value = self._columns(entry)
        entry_type = columns["type"]
        if validate:
            problem = scoring.quality_problem({**entry, "cost": value} if entry_type == "failure"
                                              else entry, entry_type)
            if problem:
                return f"rejected:{problem}"
        failure = entry_type == "failure"
        added, name = self._store.add_memory_entry(columns, similar=self._repeats(columns["trigger"]),
                                                   merge=failure, keep_higher_cost=True)
        return "added" if added else f"{'merged' if failure else 'duplicate'}:{name}"

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Store an entry the runner extracted (no quality gate): an entry already known by the
        same name and type gets its sources united and occurrences + 1 (a failure also keeps
        the higher cost); otherwise it is added. Returns the stored entry (`get` shape).

        Unlike `add` (FTL's rule for entries a person or agent writes), a similar trigger does
        not merge: extracted names already say what failed (`ftl.server.tools.observer
        .failure_name`), and triggers of unrelated failures can be over 85 % alike (the
        headline of every verify failure differs only by its task number).

        Raises: FtlError(schema_invalid) naming a missing or malformed key (``entry`` has
        `add`'s shape).
        """
        columns, _ = self._columns(entry)
        entry_type = columns["type"]
        _, name = self._store.add_memory_entry(columns, similar=None, merge=True,
                                               keep_higher_cost=entry_type == "failure")
        return self.get(name, entry_type)

    def get(self, name: str, entry_type: str = "failure") -> dict[str, Any] | None:
        """One entry by name and type, or None.

        Raises: FtlError(schema_invalid) for a type other than failure or pattern.
        """
        return self._store.memory_entry(name, _check_type(entry_type))

    def entries(self, entry_type: str | None = None, limit: int | None = None,
                order: str = "importance") -> list[dict[str, Any]]:
        """Entries of one type (or both), most important first (``order="importance"``), or by
        value (``"value"``: cost / saved), or by frequency (``"occurrences"``); at most ``limit``.

        Raises: FtlError(schema_invalid) for a type other than failure or pattern.
        """
        if entry_type is not None:
            _check_type(entry_type)
        return self._store.memory_entries(entry_type, order=order, limit=limit)

    # ------------------------------------------------------------------ retrieval

    def _matches(self, text: str, entry_type: str | None) -> dict[int, float]:
        """Entry id -> relevance in [0, 1] for ``text`` (FTS5 bm25 relative to the best match of
        the same type, times the share of the query's words matched; `scoring.relevance`)."""
        expression = scoring.fts_query(text)
        if expression is None:
            return {}
        ranks = self._store.memory_text_ranks(expression, entry_type)
        if not ranks:
            return {}
        best: dict[str, float] = {}  # per type: failures and patterns are ranked apart
        for _, kind, rank in ranks:
            best[kind] = min(best.get(kind, 0.0), rank)
        words = scoring.tokens(text)
        # Which query words each entry matches, by the same (Porter-stemmed) index.
        hits = self._store.memory_term_hits(f'"{word}"' for word in words)
        return {row_id: scoring.relevance(rank, best[kind], hits.get(row_id, 0) / len(words))
                for row_id, kind, rank in ranks}

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
        # A type asked for none is not read; the text search runs only when there are entries.
        wanted = {entry_type: self._store.memory_entries_by_id(entry_type) if limit > 0 else {}
                  for entry_type, limit in (("failure", max_failures), ("pattern", max_patterns))}
        matches = self._matches(objective, None) if objective and any(wanted.values()) else {}
        for entry_type, limit in (("failure", max_failures), ("pattern", max_patterns)):
            entries = wanted[entry_type]
            value_key = "cost" if entry_type == "failure" else "saved"
            if objective:
                scored = []
                for row_id, entry in entries.items():
                    rel = matches.get(row_id, 0.0)
                    score = scoring.hybrid_score(rel, entry[value_key], entry["times_helped"],
                                                 entry["times_failed"], entry["created_at"], now)
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
                chosen = sorted(entries.values(), key=lambda e: -(e.get(value_key) or 0))[:limit]
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
        matches = self._matches(topic, None)
        # An entry without a match scores 0.0, so only a negative threshold needs every entry.
        wanted = None if threshold < 0 else [row_id for row_id, score in matches.items() if score > threshold]
        results = []
        if wanted != []:
            for row_id, entry in self._store.memory_entries_by_id(ids=wanted).items():
                score = matches.get(row_id, 0.0)
                if score > threshold:
                    entry["score"] = round(score, 3)
                    results.append(entry)
        return sorted(results, key=lambda e: -e["score"])

    def track_access(self, names: Iterable[str], entry_type: str = "failure") -> None:
        """access_count + 1 and last_accessed = now for each named entry of ``entry_type``."""
        names = [n for n in names if n]
        if names:
            self._store.count_memory_access(names, entry_type)

    # ------------------------------------------------------------------ feedback and pruning

    def feedback(self, name: str, entry_type: str = "failure", helped: bool = True) -> str:
        """Count one injection of the entry as helpful (``helped``) or not and recompute its
        importance (`scoring.feedback_importance`). Returns ``updated`` or ``not_found``.

        Raises: FtlError(schema_invalid) for a type other than failure or pattern.
        """
        counted = self._store.count_memory_feedback(name, _check_type(entry_type), helped,
                                                    _feedback_importance)
        return "updated" if counted else "not_found"

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
        counts = [(name, entry_type, (name, entry_type) in used) for name, entry_type in sorted(shown)]
        counted = self._store.count_memory_feedback_batch(counts, _feedback_importance,
                                                          once_key=once_key)
        for (_, _, helped), updated in zip(counts, counted or []):
            if updated:
                result["helped" if helped else "not_helped"] += 1
        return result

    def prune(self, *, max_failures: int = scoring.DEFAULT_MAX_FAILURES,
              max_patterns: int = scoring.DEFAULT_MAX_PATTERNS,
              min_importance: float = scoring.DEFAULT_MIN_IMPORTANCE,
              half_life_days: float = scoring.DEFAULT_HALF_LIFE_DAYS) -> dict[str, int]:
        """Delete the least useful entries: importance recomputed with decay (`scoring.importance`);
        entries below ``min_importance`` go, then all but the ``max_*`` most important per type.
        Edges of deleted entries go with them. Returns ``{pruned_failures, pruned_patterns,
        remaining_failures, remaining_patterns, orphaned_edges_removed}``.

        Raises: FtlError(schema_invalid) for a half-life <= 0 days.
        """
        if half_life_days <= 0:
            raise _violation("--half-life", "must be > 0", "give a half-life in days, e.g. 30")
        now = self._now()
        limits = {"failure": max_failures, "pattern": max_patterns}

        def doomed(entry_type: str, rows: list[dict[str, Any]]) -> list[int]:
            scored = [(r["id"], scoring.importance(r["cost"], r["times_helped"], r["times_failed"],
                                                   r["access_count"], r["created_at"], now,
                                                   half_life_days)) for r in rows]
            kept = sorted((s for s in scored if s[1] >= min_importance), key=lambda s: -s[1])
            keep = {i for i, _ in kept[:max(0, limits[entry_type])]}
            return [i for i, _ in scored if i not in keep]

        counts = self._store.prune_memory(doomed)
        return {"pruned_failures": counts["failure"]["deleted"], "pruned_patterns": counts["pattern"]["deleted"],
                "remaining_failures": counts["failure"]["remaining"],
                "remaining_patterns": counts["pattern"]["remaining"],
                "orphaned_edges_removed": counts["edges_removed"]}

    # ------------------------------------------------------------------ relationships

    def add_relationship(self, source: str, target: str, entry_type: str = "failure",
                         rel_type: str = "co_occurs") -> str:
        """Link two entries of one type both ways (the reverse with the inverse type) and list the
        names in their ``related_typed``. Returns ``added``, ``exists``, ``not_found:<name>`` or
        ``invalid_type:<rel_type>`` (FTL ``add_relationship``)."""
        if rel_type not in scoring.RELATIONSHIP_TYPES:
            return f"invalid_type:{rel_type}"
        entry_type = "failure" if entry_type == "failure" else "pattern"
        outcome = self._store.link_memory_entries(
            entry_type, source, target, rel_type, scoring.inverse_relationship(rel_type),
            scoring.RELATIONSHIP_WEIGHTS.get(rel_type, 0.8))
        return {"no_source": f"not_found:{source}", "no_target": f"not_found:{target}"}.get(outcome, outcome)

    def related(self, name: str, entry_type: str = "failure", max_hops: int = 2,
                weights: dict[str, float] | None = None,
                min_weight_product: float = scoring.MIN_WEIGHT_PRODUCT) -> list[dict[str, Any]]:
        """Entries reachable from ``name`` within ``max_hops`` edges whose product of relationship
        weights stays >= ``min_weight_product``: ``[{entry, hops, weight, via}]``, heaviest first
        (FTL ``get_related_entries``).

        Each entry is listed once, with its heaviest path (fewest hops on a tie): ``weight`` is
        that path's product, ``hops`` its length and ``via`` the relationship of its last edge.
        Paths never pass through an entry twice, so the start is never related to itself and a
        cycle cannot raise a weight (``solves`` weighs 1.5, and ``solves`` followed by its
        inverse weighs more than the direct edge). A path goes on from an entry only when no
        path walked before reached it at least as heavy in as few hops, which keeps the walk
        small on densely linked memories (a campaign's failures all co_occur).
        """
        weights = weights or scoring.RELATIONSHIP_WEIGHTS
        entry_type = "failure" if entry_type == "failure" else "pattern"
        names = self._store.memory_names(entry_type)
        start = next((row_id for row_id, other in names.items() if other == name), None)
        if start is None:
            return []
        edges: dict[int, list[tuple[int, str]]] = {}
        for from_id, to_id, rel_type in self._store.memory_edges():
            edges.setdefault(from_id, []).append((to_id, rel_type))
        best: dict[int, tuple[float, int, str]] = {}  # entry id -> (weight, hops, via)
        # entry id -> (weight, hops, path) of the paths walked on from there
        arrivals: dict[int, list[tuple[float, int, frozenset[int]]]] = {}
        stack: list[tuple[int, float, int, frozenset[int]]] = [(start, 1.0, 0, frozenset({start}))]
        while stack:
            node, weight, hops, path = stack.pop()
            if hops >= max_hops:
                continue
            for target, rel_type in edges.get(node, []):
                product = weight * weights.get(rel_type, 0.8)
                if target in path or target not in names or product < min_weight_product:
                    continue
                reached = arrivals.setdefault(target, [])
                walked = path | {target}
                if any(w >= product and h <= hops + 1 and p <= walked for w, h, p in reached):
                    # an earlier path got here at least as heavy, in as few hops, through no
                    # entry this one avoids: every way on from here is open to it too
                    continue
                reached.append((product, hops + 1, walked))
                known = best.get(target)
                if known is None or (product, -(hops + 1)) > (known[0], -known[1]):
                    best[target] = (product, hops + 1, rel_type)
                stack.append((target, product, hops + 1, walked))
        entries = self._store.memory_entries_by_id(entry_type, ids=set(best)) if best else {}
        # An entry deleted by another process since `memory_names` is left out.
        found = [{"entry": dict(entries[target]), "hops": hops, "weight": round(weight, 3),
                  "via": via} for target, (weight, hops, via) in best.items() if target in entries]
        found.sort(key=lambda item: (-item["weight"], item["hops"], item["entry"]["name"]))
        return found

    def add_cross_relationship(self, failure: str, pattern: str, rel_type: str = "solves") -> str:
        """Link a failure to a pattern (``solves`` or ``causes``; the pattern gets ``solved_by`` /
        ``caused_by``). Returns ``added``, ``exists``, ``not_found:failure:<n>``,
        ``not_found:pattern:<n>`` or ``invalid_type:<t>`` (FTL ``add_cross_relationship``)."""
        if rel_type not in scoring.CROSS_RELATIONSHIP_TYPES:
            return f"invalid_type:{rel_type}"
        inverse = "solved_by" if rel_type == "solves" else "caused_by"
        outcome = self._store.link_memory_cross(failure, pattern, rel_type, inverse)
        return {"no_failure": f"not_found:failure:{failure}",
                "no_pattern": f"not_found:pattern:{pattern}"}.get(outcome, outcome)

    def solutions(self, failure: str) -> list[dict[str, Any]]:
        """Patterns listed as solving ``failure`` (FTL ``get_solutions``); [] if unknown."""
        entry = self._store.memory_entry(failure, "failure")
        if entry is None:
            return []
        found = (self._store.memory_entry(name, "pattern")
                 for name in entry["cross_relationships"].get("solves", []))
        return [pattern for pattern in found if pattern is not None]

    # ------------------------------------------------------------------ statistics

    def stats(self) -> dict[str, Any]:
        """Per type: ``{count, avg_importance, avg_age_days, total_access_count,
        with_relationships, health: {stale_ratio, untested_ratio, orphan_count,
        tier_distribution}}`` (FTL ``get_stats``; tiers by access count 5/2/1)."""
        now = self._now()
        rows = self._store.memory_stat_rows()
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
                if r["related_typed"] == {} and r["cross_relationships"] == {}:
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
                "with_relationships": sum(1 for r in group if r["related_typed"]),
                "health": {"stale_ratio": round(stale / n, 3), "untested_ratio": round(untested / n, 3),
                           "orphan_count": orphans, "tier_distribution": tiers}}
        return out

    def feedback_totals(self) -> dict[str, Any]:
        """``{total, with_feedback: [names], helped, failed}`` over every entry (for verify-loop)."""
        rows = self._store.memory_feedback_counts()
        with_feedback = [name for name, helped, failed in rows if helped > 0 or failed > 0]
        return {"total": len(rows), "with_feedback": with_feedback,
                "helped": sum(r[1] for r in rows), "failed": sum(r[2] for r in rows)}


def _feedback_importance(counters: dict[str, Any]) -> float:
    """An entry's importance after a feedback count (`scoring.feedback_importance`)."""
    return scoring.feedback_importance(counters["cost"], counters["times_helped"],
                                       counters["times_failed"], counters["access_count"])
