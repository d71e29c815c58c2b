"""PLAN: obtain a valid plan from the given plan file or the configured planner agent.

Enforced in code (FTL PLAN_PATTERN asked for it in prose): every planner answer that is not a
valid PROCEED (CLARIFY, CONFIRM, UNKNOWN, or a plan failing validation) counts one
clarification round, bounded by ``max_clarifications`` -> ``clarify_exhausted``; a plan file
given by the user that fails validation is ``schema_invalid`` (there is nobody to ask again).
The plan is saved before the next state, so a crash after PLAN resumes with it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ftl import events as ev
from ftl.errors import FtlError
from ftl.engine.machine import Flow
from ftl.engine.recovery import classify_command
from ftl.engine.runner import Next, Run
from ftl.engine.tools import fact
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
    selected = run.select_tools(INTENT, facts)
    if "load_plan" in selected:
        tool, args = "load_plan", {"plan": run.plan_input}
    elif "claude_planner" in selected or "agent_planner" in selected:
        # Earlier questions travel inside the exploration (``_questions``) to the next round.
        tool = "claude_planner" if "claude_planner" in selected else "agent_planner"
        args = {"objective": run.objective, "exploration": run.exploration}
    else:
        raise FtlError("dependency_missing",
                       {"name": "a plan (--plan FILE), planner_command or planner = \"claude\" "
                                "in ftl.toml"})

    result = run.recovery.run(lambda attempt: _plan_once(run, facts, tool, args), tool=tool, state="PLAN")
    decision = str(result.get("decision", "UNKNOWN")).upper()
    cost = {key: result[key] for key in ("total_cost_usd", "num_turns", "usage", "session_id")
            if result.get(key) is not None}  # a Claude planner's spend (issue 12)
    run.log.emit(ev.PLAN_DECISION, decision=decision, tool=tool,
                 questions=result.get("questions") or [], **cost)

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
    if tool == "claude_planner":  # an agent start: the shared rate gate applies
        run.agent_limits.gate.wait(run.cancel, emit=run.log.emit, state="PLAN")
    result = run.tools.call(INTENT, facts, tool, args, state="PLAN", cancel=run.cancel)
    run.agent_limits.spend.add(result.get("total_cost_usd"))
    if result.get("error_type") == "rate_limited":
        reopens = result.get("reopens_at")
        run.agent_limits.gate.close(datetime.fromisoformat(reopens) if reopens else None,
                                    emit=run.log.emit, state="PLAN",
                                    limit_kind=result.get("limit_kind"), reason=result.get("reason"))
    if result.get("error_type"):  # a Claude planner run that failed (login, limit, stall...)
        error = classify_command({**result, "output": result.get("reason")}, what="plan")
        if error.error_type in ("agent_login_required", "configuration_error"):
            error.details["problem"] = str(result.get("reason") or "")
        raise error
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

