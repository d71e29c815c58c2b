"""The Claude Code builder: ftl runs ``claude -p`` itself and reads its event stream (issue 12).

Any other agent keeps the `agent_builder` contract (JSON on stdin, a JSON result on stdout).
For Claude Code ftl knows more: it runs ::

    <claude.command> -p --output-format stream-json --verbose --max-turns <budget x turns_per_budget>
        [--agent ftl:builder] [--model M] [--permission-mode P] [--resume <session_id>] <extra_args>

in the task's directory (its worktree under worktree isolation) with the workspace rendered as
the prompt on stdin, and folds every stdout line into a `StreamSummary`
(`ftl.server.tools.claude_stream`): session id, cost, turns, API time, tokens, errors. The
process group is stopped when no line arrives for ``idle_timeout_s``.

Outcomes (``error_type`` of the builder result, classified by `ftl.engine.recovery.classify_command`):

* ``result`` subtype ``success`` and exit 0 -> ``complete`` (or ``blocked`` when the agent's last
  message holds a ``{"status": "blocked", ...}`` build result); ftl then verifies. Errors the
  CLI met and got past on its own (an ``api_retry`` after a 429) do not change that, and a run
  stopped by a timeout after its success result (it hung on exit) is taken at its result;
* ``error_max_turns`` -> ``budget_exhausted`` (FTL: the budget is used up; route OBSERVE);
* no credentials (``Not logged in · Please run /login``) -> ``agent_login_required``; an
  ``--agent`` the CLI does not know (the plugin is not installed) -> ``configuration_error``;
* a 429, overloaded or usage-limit error -> ``rate_limited`` with ``retry_after_ms`` and
  ``reopens_at`` (ISO 8601 UTC) when the message says when; the runner closes its rate gate;
* no line for ``idle_timeout_s`` -> ``stalled`` (transient) with the ``session_id``: the retry
  passes it back as ``resume_session_id`` and the CLI continues that session;
* ``error_during_execution``, another error result, or no ``result`` line (a crash mid-stream)
  -> ``task_failed``; timeout / cancel as for every builder.

Every result also carries ``total_cost_usd``, ``num_turns``, ``duration_api_ms``, ``usage``
(token counts; for a run stopped before its result, the tokens of the replies seen),
``session_id``, ``max_turns``, ``resumed_session``, ``stream`` (events read, malformed lines,
unknown events) and ``permission_denials`` (the tool calls the CLI's permission settings
refused: ``[{"tool", "input"}]``); a build that did not complete names the denials in its
``reason`` with how to allow them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from ftl.config import ClaudeSettings
from ftl.errors import FtlError
from ftl.server.tools.builders import (AGENT_STDOUT_LIMIT, _base, _run_in_scope, _stopped,
                                       _workspace, parse_build_result)
from ftl.server.tools.claude_stream import StreamReader, StreamSummary, limit_from_text, not_logged_in
from ftl.server.tools.context import ToolContext
from ftl.server.tools.planner import PlannerInput, parse_planner_output
from ftl.server.tools.proc import run_command

if TYPE_CHECKING:  # validated by builders._workspace, which imports the model when used
    from ftl.models import Workspace

_MISSING_AGENT = re.compile(r"--agent '([^']{1,100})' not found")

__all__ = ["ClaudeBuildArgs", "ClaudePlannerArgs", "claude_builder", "claude_planner", "claude_argv", "builder_prompt", "outcome",
           "denials_hint"]


class ClaudeBuildArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workspace: dict[str, Any] = Field(description="The workspace (ftl.models.Workspace as JSON).")
    exclude_paths: list[str] = Field(
        default_factory=list,
        description="Paths other tasks running at the same time may change; not charged to "
                    "this task's scope.")
    resume_session_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9._-]{1,128}$",
        description="Continue this Claude session (--resume) instead of starting a new one: "
                    "the retry of a stalled attempt.")
    claude: ClaudeSettings | None = Field(None, description="Server-bound: the [claude] table.")


def claude_argv(settings: ClaudeSettings, *, max_turns: int, agent: str | None,
                resume_session_id: str | None = None) -> list[str]:
    """The CLI's argv for one headless run (Claude Code CLI reference: ``-p``,
    ``--output-format stream-json`` needs ``--verbose``, ``--max-turns``, ``--resume``)."""
    argv = [*settings.command, "-p", "--output-format", "stream-json", "--verbose",
            "--max-turns", str(max_turns)]
    if agent:
        argv += ["--agent", agent]
    if settings.model:
        argv += ["--model", settings.model]
    if settings.permission_mode:
        argv += ["--permission-mode", settings.permission_mode]
    if resume_session_id:
        argv += ["--resume", resume_session_id]
    return argv + list(settings.extra_args)


def builder_prompt(ws: Workspace, resumed: bool) -> str:
    """The prompt: the workspace JSON the ftl:builder agent reads (agents/builder.md)."""
    head = ("Your previous run on this task was stopped because it went silent. Continue where "
            "you left off; the workspace is repeated below.\n\n" if resumed else "")
    return (head + "Carry out this ftl workspace. End with the JSON build result "
            "({\"status\": \"complete\" | \"blocked\", \"delivered\", \"reason\", \"utilized\"}).\n\n"
            "```json\n" + ws.model_dump_json(indent=2) + "\n```\n")


def outcome(summary: StreamSummary, *, exit_code: int | None, stderr: str,
            idle_timed_out: bool, now: datetime) -> dict[str, Any]:
    """The builder-result keys decided by the stream (pure; module docstring for the rules).

    Returns:
        ``{"status", "error_type", "reason", ...}`` plus ``retry_after_ms`` / ``reopens_at`` /
        ``limit_kind`` for a limit, ``delivered`` / ``utilized`` on success.
    """
    errors = [*summary.errors, stderr[-2000:]] if stderr.strip() else list(summary.errors)
    succeeded = summary.result_seen and summary.subtype == "success" and not summary.is_error
    if succeeded and (exit_code == 0 or idle_timed_out):
        # The run ended on its own terms: a 429 the CLI retried past, or a hang after the
        # result, is not this build's failure (it would be paid for and built again).
        return _built(summary)
    if idle_timed_out:
        return {"status": "failed", "error_type": "stalled",
                "reason": "no stream event within idle_timeout_s; the agent was stopped"}
    missing_agent = _MISSING_AGENT.search(stderr)
    if missing_agent and not summary.result_seen:
        return {"status": "failed", "error_type": "configuration_error",
                "reason": f"Claude Code has no agent {missing_agent.group(1)!r}: install the ftl "
                          "plugin (claude plugin install ftl@ftl), add --plugin-dir to "
                          "[claude] extra_args, or set [claude] agent"}
    for text in reversed(errors):  # before login: a limit message may offer "/login"
        limit = limit_from_text(text, now)
        if limit is not None:
            return {"status": "failed", "error_type": "rate_limited",
                    "retry_after_ms": limit.retry_after_ms, "limit_kind": limit.kind,
                    "reopens_at": limit.reopens_at.isoformat() if limit.reopens_at else None,
                    "reason": f"{limit.kind.replace('_', ' ')}: {limit.message}"}
    if any(not_logged_in(text) for text in errors):
        return {"status": "failed", "error_type": "agent_login_required",
                "reason": next(text for text in errors if not_logged_in(text))[:300]}
    if summary.subtype == "error_max_turns":
        return {"status": "failed", "error_type": "budget_exhausted",
                "reason": f"Claude Code stopped at its turn limit ({summary.num_turns} turns)"}
    if not summary.result_seen:
        return {"status": "failed", "error_type": "task_failed",
                "reason": f"Claude Code ended without a result event (exit {exit_code})"}
    return {"status": "failed", "error_type": "task_failed",
            "reason": f"Claude Code failed ({summary.subtype}, exit {exit_code}): "
                      f"{summary.result_text[-300:]}"}


def _built(summary: StreamSummary) -> dict[str, Any]:
    """The outcome of a run that ended with a success result: the agent's own build result
    (``complete``, or ``blocked`` with its reason)."""
    _, build, _ = parse_build_result(summary.result_text)
    delivered = (build.delivered if build else "") or summary.result_text[-2000:]
    if build is not None and build.status == "blocked":
        return {"status": "blocked", "error_type": None, "delivered": delivered,
                "reason": build.reason or "blocked (no reason given)", "utilized": build.utilized}
    return {"status": "complete", "error_type": None, "delivered": delivered,
            "reason": build.reason if build else None,
            "utilized": build.utilized if build else []}


def claude_builder(args: ClaudeBuildArgs, ctx: ToolContext,
                   clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
                   ) -> dict[str, Any]:
    """Run Claude Code on one workspace and report what its event stream said.

    Limits: ``workspace.timeout_s`` (s, wall clock), ``claude.idle_timeout_s`` (s without a
    stdout line), ``--max-turns`` = ``budget x claude.turns_per_budget``.

    Returns:
        The builder result (`ftl.server.tools.builders` keys) plus the keys of the module
        docstring.

    Raises:
        FtlError(schema_invalid): the workspace does not match `ftl.models.Workspace`.
        FtlError(configuration_error): the server has no ``[claude]`` settings bound.
    """
    ws = _workspace(args.workspace)
    settings = args.claude
    if settings is None:
        raise FtlError("configuration_error", {"problem": "claude_builder needs the [claude] "
                                                          "table (builder = \"claude\")"})
    max_turns = ws.budget * settings.turns_per_budget
    argv = claude_argv(settings, max_turns=max_turns, agent=settings.agent,
                       resume_session_id=args.resume_session_id)
    reader = StreamReader()
    limit = ctx.output_limit_bytes
    result, changes = _run_in_scope(
        ws, args, ctx, argv, builder_prompt(ws, bool(args.resume_session_id)).encode(),
        max(limit, AGENT_STDOUT_LIMIT), on_stdout_line=reader.feed,
        idle_timeout_s=settings.idle_timeout_s)
    summary = reader.summary
    out = _base(result, changes, limit, ws.timeout_s)
    out.update(summary.cost_fields(), max_turns=max_turns,
               resumed_session=args.resume_session_id,
               stream={"events": summary.events, "malformed_lines": summary.malformed_lines,
                       "unknown_events": summary.unknown_events})
    out["session_id"] = summary.session_id or args.resume_session_id
    finished = summary.result_seen and summary.subtype == "success" and not summary.is_error
    if result.timed_out and finished and not result.cancelled:
        out.update(timed_out=False)  # the work was done; only the exit hung: take the result
    elif _stopped(out, result, ws.timeout_s):
        return out
    decided = outcome(summary, exit_code=result.exit_code, stderr=result.stderr,
                      idle_timed_out=result.idle_timed_out or result.timed_out, now=clock())
    if decided["error_type"] == "stalled":
        decided["idle_timeout_s"] = settings.idle_timeout_s
    out.update(decided)
    out["permission_denials"] = summary.permission_denials
    if summary.denials_seen and out["status"] != "complete" and out.get("reason"):
        out["reason"] = f"{out['reason']}; {denials_hint(summary)}"
    if out["error_type"] and not str(out.get("output") or "").strip():
        out["output"] = json.dumps({"errors": summary.errors[-3:]})[:2000]
    return out


def denials_hint(summary: StreamSummary) -> str:
    """What a run's permission denials mean for the user, e.g. "Claude Code's permission
    settings refused 3 tool call(s) (Bash x2, Write): set [claude] permission_mode or allow the
    tools with --allowedTools in [claude] extra_args"."""
    counts: dict[str, int] = {}
    for denial in summary.permission_denials:
        counts[denial["tool"]] = counts.get(denial["tool"], 0) + 1
    tools = ", ".join(f"{tool} x{n}" if n > 1 else tool for tool, n in counts.items())
    more = summary.denials_seen - len(summary.permission_denials)
    return (f"Claude Code's permission settings refused {summary.denials_seen} tool call(s) "
            f"({tools}{f', {more} more' if more else ''}): set [claude] permission_mode or allow "
            f"the tools with --allowedTools in [claude] extra_args")


