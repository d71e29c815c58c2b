"""BUILD: one attempt at one task: workspace -> builder -> file-scope check -> verify.

Used for every ready task inside EXECUTE (CAMPAIGN flow, tasks in parallel) and as the BUILD
state of the TASK flow (the plan's tasks in dependency order, one at a time; FTL built only the
first). The runner, not the builder, decides complete or blocked (FTL §8.3 item 6): it runs the
verify command itself and blocks a task that changed files outside its delta/creates (item 7).

Checkpoints, so that a task's run command completes at most once across crashes:

* when the builder succeeds its workspace is marked ``built`` before verify runs, so a crash
  during verify resumes with verify only; a resumed attempt that reuses a build is itself marked
  ``built``, so a second crash still finds it;
* a shell build is wrapped so that the shell writes ``.ftl/checkpoints/<campaign_id>/
  <workspace_id>-<attempt>.built`` the moment the run command exits 0. A kill of ftl between
  that exit and the store's ``built`` row (the builder's change detection, the reply, the
  commit: tens of ms), or a command that finishes in the tool server after ftl died, leaves an
  ``abandoned`` attempt with that file, which resume takes as built instead of running the
  command again. Agent builds have no such point and stay at-least-once.
"""

from __future__ import annotations

import shlex
import threading
import time
from pathlib import Path
from typing import Any

from ftl import events as ev
from ftl.errors import FtlError
from ftl.recovery import classify_command, escalate_flaky
from ftl.runner import Next, Run
from ftl.scheduler import CancelToken, TaskOutcome
from ftl.tools import fact
from ftl.workspaces import build_workspace

BUILD_INTENT = "build_task"
VERIFY_INTENT = "verify_task"


def enter(run: Run) -> Next:
    """TASK flow: register the plan's tasks if needed and build them in dependency order."""
    from ftl.states.execute import run_dag

    plan = run.current_plan
    if plan is None:
        raise FtlError("invalid_state", {"trigger": "build", "state": "BUILD"})
    if not run.store.tasks(run.campaign_id):
        from ftl.states.register import registered

        run.log.emit(ev.PLAN_REGISTERED, **registered(plan))
        run.store.add_tasks(run.campaign_id, plan)
    run_dag(run, jobs=1)
    return Next("observe")


def run_task(run: Run, seq: str, token: CancelToken, worker: str) -> TaskOutcome:
    """Run one attempt of task ``seq`` (called in a scheduler worker thread).

    Returns:
        TaskOutcome ``complete`` (detail: delivered, duration_ms), ``blocked`` (detail:
        reason, error_type) or ``cancelled``.
    """
    started = time.monotonic()
    cancel = _bridge(token)
    try:
        task = run.current_plan.task(seq)
        row = run.store.task(run.campaign_id, seq)
        attempt = max(1, int(row.get("attempts") or 1))
        timeout_s = run.config.task_timeout_s(task.budget, task.timeout_s)
        workspace = build_workspace(
            campaign_id=run.campaign_id, plan=run.current_plan, task=task, attempt=attempt,
            timeout_s=timeout_s, tasks=run.store.tasks(run.campaign_id),
            memory=run.store.memory(type="failure", limit=5))
        spec = workspace.model_dump(mode="json")
        built = _already_built(run, seq)
        run.store.record_workspace(run.campaign_id, {**spec, "status": "active"})
        if built is not None:  # carry the checkpoint into this attempt (a second crash keeps it)
            run.store.finish_workspace(run.campaign_id, workspace.workspace_id, attempt, "built",
                                       {**built, "reused_build": True})
        facts = run.facts() + [fact("task", seq, task.type.value)]
        if task.run:
            facts.append(fact("task_has_run", seq))
        if task.builder:
            facts.append(fact("builder_requested", seq, task.builder))

        build_result: dict[str, Any] = built or {}
        if built is None:
            builder = "shell_builder" if task.builder_kind == "shell" else "agent_builder"
            build_spec = spec
            if builder == "shell_builder" and task.run:
                build_spec = {**spec, "run": _with_checkpoint(task.run, _checkpoint(run, workspace))}
            try:
                # Parallel tasks share one work tree: files other tasks may write are not
                # charged to this one by the file-scope check.
                others = sorted({path for other in run.current_plan.tasks if other.seq != seq
                                 for path in (*other.delta, *other.creates)})
                build_result = run.recovery.run(
                    lambda n: _build_once(run, facts, builder, build_spec, seq, cancel, others),
                    tool=builder, seq=seq, state=run.machine_state, escalate=_escalate_build)
            except FtlError as error:
                if cancel.is_set():
                    return TaskOutcome(seq, "cancelled", {})
                return _block(run, workspace, error)
            if build_spec is not spec:  # report the user's command, not the wrapper
                build_result["delivered"] = str(build_result.get("delivered") or "").replace(
                    build_spec["run"], task.run)
            scope = build_result.get("out_of_scope") or []
            if scope:
                error = FtlError("workspace_invalid", {"seq": seq, "issues": scope[:20]},
                                 message=f"Task {seq} changed files outside its delta: "
                                         + ", ".join(scope[:5]))
                error.emitted = False
                _emit_failure(run, error, tool=builder, seq=seq)
                return _block(run, workspace, error)
            run.store.finish_workspace(run.campaign_id, workspace.workspace_id, attempt, "built",
                                       _trim(build_result))
        try:
            verify = run.recovery.run(
                lambda n: _verify_once(run, facts, task.verify, seq, cancel),
                tool="run_verify", seq=seq, state=run.machine_state, escalate=escalate_flaky)
        except FtlError as error:
            if cancel.is_set():
                return TaskOutcome(seq, "cancelled", {})
            return _block(run, workspace, error)
        delivered = str(build_result.get("delivered") or build_result.get("output") or "")[-2000:]
        run.store.finish_workspace(run.campaign_id, workspace.workspace_id, attempt, "complete",
                                   {"build": _trim(build_result), "verify": _trim(verify)})
        return TaskOutcome(seq, "complete", {
            "delivered": delivered, "duration_ms": int((time.monotonic() - started) * 1000)})
    finally:
        cancel.set()  # releases the bridge thread


