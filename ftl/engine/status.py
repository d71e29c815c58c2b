"""A campaign's status as data, for every surface (``ftl campaign status``, the MCP tool).

Reading never creates anything: a repository without ``.ftl/ftl.db`` has no campaign.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftl import dag
from ftl.engine.run_lock import LOCK_FILE, holder
from ftl.sanitize import scrub

CAMPAIGN_KEYS = ("id", "objective", "status", "flow", "machine_state", "created_at", "finished_at")
TASK_KEYS = ("seq", "slug", "status", "attempts", "blocked_by", "block_reason", "worker")


def campaign_status(repo: Path, campaign_id: str | None = None) -> dict[str, Any] | None:
    """``{"campaign": {...}, "tasks": [...], "cascade": {...}}`` or None when there is none.

    ``campaign.message``: how a finished run ended, as its summary says (e.g. "Returned from
    ERROR (dependency_missing): ..."), None while active.
    ``campaign.run_pid``: the pid of the ftl process driving the repository now (0: one in
    another pid namespace), None when none is (`ftl.engine.run_lock.holder`, read without
    taking the lock). An ``active`` campaign with no run pid was interrupted (a crash, a kill, a
    Ctrl-C): ``ftl campaign resume`` continues it, and its ``running`` tasks will re-run.
    Each task's ``block_reason``: why a blocked task stopped (``"<error_type>: <message>"``, as
    the run's summary gives it; secrets scrubbed), None otherwise; ``blocked_by``: for a task
    blocked by the cascade, the blocked tasks it depends on.
    ``campaign.cost_usd`` and each task's ``cost_usd`` / ``num_turns``: agent spend in USD and
    turns (None when no agent build reported a cost). ``campaign.isolation``: ``worktree`` or
    ``shared``; ``campaign.integration_branch``: the branch that receives the work (worktree
    isolation), else None.

    Args:
        repo: the target repository.
        campaign_id: a campaign; default the active one, else the latest.

    Raises:
        FtlError(not_found): ``campaign_id`` names no campaign.
    """
    if not (repo / ".ftl" / "ftl.db").exists():
        return None
    from ftl.store import Store

    with Store.for_repo(repo) as store:
        record = (store.get_campaign(campaign_id) if campaign_id
                  else store.active_campaign() or store.latest_campaign())
        if record is None:
            return None
        tasks = store.tasks(record["id"])
        spend = agent_spend(store.workspaces(record["id"]))
    cascade = dag.cascade_status({t["seq"]: t["depends"] for t in tasks},
                                 {t["seq"]: t["status"] for t in tasks})
    rows = [{key: t.get(key) for key in TASK_KEYS} for t in tasks]
    for row in rows:  # where a task runs matters only while it runs
        if row["status"] != "running":
            row["worker"] = None
        if row["block_reason"]:  # written by ftl from tool errors: scrub again on the way out
            row["block_reason"] = scrub(row["block_reason"])
    for row in rows:
        row.update(spend.get(row["seq"]) or {"cost_usd": None, "num_turns": None})
    known = [row["cost_usd"] for row in rows if row["cost_usd"] is not None]
    campaign = {key: record.get(key) for key in CAMPAIGN_KEYS}
    campaign["run_pid"] = holder(repo / ".ftl" / LOCK_FILE)
    summary = record.get("summary") if isinstance(record.get("summary"), dict) else {}
    message = summary.get("message") if record.get("status") != "active" else None
    campaign["message"] = scrub(message) if isinstance(message, str) else None
    campaign["cost_usd"] = round(sum(known), 6) if known else None
    # Where the campaign's work goes: named from the stored decision, no git call (light command).
    campaign["isolation"] = (record.get("inputs") or {}).get("isolation") or "shared"
    campaign["integration_branch"] = (f"ftl/{record['id']}/integration"
                                      if campaign["isolation"] == "worktree" else None)
    return {"campaign": campaign,
            "tasks": rows, "cascade": cascade}


def agent_spend(workspaces: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task seq, the agent builds' ``cost_usd`` (USD) and ``num_turns`` summed over its
    attempts, read from each workspace's stored build result (``total_cost_usd``, issue 12);
    tasks built without an agent that reports cost are absent. A build a resumed attempt
    reused (``reused_build``: it carries the earlier attempt's result) is not counted again:
    each paid agent run counts once."""
    spend: dict[str, dict[str, Any]] = {}
    for row in workspaces:
        result = row.get("result") if isinstance(row.get("result"), dict) else {}
        build = result.get("build") if isinstance(result.get("build"), dict) else result
        if build.get("reused_build"):
            continue
        cost = build.get("total_cost_usd")
        if not isinstance(cost, (int, float)) or isinstance(cost, bool):
            continue
        entry = spend.setdefault(str(row["seq"]), {"cost_usd": 0.0, "num_turns": 0})
        entry["cost_usd"] = round(entry["cost_usd"] + float(cost), 6)
        entry["num_turns"] += int(build.get("num_turns") or 0)
    return spend