class ClaudePlannerArgs(PlannerInput):
    claude: ClaudeSettings | None = Field(None, description="Server-bound: the [claude] table.")


def claude_planner(args: ClaudePlannerArgs, ctx: ToolContext,
                   clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
                   ) -> dict[str, Any]:
    """Run Claude Code as ftl's planner (``planner = "claude"``): the planning input
    ``{"mode", "objective", "exploration", "replan"?}`` as the prompt, ``--agent
    claude.planner_agent``, ``--max-turns claude.planner_max_turns``, in the repository.

    The answer is the ``result`` event's text, read by
    `ftl.server.tools.planner.parse_planner_output` (a JSON plan, or a ``Confidence:`` header
    with a fenced plan or questions: CLARIFY is handled by the runner as for any planner).

    Returns:
        `ftl.server.tools.planner.agent_planner`'s keys (``decision``, ``plan``?,
        ``questions``, ``inferred``, ``markers``, ``exit_code``, ``timed_out``, ``cancelled``,
        ``duration_ms``, ``output_tail``) plus the cost keys (``total_cost_usd``,
        ``num_turns``, ``duration_api_ms``, ``usage``, ``session_id``) and, when the run
        failed, ``error_type`` (``agent_login_required``, ``rate_limited`` with
        ``retry_after_ms``, ``budget_exhausted``, ``stalled``, ``configuration_error``,
        ``task_failed``) with ``reason``.

    Raises:
        FtlError(configuration_error): the server has no ``[claude]`` settings bound.
    """
    settings = args.claude
    if settings is None:
        raise FtlError("configuration_error", {"problem": "claude_planner needs the [claude] "
                                                          "table (planner = \"claude\")"})
    payload: dict[str, Any] = {"mode": "replan" if args.replan is not None else "plan",
                               "objective": args.objective, "exploration": args.exploration}
    if args.replan is not None:
        payload["replan"] = args.replan
    prompt = ("Plan this ftl campaign. Answer with the plan JSON (schemas/plan.schema.json), or "
              "a Confidence: CLARIFY header and your questions.\n\n```json\n"
              + json.dumps(payload, indent=2) + "\n```\n")
    reader = StreamReader()
    result = run_command(claude_argv(settings, max_turns=settings.planner_max_turns,
                                     agent=settings.planner_agent),
                         cwd=ctx.repo, timeout_s=args.timeout_s, cancel=ctx.cancel,
                         stdin=prompt.encode(), env={"FTL_PLANNER_MODE": payload["mode"]},
                         output_limit_bytes=max(ctx.output_limit_bytes, AGENT_STDOUT_LIMIT),
                         on_stdout_line=reader.feed, idle_timeout_s=settings.idle_timeout_s)
    summary = reader.summary
    parsed: dict[str, Any] = {"decision": "UNKNOWN", "questions": [], "inferred": False,
                              "markers": []}
    out: dict[str, Any] = {"error_type": None, "reason": None}
    if not (result.timed_out or result.cancelled):
        decided = outcome(summary, exit_code=result.exit_code, stderr=result.stderr,
                          idle_timed_out=result.idle_timed_out, now=clock())
        if decided["status"] == "failed":
            out = {key: value for key, value in decided.items() if key != "status"}
        else:
            parsed = parse_planner_output(summary.result_text)
    tail = result.output.encode()[-ctx.output_limit_bytes:].decode("utf-8", errors="replace")
    return {**parsed, **out, **summary.cost_fields(), "exit_code": result.exit_code,
            "timed_out": result.timed_out, "cancelled": result.cancelled,
            "duration_ms": result.duration_ms, "output_tail": tail}
