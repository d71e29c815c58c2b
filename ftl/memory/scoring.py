"""Pure rules of ftl's memory: quality gates, importance, decay, hybrid ranking, tiers, and the
text relevance derived from SQLite FTS5 ``bm25``. No I/O; every function takes its clock value.

Source of the rules: FTL ``lib/memory.py`` (enzokro/crinzo-plugins, commit 89a2f8e), read for
behaviour: importance = log2(value + 1) x age decay (half-life 30 days) x access boost
(1 + 0.05 sqrt(accesses)) x help ratio ((helped + 1) / (helped + failed + 2)); retrieval score =
relevance x log2(value + 1) x help ratio x age decay. ftl's relevance comes from bm25 instead of
FTL's embedding / SequenceMatcher similarity (see `relevance`).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from difflib import SequenceMatcher

__all__ = [
    "DEFAULT_MAX_FAILURES", "DEFAULT_MAX_PATTERNS", "DEFAULT_HALF_LIFE_DAYS",
    "DEFAULT_MIN_IMPORTANCE", "MIN_TRIGGER_LENGTH", "MIN_FAILURE_COST", "DUPLICATE_THRESHOLD",
    "RELATIONSHIP_TYPES", "CROSS_RELATIONSHIP_TYPES", "RELATIONSHIP_WEIGHTS", "MIN_WEIGHT_PRODUCT",
    "quality_problem", "age_days", "age_decay", "help_ratio", "importance", "feedback_importance",
    "hybrid_score", "tier", "inverse_relationship", "tokens", "fts_query", "relevance",
    "is_near_duplicate",
]

DEFAULT_MAX_FAILURES = 500
DEFAULT_MAX_PATTERNS = 200
DEFAULT_HALF_LIFE_DAYS = 30.0
DEFAULT_MIN_IMPORTANCE = 0.1
MIN_TRIGGER_LENGTH = 10
MIN_FAILURE_COST = 100
DUPLICATE_THRESHOLD = 0.85
_GENERIC_TRIGGERS = frozenset({"error", "failed", "exception", "unknown"})
TIER_CRITICAL, TIER_PRODUCTIVE, TIER_EXPLORATION = 0.6, 0.4, 0.25

RELATIONSHIP_TYPES = frozenset({"co_occurs", "causes", "solves", "prerequisite", "variant"})
CROSS_RELATIONSHIP_TYPES = frozenset({"solves", "causes"})
RELATIONSHIP_WEIGHTS = {"solves": 1.5, "causes": 1.0, "prerequisite": 1.0, "co_occurs": 0.8,
                        "variant": 0.7}
MIN_WEIGHT_PRODUCT = 0.5
_INVERSE = {"co_occurs": "co_occurs", "causes": "caused_by", "caused_by": "causes",
            "solves": "solved_by", "solved_by": "solves", "prerequisite": "depends_on",
            "depends_on": "prerequisite", "variant": "variant"}


def quality_problem(entry: dict, entry_type: str) -> str | None:
    """FTL's quality gate: None when ``entry`` may be stored, else FTL's reason text
    (``trigger_too_short:N``, ``cost_too_low:N``, ``trigger_too_generic``, ``insight_too_short:N``)."""
    trigger = str(entry.get("trigger") or "")
    if len(trigger.strip()) < MIN_TRIGGER_LENGTH:
        return f"trigger_too_short:{len(trigger)}"
    if entry_type == "failure":
        cost = entry.get("cost", 0)
        if not isinstance(cost, (int, float)) or cost < MIN_FAILURE_COST:
            return f"cost_too_low:{cost}"
        if trigger.strip().lower() in _GENERIC_TRIGGERS:
            return "trigger_too_generic"
    else:
        insight = str(entry.get("insight") or "")
        if len(insight.strip()) < MIN_TRIGGER_LENGTH:
            return f"insight_too_short:{len(insight)}"
    return None


def _parse(ts: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(ts)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def age_days(created_at: str, now: datetime) -> int | None:
    """Whole days between ``created_at`` (ISO 8601) and ``now`` (aware); None if unparsable."""
    created = _parse(created_at)
    if created is None:
        return None
    return (now - created).days


def age_decay(created_at: str, now: datetime, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> float:
    """0.5 ** (age in whole days / half-life days); 1.0 for an unparsable timestamp."""
    days = age_days(created_at, now)
    return 1.0 if days is None else math.pow(0.5, days / half_life_days)


def help_ratio(times_helped: int, times_failed: int) -> float:
    """(helped + 1) / (helped + failed + 2): 0.5 without feedback, towards 1 when it helps."""
    return (times_helped + 1) / (times_helped + times_failed + 2)


def _base(value: float) -> float:
    # A NaN or infinite value (stored before ftl refused them) ranks as no value, not forever.
    return math.log2(value + 1) if value > 0 and math.isfinite(value) else 0.0


def importance(value: float, times_helped: int, times_failed: int, access_count: int,
               created_at: str, now: datetime, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> float:
    """Importance with age decay (used at insert and by prune); ``value`` is a failure's cost or a
    pattern's saved tokens."""
    return (_base(value) * age_decay(created_at, now, half_life_days)
            * (1 + 0.05 * math.sqrt(access_count)) * help_ratio(times_helped, times_failed))


