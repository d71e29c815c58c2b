"""A campaign's status as data, for every surface (``ftl campaign status``, the MCP tool).

Reading never creates anything: a repository without ``.ftl/ftl.db`` has no campaign.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftl import dag

CAMPAIGN_KEYS = ("id", "objective", "status", "flow", "machine_state", "created_at", "finished_at")
TASK_KEYS = ("seq", "slug", "status", "attempts", "blocked_by")


def campaign_status(repo: Path, campaign_id: str | None = None) -> dict[str, Any] | None:
    """``{"campaign": {...}, "tasks": [...], "cascade": {...}}`` or None when there is none.

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
    cascade = dag.cascade_status({t["seq"]: t["depends"] for t in tasks},
                                 {t["seq"]: t["status"] for t in tasks})
    return {"campaign": {key: record.get(key) for key in CAMPAIGN_KEYS},
            "tasks": [{key: t.get(key) for key in TASK_KEYS} for t in tasks],
            "cascade": cascade}
