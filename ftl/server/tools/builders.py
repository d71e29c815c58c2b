"""Builder tools: carry out one workspace (a task attempt) and report what changed.

`shell_builder` runs the task's ``run`` command; `agent_builder` runs a coding agent that reads the
workspace JSON on stdin and prints a `ftl.models.BuildResult` on stdout. Neither marks the task
complete: the runner does, after running ``verify`` itself (FTL §8.3 item 6). Both diff the work
tree before and after and report ``files_changed`` and ``out_of_scope`` (changed files outside the
task's ``delta``/``creates``), on which the runner blocks the task (FTL §8.3 item 7).

Result keys (both builders):
``status`` (``complete`` | ``blocked`` | ``failed``), ``error_type`` (None, or an `ftl.errors`
kind: ``task_failed``, ``timeout``, ``cancelled``, ``rate_limited``, ``schema_invalid``),
``retry_after_ms``, ``delivered``, ``reason``, ``utilized``, ``exit_code``, ``output`` (tail),
``timed_out``, ``cancelled``, ``duration_ms``, ``timeout_s`` (the limit applied, s),
``files_changed``, ``out_of_scope``, ``change_detection`` (``git`` | ``walk`` | ``unavailable``
when git failed after the run, in which case the change lists are empty).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ftl.errors import FtlError
from ftl.processes import LEDGER_DIR
from ftl.server.tools.context import ToolContext, resolve_workdir
from ftl.server.tools.proc import TASK_ID_VARIABLES, CommandResult, changed_paths, run_command, snapshot_tree
from ftl.vcs.scope import out_of_scope

if TYPE_CHECKING:  # imported where used: the server's boot does not build these models
    from ftl.models import BuildResult, Workspace

__all__ = ["BuildArgs", "shell_builder", "agent_builder", "parse_build_result", "out_of_scope",
           "EX_TEMPFAIL"]

EX_TEMPFAIL = 75  # sysexits.h: temporary failure; an agent exits with it when rate limited
AGENT_STDOUT_LIMIT = 4 * 1024 * 1024  # stdout kept while looking for the agent's JSON result


class BuildArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workspace: dict[str, Any] = Field(description="The workspace (ftl.models.Workspace as JSON).")
    command: list[str] | None = Field(None, description="Agent command (argv); agent_builder only.")
    exclude_paths: list[str] = Field(
        default_factory=list,
        description="Paths other tasks running at the same time may change (their delta and "
                    "creates); changes there are not charged to this task's scope.")


def _workspace(raw: dict[str, Any]) -> Workspace:
    from ftl.models import Workspace
    from ftl.validation import json_path

    try:
        return Workspace.model_validate(raw)
    except ValidationError as exc:
        violations = [{"path": json_path(("workspace", *e["loc"])), "message": e["msg"]}
                      for e in exc.errors()]
        raise FtlError("schema_invalid", {"count": len(violations), "violations": violations}) from None


def _env(ws: Workspace) -> dict[str, str]:
    return dict(zip(TASK_ID_VARIABLES, (ws.workspace_id, ws.seq, str(ws.attempt), ws.campaign_id)))


def _tail(text: str, limit: int) -> str:
    data = text.encode("utf-8", errors="replace")
    return text if len(data) <= limit else data[-limit:].decode("utf-8", errors="replace")


def _run_in_scope(ws: Workspace, args: Any, ctx: ToolContext, command: str | list[str],
                  stdin: bytes | None, limit: int,
                  **stream: Any) -> tuple[CommandResult, dict[str, Any]]:
    """Run ``command`` between two tree snapshots; return the result and the change keys.
    ``stream``: `run_command`'s ``on_stdout_line`` / ``idle_timeout_s`` (the Claude builder)."""
    cwd = resolve_workdir(ctx, ws.workdir, "$.workspace.workdir")
    if ws.base_commit:  # a task worktree: the runner diffs the task's commit against its base
        result = run_command(command, cwd=cwd, timeout_s=ws.timeout_s, cancel=ctx.cancel,
                             stdin=stdin, env=_env(ws), output_limit_bytes=limit,
                             ledger=ctx.repo / LEDGER_DIR, **stream)
        return result, {"files_changed": [], "out_of_scope": [], "change_detection": "commit"}
    method, before = snapshot_tree(cwd)
    result = run_command(command, cwd=cwd, timeout_s=ws.timeout_s, cancel=ctx.cancel,
                         stdin=stdin, env=_env(ws), output_limit_bytes=limit,
                         ledger=ctx.repo / LEDGER_DIR, **stream)
    method, after = snapshot_tree(cwd, method)
    changed = changed_paths(before, after) if method != "unavailable" else []
    scope = out_of_scope(changed, [*ws.delta, *ws.creates], cwd, args.exclude_paths)
    return result, {"files_changed": changed, "out_of_scope": scope, "change_detection": method}


def _base(result: CommandResult, changes: dict[str, Any], limit: int,
          timeout_s: float) -> dict[str, Any]:
    return {"status": "failed", "error_type": None, "retry_after_ms": None, "delivered": "",
            "reason": None, "utilized": [], "exit_code": result.exit_code,
            "output": _tail(result.output, limit), "timed_out": result.timed_out,
            "cancelled": result.cancelled, "duration_ms": result.duration_ms,
            "timeout_s": timeout_s, **changes}


def _stopped(out: dict[str, Any], result: CommandResult, timeout_s: float) -> bool:
    """Fill in a timeout or cancel outcome; True when there was one."""
    if result.timed_out:
        out.update(error_type="timeout", reason=f"timed out after {timeout_s:g} s")
    elif result.cancelled:
        out.update(error_type="cancelled", reason="cancelled")
    else:
        return False
    return True


