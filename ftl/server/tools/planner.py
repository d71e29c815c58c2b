"""Planner tools: load a given plan, or run a planner agent and read its decision.

`load_plan` validates a plan the user supplied (``--plan``) and answers PROCEED. `agent_planner`
runs the configured planner command with the planning input on stdin and reads what it prints
with `parse_planner_output`: a JSON plan or envelope, or FTL-style markdown (a ``Confidence:``
header, a fenced JSON plan, questions). The decision values are FTL's (PROCEED, CLARIFY, CONFIRM,
UNKNOWN; ``shared/reference/ftl-behaviour.md`` §4.6); the parser is ftl's own and more tolerant
than FTL's decision_parser (it tries every fenced block, not only the first).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field

from ftl.server.tools.context import ToolContext
from ftl.server.tools.proc import run_command

__all__ = ["LoadPlanArgs", "AgentPlannerArgs", "load_plan", "agent_planner",
           "parse_planner_output", "DECISIONS"]

DECISIONS = ("PROCEED", "CLARIFY", "CONFIRM", "UNKNOWN")
_PRECEDENCE = ("CLARIFY", "CONFIRM", "PROCEED")  # a request for clarification outranks a go-ahead
MAX_PARSE_CHARS = 2_000_000  # planner output beyond this is not searched for a plan


class LoadPlanArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan: dict[str, Any] = Field(description="The plan as FTL plan.json (objective, tasks, ...).")


class PlannerInput(BaseModel):
    """What every planner tool receives (the agent planner and the Claude planner)."""

    model_config = ConfigDict(extra="forbid")
    objective: str = Field(min_length=1, description="The campaign objective.")
    exploration: dict[str, Any] = Field(default_factory=dict,
                                        description="Aggregated explorer results.")
    replan: dict[str, Any] | None = Field(
        None, description="Re-plan input (completed/blocked/remaining tasks); selects replan mode.")
    timeout_s: float = Field(600.0, gt=0, description="Time limit for the planner, s.")


class AgentPlannerArgs(PlannerInput):
    command: list[str] = Field(min_length=1, description="Planner agent command (argv).")


def load_plan(args: LoadPlanArgs, ctx: ToolContext) -> dict[str, Any]:
    """Validate a supplied plan.

    Returns:
        ``{"decision": "PROCEED", "plan": <the normalised plan, JSON with aliases>}``.

    Raises:
        FtlError(schema_invalid | cycle_detected): from `ftl.validation.parse_plan`, with every
            violation and its JSON path.
    """
    from ftl.validation import parse_plan  # at the first plan: not part of the server's boot

    plan = parse_plan(args.plan, source="plan argument")
    return {"decision": "PROCEED", "plan": plan.model_dump(mode="json", by_alias=True)}


def agent_planner(args: AgentPlannerArgs, ctx: ToolContext) -> dict[str, Any]:
    """Run the planner agent and read its decision (FTL PLAN_PATTERN planner call, §2.3).

    The agent gets ``{"mode": "plan" | "replan", "objective", "exploration", "replan"?}`` as JSON
    on stdin, runs in the repository with ``timeout_s``, and prints its answer on stdout (see
    `parse_planner_output`). The plan is NOT validated here: the runner validates it and counts a
    PROCEED with an invalid plan as a clarification round (FTL §2.3).

    Returns:
        ``{"decision", "plan"?, "questions", "inferred", "markers", "exit_code", "timed_out",
        "cancelled", "duration_ms", "output_tail"}``. A timeout or cancel gives decision UNKNOWN
        with ``timed_out``/``cancelled`` set, for the runner to classify.
    """
    payload: dict[str, Any] = {"mode": "replan" if args.replan is not None else "plan",
                               "objective": args.objective, "exploration": args.exploration}
    if args.replan is not None:
        payload["replan"] = args.replan
    result = run_command(args.command, cwd=ctx.repo, timeout_s=args.timeout_s, cancel=ctx.cancel,
                         stdin=json.dumps(payload).encode(), env={"FTL_PLANNER_MODE": payload["mode"]},
                         output_limit_bytes=max(ctx.output_limit_bytes, 4 * 1024 * 1024))
    if result.timed_out or result.cancelled:
        parsed: dict[str, Any] = {"decision": "UNKNOWN", "questions": [], "inferred": False,
                                  "markers": []}
    else:
        parsed = parse_planner_output(result.stdout)
    limit = ctx.output_limit_bytes
    tail = result.output.encode()[-limit:].decode("utf-8", errors="replace")
    return {**parsed, "exit_code": result.exit_code, "timed_out": result.timed_out,
            "cancelled": result.cancelled, "duration_ms": result.duration_ms, "output_tail": tail}


# --------------------------------------------------------------------------- parsing

_HEADER_RE = re.compile(
    r"^[\s>#*_`-]*(?:confidence|decision)[\s*_`]*[:=\-–—][\s*_`]*(PROCEED|CLARIFY|CONFIRM)\b",
    re.IGNORECASE)
# A bare decision heading counts only in capitals: "## Confirm the API" is not a decision.
_BARE_HEADER_RE = re.compile(r"^\s*#{1,6}\s*[*_`]*(PROCEED|CLARIFY|CONFIRM)\b")
_QUESTIONS_HEAD_RE = re.compile(r"^\s*#{1,6}\s*.*\b(?:blocking\s+)?questions?\b", re.IGNORECASE)
_FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
_NUMBERED_RE = re.compile(r"^\s*(?:\d{1,3}[.)]|\(\d{1,3}\))\s+(.*\?)[\s*_]*$")
_BULLET_RE = re.compile(r"^\s*[-*+•]\s+(?:\[[ xX]\]\s+)?(.*\?)[\s*_]*$")


def _split_fences(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(prose lines outside code fences, ``(info string, contents)`` of every fenced block in
    order; the info string is the fence's language tag, lower-cased, "" when untagged)."""
    prose: list[str] = []
    blocks: list[tuple[str, str]] = []
    current: list[str] | None = None
    marker = tag = ""
    for line in text.splitlines():
        fence = _FENCE_RE.match(line)
        if current is None:
            if fence:
                current, marker, tag = [], fence.group(1), fence.group(2).lower()
            else:
                prose.append(line)
        elif fence and line.strip().startswith(marker[0] * len(marker)) and not fence.group(2):
            blocks.append((tag, "\n".join(current)))
            current = None
        else:
            current.append(line)
    if current is not None:  # unclosed fence: keep what it holds
        blocks.append((tag, "\n".join(current)))
    return prose, blocks


