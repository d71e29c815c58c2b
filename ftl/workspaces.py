"""Workspace assembly: the spec a builder receives for one attempt at one task.

A workspace is ``{seq}-{slug}`` plus the attempt number, built fresh for every attempt (so an
attempt interrupted by a crash is re-run from a fresh workspace). It carries the task spec,
lineage from completed parents (what they delivered) and prior knowledge: failures of sibling
tasks blocked earlier in this campaign, earlier failed attempts of this task, and failure
patterns remembered from earlier campaigns (FTL workspace create, §5.3-5.4 of the behaviour
reference, with the lineage and sibling rules computed at each attempt instead of frozen).
"""

from __future__ import annotations

from typing import Any

from ftl.models import Plan, Task, Workspace

SIBLING_LIMIT = 10
MEMORY_LIMIT = 5


def first_line(text: str | None, limit: int = 200) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def build_workspace(*, campaign_id: str, plan: Plan, task: Task, attempt: int, timeout_s: float,
                    tasks: list[dict[str, Any]], memory: list[dict[str, Any]] | None = None) -> Workspace:
    """Assemble the workspace for ``task``'s attempt number ``attempt``.

    Args:
        campaign_id: the campaign.
        plan: the registered plan (objective, framework, idioms).
        task: the task spec.
        attempt: 1-based attempt counter from the store.
        timeout_s: the task's wall-clock limit, s.
        tasks: the campaign's task rows from the store (status, delivered, block_reason).
        memory: failure patterns from earlier campaigns (store memory rows).
    """
    by_seq = {row["seq"]: row for row in tasks}
    parents = [
        {"seq": dep, "workspace_id": f"{dep}-{by_seq[dep]['slug']}",
         "delivered": (by_seq[dep].get("delivered") or "")[:2000]}
        for dep in task.depends if dep in by_seq and by_seq[dep]["status"] == "complete"
    ]
    lineage: dict[str, Any] = {}
    if parents:
        lineage = {"parents": parents, "parent": parents[0]["workspace_id"],
                   "prior_delivery": parents[0]["delivered"]}
    siblings = [
        {"name": f"sibling-{row['seq']}-{row['slug']}", "type": "failure",
         "trigger": first_line(row.get("block_reason")) or f"task {row['seq']} blocked",
         "source": [f"{row['seq']}-{row['slug']}"]}
        for row in tasks
        if row["status"] == "blocked" and row["seq"] != task.seq
    ][:SIBLING_LIMIT]
    own = by_seq.get(task.seq, {})
    previous = []
    if attempt > 1 and own.get("block_reason"):
        previous.append({"name": f"previous-attempt-{task.seq}", "type": "failure",
                         "trigger": first_line(own.get("block_reason"))})
    failures = [
        {"name": entry.get("name"), "type": "failure", "trigger": entry.get("trigger"),
         "fix": entry.get("fix")}
        for entry in (memory or []) if entry.get("type") == "failure"
    ][:MEMORY_LIMIT]
    prior: dict[str, Any] = {}
    if siblings:
        prior["sibling_failures"] = siblings
    if previous:
        prior["previous_attempts"] = previous
    if failures:
        prior["failures"] = failures
    return Workspace(
        workspace_id=task.workspace_id, campaign_id=campaign_id, seq=task.seq, slug=task.slug,
        type=task.type, attempt=attempt, objective=plan.objective, delta=list(task.delta),
        creates=list(task.creates), verify=task.verify, run=task.run, budget=task.budget,
        timeout_s=timeout_s, framework=plan.framework, idioms=plan.idioms, lineage=lineage,
        prior_knowledge=prior)