def shell_builder(args: BuildArgs, ctx: ToolContext) -> dict[str, Any]:
    """Run the workspace's ``run`` command through ``/bin/sh -c`` in the repository (or in the
    workspace's ``workdir``, the task's worktree).

    Limits: ``workspace.timeout_s`` (s); the invocation's cancel flag. Environment adds
    FTL_WORKSPACE_ID, FTL_TASK_SEQ, FTL_ATTEMPT and FTL_CAMPAIGN_ID.

    Returns:
        The builder result (module docstring): status ``complete`` on exit 0, else ``failed``
        with error_type ``task_failed``, ``timeout`` or ``cancelled``.

    Raises:
        FtlError(schema_invalid): the workspace does not match `ftl.models.Workspace`, or has no
            ``run`` command.
    """
    ws = _workspace(args.workspace)
    if not ws.run or not ws.run.strip():
        raise FtlError("schema_invalid", {"count": 1, "violations": [{
            "path": "$.workspace.run", "message": "the shell builder needs a run command",
            "fix": "give the task a 'run' shell command, or use the agent builder"}]})
    limit = ctx.output_limit_bytes
    result, changes = _run_in_scope(ws, args, ctx, ws.run, None, limit)
    out = _base(result, changes, limit, ws.timeout_s)
    if _stopped(out, result, ws.timeout_s):
        return out
    if result.exit_code == 0:
        out.update(status="complete", delivered=f"ran: {ws.run}")
    else:
        out.update(error_type="task_failed", reason=f"run command exited {result.exit_code}")
    return out


def parse_build_result(stdout: str) -> tuple[dict[str, Any] | None, BuildResult | None, str | None]:
    """Find and check an agent's JSON result in its stdout; pure, never raises.

    The last top-level JSON object carrying a ``status`` key wins (agents print logs first);
    failing that, the last JSON object of any kind.

    Returns:
        ``(raw object | None, BuildResult | None, problem | None)``: the object found, its
        validated form, and why it was rejected when it was.
    """
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    position = stdout.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(stdout, position)
        except (ValueError, RecursionError):
            position = stdout.find("{", position + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
        position = stdout.find("{", end)
    if not found:
        return None, None, "no JSON object on stdout"
    raw = next((obj for obj in reversed(found) if "status" in obj), found[-1])
    from ftl.models import BuildResult
    from ftl.validation import json_path

    try:
        return raw, BuildResult.model_validate(raw), None
    except ValidationError as exc:
        problems = "; ".join(f"{json_path(e['loc'])}: {e['msg']}" for e in exc.errors())
        return raw, None, problems


def _retry_after_ms(raw: dict[str, Any] | None) -> int | None:
    value = (raw or {}).get("retry_after_ms")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def agent_builder(args: BuildArgs, ctx: ToolContext) -> dict[str, Any]:
    """Run a coding agent on the workspace (FTL builder contract §7, with structured output).

    The agent (``args.command``) runs in the repository with the workspace JSON on stdin, the
    same environment and limits as `shell_builder`, and must print a JSON object matching
    `ftl.models.BuildResult` (``{status: complete | blocked, delivered, reason, utilized}``) on
    stdout; other text around it is ignored (`parse_build_result`).

    Outcomes:
        * timeout / cancel -> ``failed`` with error_type ``timeout`` / ``cancelled``;
        * rate limit (exit code 75 = EX_TEMPFAIL, or ``{"status": "blocked", "error_type":
          "rate_limited", "retry_after_ms": N}``) -> ``failed``, ``rate_limited``, with
          ``retry_after_ms`` N (None when the agent gave none);
        * no valid result object -> ``failed``, ``schema_invalid``, the problem in ``reason``;
        * ``blocked`` -> ``blocked`` with the agent's ``reason`` (whatever the exit code);
        * ``complete`` with exit 0 -> ``complete``; with another exit code -> ``failed``,
          ``task_failed`` (the agent's report and its exit status disagree).

    Raises:
        FtlError(schema_invalid): the workspace does not match `ftl.models.Workspace`.
        FtlError(configuration_error): no agent command was given.
    """
    ws = _workspace(args.workspace)
    if not args.command:
        raise FtlError("configuration_error", {"problem": "no agent command configured "
                                                          "(set agent_command in ftl.toml)"})
    limit = ctx.output_limit_bytes
    stdin = ws.model_dump_json().encode()
    result, changes = _run_in_scope(ws, args, ctx, list(args.command), stdin,
                                    max(limit, AGENT_STDOUT_LIMIT))
    out = _base(result, changes, limit, ws.timeout_s)
    if _stopped(out, result, ws.timeout_s):
        return out
    raw, build, problem = parse_build_result(result.stdout)
    if result.exit_code == EX_TEMPFAIL or (raw or {}).get("error_type") == "rate_limited":
        out.update(error_type="rate_limited", retry_after_ms=_retry_after_ms(raw),
                   reason=str((raw or {}).get("reason") or "agent reported a rate limit"))
        return out
    if build is None:
        out.update(error_type="schema_invalid",
                   reason=f"agent output is not a build result: {problem}")
        return out
    out.update(delivered=build.delivered, reason=build.reason, utilized=build.utilized)
    if build.status == "blocked":
        out.update(status="blocked", reason=build.reason or "blocked (no reason given)")
    elif result.exit_code == 0:
        out.update(status="complete")
    else:
        out.update(error_type="task_failed",
                   reason=f"agent reported complete but exited {result.exit_code}")
    return out
