"""FTL-compatible ``memory.py``: failures and patterns that outlive campaigns, over ftl's store.

FTL memory.py (enzokro/crinzo-plugins ``ftl/lib/memory.py``, commit 89a2f8e) with the same
commands, arguments and payloads, on `ftl.memory.MemoryStore` (``<repo>/.ftl/ftl.db``). Text
relevance comes from SQLite FTS5 bm25 instead of FTL's embeddings / difflib ratio, so the
``_relevance``, ``_score`` and ``score`` numbers differ (docs/ftl-compat.md). Output and exit
codes: see ``lib/_common.py``; entries print with FTL's keys in the FTL output mode and with
ftl's extra keys (campaign_id, occurrences, updated_at) in the envelope's ``data``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import click

from _common import Env, FtlRefusal, Reply, command, script_group, violation, wrap
from ftl.memory import scoring

cli = script_group("memory.py", "Failures and patterns remembered across campaigns (FTL memory.py).")

_TYPE = click.option("--type", "entry_type", type=click.Choice(["failure", "pattern"]), default="failure",
                     show_default=True, help="Entry type.")


def _memory(env: Env):
    from ftl.memory import MemoryStore

    return MemoryStore(env.store)


def _views(entries: list[dict]) -> list[dict]:
    from ftl.memory import MemoryStore

    return [MemoryStore.ftl_view(e) for e in entries]


def _json_object(text: str, option: str) -> dict:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise violation(option, "is not valid JSON", "pass one JSON object, e.g. '{\"name\": ...}'") from None
    if not isinstance(value, dict):
        raise violation(option, "must be a JSON object", "pass one JSON object")
    return value


@command(cli, "context")
@click.option("--type", "task_type", default="BUILD", show_default=True,
              help="Task type SPEC, BUILD or VERIFY (accepted, as in FTL; not used for ranking).")
@click.option("--tags", default=None, help="Comma-separated tags (accepted, as in FTL; not used).")
@click.option("--objective", default=None, help="Rank by relevance to this text (FTS5 bm25).")
@click.option("--max-failures", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--max-patterns", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--all", "everything", is_flag=True, help="Up to 100 of each, by value, no objective.")
@click.option("--include-tiers", is_flag=True, help="Add _tier (critical/productive/exploration/archive).")
def context(env: Env, task_type: str, tags: str | None, objective: str | None, max_failures: int,
            max_patterns: int, everything: bool, include_tiers: bool) -> Reply:
    """Failures and patterns to inject into a builder (counts each returned entry as accessed).

    data: {"failures": [entry], "patterns": [entry]}; with --objective each entry has
    _relevance (0-1, from bm25) and _score (relevance x log2(value+1) x help ratio x decay).
    """
    if everything:
        found = _memory(env).context(max_failures=100, max_patterns=100, include_tiers=include_tiers)
    else:
        found = _memory(env).context(objective=objective, max_failures=max_failures,
                                     max_patterns=max_patterns, include_tiers=include_tiers)
    return Reply(found, ftl={"failures": _views(found["failures"]), "patterns": _views(found["patterns"])})


def _add(env: Env, text: str, entry_type: str) -> Reply:
    entry = _json_object(text, "--json")
    entry["type"] = entry_type
    status = _memory(env).add(entry)
    return Reply({"status": status}, ftl_indent=None)


@command(cli, "add-failure")
@click.option("--json", "text", required=True, help='Failure: {"name", "trigger", "fix", "cost", "match"?, "source"?}.')
def add_failure(env: Env, text: str) -> Reply:
    """Add a failure. data: {"status": "added" | "merged:<name>" | "rejected:<reason>"}.

    Quality gate: trigger >= 10 characters and not generic, cost >= 100. Same name, or a
    trigger more than 85 % similar, merges into the existing entry (sources united, higher cost).
    """
    return _add(env, text, "failure")


@command(cli, "add-pattern")
@click.option("--json", "text", required=True, help='Pattern: {"name", "trigger", "insight", "saved", "source"?}.')
def add_pattern(env: Env, text: str) -> Reply:
    """Add a success pattern. data: {"status": "added" | "duplicate:<name>" | "rejected:<reason>"}."""
    return _add(env, text, "pattern")


@command(cli, "query")
@click.argument("topic")
def query(env: Env, topic: str) -> Reply:
    """Entries relevant to TOPIC (relevance > 0.3), best first, each with `score`.

    data: {"items": [entry + score]}.
    """
    found = _memory(env).query(topic)
    views = [{**view, "score": entry["score"]} for view, entry in zip(_views(found), found)]
    return Reply(wrap(found), ftl=views)


@command(cli, "prune")
@click.option("--max-failures", type=click.IntRange(min=0), default=scoring.DEFAULT_MAX_FAILURES, show_default=True)
@click.option("--max-patterns", type=click.IntRange(min=0), default=scoring.DEFAULT_MAX_PATTERNS, show_default=True)
@click.option("--min-importance", type=float, default=scoring.DEFAULT_MIN_IMPORTANCE, show_default=True)
@click.option("--half-life", type=float, default=scoring.DEFAULT_HALF_LIFE_DAYS, show_default=True,
              help="Days after which an entry's importance halves.")
def prune(env: Env, max_failures: int, max_patterns: int, min_importance: float, half_life: float) -> Reply:
    """Delete the least useful entries (importance with decay below --min-importance, then all
    but the most important --max-* per type). data: {pruned_failures, pruned_patterns,
    remaining_failures, remaining_patterns, orphaned_edges_removed}."""
    return Reply(_memory(env).prune(max_failures=max_failures, max_patterns=max_patterns,
                                    min_importance=min_importance, half_life_days=half_life))


@command(cli, "add-relationship")
@click.argument("source")
@click.argument("target")
@_TYPE
@click.option("--rel-type", default="co_occurs", show_default=True,
              help="co_occurs, causes, solves, prerequisite or variant.")
def add_relationship(env: Env, source: str, target: str, entry_type: str, rel_type: str) -> Reply:
    """Link SOURCE and TARGET (same type) both ways. data: {"status": "added" | "exists" |
    "not_found:<name>" | "invalid_type:<t>"}."""
    return Reply({"status": _memory(env).add_relationship(source, target, entry_type, rel_type)},
                 ftl_indent=None)


@command(cli, "related")
@click.argument("name")
@_TYPE
@click.option("--max-hops", type=click.IntRange(min=0), default=2, show_default=True)
def related(env: Env, name: str, entry_type: str, max_hops: int) -> Reply:
    """Entries linked to NAME within --max-hops (weight product >= 0.5), heaviest first.
    data: {"items": [{entry, hops, weight, via}]}."""
    found = _memory(env).related(name, entry_type, max_hops)
    views = [{**hop, "entry": _views([hop["entry"]])[0]} for hop in found]
    return Reply(wrap(found), ftl=views)


@command(cli, "stats")
def stats(env: Env) -> Reply:
    """Counts, average importance and age, health (stale, untested, orphans, tiers) per type.
    data: {"failures": {...}, "patterns": {...}}."""
    return Reply(_memory(env).stats())


def verify_loop_report(store) -> dict[str, Any]:
    """FTL ``verify_loop``: is the learning loop closed (memory injected, builders' UTILIZED
    recorded, feedback counted)? ``{loop_status: CLOSED | OPEN, summary, issues,
    recommendations, sample_utilized_workspaces, sample_feedback_memories}``."""
    from ftl.memory import MemoryStore

    totals = MemoryStore(store).feedback_totals()
    rows = [w for c in store.list_campaigns() for w in store.workspaces(c["campaign_id"])]
    complete = [w for w in rows if w["status"] == "complete"]

    def utilized(w: dict) -> list:
        result = w["result"] if isinstance(w["result"], dict) else {}
        build = result.get("build") if isinstance(result.get("build"), dict) else {}
        return result.get("utilized") or build.get("utilized") or []

    def injected(w: dict) -> bool:
        prior = (w["spec"] or {}).get("prior_knowledge") or {}
        return bool(prior.get("failures") or prior.get("patterns"))

    with_utilized = [w["workspace_id"] for w in complete if utilized(w)]
    with_prior = [w["workspace_id"] for w in rows if injected(w)]
    issues = []
    if totals["total"] == 0:
        issues.append("No memories in database - nothing to learn from")
    elif not totals["with_feedback"]:
        issues.append("No feedback recorded - times_helped and times_failed are all 0")
    if complete and not with_utilized:
        issues.append("Completed workspaces exist but none have utilized_memories - builder may not be "
                      "outputting UTILIZED")
    if rows and not with_prior:
        issues.append("Workspaces exist but none have prior_knowledge - memory injection may not be working")
    if totals["helped"] == 0 and totals["failed"] == 0 and complete:
        issues.append("Workspaces completed but no feedback recorded - feedback-batch may not be called")
    text = " ".join(issues)
    advice = [("UTILIZED", "Run a task with /ftl and check builder outputs UTILIZED: [...]"),
              ("feedback-batch", "Check SKILL.md feedback-batch calls are executing"),
              ("No memories", "Add failures/patterns via memory.py add-failure/add-pattern"),
              ("prior_knowledge", "Check workspace.py create includes prior_knowledge")]
    return {
        "loop_status": "CLOSED" if not issues and totals["helped"] + totals["failed"] > 0 else "OPEN",
        "summary": {"total_memories": totals["total"], "memories_with_feedback": len(totals["with_feedback"]),
                    "total_times_helped": totals["helped"], "total_times_failed": totals["failed"],
                    "complete_workspaces": len(complete), "workspaces_with_utilized": len(with_utilized),
                    "workspaces_with_prior_knowledge": len(with_prior)},
        "issues": issues,
        "recommendations": [tip for key, tip in advice if key in text],
        "sample_utilized_workspaces": with_utilized[:3],
        "sample_feedback_memories": totals["with_feedback"][:5],
    }


@command(cli, "verify-loop")
def verify_loop(env: Env) -> Reply:
    """Diagnose the learning loop. data: {loop_status, summary, issues, recommendations,
    sample_utilized_workspaces, sample_feedback_memories}."""
    return Reply(verify_loop_report(env.store))


@command(cli, "feedback")
@click.argument("name")
@_TYPE
@click.option("--helped", is_flag=True, help="The entry helped.")
@click.option("--failed", is_flag=True, help="The entry was injected and did not help.")
def feedback(env: Env, name: str, entry_type: str, helped: bool, failed: bool) -> Reply:
    """Record whether entry NAME helped; its importance is recomputed.
    data: {"status": "updated" | "not_found"}. Neither --helped nor --failed -> exit 2
    (FTL output mode: FTL's message on stderr, exit 1)."""
    if not helped and not failed:
        raise FtlRefusal("schema_invalid", {"count": 1, "violations": [{
            "path": "--helped/--failed", "message": "one of them is required",
            "fix": "pass --helped or --failed"}]}, ftl_stderr="Must specify --helped or --failed",
            message="Pass --helped or --failed.")
    return Reply({"status": _memory(env).feedback(name, entry_type, helped=helped)}, ftl_indent=None)


def _items(plain: str | None, encoded: str | None, option: str) -> list:
    if encoded is not None:
        try:
            plain = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise violation(f"{option}-b64", "is not base64 of UTF-8 JSON", "base64-encode the JSON array") from None
        option = f"{option}-b64"
    if plain is None:
        name = option.removesuffix("-b64").lstrip("-")
        raise FtlRefusal("schema_invalid", {"count": 1, "violations": [{
            "path": option, "message": "is required", "fix": f"pass --{name} or --{name}-b64"}]},
            ftl_payload={"error": f"Must provide --{name} or --{name}-b64"},
            message=f"Must provide --{name} or --{name}-b64.")
    try:
        value = json.loads(plain)
    except (json.JSONDecodeError, RecursionError):
        raise violation(option, "is not valid JSON", "pass a JSON array of {name, type}") from None
    if not isinstance(value, list):
        raise violation(option, "must be a JSON array", "pass a JSON array of {name, type}")
    return value


@command(cli, "feedback-batch")
@click.option("--utilized", default=None, help="JSON array of the entries that helped [{name, type}].")
@click.option("--injected", default=None, help="JSON array of the entries that were injected [{name, type}].")
@click.option("--utilized-b64", default=None, help="--utilized, base64-encoded (no shell quoting).")
@click.option("--injected-b64", default=None, help="--injected, base64-encoded.")
def feedback_batch(env: Env, utilized: str | None, injected: str | None, utilized_b64: str | None,
                   injected_b64: str | None) -> Reply:
    """Each injected entry counts as helped if it is in --utilized, else as not helped.
    data: {"helped": n, "not_helped": m}."""
    used = _items(utilized, utilized_b64, "--utilized")
    shown = _items(injected, injected_b64, "--injected")
    return Reply(_memory(env).feedback_batch(used, shown), ftl_indent=None)


@command(cli, "add-cross-relationship")
@click.argument("failure")
@click.argument("pattern")
@click.option("--type", "rel_type", default="solves", show_default=True, help="solves or causes.")
def add_cross_relationship(env: Env, failure: str, pattern: str, rel_type: str) -> Reply:
    """Link failure FAILURE to pattern PATTERN. data: {"status": "added" | "exists" |
    "not_found:failure:<n>" | "not_found:pattern:<n>" | "invalid_type:<t>"}."""
    return Reply({"status": _memory(env).add_cross_relationship(failure, pattern, rel_type)},
                 ftl_indent=None)


@command(cli, "get-solutions")
@click.argument("failure")
def get_solutions(env: Env, failure: str) -> Reply:
    """Patterns that solve FAILURE. data: {"items": [pattern entry]}."""
    found = _memory(env).solutions(failure)
    return Reply(wrap(found), ftl=_views(found))

