"""BUILD: one attempt at one task: workspace -> builder -> file-scope check -> verify.

Used for every ready task inside EXECUTE (CAMPAIGN flow, tasks in parallel) and as the BUILD
state of the TASK flow (the plan's tasks in dependency order, one at a time; FTL built only the
first; the dependents of a task that blocked are then marked blocked too, so the TASK flow never
ends with pending tasks). The runner, not the builder, decides complete or blocked (FTL §8.3
item 6): it runs the verify command itself and blocks a task that changed files outside its
delta/creates (item 7). Files that tasks able to run at the same time may write are not charged
to this one: with one job nothing runs alongside, otherwise only tasks that are neither
ancestors nor descendants of this one in the DAG, and have not finished, can.

Every failure of an attempt, including one outside a tool call (the store, assembling the
workspace), goes through the recovery protocol: ``TOOL_FAILURE`` -> ``FAILURE_CLASSIFIED`` ->
``RECOVERY_ATTEMPT`` block_task, and the workspace row is finished as ``blocked``.

Checkpoints, so that a task's run command completes at most once across retries and crashes:

* a shell build is wrapped so that the shell appends ``<workspace_id>-<attempt>`` to the
  campaign's journal ``.ftl/checkpoints/<campaign_id>.built`` the moment the run command exits
  0 (`ftl.engine.checkpoints`);
* before each try of the build (the first and every retry of a transient failure) the journal
  is checked: if a previous try's command completed but its reply was lost (``network_error``,
  ``timeout`` raised by the client after the command ran), the build is taken as done
  (``RECOVERY_ATTEMPT`` reuse_build) instead of running the command again;
* when the builder succeeds its workspace is marked ``built`` before verify runs, so a crash
  during verify resumes with verify only; a resumed attempt that reuses a build is recorded as
  ``built`` in the same statement that records it, so a second crash still finds it;
* a kill of ftl between the command's exit and the store's ``built`` row (the builder's change
  detection, the reply, the commit: tens of ms), or a command that finishes in the tool server
  after ftl died, leaves an ``abandoned`` attempt with its checkpoint, which resume takes as
  built. Resume walks back over abandoned attempts without one (they died before their command
  completed) to an earlier built one, and stops at a blocked or cancelled attempt or a changed
  task spec.

Build and verify commands outlive a killed ftl (no parent-death signal, a ledger entry with a
deadline): the shell still writes the checkpoint when the command ends, and the resume waits
for such commands before anything runs again (`ftl.engine.runner.Runner._reap_orphans`), so a
command that was about to finish is not killed unrecorded and then repeated.

The remaining at-least-once window: a run command may run again when the runner cannot know
it completed, namely (1) the previous try's command is still running when the retry starts
(only possible when the client gave up while the server keeps the command going, e.g. a remote
server after a network error); (2) the tool server does not share the runner's file system (a
remote HTTP or ``stdio:`` server elsewhere), so the checkpoint is not visible; (3) leftovers
killed at once (``ftl campaign resume --kill-leftovers``) or past their deadline; (4) agent
builds without a checkpoint: a lost reply runs the agent again. A command that failed
(non-zero exit) is run again by design. A build taken from a checkpoint has no change list (it
was in the lost reply), so in a shared checkout the file-scope check is skipped for it; verify
still runs.

With worktree isolation (`_attempt_in_worktree`, `ftl.vcs.worktrees`) the task runs in its own
worktree from the integration head; the scope check is the staged diff against that base (also
for a reused build), the idiom check runs on the same files, and the verified result is a
commit integrated into the campaign's branch. The commit is the record resume looks for first.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any, Callable

from ftl import dag
from ftl import events as ev
from ftl.errors import FtlError
from ftl.idioms import check_idioms, detected_frameworks, violation_error
from ftl.engine import checkpoints
from ftl.engine.machine import Flow
from ftl.engine.recovery import classify_command, classify_exception, escalate_flaky
from ftl.engine.runner import Next, Run
from ftl.engine.scheduler import CancelToken, TaskOutcome
from ftl.states.execute import AGENT_COST_KEYS
from ftl.engine.status import agent_spend
from ftl.engine.tools import fact
from ftl.vcs.scope import out_of_scope
from ftl.vcs.git import GitError
from ftl.vcs.worktrees import MergeConflict, spec_digest
from ftl.engine.workspaces import build_workspace

BUILD_INTENT = "build_task"
VERIFY_INTENT = "verify_task"

_LOG = logging.getLogger("ftl.states.build")


def enter(run: Run) -> Next:
    """TASK flow: register the plan's tasks if needed, build them in dependency order, then
    mark blocked every pending task a blocked task made unreachable (``CASCADE_PROPAGATE``)."""
    from ftl.states.cascade import propagate
    from ftl.states.execute import run_dag

    plan = run.current_plan
    if plan is None:
        raise FtlError("invalid_state", {"trigger": "build", "state": "BUILD"})
    if not run.store.tasks(run.campaign_id):
        from ftl.states.register import registered

        run.log.emit(ev.PLAN_REGISTERED, **registered(plan))
        run.store.add_tasks(run.campaign_id, plan)
    run_dag(run, jobs=1)
    propagate(run)
    return Next("observe")


def run_task(run: Run, seq: str, token: CancelToken, worker: str) -> TaskOutcome:
    """Run one attempt of task ``seq`` (called in a scheduler worker thread).

    ``token`` is the scheduler's: its event is what tool calls and retry backoffs wait on, so a
    cancel (Ctrl-C) stops a running command and ends a backoff without a further try.

    Returns:
        TaskOutcome ``complete`` (detail: delivered, duration_ms), ``blocked`` (detail:
        reason, error_type) or ``cancelled``. Never raises: an unexpected error blocks the task
        through the recovery protocol (see the module docstring).
    """
    started = time.monotonic()
    cancel = token.event
    recorded: list[Any] = []  # the workspace, once its row exists
    try:
        return _attempt(run, seq, cancel, started, recorded, worker)
    except Exception as exc:  # noqa: BLE001 - never the scheduler's last-resort block
        return _fail_task(run, seq, recorded[0] if recorded else None, exc)


def _attempt(run: Run, seq: str, cancel: threading.Event, started: float,
             recorded: list[Any], worker: str = "w1") -> TaskOutcome:
    from ftl.memory import MemoryStore

    task = run.current_plan.task(seq)
    # The full rows of what the workspace reads: this task, its dependencies, the blocked tasks
    # (sibling failures, from an index). Nothing here reads every task of a big campaign.
    blocked = run.store.blocked_seqs(run.campaign_id)
    rows = run.store.tasks(run.campaign_id, seqs=[seq, *task.depends, *blocked])
    row = next((r for r in rows if r["seq"] == seq), None) or run.store.task(run.campaign_id, seq)
    attempt = max(1, int(row.get("attempts") or 1))
    timeout_s = run.config.task_timeout_s(task.budget, task.timeout_s)
    workspace = build_workspace(
        campaign_id=run.campaign_id, plan=run.current_plan, task=task, attempt=attempt,
        timeout_s=timeout_s, tasks=rows,
        memory=MemoryStore(run.store).context(objective=f"{run.current_plan.objective} {task.slug}",
                                              max_failures=5, max_patterns=0)["failures"])
    spec = workspace.model_dump(mode="json")
    facts = _task_kind_facts(run, task)
    if run.task_isolation(task) == "worktree":
        if run.worktrees is None:
            raise FtlError("configuration_error", {
                "problem": f"task {seq} asks for isolation = \"worktree\", but the repository is "
                           "not a git work tree with a commit"})
        if run.runs_on_cluster(task):
            return _attempt_on_cluster(run, task, workspace, spec, cancel, started, recorded,
                                       worker)
        return _attempt_in_worktree(run, task, workspace, spec, facts, cancel, started, recorded)
    built = _already_built(run, seq, spec)
    # A reused build is recorded as built in the same statement: a crash cannot lose it.
    run.store.record_workspace(run.campaign_id, {**spec, "status": "active"},
                               built=None if built is None else {**built[0], "reused_build": True})
    recorded.append(workspace)
    built = built[0] if built is not None else None

    outcome = _build_and_verify(run, task, workspace, spec, facts, cancel, built,
                                exclude=_concurrent_paths(run, seq))
    if isinstance(outcome, TaskOutcome):
        return outcome
    build_result, verify = outcome
    return _complete(run, workspace, build_result, verify, started)


def _build_and_verify(run: Run, task: Any, workspace: Any, spec: dict[str, Any], facts: list,
                      cancel: threading.Event, built: dict[str, Any] | None, *,
                      exclude: list[str], tree: Any = None, round_: int = 1,
                      spent: dict[str, Any] | None = None
                      ) -> TaskOutcome | tuple[dict[str, Any], dict[str, Any]]:
    """Build (unless ``built`` holds a finished build's result), check the file scope, record
    the workspace as ``built``, verify. ``tree``: the task's worktree (its staged diff against
    its base is the scope that counts). ``spent``: the agent cost of this attempt's earlier
    round (a merge conflict's re-run), counted into this round's. Returns ``(build result,
    verify result)``, or the task's outcome when it blocked or was cancelled."""
    seq = task.seq
    build_result: dict[str, Any] = dict(built or {})
    if built is not None:  # an earlier attempt's build: its agent cost is counted on that attempt
        build_result["reused_build"] = True
    builder = _builder_for(run, task)
    claude = _ClaudeTries(run, seq, cancel, spent) if builder == "claude_builder" else None
    if built is None:
        build_spec = spec
        checkpoint: checkpoints.Checkpoint | None = None
        if builder == "shell_builder" and task.run:
            checkpoint = checkpoints.prepare(checkpoints.checkpoint_for(
                run.repo, run.campaign_id, workspace.workspace_id, workspace.attempt, round_))
            if checkpoint is not None:
                build_spec = {**spec, "run": checkpoints.wrap(task.run, checkpoint)}
        others = exclude

        def build_try(number: int) -> dict[str, Any]:
            if checkpoint is not None and checkpoints.written(checkpoint):
                # An earlier try's command completed; only its reply was lost. Never run it twice.
                run.recovery.recovery(strategy="reuse_build", success=True, state=run.machine_state,
                                      task_seq=seq, attempt=number)
                return {"status": "complete", "delivered": f"ran: {task.run}",
                        "from_checkpoint": True}
            if claude is not None:
                return claude.build(facts, build_spec, others)
            return _build_once(run, facts, builder, build_spec, seq, cancel, others)

        try:
            build_result = run.recovery.run(build_try, tool=builder, seq=seq, state=run.machine_state,
                                            escalate=_escalate_build, cancel=cancel)
        except FtlError as error:
            if cancel.is_set():
                return TaskOutcome(seq, "cancelled", {})
            return _block(run, workspace, error)
        if build_spec is not spec:  # report the user's command, not the wrapper
            build_result["delivered"] = str(build_result.get("delivered") or "").replace(
                build_spec["run"], task.run)
    # A build recorded as built was staged (and its scope checked) before its verify ran: the
    # index still holds it, and staging again would take in what that verify wrote.
    staged = built is not None and built.get("change_detection") == "git-commit"
    if tree is not None and not staged:  # the commit's diff decides, .gitignore honoured
        changed = run.worktrees.stage(tree)
        build_result.update(files_changed=changed, change_detection="git-commit",
                            out_of_scope=out_of_scope(changed, [*task.delta, *task.creates],
                                                      tree.path))
    def blocked(error: FtlError) -> TaskOutcome:
        # The build ran (and an agent's was paid for): its cost stays on the blocked row,
        # unless it is an earlier attempt's build reused here (that attempt's row holds it).
        cost = {} if build_result.get("reused_build") else {
            key: build_result[key] for key in AGENT_COST_KEYS if build_result.get(key) is not None}
        if cost and not error.details.get("agent_cost"):
            error.details["agent_cost"] = cost
        return _block(run, workspace, error)

    if (built is None or tree is not None) and not staged:
        scope = build_result.get("out_of_scope") or []
        if scope:
            error = FtlError("workspace_invalid", {"seq": seq, "issues": scope[:20]},
                             message=f"Task {seq} changed files outside its delta: "
                                     + ", ".join(scope[:5]))
            error.emitted = False
            _emit_failure(run, error, tool=builder, seq=seq)
            return blocked(error)
    if built is None and round_ == 1:  # a re-run's build is not a second checkpoint
        run.store.finish_workspace(run.campaign_id, workspace.workspace_id, workspace.attempt,
                                   "built", _trim(build_result))
    violations = _idiom_violations(run, task, build_result, tree)
    if violations:
        error = violation_error(seq, violations)
        _emit_failure(run, error, tool="idiom_check", seq=seq)
        return blocked(error)
    workdir = tree.workdir if tree is not None else None
    try:
        verify = run.recovery.run(
            lambda n: _verify_once(run, facts, task.verify, seq, cancel, workdir),
            tool="run_verify", seq=seq, state=run.machine_state, escalate=escalate_flaky,
            cancel=cancel)
    except FtlError as error:
        if cancel.is_set():
            return TaskOutcome(seq, "cancelled", {})
        return blocked(error)
    return build_result, verify


def _idiom_violations(run: Run, task: Any, build_result: dict[str, Any], tree: Any) -> list:
    """The plan's and the detected frameworks' idioms checked on the files this task changed
    (FTL ERROR_HANDLING idiom_violation, checked by code after the build, before verify). Only
    the task's own delta and creates count: in a shared checkout with jobs > 1 the change list
    can hold a parallel task's files."""
    own = {*task.delta, *task.creates}
    changed = [p for p in (build_result.get("files_changed") or sorted(own)) if p in own]
    plan = run.current_plan
    return check_idioms(tree.path if tree is not None else run.repo, changed, plan.idioms,
                        detected_frameworks(run.exploration.get("pattern"),
                                            plan_framework=plan.framework,
                                            plan_confidence=plan.framework_confidence))


def _complete(run: Run, workspace: Any, build_result: dict[str, Any], verify: dict[str, Any],
              started: float, **detail: Any) -> TaskOutcome:
    detail.update({key: build_result[key] for key in AGENT_COST_KEYS
                   if build_result.get(key) is not None})
    delivered = str(build_result.get("delivered") or build_result.get("output") or "")[-2000:]
    run.store.finish_workspace(run.campaign_id, workspace.workspace_id, workspace.attempt,
                               "complete", {"build": _trim(build_result), "verify": _trim(verify),
                                            **detail})
    return TaskOutcome(workspace.seq, "complete", {
        "delivered": delivered, "duration_ms": round((time.monotonic() - started) * 1000), **detail})


def _attempt_in_worktree(run: Run, task: Any, workspace: Any, spec: dict[str, Any], facts: list,
                         cancel: threading.Event, started: float,
                         recorded: list[Any]) -> TaskOutcome:
    """One attempt in the task's own worktree; its result is a commit integrated into the
    campaign's integration branch (`ftl.vcs.worktrees`).

    Resume first asks git: a commit of this task (same spec) on its branch means build and
    verify passed before the crash, so it is integrated (if it is not already) and the task
    completes without running anything (``RECOVERY_ATTEMPT`` reuse_commit). Else a finished
    build whose worktree still stands on its base is verified (reuse_build), else the worktree
    is reset to the integration head and the task built. A commit that conflicts with the
    head (``merge_conflict``) is re-run once on the new head (``RECOVERY_ATTEMPT``
    rebase_rerun), then the task blocks naming the other task.
    """
    trees = run.worktrees
    seq, name = task.seq, workspace.workspace_id
    commit, tree, built = None, None, None
    build_result: dict[str, Any] = {}
    verify: dict[str, Any] = {}
    earlier = run.store.workspaces(run.campaign_id, seq)  # this task's attempts so far
    found = _reused_commit(run, task, workspace, spec, recorded, earlier)
    if found is not None:
        commit, build_result = found, {"reused_commit": found.commit}
    else:
        previous = _already_built(run, seq, spec, earlier)
        if previous is not None and previous[1].get("base_commit"):
            tree = trees.reuse(name, previous[1]["base_commit"], previous[1].get("workdir"))
            built = previous[0] if tree is not None else None
        if built is not None:  # the build finished before a crash; its files are still there
            run.recovery.recovery(strategy="reuse_build", success=True, state=run.machine_state,
                                  task_seq=seq, base=tree.base)
        tree = tree or trees.prepare(name)
        spec = {**spec, "workdir": tree.workdir, "base_commit": tree.base}
        run.store.record_workspace(run.campaign_id, {**spec, "status": "active"},
                                   built=None if built is None else {**built, "reused_build": True})
        recorded.append(workspace)
    spent: dict[str, Any] | None = None  # round 1's agent cost, carried into round 2's
    for round_ in (1, 2):
        if commit is None:
            outcome = _build_and_verify(run, task, workspace, spec, facts, cancel, built,
                                        exclude=[], tree=tree, round_=round_, spent=spent)
            if isinstance(outcome, TaskOutcome):
                return outcome
            build_result, verify = outcome
            commit = trees.commit(tree, seq=seq, slug=task.slug, attempt=workspace.attempt,
                                  spec=spec)
            changed = build_result.get("files_changed") or []
            run.log.emit(ev.TASK_COMMIT, task_seq=seq, attempt=workspace.attempt,
                         commit=commit.commit, base=commit.base, file_count=len(changed),
                         files=changed[:50])
        try:
            return _integrate(run, workspace, commit, build_result, verify, started, tree=tree)
        except MergeConflict as conflict:
            outcome = _conflicted(run, workspace, commit, conflict, round_, cancel)
            if outcome is not None:
                return outcome
            # Round 2 on the new head, in the folder the task holds (MERGE_CONFLICT named the
            # first commit).
            tree = trees.renew(tree) if tree is not None else trees.prepare(name)
            spent = {} if build_result.get("reused_build") else {  # a reused build: paid before
                key: build_result[key] for key in AGENT_COST_KEYS if build_result.get(key) is not None}
            built, commit = None, None
            spec = {**spec, "workdir": tree.workdir, "base_commit": tree.base}
    raise AssertionError("unreachable: the second round returns or blocks")


def _reused_commit(run: Run, task: Any, workspace: Any, spec: dict[str, Any],
                   recorded: list[Any], rows: list[dict[str, Any]] | None = None) -> Any:
    """The task's verified commit from before a crash (same spec), recorded as reused; or None.
    Only an attempt after an earlier one (a resume, a re-run) can find its commit made.
    ``rows``: the task's workspace rows, when the caller has read them."""
    trees = run.worktrees
    if rows is None:
        rows = run.store.workspaces(run.campaign_id, task.seq)
    earlier = workspace.attempt > 1 or bool(rows)
    found = trees.task_commit(workspace.workspace_id) if earlier else None
    if found is None or found.trailers.get("Ftl-Spec") != spec_digest(spec):
        return None
    run.store.record_workspace(run.campaign_id, {**spec, "status": "active",
                                                 "base_commit": found.base},
                               built={"status": "complete", "reused_commit": found.commit})
    recorded.append(workspace)
    run.recovery.recovery(strategy="reuse_commit", success=True, state=run.machine_state,
                          task_seq=task.seq, commit=found.commit,
                          integrated=trees.is_integrated(found.commit))
    return found


def _attempt_on_cluster(run: Run, task: Any, workspace: Any, spec: dict[str, Any],
                        cancel: threading.Event, started: float, recorded: list[Any],
                        lane: str) -> TaskOutcome:
    """One attempt whose build and verify run as one Ray task on a cluster node (issue 14).

    The driver keeps the protocol: each try is sent with the integration head as its base
    (`ftl.executors.ray_cluster.RayCluster.run_attempt`); a failed build or verify comes back
    as a result and is classified here like a local one (``classify_command``), a lost worker
    as the transient ``worker_lost``; the recovery protocol retries or blocks. A verified
    result is a commit carried back as a bundle, fetched into the task's branch and
    integrated as in worktree mode, so resume finds it the same way (``reuse_commit``).

    Differences from a local worktree attempt: every try (a retried flaky verify too) runs the
    build again, in a fresh checkout on whichever node Ray picks; there is no ``built``
    checkpoint, since a node's checkout does not outlive its try.
    """
    from ftl.vcs.bundles import fetch_task_bundle
    from ftl.vcs.worktrees import task_branch

    trees, seq, name = run.worktrees, task.seq, workspace.workspace_id
    rounds = (1, 2)
    found = _reused_commit(run, task, workspace, spec, recorded)
    if found is not None:
        try:
            return _integrate(run, workspace, found, {"reused_commit": found.commit}, {}, started)
        except MergeConflict as conflict:  # the head moved on since: the first round is spent
            outcome = _conflicted(run, workspace, found, conflict, 1, cancel)
            if outcome is not None:
                return outcome
            rounds = (2,)
    plan = run.current_plan
    frameworks = detected_frameworks(run.exploration.get("pattern"), plan_framework=plan.framework,
                                     plan_confidence=plan.framework_confidence)
    placed: dict[str, Any] = {}
    for round_ in rounds:
        base = trees.ensure_integration()
        attempt_spec = {**spec, "base_commit": base, "executor": "ray"}
        if not recorded:
            run.store.record_workspace(run.campaign_id, {**attempt_spec, "status": "active"})
            recorded.append(workspace)

        def on_placed(where: dict[str, Any], number: int) -> None:
            placed.update(where)
            run.log.emit(ev.TASK_PLACED, task_seq=seq, attempt=workspace.attempt,
                         try_number=number, node=where["node"], node_worker=where["worker"],
                         worker=lane)
            run.store.place_task(run.campaign_id, seq,
                                 f"{lane} @ node {where['node']} ({where['worker']})")

        def one_try(number: int, base: str = base, round_: int = round_) -> dict[str, Any]:
            request = {
                "campaign_id": run.campaign_id, "seq": seq, "slug": task.slug, "name": name,
                "attempt": workspace.attempt, "base": base, "run": task.run,
                "verify": task.verify, "timeout_s": workspace.timeout_s,
                "verify_timeout_s": run.config.verify_timeout_s, "delta": list(task.delta),
                "creates": list(task.creates), "spec": spec,
                "output_limit_bytes": run.config.output_limit_bytes,
                "idioms": plan.idioms.model_dump(mode="json") if plan.idioms else None,
                "frameworks": frameworks,
                "attempt_id": f"{run.campaign_id}/{name}/{workspace.attempt}/{round_}/{number}"}
            result = run.cluster.run_attempt(
                request, cancel=cancel, on_placed=lambda where: on_placed(where, number),
                num_cpus=task.resources.num_cpus if task.resources else 1.0)
            if result["phase"] == "build":
                raise classify_command(result["build"], what="build", seq=seq)
            if result["phase"] == "verify":
                raise classify_command(result["verify"], what="verify", seq=seq)
            return result

        try:
            result = run.recovery.run(one_try, tool="ray_attempt", seq=seq,
                                      state=run.machine_state, escalate=_escalate_remote,
                                      cancel=cancel)
        except FtlError as error:
            # "cancelled" from the cluster: the run's cancel, or the cluster lost (resumable).
            if cancel.is_set() or error.error_type == "cancelled":
                return TaskOutcome(seq, "cancelled", {})
            return _block(run, workspace, error, **_where(placed))
        if result["phase"] == "scope":
            scope = result["out_of_scope"]
            error = FtlError("workspace_invalid", {"seq": seq, "issues": scope[:20]},
                             message=f"Task {seq} changed files outside its delta: "
                                     + ", ".join(scope[:5]))
            error.emitted = False
            _emit_failure(run, error, tool="ray_attempt", seq=seq)
            return _block(run, workspace, error, **_where(placed))
        if result["phase"] == "idioms":
            error = violation_error(seq, result["violations"])
            _emit_failure(run, error, tool="idiom_check", seq=seq)
            return _block(run, workspace, error, **_where(placed))
        commit_id = fetch_task_bundle(run.repo, result["bundle"], task_branch(run.campaign_id, name),
                                      result["commit"])
        commit = trees.task_commit(name)  # with its trailers, as resume will read it
        if commit is None or commit.commit != commit_id:  # moved by hand meanwhile
            raise RuntimeError(f"task branch of {name} does not hold {commit_id[:12]}")
        changed = result.get("files_changed") or []
        build_result = {**(result.get("build") or {}), "files_changed": changed,
                        "change_detection": "git-commit", "node": result["node"]}
        run.log.emit(ev.TASK_COMMIT, task_seq=seq, attempt=workspace.attempt,
                     commit=commit.commit, base=commit.base, file_count=len(changed),
                     files=changed[:50])
        try:
            return _integrate(run, workspace, commit, build_result, result.get("verify") or {},
                              started, **_where(placed))
        except MergeConflict as conflict:
            outcome = _conflicted(run, workspace, commit, conflict, round_, cancel,
                                  **_where(placed))
            if outcome is not None:
                return outcome
    raise AssertionError("unreachable: the second round returns or blocks")


def _conflicted(run: Run, workspace: Any, commit: Any, conflict: MergeConflict, round_: int,
                cancel: threading.Event, **where: Any) -> TaskOutcome | None:
    """A task commit that does not merge: ``MERGE_CONFLICT`` and the failure, then the task's
    outcome (blocked after round 2, or cancelled) or None after ``rebase_rerun`` was recorded
    (round 1: the caller runs the task again on the new head)."""
    seq, others = workspace.seq, conflict.other_seqs
    error = FtlError("merge_conflict", {
        "seq": seq, "other_seq": ", ".join(others) or "(a change outside this campaign)",
        "paths": conflict.paths[:20]})
    run.log.emit(ev.MERGE_CONFLICT, task_seq=seq, commit=commit.commit, base=commit.base,
                 other_seqs=others, paths=conflict.paths[:20], round=round_)
    _emit_failure(run, error, tool="integrate", seq=seq)
    if cancel.is_set() and round_ == 1:  # its commit stays on its branch: the resume retries it
        return TaskOutcome(seq, "cancelled", dict(where))
    if round_ == 2:
        return _block(run, workspace, error, **where)
    run.recovery.recovery(strategy="rebase_rerun", success=True, state=run.machine_state,
                          task_seq=seq, error=error, other_seqs=others)
    return None


def _where(placed: dict[str, Any]) -> dict[str, Any]:
    """A cluster attempt's placement as TaskOutcome detail (TASK_END's ``node``)."""
    return {"node": placed["node"], "node_worker": placed["worker"]} if placed else {}


def _escalate_remote(error: FtlError) -> FtlError:
    """A cluster attempt's last failure: a build's as `_escalate_build`, a verify's as
    ``escalate_flaky`` (the step is in ``details["tool"]``, set by ``classify_command``)."""
    if error.details.get("tool") == "verify":
        return escalate_flaky(error)
    return _escalate_build(error)


def _integrate(run: Run, workspace: Any, commit: Any, build_result: dict[str, Any],
               verify: dict[str, Any], started: float, tree: Any = None,
               **detail: Any) -> TaskOutcome:
    """Integrate a verified task commit and complete the task. Its worktree (``tree``, else
    the task's own path) is released for the next task, or removed: git's cost of adding a
    worktree grows with the number standing, and a reused one is reset, not checked out anew.
    Raises MergeConflict."""
    integration = run.worktrees.integrate(commit, name=workspace.workspace_id)
    if not integration.already:
        run.log.emit(ev.TASK_INTEGRATED, task_seq=workspace.seq, commit=commit.commit,
                     head=integration.head, previous=integration.previous,
                     fast_forward=integration.fast_forward)
    try:  # the commit is integrated: resume needs only the branch from here on
        if tree is not None:
            run.worktrees.release(tree)
        else:
            run.worktrees.remove(workspace.workspace_id)
    except (GitError, OSError) as error:  # a leftover folder; the campaign's end removes it
        _LOG.warning("task %s: its worktree was not removed: %s", workspace.seq, error)
    return _complete(run, workspace, build_result, verify, started, commit=commit.commit,
                     integration_head=integration.head, **detail)


def _builder_for(run: Run, task: Any) -> str:
    """The build tool: the shell builder for a run command; for agent tasks the agent builder,
    or Claude Code itself when ``builder = "claude"`` (issue 12)."""
    if task.builder_kind == "shell":
        return "shell_builder"
    return "claude_builder" if run.config.builder == "claude" else "agent_builder"


class _ClaudeTries:
    """The tries of one task attempt with the Claude builder, and what they share with every
    other agent of the run (``run.agent_limits``, `ftl.executors.agent_limits`).

    Before each try: the campaign's spend limit (``max_cost_usd``: reached -> the task is not
    started, ``budget_exhausted``) and the rate gate (closed -> wait until it opens). After
    each try: its cost is added to the task's and the run's; a rate or usage limit closes the
    gate until its reset; a stall keeps the session id, so the retry continues that session
    (``--resume``).
    """

    def __init__(self, run: Run, seq: str, cancel: threading.Event,
                 spent: dict[str, Any] | None = None) -> None:
        """``spent``: the attempt's cost so far (an earlier round's; already in the run's spend)."""
        self.run, self.seq, self.cancel = run, seq, cancel
        self.resume: str | None = None
        spent = spent or {}
        self.cost: dict[str, Any] = {
            "total_cost_usd": float(spent.get("total_cost_usd") or 0.0),
            "num_turns": int(spent.get("num_turns") or 0),
            "duration_api_ms": int(spent.get("duration_api_ms") or 0),
            "usage": dict(spent.get("usage") or {}), "session_id": spent.get("session_id")}

    def build(self, facts: list, spec: dict[str, Any], exclude: list[str]) -> dict[str, Any]:
        run, limits = self.run, self.run.agent_limits
        limits.spend.seed_once(lambda: sum(  # a resume: the builds and planners of earlier runs
            item["cost_usd"] for item in agent_spend(run.store.workspaces(run.campaign_id)).values())
            + ev.earlier_planner_spend_usd(run.log.path))
        self._check_spend()
        args: dict[str, Any] = {"workspace": spec, "exclude_paths": exclude}
        if self.resume:
            args["resume_session_id"] = self.resume
        refused: list[FtlError] = []

        def start(announce: Callable[[], None]) -> None:
            # Checked again once the gate opens: agents that ran while this start waited may
            # have reached the spend limit meanwhile.
            try:
                self._check_spend()
            except FtlError as error:
                refused.append(error)
                return
            announce()

        # The start waits while the rate gate is closed; its TOOL_CALL is written under the
        # gate's lock, so no start is ever logged after a close it did not wait out.
        try:
            result = run.tools.call(BUILD_INTENT, facts, "claude_builder", args,
                                    state=run.machine_state, seq=self.seq, cancel=self.cancel,
                                    admit=lambda announce: limits.gate.wait(
                                        self.cancel, emit=run.log.emit, state=run.machine_state,
                                        then=lambda: start(announce)))
        except FtlError:
            if refused:
                raise refused[0] from None
            raise
        self._add_cost(result)
        if result.get("error_type") == "rate_limited":
            reopens = result.get("reopens_at")
            limits.gate.close(datetime.fromisoformat(reopens) if reopens else None,
                              emit=run.log.emit, state=run.machine_state, task_seq=self.seq,
                              limit_kind=result.get("limit_kind"), reason=result.get("reason"))
        if result.get("error_type") == "stalled" and result.get("session_id"):
            self.resume = str(result["session_id"])
        if result.get("status") != "complete":
            error = classify_command(result, what="build", seq=self.seq)
            error.details.update({key: result[key] for key in (
                "session_id", "idle_timeout_s", "reopens_at", "limit_kind", "max_turns")
                if result.get(key) is not None}, agent_cost=dict(self.cost))
            if error.error_type in ("agent_login_required", "configuration_error"):
                error.details["problem"] = str(result.get("reason") or "not logged in")
            if error.error_type == "budget_exhausted":
                error.details["budget"] = spec.get("budget")
            raise error
        return {**result, **self.cost}

    def _check_spend(self) -> None:
        """Raise FtlError(budget_exhausted) when the campaign's agent spend reached max_cost_usd."""
        run, spend = self.run, self.run.agent_limits.spend
        if spend.reached(run.config.max_cost_usd):
            raise FtlError("budget_exhausted", {"seq": self.seq, "budget": run.config.max_cost_usd},
                           message=f"Task {self.seq} not started: the campaign's agent spend "
                                   f"${spend.total_usd:.2f} reached max_cost_usd "
                                   f"${run.config.max_cost_usd:.2f}.")

    def _add_cost(self, result: dict[str, Any]) -> None:
        cost = self.cost
        cost["total_cost_usd"] = round(cost["total_cost_usd"]
                                       + float(result.get("total_cost_usd") or 0.0), 6)
        cost["num_turns"] += int(result.get("num_turns") or 0)
        cost["duration_api_ms"] += int(result.get("duration_api_ms") or 0)
        for kind, count in (result.get("usage") or {}).items():
            cost["usage"][kind] = cost["usage"].get(kind, 0) + int(count or 0)
        cost["session_id"] = result.get("session_id") or cost["session_id"]
        self.run.agent_limits.spend.add(result.get("total_cost_usd"))


def _concurrent_paths(run: Run, seq: str) -> list[str]:
    """Paths (delta + creates) of the tasks that may run while ``seq`` runs in the shared
    checkout, so the builder does not charge their changes to ``seq``: none with one job (the
    TASK flow always has one); otherwise the unfinished shared tasks that are neither ancestors
    nor descendants of ``seq`` (a task in its own worktree never touches the checkout). Only
    this case reads the whole graph."""
    jobs = 1 if run.flow is Flow.TASK else run.config.jobs
    if jobs <= 1:
        return []
    deps, statuses = run.store.task_graph(run.campaign_id)
    related = dag.ancestors(deps, seq) | dag.descendants(deps, seq) | {seq}
    live = {other for other, status in statuses.items() if status in ("pending", "running")}
    return sorted({path for other in run.current_plan.tasks
                   if other.seq in live and other.seq not in related
                   and run.task_isolation(other) == "shared"
                   for path in (*other.delta, *other.creates)})


def _task_kind_facts(run: Run, task: Any) -> list[dict[str, Any]]:
    """The facts of a build or verify selection: the campaign's, and the task's kind without its
    seq (``task_kind``, ``run_given``, ``builder_kind``), so one selection serves every task of
    the same kind while its macro-tools are valid (`ftl.engine.tools.ToolClient`); the seq travels in
    the invocation's arguments (the workspace, the verifier's ``seq``). Issue 11 item 3."""
    facts = run.facts() + [fact("task_kind", task.type.value)]
    if task.run:
        facts.append(fact("run_given"))
    requested = "claude" if _builder_for(run, task) == "claude_builder" else task.builder
    if requested:
        facts.append(fact("builder_kind", requested))
    return facts


def _build_once(run: Run, facts: list, builder: str, spec: dict, seq: str,
                cancel: threading.Event, exclude_paths: list[str]) -> dict[str, Any]:
    try:
        result = run.tools.call(BUILD_INTENT, facts, builder,
                                {"workspace": spec, "exclude_paths": exclude_paths},
                                state=run.machine_state, seq=seq, cancel=cancel)
    except FtlError as error:
        if error.error_type == "tool_not_exposed" and builder == "agent_builder":
            # The usual cause: a task without a run command, and no agent to build it.
            raise FtlError("tool_not_exposed", error.details, message=(
                f"Task {seq} has no run command, and the server offers no agent builder: give the "
                "task a run command, or configure an agent (agent_command in ftl.toml, or "
                'builder = "claude" for Claude Code).')) from None
        raise
    if result.get("status") != "complete":
        raise classify_command(result, what="build", seq=seq)
    return result


def _verify_once(run: Run, facts: list, command: str, seq: str,
                 cancel: threading.Event, workdir: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"command": command, "timeout_s": run.config.verify_timeout_s,
                            "seq": seq}
    if workdir:
        args["workdir"] = workdir
    result = run.tools.call(VERIFY_INTENT, facts, "run_verify", args,
                            state=run.machine_state, seq=seq, cancel=cancel)
    if not result.get("passed"):
        raise classify_command(result, what="verify", seq=seq)
    return result


def _escalate_build(error: FtlError) -> FtlError:
    """A builder that timed out on its retry used up its budget (FTL budget_exhausted)."""
    if error.error_type == "timeout":
        return FtlError("budget_exhausted", {**error.details, "budget": error.details.get("timeout_s")})
    return error


def _block(run: Run, workspace: Any, error: FtlError, **where: Any) -> TaskOutcome:
    """In-state recovery for a task failure: block the task, keep the campaign going."""
    reason = f"{error.error_type}: {error.message}"
    tail = str(error.details.get("output_tail") or "")
    if tail:
        reason += "\n" + tail[-1500:]
    run.recovery.recovery(strategy="block_task", success=True, state=run.machine_state,
                          task_seq=workspace.seq, error=error)
    cost = error.details.get("agent_cost") or {}
    run.store.finish_workspace(run.campaign_id, workspace.workspace_id, workspace.attempt,
                               "blocked", {"error_type": error.error_type, "reason": reason,
                                           **({"build": cost} if cost else {})})
    return TaskOutcome(workspace.seq, "blocked", {"reason": reason, "error_type": error.error_type,
                                                  **cost, **where})


def _fail_task(run: Run, seq: str, workspace: Any, exc: Exception) -> TaskOutcome:
    """An attempt failed outside the recovery protocol's tool calls (the store, assembling the
    workspace, a bug): emit and classify it, block the task, finish its workspace row."""
    error = classify_exception(exc)
    if error.error_type == "internal_error":
        _LOG.error("task %s failed (correlation id %s)", seq, error.details.get("correlation_id"),
                   exc_info=exc)
    if not getattr(error, "emitted", False):
        _emit_failure(run, error, tool="run_task", seq=seq,
                      decision="escalate" if error.transient else "structural")
    reason = f"{error.error_type}: {error.message}"
    run.recovery.recovery(strategy="block_task", success=True, state=run.machine_state,
                          task_seq=seq, error=error)
    if workspace is not None:
        try:
            run.store.finish_workspace(run.campaign_id, workspace.workspace_id, workspace.attempt,
                                       "blocked", {"error_type": error.error_type, "reason": reason})
        except Exception:  # noqa: BLE001 - the row stays active; resume marks it abandoned
            _LOG.warning("task %s: could not finish workspace %s", seq, workspace.workspace_id,
                         exc_info=True)
    return TaskOutcome(seq, "blocked", {"reason": reason, "error_type": error.error_type})


def _emit_failure(run: Run, error: FtlError, *, tool: str, seq: str,
                  decision: str = "structural") -> None:
    failure = run.log.emit(ev.TOOL_FAILURE, state=run.machine_state, tool=tool, task_seq=seq,
                           error_type=error.error_type, message=error.message, details=error.details)
    run.log.emit(ev.FAILURE_CLASSIFIED, state=run.machine_state, tool=tool, task_seq=seq,
                 failure_seq=failure["seq"], error_type=error.error_type,
                 klass=error.kind.klass.value, decision=decision)
    error.emitted = True


def _already_built(run: Run, seq: str, spec: dict[str, Any], rows: list[dict[str, Any]] | None = None
                   ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The result of a build that finished before a crash, so that resume verifies instead of
    building again, with the spec of the attempt that built it: ``(result, spec)`` or None.

    Walks the task's attempts from the newest: ``built`` gives its result; ``complete`` its
    build result (the crash fell between the workspace's and the task's commits); ``abandoned``
    with its shell checkpoint a build that finished unseen; ``abandoned`` without one died
    before its command completed, so the attempt before it is looked at, except after a
    worktree attempt (it reset the folder the earlier build was in). Anything else
    (blocked, cancelled, active), or an attempt whose command or scope differs from ``spec``
    (a re-plan changed the task), ends the walk: there is nothing to reuse. ``rows``: the
    task's workspace rows, when the caller has read them.
    """
    if rows is None:
        rows = run.store.workspaces(run.campaign_id, seq)
    for row in reversed(rows):
        old = row.get("spec") or {}
        if any(old.get(key) != spec.get(key) for key in ("run", "delta", "creates")):
            return None
        status = row.get("status")
        if status == "built":
            return row.get("result") or {}, old
        if status == "complete":
            return (row.get("result") or {}).get("build") or {}, old
        if status != "abandoned":
            return None
        if checkpoints.written(checkpoints.checkpoint_for(run.repo, run.campaign_id,
                                                          row["workspace_id"], row["attempt"])):
            return {"status": "complete", "delivered": f"ran: {old.get('run') or ''}",
                    "from_checkpoint": True}, old
        if old.get("base_commit"):  # a worktree attempt reset its folder before it died: an
            return None             # earlier build there is gone, a half-written one may be in it
    return None


def _trim(result: dict[str, Any]) -> dict[str, Any]:
    trimmed = dict(result)
    for key in ("output", "stdout", "stderr"):
        if isinstance(trimmed.get(key), str):
            trimmed[key] = trimmed[key][-4000:]
    return trimmed
