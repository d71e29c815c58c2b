"""COMPLETE: summarise the campaign and finish it (FTL COMPLETE; the summary FTL lost is kept).

Exit code 0 when every task is complete, 3 when the campaign finished with blocked tasks, 4
when an error's route (budget_exhausted -> OBSERVE, FTL ERROR_PATTERN) led here: the campaign
ended early, e.g. before any plan when the planner ran out of turns, which is no success even
with no task blocked.
"""

from __future__ import annotations

from typing import Any

from ftl import events as ev
from ftl.engine.runner import EXIT_BLOCKED, EXIT_OK, EXIT_RETURNED, Finish, Run


def enter(run: Run) -> Finish:
    summary = summarize(run)
    clean = summary["blocked"] == 0 and summary["pending"] == 0
    flow = "Task flow" if summary["flow"] == "task" else "Campaign"
    counts = (f"{summary['complete']} complete, {summary['blocked']} blocked"
              + (f", {summary['pending']} never run." if summary["pending"] else "."))
    error = run.tracked.observed_error
    if error:
        summary["error"] = error
        summary["message"] = (f"{flow} ended early after ERROR ({error.get('error_type')}): "
                              f"{error.get('message')} {counts}")
        run.log.emit(ev.RETURN, reason=error.get("error_type"), route="observe",
                     summary={k: summary[k] for k in ("message", "total", "complete", "blocked")})
        return Finish("returned", EXIT_RETURNED, summary)  # as a RETURN from ERROR: same surfaces
    summary["message"] = f"{flow} complete. {counts}"
    return Finish("complete" if clean else "complete_with_blocked",
                  EXIT_OK if clean else EXIT_BLOCKED, summary)


def summarize(run: Run) -> dict[str, Any]:
    rows = run.store.tasks(run.campaign_id)
    summary: dict[str, Any] = {
        "campaign_id": run.campaign_id, "objective": run.objective, "flow": run.flow.value,
        "total": len(rows),
        "complete": sum(r["status"] == "complete" for r in rows),
        "blocked": sum(r["status"] == "blocked" for r in rows),
        "pending": sum(r["status"] in ("pending", "running") for r in rows),
        "tasks": [{"seq": r["seq"], "slug": r["slug"], "status": r["status"],
                   "attempts": r.get("attempts"), "blocked_by": r.get("blocked_by") or [],
                   "block_reason": (r.get("block_reason") or "").splitlines()[0][:300]
                   if r.get("block_reason") else None}
                  for r in rows],
        "iterations": run.tracked.iteration_count, "replans": run.tracked.replan_count,
    }
    if run.cascade_analysis:
        summary["cascade_analysis"] = run.cascade_analysis
    return summary
