"""The re-planning input (FTL get-replan-input), computed from the store alone.

CASCADE hands it to the planner agent; ``lib/campaign.py get-replan-input`` prints it.
"""

from __future__ import annotations

from typing import Any

from ftl.errors import FtlError


def replan_input(store, campaign_id: str) -> dict[str, Any]:
    """FTL get-replan-input (§6.7) from the store alone, with the remaining tasks' full specs.

    The one source of the replanner's input, for CASCADE and for ``lib/campaign.py``: ``{mode: "replan",
    objective, framework, completed_count, blocked_count, pending_count, completed_tasks:
    [{seq, slug, delivered (<= 200 chars)}], blocked_tasks: [{seq, slug, reason (<= 300
    chars)}], remaining_tasks: [task spec]}``. ``delivered`` and ``reason`` come from the task
    rows, so they are never "(no workspace)" (FTL's lazy import failed, §8.2 item 9); the
    framework is the latest plan's, else the campaign's.

    Raises: FtlError(not_found) for an unknown campaign.
    """
    campaign = store.get_campaign(campaign_id)
    rows = store.tasks(campaign_id)
    try:
        framework = store.get_plan(campaign_id).framework
    except FtlError:
        framework = campaign["framework"]
    return {
        "mode": "replan", "objective": campaign["objective"], "framework": framework,
        "completed_count": sum(r["status"] == "complete" for r in rows),
        "blocked_count": sum(r["status"] == "blocked" for r in rows),
        "pending_count": sum(r["status"] == "pending" for r in rows),
        "completed_tasks": [{"seq": r["seq"], "slug": r["slug"], "delivered": (r.get("delivered") or "")[:200]}
                            for r in rows if r["status"] == "complete"],
        "blocked_tasks": [{"seq": r["seq"], "slug": r["slug"], "reason": (r.get("block_reason") or "")[:300]}
                          for r in rows if r["status"] == "blocked"],
        "remaining_tasks": [r["spec"] for r in rows if r["status"] == "pending"],
    }