def feedback_importance(value: float, times_helped: int, times_failed: int, access_count: int) -> float:
    """Importance recomputed after feedback: as `importance` without the age decay (FTL's rule)."""
    return _base(value) * help_ratio(times_helped, times_failed) * (1 + 0.05 * math.sqrt(access_count))


def hybrid_score(relevance_value: float, value: float, times_helped: int, times_failed: int,
                 created_at: str, now: datetime, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> float:
    """Retrieval score: relevance x log2(value + 1) x help ratio x age decay (0 when value <= 0)."""
    if not value > 0 or not math.isfinite(value):
        return 0.0
    return (relevance_value * math.log2(value + 1) * help_ratio(times_helped, times_failed)
            * age_decay(created_at, now, half_life_days))


def tier(relevance_value: float) -> str:
    """critical (>= 0.6), productive (>= 0.4), exploration (>= 0.25) or archive."""
    if relevance_value >= TIER_CRITICAL:
        return "critical"
    if relevance_value >= TIER_PRODUCTIVE:
        return "productive"
    if relevance_value >= TIER_EXPLORATION:
        return "exploration"
    return "archive"


def inverse_relationship(rel_type: str) -> str:
    """The reverse edge's type (causes <-> caused_by, solves <-> solved_by, ...)."""
    return _INVERSE.get(rel_type, rel_type)


_TOKEN = re.compile(r"[0-9a-z]+")
_STOPWORDS = frozenset({"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is",
                        "it", "of", "on", "or", "the", "to", "with"})


def tokens(text: str) -> list[str]:
    """Distinct lower-case alphanumeric words of ``text`` (FTS5 unicode61's split), stopwords and
    one-letter words removed, in first-seen order. The index stems them (Porter)."""
    seen: dict[str, None] = {}
    for word in _TOKEN.findall((text or "").lower()):
        if len(word) > 1 and word not in _STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)


def fts_query(text: str) -> str | None:
    """An FTS5 MATCH expression: every token of ``text`` quoted, joined by OR; None if no token."""
    words = tokens(text)
    return " OR ".join(f'"{w}"' for w in words) if words else None


def relevance(bm25_score: float, best_bm25: float, coverage: float) -> float:
    """Relevance in [0, 1] of an FTS5 match.

    Args:
        bm25_score: the entry's ``bm25(memory_fts)`` (negative; more negative = better).
        best_bm25: the best (most negative) score among the matches of the same query.
        coverage: the share of the query's words the entry matches (0-1).

    bm25 alone is relative to the corpus (with one entry its IDF is clamped near zero), so it
    only orders the matches: relevance = (bm25 / best bm25) x coverage. The best match covering
    every query word scores 1.0.
    """
    if best_bm25 >= 0 or coverage <= 0:
        return 0.0
    return max(0.0, min(1.0, (bm25_score / best_bm25) * coverage))


def is_near_duplicate(a: str, b: str) -> bool:
    """FTL's duplicate rule without embeddings: difflib ratio of the lower-cased triggers > 0.85."""
    if not a or not b:
        return False
    matcher = SequenceMatcher(None, a.lower(), b.lower())
    # The cheap upper bounds first (difflib's documented idiom): same answer, most pairs end early.
    return (matcher.real_quick_ratio() > DUPLICATE_THRESHOLD and matcher.quick_ratio() > DUPLICATE_THRESHOLD
            and matcher.ratio() > DUPLICATE_THRESHOLD)
