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
from ftl.states.execute import AGENT_COST_KEYS
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
    else:
        # Earlier questions travel inside the exploration (``_questions``) to the next round.
        tool = planner_tool(selected)
        args = {"objective": run.objective, "exploration": run.exploration}

    result = run.recovery.run(lambda attempt: ask_planner(run, facts, tool, args), tool=tool,
                              state="PLAN")
    decision = log_decision(run, tool, result, state="PLAN")

    # A go-ahead whose plan does not parse as one (``plan_attempt``) is an invalid plan: the
    # next round is told why, as for a plan that fails validation.
    candidate = result.get("plan") if isinstance(result.get("plan"), dict) else result.get("plan_attempt")
    if decision == "PROCEED" and isinstance(candidate, dict):
        try:
            plan = parse_plan(candidate, source=tool)
        except FtlError as error:
            if tool == "load_plan":
                raise
            run.log.emit(ev.PLAN_VALIDATION_FAILED, errors=error.details.get("violations", []))
            return _clarify(run, questions + [f"The plan was invalid: {error.message}"])
        run.current_plan = plan
        run.store.save_plan(run.campaign_id, plan)
        return Next("build" if run.flow is Flow.TASK else "register")
    return _clarify(run, questions + list(result.get("questions") or []))


def log_decision(run: Run, tool: str, result: dict[str, Any], *, state: str) -> str:
    """Write the planner's ``PLAN_DECISION`` (PLAN's, or CASCADE's re-plan) with its
    questions and, for a paid planner, its cost (issue 12: a resume seeds the spend limit from
    these, `ftl.events.earlier_planner_spend_usd`). Returns the decision, upper case."""
    decision = str(result.get("decision", "UNKNOWN")).upper()
    cost = {key: result[key] for key in ("total_cost_usd", "num_turns", "usage", "session_id")
            if result.get(key) is not None}
    run.log.emit(ev.PLAN_DECISION, state=state, decision=decision, tool=tool,
                 questions=result.get("questions") or [], **cost)
    return decision


def planner_tool(selected: dict[str, Any]) -> str:
    """The planner macro-tool the server selected for a planning intent: ``claude_planner``
    (``planner = "claude"``; the rules prefer it) or ``agent_planner`` (``planner_command``).
    PLAN and CASCADE's re-plan choose the same way.

    Raises:
        FtlError(dependency_missing): neither is selected (no planner is configured).
    """
    for tool in ("claude_planner", "agent_planner"):
        if tool in selected:
            return tool
    raise FtlError("dependency_missing",
                   {"name": "a plan (--plan FILE), planner_command or planner = \"claude\" "
                            "in ftl.toml"})


def ask_planner(run: Run, facts: list, tool: str, args: dict[str, Any], *,
                intent: str = INTENT, state: str = "PLAN") -> dict[str, Any]:
    """One planner call (``intent`` ``plan_campaign``, or ``replan_campaign`` from CASCADE).

    A Claude planner is an agent start: it waits at the shared rate gate, its cost counts
    towards the spend limit, and a rate limit it meets closes the gate. A planner that crashed
    or timed out without an answer is a failure (emitted, classified, retried once if
    transient by the caller's recovery protocol), not a clarification round.

    Returns:
        the planner tool's result (``decision``, ``plan``?, ``questions``, cost keys, ...).
    Raises:
        FtlError: the failure, classified by `ftl.engine.recovery.classify_command`.
    """
    if tool == "claude_planner":  # an agent start: the shared rate gate applies
        run.agent_limits.gate.wait(run.cancel, emit=run.log.emit, state=state)
    result = run.tools.call(intent, facts, tool, args, state=state, cancel=run.cancel)
    run.agent_limits.spend.add(result.get("total_cost_usd"))
    if result.get("error_type") == "rate_limited":
        reopens = result.get("reopens_at")
        run.agent_limits.gate.close(datetime.fromisoformat(reopens) if reopens else None,
                                    emit=run.log.emit, state=state,
                                    limit_kind=result.get("limit_kind"), reason=result.get("reason"))
    if result.get("error_type"):  # a Claude planner run that failed (login, limit, stall...)
        error = classify_command({**result, "output": result.get("reason")}, what="plan")
        cost = {key: result[key] for key in AGENT_COST_KEYS if result.get(key) is not None}
        if cost.get("total_cost_usd"):  # paid for: TOOL_FAILURE keeps it for a resume's spend
            error.details["agent_cost"] = cost
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

