"""Workspace assembly: the spec a builder receives for one attempt at one task.

A workspace is ``{seq}-{slug}`` plus the attempt number, built fresh for every attempt (so an
attempt interrupted by a crash is re-run from a fresh workspace). It carries the task spec,
lineage from completed parents (what they delivered) and prior knowledge in FTL's shape
(``{failures, patterns, sibling_failures}``, plus ftl's ``previous_attempts``): memory entries
ranked for the objective (`ftl.memory.MemoryStore.context`), failures of sibling tasks blocked
earlier in this campaign, and earlier failed attempts of this task (FTL workspace create,
§5.3-5.4 of the behaviour reference, with the lineage and sibling rules computed at each attempt
instead of frozen). Pure: the callers read the store and the files.
"""

from __future__ import annotations

import re
from typing import Any

from ftl.models import Plan, Task, Workspace

SIBLING_LIMIT = 10
MEMORY_LIMIT = 5
PATTERN_LIMIT = 3
SIBLING_FIX = "See blocked workspace for attempted fixes"  # FTL's text for sibling failures
SIBLING_COST = 1000  # FTL's cost of a sibling failure (tokens)
CODE_CONTEXT_LINES = 60
_FTL_ENTRY_KEYS = ("name", "type", "trigger", "source", "access_count", "last_accessed", "times_helped",
                   "times_failed", "importance", "created_at", "fix", "match", "cost", "insight", "saved",
                   "related_typed", "cross_relationships", "_relevance", "_score", "_tier")


def first_line(text: str | None, limit: int = 200) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


#: Counters that change as memory is read and rated: left out of the runner's workspaces, whose
#: spec must stay the same across a crash and resume (it is digested into the task's commit).
_VOLATILE_KEYS = frozenset({"access_count", "last_accessed", "importance", "times_helped", "times_failed",
                            "_relevance", "_score", "_tier"})


def _entry_view(entry: dict[str, Any], *, stable: bool = False) -> dict[str, Any]:
    return {k: entry[k] for k in _FTL_ENTRY_KEYS if k in entry and not (stable and k in _VOLATILE_KEYS)}


def build_workspace(*, campaign_id: str, plan: Plan, task: Task, attempt: int, timeout_s: float,
                    tasks: list[dict[str, Any]],
                    memory: list[dict[str, Any]] | dict[str, list[dict[str, Any]]] | None = None) -> Workspace:
    """Assemble the workspace for ``task``'s attempt number ``attempt``.

    Args:
        campaign_id: the campaign.
        plan: the registered plan (objective, framework, idioms).
        task: the task spec.
        attempt: 1-based attempt counter from the store.
        timeout_s: the task's wall-clock limit, s.
        tasks: the campaign's task rows from the store (status, delivered, block_reason).
        memory: what memory offers this task: a `MemoryStore.context` result ``{"failures":
            [...], "patterns": [...]}`` (kept with FTL's keys, as ``lib/workspace.py`` shows
            them), or a list of entries (the runner's; failures only, at most 5, without the
            read/feedback counters, so the spec is the same on resume).

    Returns: the `Workspace`; ``prior_knowledge`` is ``{failures: [memory entry], patterns:
    [memory entry], sibling_failures: [{name, trigger, fix, cost, source}], previous_attempts?:
    [{name, type, trigger}]}`` (entries with FTL's keys, ``_relevance``/``_score`` when ranked).
    """
    by_seq = {row["seq"]: row for row in tasks}
    parents = [
        {"seq": dep, "workspace_id": f"{dep}-{by_seq[dep]['slug']}",
         "delivered": (by_seq[dep].get("delivered") or "")[:2000]}
        for dep in task.depends if dep in by_seq and by_seq[dep]["status"] == "complete"
    ]
    lineage: dict[str, Any] = {"parents": parents} if task.depends else {}  # FTL's shape
    if parents:
        lineage.update(parent=parents[0]["workspace_id"], prior_delivery=parents[0]["delivered"])
    siblings = [
        {"name": f"sibling-{row['seq']}-{row['slug']}",
         "trigger": first_line(row.get("block_reason")) or f"Blocked: {row['seq']}-{row['slug']}",
         "fix": SIBLING_FIX, "cost": SIBLING_COST, "source": [f"{row['seq']}-{row['slug']}"]}
        for row in tasks
        if row["status"] == "blocked" and row["seq"] != task.seq and not row.get("blocked_by")
    ][:SIBLING_LIMIT]
    own = by_seq.get(task.seq, {})
    previous = []
    if attempt > 1 and own.get("block_reason"):
        previous.append({"name": f"previous-attempt-{task.seq}", "type": "failure",
                         "trigger": first_line(own.get("block_reason"))})
    if isinstance(memory, dict):
        failures = [_entry_view(e) for e in memory.get("failures") or []][:MEMORY_LIMIT]
        patterns = [_entry_view(e) for e in memory.get("patterns") or []][:PATTERN_LIMIT]
    else:
        failures = [_entry_view(e, stable=True) for e in memory or [] if e.get("type") == "failure"][:MEMORY_LIMIT]
        patterns = []
    prior: dict[str, Any] = {"failures": failures, "patterns": patterns, "sibling_failures": siblings}
    if previous:
        prior["previous_attempts"] = previous
    return Workspace(
        workspace_id=task.workspace_id, campaign_id=campaign_id, seq=task.seq, slug=task.slug,
        type=task.type, attempt=attempt, objective=plan.objective, delta=list(task.delta),
        creates=list(task.creates), verify=task.verify, run=task.run, budget=task.budget,
        timeout_s=timeout_s, framework=plan.framework, idioms=plan.idioms, lineage=lineage,
        prior_knowledge=prior)