def _build_once(run: Run, facts: list, builder: str, spec: dict, seq: str,
                cancel: threading.Event, exclude_paths: list[str]) -> dict[str, Any]:
    result = run.tools.call(BUILD_INTENT, facts, builder,
                            {"workspace": spec, "exclude_paths": exclude_paths},
                            state=run.machine_state, seq=seq, cancel=cancel)
    if result.get("status") != "complete":
        raise classify_command(result, what="build", seq=seq)
    return result


def _verify_once(run: Run, facts: list, command: str, seq: str,
                 cancel: threading.Event) -> dict[str, Any]:
    result = run.tools.call(VERIFY_INTENT, facts, "run_verify",
                            {"command": command, "timeout_s": run.config.verify_timeout_s},
                            state=run.machine_state, seq=seq, cancel=cancel)
    if not result.get("passed"):
        raise classify_command(result, what="verify", seq=seq)
    return result


def _escalate_build(error: FtlError) -> FtlError:
    """A builder that timed out on its retry used up its budget (FTL budget_exhausted)."""
    if error.error_type == "timeout":
        return FtlError("budget_exhausted", {**error.details, "budget": error.details.get("timeout_s")})
    return error


def _block(run: Run, workspace: Any, error: FtlError) -> TaskOutcome:
    """In-state recovery for a task failure: block the task, keep the campaign going."""
    reason = f"{error.error_type}: {error.message}"
    tail = str(error.details.get("output_tail") or "")
    if tail:
        reason += "\n" + tail[-1500:]
    run.recovery.recovery(strategy="block_task", success=True, state=run.machine_state,
                          task_seq=workspace.seq, error=error)
    run.store.finish_workspace(run.campaign_id, workspace.workspace_id, workspace.attempt,
                               "blocked", {"error_type": error.error_type, "reason": reason})
    return TaskOutcome(workspace.seq, "blocked", {"reason": reason, "error_type": error.error_type})


def _emit_failure(run: Run, error: FtlError, *, tool: str, seq: str) -> None:
    failure = run.log.emit(ev.TOOL_FAILURE, state=run.machine_state, tool=tool, task_seq=seq,
                           error_type=error.error_type, message=error.message, details=error.details)
    run.log.emit(ev.FAILURE_CLASSIFIED, state=run.machine_state, tool=tool, task_seq=seq,
                 failure_seq=failure["seq"], error_type=error.error_type,
                 klass=error.kind.klass.value, decision="structural")


def _already_built(run: Run, seq: str) -> dict[str, Any] | None:
    """The result of a build that finished before a crash, so that resume verifies instead of
    building again: the last attempt is ``built``; or ``complete`` (the crash fell between the
    workspace's and the task's commits, so the task is not complete yet); or it was abandoned
    by a crash after its shell checkpoint."""
    rows = run.store.workspaces(run.campaign_id, seq)
    if not rows:
        return None
    last = rows[-1]
    if last.get("status") == "built":
        return last.get("result") or {}
    if last.get("status") == "complete":
        return (last.get("result") or {}).get("build") or {}
    if last.get("status") == "abandoned" and _checkpoint_path(
            run, last["workspace_id"], last["attempt"]).exists():
        return {"status": "complete", "delivered": f"ran: {last['spec'].get('run') or ''}",
                "from_checkpoint": True}
    return None


def _checkpoint_path(run: Run, workspace_id: str, attempt: int) -> Path:
    return run.repo / ".ftl" / "checkpoints" / run.campaign_id / f"{workspace_id}-{attempt}.built"


def _checkpoint(run: Run, workspace: Any) -> Path:
    path = _checkpoint_path(run, workspace.workspace_id, workspace.attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def _with_checkpoint(command: str, checkpoint: Path) -> str:
    """``command`` in a subshell, then the checkpoint written by a shell builtin on exit 0.

    Newlines, not ``;``, close the subshell, so a trailing ``# comment`` in the command cannot
    swallow the wrapper; the command's exit status is the wrapper's.
    """
    return (f"(\n{command}\n)\nftl_status=$?\n"
            f"if [ $ftl_status -eq 0 ]; then : > {shlex.quote(str(checkpoint))}; fi\n"
            "exit $ftl_status")


def _bridge(token: CancelToken) -> threading.Event:
    """A threading.Event set when the scheduler cancels ``token`` (what tools poll)."""
    event = threading.Event()

    def watch() -> None:
        while not event.is_set():
            if token.wait(0.1):
                event.set()

    threading.Thread(target=watch, name="cancel-bridge", daemon=True).start()
    return event


def _trim(result: dict[str, Any]) -> dict[str, Any]:
    trimmed = dict(result)
    for key in ("output", "stdout", "stderr"):
        if isinstance(trimmed.get(key), str):
            trimmed[key] = trimmed[key][-4000:]
    return trimmed
