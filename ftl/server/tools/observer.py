"""The observer tool: turn a finished campaign's attempts into memory for later campaigns.

OBSERVE calls it once per campaign. It reads the campaign's task rows and workspace attempts from
the store, extracts failure patterns from blocked attempts and success patterns from completed
tasks, and writes them with `ftl.memory.MemoryStore.record` (which merges an entry seen before
only by its exact ``(name, type)``: the block reasons of different tasks share their headline
wording, "verify_failed: Task 001's verify command failed (exit 1).", so a similarity rule
merged every verify failure into the first one). Then it closes FTL's learning loop: for every
completed attempt whose builder reported ``utilized`` memory entries, each entry injected into
that attempt's prior knowledge counts as helped (utilized) or not
(`ftl.memory.MemoryStore.feedback_batch`, once per attempt), which moves its importance. Rules
after FTL observer.py analyze (``shared/reference/ftl-behaviour.md`` §7), limited to this
campaign (FTL scanned every campaign's workspaces) and without FTL's re-run of verify commands
to confirm blocks: the runner already ran verify itself before blocking.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ftl.errors import FtlError
from ftl.server.tools.context import ToolContext

__all__ = ["ObserveArgs", "observer", "extract_failures", "extract_patterns", "failure_name",
           "failure_trigger", "score_pattern", "MIN_PATTERN_SCORE", "record_feedback",
           "utilized_of", "injected_of"]

MIN_PATTERN_SCORE = 3  # FTL MIN_PATTERN_SCORE
SCORE_BLOCKED_THEN_FIXED = 3
SCORE_CLEAN_FIRST_TRY = 2
SCORE_MULTI_FILE = 1
_NAME_WORDS = 6
_TEXT_LIMIT = 300
_SKIPPED_ERRORS = frozenset({"cancelled"})  # a cancel teaches nothing about the task
FAILURE_COST_PER_BUDGET = 1000  # FTL observer: a failure cost its budget x 1000 tokens
PATTERN_SAVED_PER_BUDGET = 500  # FTL observer: a pattern saves its budget x 500 tokens


class ObserveArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    campaign_id: str = Field(min_length=1, description="The campaign to observe.")


def _first_line(text: Any) -> str:
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()[:_TEXT_LIMIT]
    return ""


# A line of command output that says what went wrong: an exception or error name, or the
# words compilers, shells, package managers and test runners use for it.
_ERROR_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Failure)\b|\b(?:error|errors|failed|"
                         r"failure|fatal|panic|not found|no such|denied|refused|cannot|can't|"
                         r"unable|missing|invalid|undefined|unexpected|expected)\b", re.I)
# Lines that frame the output rather than say anything: decoration rules, pytest's section
# headers, a traceback's header and its frames.
_NOISE_LINE = re.compile(r"^(?:[=_\-*#~. ]{3,}.*[=_\-*#~]{3,}|[=_\-*#~]{3,}|Traceback \(most recent"
                         r" call last\):|File \".*\", line \d+.*)$")
_PYTEST_E = re.compile(r"^E\s+")


def _meaningful_lines(text: str) -> list[str]:
    """Non-blank lines of ``text`` (stripped, pytest's ``E`` gutter removed) that carry words:
    at least three letters, not decoration or traceback framing (`_NOISE_LINE`)."""
    found = []
    for raw in str(text or "").splitlines():
        line = _PYTEST_E.sub("", raw.strip())
        if len(re.findall(r"[A-Za-z]", line)) >= 3 and not _NOISE_LINE.match(line):
            found.append(line[:_TEXT_LIMIT])
    return found


def failure_trigger(reason: Any) -> str:
    """What a blocked attempt failed on, from its block reason ``"<error_type>: <message>"``
    followed by the command's output tail (``states/build.py`` ``_block``): the first line of
    the tail naming an error (`_ERROR_LINE`), else its first meaningful line, else the reason's
    headline when there is no tail; secrets scrubbed and absolute paths cut
    (`ftl.sanitize.sanitize_text`).

    ``failure_trigger("verify_failed: Task 003's verify command failed (exit 1).\\n"
    "E   AssertionError: 41 != 42")`` -> ``"AssertionError: 41 != 42"``.
    """
    from ftl.sanitize import sanitize_text

    # Command output goes into the shared memory store and later prompts: secrets scrubbed and
    # absolute paths cut over the whole text first (a key can span lines), then a line chosen.
    reason = sanitize_text(str(reason or ""), 256 * 1024)
    headline = _first_line(reason)
    lines = reason.strip().splitlines()
    tail = _meaningful_lines("\n".join(lines[1:]))
    return next((line for line in tail if _ERROR_LINE.search(line)), tail[0] if tail else headline)


def _slugify(text: str, words: int = _NAME_WORDS) -> str:
    """Letters-only kebab words: numbers, paths' digits and punctuation are dropped, so the same
    failure in another run or campaign normalises to the same name."""
    tokens = [t for t in re.findall(r"[a-z]+", text.lower().replace("_", " ")) if len(t) > 1]
    return "-".join(tokens[:words])


def failure_name(slug: str, reason: str) -> str:
    """Memory name of a failure: ``<task slug>--<words of what it failed on>``: the reason's
    error type and its `failure_trigger` when the reason carries output, else the reason's
    headline; normalised by `_slugify`, so the same failure in another run or campaign gets
    the same name, and different failures of one task get different ones.

    ``failure_name("add-login", "verify_failed: Task 003's verify command failed (exit 1).")``
    -> ``"add-login--verify-failed-task-verify-command-failed"``;
    ``failure_name("add-login", "verify_failed: ...\\nE   ImportError: cannot import name 'x'")``
    -> ``"add-login--verify-failed-importerror-cannot-import-name"``.
    """
    headline = _first_line(reason)
    trigger = failure_trigger(reason)
    if trigger != headline:
        kind, sep, _ = headline.partition(":")
        trigger = f"{kind} {trigger}" if sep and re.fullmatch(r"[a-z_]+", kind) else trigger
    normalised = _slugify(trigger)
    return f"{slug}--{normalised}" if normalised else f"{slug}--blocked"


def _source(campaign_id: str, workspace: dict[str, Any]) -> str:
    """A workspace attempt's qualified id ``<campaign_id>/<workspace_id>/<attempt>``: bare
    workspace ids repeat across attempts and campaigns, so they cannot key memory sources."""
    return f"{campaign_id}/{workspace['workspace_id']}/{workspace.get('attempt', 1)}"


def _reason(workspace: dict[str, Any]) -> tuple[str, str | None]:
    result = workspace.get("result") if isinstance(workspace.get("result"), dict) else {}
    return str(result.get("reason") or ""), result.get("error_type")


def _delivered(workspace: dict[str, Any]) -> str:
    result = workspace.get("result") if isinstance(workspace.get("result"), dict) else {}
    build = result.get("build") if isinstance(result.get("build"), dict) else result
    return _first_line(build.get("delivered") or "")


def extract_failures(tasks: list[dict[str, Any]], workspaces: list[dict[str, Any]],
                     campaign_id: str) -> list[dict[str, Any]]:
    """Failure memory entries from a campaign's blocked attempts; pure.

    Each blocked workspace attempt (except cancels) gives ``{name: failure_name(slug, reason),
    type: "failure", trigger: failure_trigger(reason) (the error line of the output, else the
    reason's headline), fix: what a later complete attempt of the same task delivered (else ""),
    source: [qualified workspace ids, see `_source`], campaign_id, seq, error_type}``;
    attempts with the same name merge their sources. A task blocked with no workspace and no
    ``blocked_by`` (it failed before a builder ran) counts too, from its ``block_reason``; tasks
    blocked only by propagation (``blocked_by`` set) teach nothing new and are skipped.
    """
    slugs = {t["seq"]: t["slug"] for t in tasks}
    budgets = {t["seq"]: _budget(t) for t in tasks}
    by_seq: dict[str, list[dict[str, Any]]] = {}
    for ws in workspaces:
        by_seq.setdefault(ws["seq"], []).append(ws)
    entries: dict[str, dict[str, Any]] = {}

    def add(seq: str, reason: str, error_type: str | None, source: str, fix: str) -> None:
        name = failure_name(slugs.get(seq, f"task-{seq}"), reason)
        entry = entries.setdefault(name, {
            "name": name, "type": "failure",
            "trigger": failure_trigger(reason) or f"task {seq} blocked",
            "fix": fix, "cost": budgets.get(seq, 5) * FAILURE_COST_PER_BUDGET, "source": [],
            "campaign_id": campaign_id, "seq": seq, "error_type": error_type})
        if source not in entry["source"]:
            entry["source"].append(source)
        if fix and not entry["fix"]:
            entry["fix"] = fix

    for seq, attempts in by_seq.items():
        attempts = sorted(attempts, key=lambda w: w.get("attempt") or 0)
        for index, ws in enumerate(attempts):
            if ws.get("status") != "blocked":
                continue
            reason, error_type = _reason(ws)
            if error_type in _SKIPPED_ERRORS:
                continue
            later = next((w for w in attempts[index + 1:] if w.get("status") == "complete"), None)
            add(seq, reason, error_type, _source(campaign_id, ws),
                _delivered(later) if later else "")
    for task in tasks:
        if task["status"] == "blocked" and not task.get("blocked_by") and not any(
                w.get("status") == "blocked" for w in by_seq.get(task["seq"], [])):
            add(task["seq"], task.get("block_reason") or "", None,
                f"{campaign_id}/{task['seq']}-{task['slug']}", "")
    return list(entries.values())


def _budget(task: dict[str, Any]) -> int:
    spec = task.get("spec") if isinstance(task.get("spec"), dict) else {}
    budget = spec.get("budget")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else 5


def score_pattern(task: dict[str, Any], attempts: list[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    """Success score of a completed task (FTL observer scoring, the parts ftl can see).

    ``blocked_then_fixed`` +3 (an earlier attempt blocked), ``clean_first_try`` +2 (complete on
    the first attempt, nothing blocked), ``multi_file`` +1 (delta + creates name more than one
    file). Returns ``(score, breakdown)``.
    """
    breakdown: dict[str, int] = {}
    blocked_before = any(w.get("status") == "blocked" for w in attempts)
    if blocked_before:
        breakdown["blocked_then_fixed"] = SCORE_BLOCKED_THEN_FIXED
    elif (task.get("attempts") or 1) <= 1:
        breakdown["clean_first_try"] = SCORE_CLEAN_FIRST_TRY
    spec = task.get("spec") if isinstance(task.get("spec"), dict) else {}
    files = {*(spec.get("delta") or []), *(spec.get("creates") or [])}
    if len(files) > 1:
        breakdown["multi_file"] = SCORE_MULTI_FILE
    return sum(breakdown.values()), breakdown


def extract_patterns(tasks: list[dict[str, Any]], workspaces: list[dict[str, Any]],
                     campaign_id: str) -> list[dict[str, Any]]:
    """Success-pattern entries from a campaign's completed tasks scoring >= 3; pure.

    Entry: ``{name: "<slug>--fixed-after-block" | "<slug>--clean", type: "pattern", trigger:
    the task's slug words and files, insight: what it delivered (plus the block it overcame),
    source: [qualified workspace ids], campaign_id, seq, score, breakdown}``.
    """
    by_seq: dict[str, list[dict[str, Any]]] = {}
    for ws in workspaces:
        by_seq.setdefault(ws["seq"], []).append(ws)
    patterns = []
    for task in tasks:
        if task["status"] != "complete":
            continue
        attempts = sorted(by_seq.get(task["seq"], []), key=lambda w: w.get("attempt") or 0)
        score, breakdown = score_pattern(task, attempts)
        if score < MIN_PATTERN_SCORE:
            continue
        spec = task.get("spec") if isinstance(task.get("spec"), dict) else {}
        files = [*(spec.get("delta") or []), *(spec.get("creates") or [])]
        done = next((w for w in reversed(attempts) if w.get("status") == "complete"), None)
        delivered = (_delivered(done) if done else "") or _first_line(task.get("delivered"))
        insight = delivered or f"task {task['slug']} completed"
        blocked = [w for w in attempts if w.get("status") == "blocked"]
        if blocked:
            insight = f"{insight} (after: {_first_line(_reason(blocked[-1])[0]) or 'a blocked attempt'})"
        kind = "fixed-after-block" if blocked else "clean"
        patterns.append({
            "name": f"{task['slug']}--{kind}", "type": "pattern",
            "trigger": f"{task['slug'].replace('-', ' ')}: "
                       f"{', '.join(files[:5]) or task.get('type', 'task')}",
            "insight": insight[:_TEXT_LIMIT], "saved": _budget(task) * PATTERN_SAVED_PER_BUDGET,
            "source": [_source(campaign_id, w) for w in attempts]
                      or [f"{campaign_id}/{task['seq']}-{task['slug']}"],
            "campaign_id": campaign_id, "seq": task["seq"], "score": score, "breakdown": breakdown})
    return patterns


def _store_entry(memory: Any, entry: dict[str, Any], known: dict[tuple[str, str], dict]) -> str:
    """Write ``entry`` unless memory already holds it with all its sources (a re-run of OBSERVE
    must not count the same attempts twice). Returns ``added``, ``merged:<stored name>`` (FTL's
    form; the entry of the same name and type got its sources) or ``unchanged``."""
    existing = known.get((entry["name"], entry["type"]))
    if existing is not None and set(entry["source"]) <= set(existing.get("source") or []):
        return "unchanged"
    stored = memory.record(entry)
    known[(entry["name"], entry["type"])] = stored
    return "added" if existing is None else f"merged:{stored['name']}"


def utilized_of(workspace: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``{name, type}`` memory entries the builder of a workspace attempt said it used."""
    result = workspace.get("result") if isinstance(workspace.get("result"), dict) else {}
    build = result.get("build") if isinstance(result.get("build"), dict) else {}
    items = result.get("utilized") or build.get("utilized") or []
    return [i for i in items if isinstance(i, dict) and isinstance(i.get("name"), str)
            and i.get("type", "failure") in ("failure", "pattern")]


def injected_of(workspace: dict[str, Any]) -> list[dict[str, str]]:
    """The ``{name, type}`` memory entries injected into a workspace attempt's prior knowledge
    (failures, patterns and sibling failures, each once; FTL get-injected)."""
    spec = workspace.get("spec") if isinstance(workspace.get("spec"), dict) else {}
    prior = spec.get("prior_knowledge") if isinstance(spec.get("prior_knowledge"), dict) else {}
    seen: list[dict[str, str]] = []
    for key, kind in (("failures", "failure"), ("patterns", "pattern"), ("sibling_failures", "failure")):
        for entry in prior.get(key) or []:
            item = {"name": entry.get("name"), "type": kind}
            if isinstance(item["name"], str) and item not in seen:
                seen.append(item)
    return seen


def record_feedback(store: Any, campaign_id: str, workspaces: list[dict[str, Any]]) -> dict[str, int]:
    """Count the builders' ``utilized`` feedback of completed attempts into memory, once per
    attempt (an OBSERVE re-run counts nothing twice). Returns ``{"helped": n, "not_helped": m}``."""
    from ftl.memory import MemoryStore

    total = {"helped": 0, "not_helped": 0}
    memory = MemoryStore(store)
    for ws in workspaces:
        if ws.get("status") != "complete":
            continue
        used, shown = utilized_of(ws), injected_of(ws)
        if not used or not shown:
            continue
        used = [{"name": i["name"], "type": i.get("type", "failure")} for i in used]
        counted = memory.feedback_batch(used, shown, once_key=_source(campaign_id, ws))
        total["helped"] += counted["helped"]
        total["not_helped"] += counted["not_helped"]
    return total


def observer(args: ObserveArgs, ctx: ToolContext) -> dict[str, Any]:
    """Extract failure and success patterns of one campaign into memory (FTL OBSERVE).

    Returns:
        ``{"failures_extracted": [{name, trigger, result: added | merged:<name> | unchanged}],
        "patterns_extracted": [{name, score, breakdown, result}],
        "feedback_recorded": {"helped": n, "not_helped": m}, "relationships_added": k (co_occurs
        links between this campaign's failures, FTL's rule),
        "workspaces": {"complete": n, "blocked": m, <other status>: k}}`` (counts of workspace
        attempts by status; feedback counted by `record_feedback`).

    Raises:
        FtlError(not_found): no store yet, or no such campaign.
    """
    if not ctx.store_path.exists():
        raise FtlError("not_found", {"what": f"campaign {args.campaign_id} (no store yet)"})
    from ftl.memory import MemoryStore
    from ftl.store import Store

    with Store(ctx.store_path) as store:
        memory = MemoryStore(store)
        tasks = store.tasks(args.campaign_id)
        workspaces = store.workspaces(args.campaign_id)
        failures = extract_failures(tasks, workspaces, args.campaign_id)
        patterns = extract_patterns(tasks, workspaces, args.campaign_id)
        known = {(m["name"], m["type"]): m for m in memory.entries(limit=100_000)}
        failures_out = [{"name": f["name"], "trigger": f["trigger"],
                         "result": _store_entry(memory, f, known)} for f in failures]
        patterns_out = [{"name": p["name"], "score": p["score"], "breakdown": p["breakdown"],
                         "result": _store_entry(memory, p, known)} for p in patterns]
        feedback = record_feedback(store, args.campaign_id, workspaces)
        # FTL links the failures of one campaign to each other (co_occurs, both ways).
        names = [f["name"] for f in failures]
        linked = sum(memory.add_relationship(a, b, "failure", "co_occurs") == "added"
                     for i, a in enumerate(names) for b in names[i + 1:])
    counts: dict[str, int] = {"complete": 0, "blocked": 0}
    for ws in workspaces:
        counts[ws["status"]] = counts.get(ws["status"], 0) + 1
    return {"failures_extracted": failures_out, "patterns_extracted": patterns_out,
            "feedback_recorded": feedback, "relationships_added": linked, "workspaces": counts}
