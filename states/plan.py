"""PLAN: obtain a valid plan from the given plan file or the configured planner agent.

Enforced in code (FTL PLAN_PATTERN asked for it in prose): every planner answer that is not a
valid PROCEED (CLARIFY, CONFIRM, UNKNOWN, or a plan failing validation) counts one
clarification round, bounded by ``max_clarifications`` -> ``clarify_exhausted``; a plan file
given by the user that fails validation is ``schema_invalid`` (there is nobody to ask again).
The plan is saved before the next state, so a crash after PLAN resumes with it.
"""

from __future__ import annotations

from typing import Any

from ftl import events as ev
from ftl.errors import FtlError
from ftl.machine import Flow
from ftl.recovery import classify_command
from ftl.runner import Next, Run
from ftl.tools import fact
from ftl.validation import parse_plan

INTENT = "plan_campaign"


def enter(run: Run) -> Next:
    tracked = run.tracked
    questions: list[str] = list(run.exploration.get("_questions", [])) if run.exploration else []
    if tracked.clarify_count > run.config.max_clarifications:
        raise FtlError("clarify_exhausted", {"count": tracked.clarify_count, "questions": questions})
    facts = run.facts()
    if run.plan_input is not None:
        facts.append(fact("plan_given"))
    selected = run.tools.select(INTENT, facts)
    if "load_plan" in selected:
        tool, args = "load_plan", {"plan": run.plan_input}
    elif "agent_planner" in selected:
        # Earlier questions travel inside the exploration (``_questions``) to the next round.
        tool, args = "agent_planner", {"objective": run.objective, "exploration": run.exploration}
    else:
        raise FtlError("dependency_missing",
                       {"name": "a plan (--plan FILE) or planner_command in ftl.toml"})

    result = run.recovery.run(lambda attempt: _plan_once(run, facts, tool, args), tool=tool, state="PLAN")
    decision = str(result.get("decision", "UNKNOWN")).upper()
    run.log.emit(ev.PLAN_DECISION, decision=decision, tool=tool,
                 questions=result.get("questions") or [])

    if decision == "PROCEED" and isinstance(result.get("plan"), dict):
        try:
            plan = parse_plan(result["plan"], source=tool)
        except FtlError as error:
            if tool == "load_plan":
                raise
            run.log.emit(ev.PLAN_VALIDATION_FAILED, errors=error.details.get("violations", []))
            return _clarify(run, questions + [f"The plan was invalid: {error.message}"])
        run.current_plan = plan
        run.store.save_plan(run.campaign_id, plan)
        return Next("build" if run.flow is Flow.TASK else "register")
    return _clarify(run, questions + list(result.get("questions") or []))


def _plan_once(run: Run, facts: list, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One planner call. A planner that crashed or timed out without an answer is a failure
    (emitted, classified, retried once if transient), not a clarification round."""
    result = run.tools.call(INTENT, facts, tool, args, state="PLAN", cancel=run.cancel)
    answered = str(result.get("decision", "UNKNOWN")).upper() != "UNKNOWN" or result.get("plan")
    if not answered and (result.get("timed_out") or result.get("exit_code") not in (None, 0)):
        raise classify_command({**result, "output": result.get("output_tail") or result.get("output")},
                               what="plan")
    return result


def _clarify(run: Run, questions: list[str]) -> Next:
    """Count one clarification round (every non-PROCEED answer counts, UNKNOWN included)."""
    run.tracked.clarify_count += 1
    run.exploration = {**run.exploration, "_questions": questions[-20:]}
    if not run.clarifications_left():
        raise FtlError("clarify_exhausted", {"count": run.tracked.clarify_count,
                                             "questions": questions[-20:]})
    return Next("clarify")

