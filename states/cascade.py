"""CASCADE: decide what to do about tasks that can no longer run.

cascade-status over the store's tasks; when some pending tasks are unreachable (an ancestor is
blocked): run cascade analysis (`ftl.server.tools.cascade.analyze_tasks`, told whether a planner
or an unused revised plan is available and how many re-plans are left) and do what it
recommends, so the logged recommendation and the action always agree (issue 15 item 5):

* ``replan``: at least ``replan_threshold`` tasks are unreachable behind roots that are not
  worth a retry, and a re-plan is possible (bounded by ``max_replans``; the merge keeps
  completed work and may add tasks). A failed re-plan propagates.
* ``stuck``: the same, but every re-plan is used up: ``cascade_stuck`` (ERROR returns the
  analysis).
* ``retry``: a root blocked for a transient-looking reason that has run fewer than twice is
  re-opened with its own spec (``RECOVERY_ATTEMPT`` retry_root, through the store's merge, the
  only legal blocked -> pending move) and EXECUTE runs it once more.
* ``propagate``: block every unreachable task, naming its blocked root.

Failures of a re-plan that no tool call announced (the planner gave no plan, the revision does
not merge) are emitted and classified (``TOOL_FAILURE`` tool ``replan``) before
``CASCADE_MERGE_FAILED``.

Crash safety: the merge, the incremented ``replan_count`` and the ``replan_merged`` marker are
written in one transaction (`Store.merge_revised_plan` with ``tracked``). The marker stays in
the stored tracked variables until EXECUTE's entry saves the machine, so a crash between the
merge and EXECUTE resumes in CASCADE, finds the merged tasks ready and goes to EXECUTE, instead
of observing a campaign whose re-opened tasks never run.
"""

from __future__ import annotations

from typing import Any

from ftl import dag
from ftl import events as ev
from ftl.errors import FtlError
from ftl.engine.runner import REPLAN_MERGED, Next, Run
from ftl.engine.replan import replan_input
from ftl.states.plan import ask_planner, log_decision, planner_tool
from ftl.states.register import registered
from ftl.engine.tools import fact
from ftl.validation import parse_plan

REPLAN_INTENT = "replan_campaign"


def enter(run: Run) -> Next:
    run.replan_ok = False
    rows = run.store.tasks(run.campaign_id)
    deps = {r["seq"]: r["depends"] for r in rows}
    status = {r["seq"]: r["status"] for r in rows}
    cascade = dag.cascade_status(deps, status)
    run.log.emit(ev.CASCADE_STATUS, cascade_state=cascade["state"],
                 unreachable=cascade.get("unreachable", []))
    if run.replan_pending:  # a merge committed, then the process died before EXECUTE started
        run.replan_pending = False
        if cascade["state"] == "in_progress":
            return _execute_merged(run, {"resumed": True})
    if cascade["state"] != "stuck":
        return Next("observe")

    analysis = run.cascade_analysis = analyze(run)
    unreachable = cascade.get("unreachable", [])
    recommendation = analysis.get("recommendation")
    if recommendation == "stuck":
        raise FtlError("cascade_stuck", {"unreachable": len(unreachable)})
    if recommendation == "replan":
        run.log.emit(ev.CASCADE_REPLAN, affected=len(unreachable))
        run.tracked.replan_count += 1
        try:
            revised = _revised_plan(run)
            merge = run.store.merge_revised_plan(run.campaign_id, revised,
                                                 max_new_tasks=run.config.max_replan_new_tasks,
                                                 tracked={**run.tracked_json(), REPLAN_MERGED: True})
        except FtlError as error:
            _emit_failure(run, error, tool="replan")
            run.log.emit(ev.CASCADE_MERGE_FAILED, error=error.message, error_type=error.error_type)
            run.recovery.recovery(strategy="replan", success=False, error=error)
        else:
            return _execute_merged(run, merge)
    elif recommendation == "retry":
        roots = [root["seq"] for root in analysis.get("roots", []) if root.get("retryable")]
        try:
            merge = run.store.merge_revised_plan(
                run.campaign_id, _same_tasks(run, roots), max_new_tasks=0,
                tracked={**run.tracked_json(), REPLAN_MERGED: True})
        except FtlError as error:
            _emit_failure(run, error, tool="retry_root")
            run.recovery.recovery(strategy="retry_root", success=False, error=error, roots=roots)
        else:
            return _execute_merged(run, {**merge, "roots": roots}, strategy="retry_root")

    propagate(run, always_emit=True)
    return Next("observe")


def planner_available(run: Run) -> bool:
    """Whether a re-plan can be asked for: a planner (``planner = "claude"`` or a
    ``planner_command``, as PLAN would use), or a revised plan not used yet."""
    return run.config.planner == "claude" or bool(run.config.planner_command) or (
        run.revised_plan_input is not None and run.tracked.replan_count == 0)