def _is_plan(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("tasks"), list)


def _names_plan_fields(value: Any) -> bool:
    """An object that names a plan's two required fields, whatever their values (FTL's rule for
    a plan written in the text: an object with "objective" then "tasks")."""
    return isinstance(value, dict) and "objective" in value and "tasks" in value


def _objects(text: str) -> Iterator[dict[str, Any]]:
    """Every top-level JSON object embedded in ``text``, left to right."""
    decoder = json.JSONDecoder()
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict):
            yield value
        position = text.find("{", end)


def _clean_question(text: str) -> str:
    return re.sub(r"^[*_`\s]+|[*_`\s]+(?=\?$)", "", text).strip()


def _questions(prose: list[str]) -> list[str]:
    """Numbered or bulleted lines ending in "?" (outside code fences), de-duplicated in order."""
    seen: dict[str, None] = {}
    for line in prose:
        match = _NUMBERED_RE.match(line) or _BULLET_RE.match(line)
        if match:
            question = _clean_question(match.group(1))
            if len(question) > 1:
                seen.setdefault(question, None)
    return list(seen)


def _from_json_answer(value: Any) -> dict[str, Any] | None:
    """A planner answer given as one JSON value: a plan, or ``{decision, plan?, questions?}``."""
    if _is_plan(value):
        return {"decision": "PROCEED", "plan": value, "questions": [], "inferred": True,
                "markers": ["json-plan"]}
    if isinstance(value, dict) and isinstance(value.get("decision"), str) \
            and value["decision"].upper() in _PRECEDENCE:
        listed = value.get("questions") if isinstance(value.get("questions"), list) else []
        questions = [str(q) for q in listed if isinstance(q, (str, int, float))]
        answer: dict[str, Any] = {"decision": value["decision"].upper(), "questions": questions,
                                  "inferred": False, "markers": ["json-decision"]}
        if _is_plan(value.get("plan")):
            answer["plan"] = value["plan"]
        elif isinstance(value.get("plan"), dict) and value["plan"]:
            answer["plan_attempt"] = value["plan"]
            answer["markers"].append("plan-attempt")
        return answer
    return None