def verify_source(verify: str | None) -> str | None:
    """The test file a verify command runs, or None (FTL workspace ``verify_source`` rule): a
    quoted ``*.py`` path, else an unquoted one, that mentions "test" or starts with ``tests/``;
    None for commands with a glob."""
    if not verify or "*" in verify:
        return None
    quoted = re.search(r"[\"']([^\"']+\.py)[\"']", verify)
    if quoted and ("test" in quoted.group(1).lower() or quoted.group(1).startswith("tests/")):
        return quoted.group(1)
    for match in re.finditer(r"(?:^|\s)((?:tests?/)?[\w/.-]+\.py)(?:\s|$)", verify):
        if "test" in match.group(1).lower() or match.group(1).startswith("tests/"):
            return match.group(1)
    return None


def _line_range(text: str | None) -> tuple[int, int] | None:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def code_context(path: str, text: str, *, target_lines: str | None = None, task_type: str = "BUILD",
                 max_lines: int = CODE_CONTEXT_LINES) -> dict[str, str]:
    """A snapshot of a delta file for the builder (FTL workspace ``code_contexts``).

    Args:
        path: the file, relative to the repository.
        text: its content.
        target_lines: ``"START-END"`` (1-based) the task targets; None or a SPEC task: the head.
        max_lines: lines shown when there is no target.

    Returns: ``{path, lines: "1-60" | "1-15,S-E", content, exports: "f(), Class, NAME",
    imports: "import x\nfrom y import z"}``: without a target the first ``max_lines`` lines;
    with one, the first 15 lines, a marker for the omitted span, and the target from 5 lines
    before to 10 after.
    """
    lines_all = text.split("\n")
    total = len(lines_all)
    span = _line_range(target_lines)
    if task_type == "SPEC" or span is None:
        shown = lines_all[:max_lines]
        ranges = f"1-{min(len(shown), max_lines)}"
    else:
        head_end = min(15, total)
        shown = list(lines_all[:head_end])
        start = max(head_end, span[0] - 5)
        end = min(total, span[1] + 10)
        if start > head_end:
            shown.append(f"# ... lines {head_end + 1}-{start - 1} omitted ...")
        shown.extend(lines_all[start:end])
        ranges = f"1-{head_end},{start + 1}-{end}"
    imports = [line.strip() for line in lines_all[:30] if line.startswith(("import ", "from "))]
    exports = []
    for line in shown:
        if line.startswith("def "):
            exports.append(line.split("(")[0][4:].strip() + "()")
        elif line.startswith("class "):
            exports.append(line.split("(")[0].split(":")[0][6:].strip())
        elif "=" in line and not line.startswith((" ", "#")):
            name = line.split("=")[0].strip()
            if name.isidentifier():
                exports.append(name)
    return {"path": path, "lines": ranges, "content": "\n".join(shown), "exports": ", ".join(exports),
            "imports": "\n".join(imports)}