def _same_tasks(run: Run, seqs: list[str]):
    """The current plan restricted to ``seqs``, unchanged: merged, it re-opens those tasks."""
    plan = run.store.get_plan(run.campaign_id)
    wanted = set(seqs)
    return plan.model_copy(update={"tasks": [t for t in plan.tasks if t.seq in wanted]})


def _emit_failure(run: Run, error: FtlError, *, tool: str) -> None:
    """TOOL_FAILURE + FAILURE_CLASSIFIED for a failure no tool call announced yet."""
    if getattr(error, "emitted", False):
        return
    failure = run.log.emit(ev.TOOL_FAILURE, state="CASCADE", tool=tool,
                           error_type=error.error_type, message=error.message,
                           details=error.safe_details())
    run.log.emit(ev.FAILURE_CLASSIFIED, state="CASCADE", tool=tool, failure_seq=failure["seq"],
                 error_type=error.error_type, klass=error.kind.klass.value, decision="structural")
    error.emitted = True


def propagate(run: Run, *, always_emit: bool = False) -> list[tuple[str, list[str]]]:
    """Block every pending task that can no longer run, naming its blocked roots.

    ``CASCADE_PROPAGATE`` is written before the store changes (event before action); with
    ``always_emit`` also when nothing is propagated. Returns the ``(seq, roots)`` pairs.
    """
    rows = run.store.tasks(run.campaign_id)
    propagated = dag.propagate_blocks({r["seq"]: r["depends"] for r in rows},
                                      {r["seq"]: r["status"] for r in rows})
    if propagated or always_emit:
        run.log.emit(ev.CASCADE_PROPAGATE,
                     propagated=[{"seq": seq, "blocked_by": roots} for seq, roots in propagated])
    for seq, roots in propagated:
        run.store.transition_task(run.campaign_id, seq, "blocked", blocked_by=roots,
                                  reason=f"unreachable: blocked by {', '.join(roots)}")
    return propagated


def _execute_merged(run: Run, fields: dict[str, Any], strategy: str = "replan") -> Next:
    """Hand a merged re-plan (or re-opened roots) to EXECUTE (the ``replan_merged`` guard lets
    ``execute`` fire)."""
    run.current_plan = run.store.get_plan(run.campaign_id)
    run.replan_ok = True
    run.recovery.recovery(strategy=strategy, success=True, **fields)
    run.log.emit(ev.PLAN_REGISTERED, replan=True, **registered(run.current_plan))
    return Next("execute")


def analyze(run: Run) -> dict[str, Any]:
    """Cascade analysis through the tool server (intent ``analyze_cascade``)."""
    facts = run.facts() + [fact("blocked", r["seq"]) for r in run.store.tasks(run.campaign_id)
                           if r["status"] == "blocked"]
    analysis = run.recovery.run(
        lambda n: run.tools.call("analyze_cascade", facts, "cascade_analysis",
                                 {"campaign_id": run.campaign_id,
                                  "replan_threshold": run.config.replan_threshold,
                                  "planner_available": planner_available(run),
                                  "replans_left": max(0, run.config.max_replans
                                                      - run.tracked.replan_count)},
                                 state=run.machine_state, cancel=run.cancel),
        tool="cascade_analysis", state=run.machine_state)
    run.log.emit(ev.CASCADE_ANALYSIS, recommendation=analysis.get("recommendation"),
                 roots=[root.get("seq") for root in analysis.get("roots", [])],
                 unreachable_count=analysis.get("unreachable_count"))
    return analysis


def _revised_plan(run: Run):
    """The revised plan: the unused one given with the campaign, else the planner's answer to
    ``replan_campaign``; the planner is chosen as PLAN chooses (`ftl.states.plan.planner_tool`:
    Claude Code with ``planner = "claude"``, else the planner command) and called the same way
    (`ftl.states.plan.ask_planner`: rate gate, spend, classification)."""
    if run.revised_plan_input is not None and run.tracked.replan_count == 1:
        return parse_plan(run.revised_plan_input, source="revised plan", known_seqs=_seqs(run))
    facts = run.facts()
    tool = planner_tool(run.select_tools(REPLAN_INTENT, facts))
    args = {"objective": run.objective, "exploration": run.exploration,
            "replan": replan_input(run.store, run.campaign_id)}
    result = run.recovery.run(
        lambda n: ask_planner(run, facts, tool, args, intent=REPLAN_INTENT, state="CASCADE"),
        tool=tool, state="CASCADE")
    decision = log_decision(run, tool, result, state="CASCADE")
    if decision != "PROCEED" or not isinstance(result.get("plan"), dict):
        raise FtlError("decision_unknown", {}, message="The planner did not return a revised plan.")
    return parse_plan(result["plan"], source="revised plan", known_seqs=_seqs(run))


def _seqs(run: Run) -> set[str]:
    return {row["seq"] for row in run.store.tasks(run.campaign_id)}