def parse_planner_output(text: str) -> dict[str, Any]:
    """Read a planner's answer; pure, and never raises, whatever ``text`` holds.

    Accepted forms, tried in order:

    1. The whole output is one JSON value: a plan (an object with a ``tasks`` list) means
       PROCEED; an envelope ``{"decision": ..., "plan"?: {...}, "questions"?: [...]}`` is taken
       as it says.
    2. Markdown. The decision is a header line ``Confidence: X`` or ``Decision: X`` (any heading
       level, bold or not, any case) or a heading ``### X`` (capitals only), X in PROCEED,
       CLARIFY or CONFIRM; when several differ, CLARIFY beats CONFIRM beats PROCEED. The plan is
       the first fenced block that parses as a JSON plan; failing that, the first JSON plan
       object found in the text. Questions are numbered or bulleted lines ending in "?" outside
       code fences. Without a plan, a malformed one is kept as ``plan_attempt``: the first
       ``json`` or untagged fenced block that is a non-empty JSON object, else an object in the
       text naming "objective" and "tasks" (e.g. ``{"objective": "x", "tasks": "no"}``), so a
       caller can say why it is not a plan (FTL's decision_parser returned such an object as
       the plan with ``valid: false``). It does not change the decision.
    3. No header: a plan found means PROCEED; a "Questions" heading with questions means
       CLARIFY; otherwise UNKNOWN. These inferred decisions carry ``inferred: true``.

    Returns:
        ``{"decision": PROCEED | CLARIFY | CONFIRM | UNKNOWN, "plan"?: dict (unvalidated, its
        "tasks" a list), "plan_attempt"?: dict (only without "plan"), "questions": [str],
        "inferred": bool, "markers": [str]}``; ``markers`` names what was recognised
        (``"header:CLARIFY"``, ``"fenced-plan"``, ``"raw-plan"``, ``"plan-attempt"``, ...).
    """
    if not isinstance(text, str):
        text = str(text)
    text = text[:MAX_PARSE_CHARS]
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            answer = _from_json_answer(json.loads(stripped))
        except (ValueError, RecursionError):
            answer = None
        if answer is not None:
            return answer

    prose, blocks = _split_fences(text)
    markers: list[str] = []
    headers: set[str] = set()
    questions_section = False
    for line in prose:
        match = _HEADER_RE.match(line) or _BARE_HEADER_RE.match(line)
        if match:
            decision = match.group(1).upper()
            headers.add(decision)
            markers.append(f"header:{decision}")
        if _QUESTIONS_HEAD_RE.match(line):
            questions_section = True
            markers.append("questions-section")

    plan: dict[str, Any] | None = None
    attempt: dict[str, Any] | None = None  # the first JSON object given as the plan, if malformed
    for tag, block in blocks:
        try:
            candidate = json.loads(block)
        except (ValueError, RecursionError):
            candidate = next((obj for obj in _objects(block) if _is_plan(obj)), None)
        if _is_plan(candidate):
            plan = candidate
            markers.append("fenced-plan")
            break
        if attempt is None and tag in ("", "json") and isinstance(candidate, dict) and candidate:
            attempt = candidate
    if plan is None:
        objects = list(_objects("\n".join(prose)))
        plan = next((obj for obj in objects if _is_plan(obj)), None)
        if plan is not None:
            markers.append("raw-plan")
        elif attempt is None:
            attempt = next((obj for obj in objects if _names_plan_fields(obj)), None)

    questions = _questions(prose)
    inferred = False
    if headers:
        decision = next(d for d in _PRECEDENCE if d in headers)
    elif plan is not None:
        decision, inferred = "PROCEED", True
    elif questions_section and questions:
        decision, inferred = "CLARIFY", True
    else:
        decision = "UNKNOWN"
    if plan is None and attempt is not None:
        markers.append("plan-attempt")
    answer = {"decision": decision, "questions": questions, "inferred": inferred,
              "markers": list(dict.fromkeys(markers))}
    if plan is not None:
        answer["plan"] = plan
    elif attempt is not None:
        answer["plan_attempt"] = attempt
    return answer
