"""OBSERVE: extract failure and success patterns into memory for later campaigns.

Skipped, as a computable predicate instead of FTL's prose, when every task is blocked by one
root cause (nothing was learned beyond that one failure, which the block records).
Observation is not essential to the outcome: a failing observer is recorded as a recovery
(``skip_observation``) and the campaign completes.
"""

from __future__ import annotations


from ftl import events as ev
from ftl.errors import FtlError
from ftl.engine.runner import Next, Run


def enter(run: Run) -> Next:
    rows = run.store.tasks(run.campaign_id)
    if rows and all(r["status"] == "blocked" for r in rows):
        roots = {r["seq"] for r in rows if not r.get("blocked_by")}
        if len(roots) == 1:
            run.log.emit(ev.OBSERVATION, skipped=True, reason="every task blocked by one root cause",
                         root=next(iter(roots)))
            return Next("complete")
    try:
        result = run.recovery.run(
            lambda n: run.tools.call("observe_outcomes", run.facts(), "observer",
                                     {"campaign_id": run.campaign_id}, state="OBSERVE",
                                     cancel=run.cancel),
            tool="observer", state="OBSERVE")
    except FtlError as error:
        run.recovery.recovery(strategy="skip_observation", success=True, error_type=error.error_type)
        return Next("complete")
    run.observation = result
    run.log.emit(ev.OBSERVATION, skipped=False,
                 failures_extracted=len(result.get("failures_extracted", [])),
                 patterns_extracted=len(result.get("patterns_extracted", [])),
                 feedback_recorded=result.get("feedback_recorded", {"helped": 0, "not_helped": 0}))
    return Next("complete")



