"""The verifier tool: run a task's ``verify`` command and say whether it passed.

The runner, not the builder, decides that a task is complete, and only after this check passes
(FTL §8.3 item 6: FTL left verification to the builder's prose).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ftl.processes import LEDGER_DIR
from ftl.server.tools.context import ToolContext, resolve_workdir
from ftl.server.tools.proc import run_command

__all__ = ["VerifyArgs", "run_verify"]


class VerifyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, description="Shell command that exits 0 when the task is done.")
    timeout_s: float = Field(300.0, gt=0, description="Time limit, s.")
    workdir: str | None = Field(None, description="Where to run, relative to the repository (a "
                                                  "task's worktree); default the repository.")
    seq: str | None = Field(None, max_length=64, description="The task verified: its outcome facts "
                                                            "(verify_result, task_status) name it.")


def run_verify(args: VerifyArgs, ctx: ToolContext) -> dict[str, Any]:
    """Run ``args.command`` through ``/bin/sh -c`` in the repository (or ``args.workdir``).

    Returns:
        ``{"passed": exit 0 and not timed out or cancelled, "exit_code" (None when stopped),
        "output" (combined stdout/stderr tail, at most ctx.output_limit_bytes bytes),
        "timed_out", "cancelled", "duration_ms", "timeout_s" (the limit applied, s)}``.
        A failing command is a result, not an error.

    Raises:
        FtlError(invalid_params): the command is blank.
        FtlError(workspace_invalid): ``workdir`` is not a folder inside the repository.
    """
    cwd = resolve_workdir(ctx, args.workdir, "$.workdir")
    result = run_command(args.command, cwd=cwd, timeout_s=args.timeout_s, cancel=ctx.cancel,
                         output_limit_bytes=ctx.output_limit_bytes,
                         ledger=ctx.repo / LEDGER_DIR)
    return {"passed": result.ok, "exit_code": result.exit_code, "output": result.output,
            "timed_out": result.timed_out, "cancelled": result.cancelled,
            "duration_ms": result.duration_ms, "timeout_s": args.timeout_s}
