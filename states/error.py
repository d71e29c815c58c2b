"""ERROR: route the error by its registry row (FTL ERROR_PATTERN, every route reachable).

    timeout            -> PLAN with the partial exploration (only from EXPLORE, and only when
                          some explorer's result is in it; else summary)
    decision_unknown   -> PLAN (treated as CLARIFY; only from EXPLORE, else summary)
    quorum_failure     -> RETURN the partial results
    cascade_stuck      -> run cascade analysis and RETURN it
    schema_invalid,
    cycle_detected     -> RETURN the validation errors
    clarify_exhausted  -> RETURN the open questions
    budget_exhausted   -> OBSERVE, then COMPLETE reports the error (exit 4)
    iteration_exhausted,
    stuck_detected     -> CASCADE
    anything else      -> RETURN an error summary

Re-entries are bounded: after ``MAX_ERROR_ENTRIES`` the run returns whatever the route.

The PLAN route is FTL ERROR_PATTERN's "timeout -> PLAN with partial data": a failure in another
state (EXECUTE, CASCADE: re-planning would replace a registered campaign), or one from EXPLORE
before any explorer answered (e.g. the tool selection timed out), has no partial data to plan
with and returns the summary instead. The origin is stored with the pending error, so a resumed
ERROR routes the same way (`ftl.engine.runner.Runner.resume`).
"""

from __future__ import annotations

from typing import Any

from ftl import events as ev
from ftl.errors import FtlError, Route
from ftl.engine.machine import Flow
from ftl.engine.runner import EXIT_RETURNED, MAX_ERROR_ENTRIES, Finish, Next, Run
from ftl.states.complete import summarize


def enter(run: Run) -> Next | Finish:
    error = run.error or FtlError("internal_error", {"correlation_id": run.campaign_id})
    route = error.kind.route
    run.tracked.error_count += 1
    if run.tracked.error_count > MAX_ERROR_ENTRIES:
        route = Route.SUMMARY
    if route is Route.CASCADE and run.flow is Flow.TASK:
        route = Route.OBSERVE
    if route is Route.PLAN and (run.error_origin != "EXPLORE" or (
            error.error_type == "timeout" and not has_partial_exploration(run))):
        route = Route.SUMMARY  # only an exploration timeout has partial data to plan with
    run.log.emit(ev.ERROR_ROUTE, error_type=error.error_type, route=route.value)

    if route is Route.PLAN:
        return Next("plan")
    if route is Route.CASCADE:
        return Next("cascade")
    if route is Route.OBSERVE:  # learn from it, then end: COMPLETE reports it (exit 4)
        run.tracked.observed_error = {"error_type": error.error_type, "message": error.message,
                                      "remediation": error.kind.remediation}
        return Next("observe")

    payload: dict[str, Any] = {}
    if route is Route.CASCADE_ANALYSIS:
        from ftl.states.cascade import analyze
        try:
            payload["cascade_analysis"] = run.cascade_analysis or analyze(run)
        except FtlError as failure:
            run.recovery.recovery(strategy="cascade_analysis", success=False,
                                  error_type=failure.error_type)
    elif route is Route.RETURN_ERRORS:
        payload["violations"] = error.details.get("violations", [])
        if "cycle" in error.details:
            payload["cycle"] = error.details["cycle"]
    elif route is Route.RETURN_QUESTIONS:
        payload["questions"] = error.details.get("questions", [])
    elif route is Route.RETURN_PARTIAL:
        payload["exploration"] = run.exploration
    summary = {
        **summarize(run),
        "error": {"error_type": error.error_type, "message": error.message,
                  "remediation": error.kind.remediation, "details": error.safe_details()},
        "route": route.value, **payload,
    }
    summary["message"] = f"Returned from ERROR ({error.error_type}): {error.message}"
    run.log.emit(ev.RETURN, reason=error.error_type, route=route.value,
                 summary={k: summary[k] for k in ("message", "total", "complete", "blocked")})
    return Finish("returned", EXIT_RETURNED, summary)


def has_partial_exploration(run: Run) -> bool:
    """Whether the exploration holds at least one explorer's usable result
    (``_meta.modes_completed``, `ftl.states.explore.aggregate`): the partial data FTL
    ERROR_PATTERN's timeout route plans with."""
    if not isinstance(run.exploration, dict):
        return False
    meta = run.exploration.get("_meta")
    return isinstance(meta, dict) and bool(meta.get("modes_completed"))
