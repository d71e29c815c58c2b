"""FTL-compatible ``workspace.py``: one builder attempt at one task, over ftl's store.

FTL workspace.py (``shared/reference/ftl-behaviour.md`` §4.2, §5.3-5.4) with its lifecycle
enforced: creating a workspace starts the task (pending -> running, dependencies complete),
completing or blocking it ends the attempt and moves the task the same way, and each attempt
gets a fresh workspace (FTL's ids were global, re-used across attempts and never changed
status, §8.2 item 14). Workspaces belong to a campaign; ids are ``{seq}-{slug}`` plus an
attempt number. Output and exit codes: see ``lib/_common.py``.

Workspace object (every command): the workspace spec of `ftl.engine.workspaces.build_workspace`
(workspace_id, campaign_id, seq, slug, type, attempt, objective, delta, creates, verify, run,
budget, timeout_s, framework, idioms, lineage, prior_knowledge) plus FTL's ``id`` (=
workspace_id), ``status`` (active | built | complete | blocked | cancelled | abandoned),
``created_at``, ``completed_at``, ``blocked_at``, ``finished_at``, ``delivered`` and the stored
``result``.
"""

from __future__ import annotations

from typing import Any

import click

from _common import (PLAN_VERSION, Env, FtlRefusal, Reply, command, parse_json_option,
                     parse_workspace_ref, script_group, wrap)
from ftl.surfaces.envelope import Warning
from ftl.errors import FtlError

cli = script_group("workspace.py", "Workspaces: one builder attempt at one task (FTL workspace.py).")

WORKER = "lib/workspace.py"
OPEN = ("active", "built")


def view(row: dict) -> dict[str, Any]:
    """The workspace object of the module docstring from a store workspace row."""
    spec = row["spec"] if isinstance(row["spec"], dict) else {}
    result = row["result"] if isinstance(row["result"], dict) else {}
    build = result.get("build") if isinstance(result.get("build"), dict) else {}
    status, finished = row["status"], row["finished_at"]
    return {
        **spec, "id": row["workspace_id"], "workspace_id": row["workspace_id"],
        "campaign_id": row["campaign_id"], "seq": row["seq"], "attempt": row["attempt"],
        "status": status, "created_at": row["created_at"], "finished_at": finished,
        "completed_at": finished if status == "complete" else None,
        "blocked_at": finished if status == "blocked" else None,
        "delivered": str(result.get("delivered") or build.get("delivered") or ""),
        "result": row["result"],
    }


def ftl_view(row: dict) -> dict[str, Any]:
    """FTL's workspace object (``_ws_to_dict``) from a store workspace row: {id, workspace_id,
    status, created_at, completed_at, blocked_at, objective, delta, verify, verify_source,
    budget, delivered, framework, framework_confidence} plus, when not empty, idioms (only
    with a framework other than "none"), prior_knowledge, lineage, utilized_memories,
    code_contexts with code_context (the first), preflight."""
    spec = row["spec"] if isinstance(row["spec"], dict) else {}
    full = view(row)
    status = {"built": "active"}.get(row["status"], row["status"])
    out: dict[str, Any] = {
        "id": row["workspace_id"], "workspace_id": row["workspace_id"], "status": status,
        "created_at": row["created_at"], "completed_at": full["completed_at"],
        "blocked_at": full["blocked_at"], "objective": spec.get("objective", ""),
        "delta": spec.get("delta", []), "verify": spec.get("verify", ""),
        "verify_source": spec.get("verify_source"), "budget": spec.get("budget", 5),
        "delivered": full["delivered"], "framework": spec.get("framework"),
        "framework_confidence": spec.get("framework_confidence", 1.0)}
    if spec.get("framework") not in (None, "none") and spec.get("idioms"):
        out["idioms"] = spec["idioms"]
    for key in ("prior_knowledge", "lineage"):
        if spec.get(key):
            out[key] = spec[key]
    result = row["result"] if isinstance(row["result"], dict) else {}
    if result.get("utilized"):
        out["utilized_memories"] = result["utilized"]
    if spec.get("code_contexts"):
        out["code_contexts"] = spec["code_contexts"]
        out["code_context"] = spec["code_contexts"][0]
    if spec.get("preflight"):
        out["preflight"] = spec["preflight"]
    return out


def _find(env: Env, campaign_id: str, ref: str) -> dict:
    """The latest attempt of the workspace ``ref`` names. Raises: FtlError(not_found)."""
    seq, workspace_id = parse_workspace_ref(ref)
    rows = [r for r in env.store.workspaces(campaign_id, seq=seq)
            if workspace_id is None or r["workspace_id"] == workspace_id]
    if not rows:
        what = workspace_id or f"any workspace of task {seq}"
        raise FtlError("not_found", {"what": f"workspace {what} in campaign {campaign_id}"},
                       message=f"Workspace {what} was not found in campaign {campaign_id}.")
    return max(rows, key=lambda r: (r["attempt"], r["created_at"]))


def _start(env: Env, cid: str, seq: str) -> dict:
    """pending -> running; refused as illegal_transition naming the open dependencies."""
    try:
        return env.store.transition_task(cid, seq, "running", worker=WORKER)
    except FtlError as error:
        if error.error_type != "invalid_state":
            raise
        raise FtlError("illegal_transition", {"what": error.message, "seq": seq, "to_status": "running"},
                       message=error.message) from None


def _open_attempt_of(env: Env, cid: str, row: dict) -> dict | None:
    """The open workspace (active or built) of task ``row``'s current attempt, or None."""
    current = [w for w in env.store.workspaces(cid, seq=row["seq"])
               if w["attempt"] == row["attempts"] and w["status"] in OPEN]
    return current[-1] if current else None


def _create_one(env: Env, cid: str, plan, seq: str) -> dict:
    """Start ``seq`` (or pick up its running attempt) and record its workspace; return the row.

    The workspace is built from the task's current spec in the store (a re-plan merge may have
    revised or added it since any given plan version) and ``plan``'s header (objective,
    framework, idioms). Two calls for the same task at once both return the one attempt: the
    store's transition and its (workspace, attempt) key let only one start and record it, and
    the other re-reads what the first recorded.
    """
    from ftl.engine.workspaces import build_workspace
    from ftl.models import Task

    row = env.store.task(cid, seq)
    if row["status"] == "pending":
        try:
            row = _start(env, cid, seq)
        except FtlError as error:
            row = env.store.task(cid, seq)
            if error.error_type != "illegal_transition" or row["status"] != "running":
                raise
    if row["status"] == "running":
        found = _open_attempt_of(env, cid, row)
        if found is not None:  # FTL create is idempotent: the open attempt is returned as it is
            return found
    else:
        hint = ("re-open it with campaign.py merge-revised-plan" if row["status"] == "blocked"
                else f"read its workspace with `workspace.py parse {seq}`")
        text = f"Task {seq} is {row['status']}; no new attempt can start ({hint})."
        raise FtlError("conflict", {"what": text}, message=text)
    task = Task.model_validate(row["spec"])
    from ftl.memory import MemoryStore

    memory = MemoryStore(env.store).context(objective=plan.objective or None, max_failures=5,
                                            max_patterns=3)
    workspace = build_workspace(
        campaign_id=cid, plan=plan, task=task, attempt=row["attempts"],
        timeout_s=env.config.task_timeout_s(task.budget, task.timeout_s),
        tasks=env.store.tasks(cid), memory=memory)
    try:
        env.store.record_workspace(cid, {**workspace.model_dump(mode="json"),
                                         **_ftl_extras(env, cid, task), "status": "active"})
    except FtlError as error:
        if error.error_type != "conflict":
            raise
        found = _open_attempt_of(env, cid, env.store.task(cid, seq))  # recorded by a concurrent call
        if found is None:
            raise
        return found
    return _find(env, cid, workspace.workspace_id)


def _ftl_extras(env: Env, cid: str, task) -> dict[str, Any]:
    """What FTL's workspace carries beyond ftl's `Workspace`: verify_source, code_contexts of
    the delta files that exist (read here, at the edge), preflight, framework_confidence (the
    exploration's pattern confidence, else 0.5) and the task's pass-through fields."""
    from ftl.engine.workspaces import code_context, verify_source

    contexts = []
    for name in task.delta:
        path = env.repo / name
        try:
            text = path.read_text(encoding="utf-8") if path.is_file() else None
        except (OSError, UnicodeDecodeError):
            text = None
        if text is not None:
            contexts.append(code_context(name, text, target_lines=task.target_lines.get(name),
                                         task_type=task.type.value))
    exploration = env.store.exploration(cid) or {}
    pattern = exploration.get("pattern") if isinstance(exploration.get("pattern"), dict) else {}
    confidence = pattern.get("confidence", 0.5)
    return {"verify_source": task.verify_source or verify_source(task.verify), "code_contexts": contexts,
            "preflight": list(task.preflight),
            "framework_confidence": float(confidence) if isinstance(confidence, (int, float)) else 0.5,
            **(task.model_extra or {})}


@command(cli, "create")
@click.option("--plan-id", "plan_id", type=PLAN_VERSION, required=True,
              help="Plan version N of the active campaign (see plan.py).")
@click.option("--task", "task_seq", default=None, help="Only this task's seq (001, 1 and 01 are equal).")
def create(env: Env, plan_id: int, task_seq: str | None) -> Reply:
    """Create workspaces for the campaign's tasks, starting each task (pending -> running).

    A campaign without tasks first registers plan version N (FTL's TASK flow creates
    workspaces without add-tasks). Each workspace is built from its task's current spec in the
    store and the header (objective, framework, idioms) of the latest plan version, so a task
    a re-plan merge added or revised gets its current spec while FTL's flow keeps passing the
    plan id it started with; an N older than the latest only adds a STALE_CACHE warning.
    With --task: that task, which must be ready (every dependency complete) or already running
    (its open workspace is returned unchanged). Without: every READY task; the others are
    listed in `skipped` (FTL created one for every task, so all but the first stayed active
    forever, §8.2 item 1). data: {"created": [workspace, ...], "skipped": [{seq, status}]}.
    No active campaign, unknown plan version or seq -> NOT_FOUND; a blocked, complete or
    not-ready task -> CONFLICT (exit 2).
    """
    from ftl import dag
    from ftl.models import normalize_seq

    cid = env.active()["campaign_id"]
    plan = env.store.get_plan(cid, plan_id)
    warnings = []
    latest = env.store.plan_versions(cid)[-1]
    if plan_id != latest:
        warnings.append(Warning("STALE_CACHE", f"plan version {plan_id} is not the latest ({latest}); "
                                               "workspaces are built from the tasks' current specs",
                                {"plan_id": plan_id, "latest": latest}))
    seq = None
    if task_seq is not None:
        try:
            seq = normalize_seq(task_seq)
        except ValueError as exc:
            raise FtlError("schema_invalid", {"count": 1, "violations": [
                {"path": "--task", "message": str(exc), "fix": "pass a seq like 001"}]}) from None
    if not env.store.tasks(cid):  # register the plan first: FTL's TASK flow never calls add-tasks
        try:
            env.store.add_tasks(cid, plan)
        except FtlError as error:  # a concurrent create registered it first: use its tasks
            if error.error_type != "conflict" or not env.store.tasks(cid):
                raise
    if env.store.plan_versions(cid)[-1] != plan_id:  # the header of the latest version
        plan = env.store.get_plan(cid)
    depends, status = env.store.task_graph(cid)
    skipped: list[dict[str, str]] = []
    if seq is not None:
        if seq not in status:
            text = f"Task {seq} is not a task of campaign {cid}; its tasks are those of its plan versions."
            raise FtlError("not_found", {"what": f"task {seq} of campaign {cid}"}, message=text)
        seqs = [seq]
    else:
        ready = set(dag.ready_set(depends, status))
        seqs = [s for s in status if s in ready]
        skipped = [{"seq": s, "status": state} for s, state in status.items() if s not in ready]
    rows = [_create_one(env, cid, plan, s) for s in seqs]
    return Reply({"created": [view(r) for r in rows], "skipped": skipped}, warnings=warnings,
                 ftl={"created": [ftl_view(r) for r in rows]}, ftl_indent=None)


def _open_attempt(env: Env, ref: str) -> tuple[str, dict]:
    """The active campaign's open workspace ``ref`` whose task is running this attempt."""
    cid = env.active()["campaign_id"]
    row = _find(env, cid, ref)
    if row["status"] not in OPEN:
        text = f"Workspace {row['workspace_id']} attempt {row['attempt']} is already {row['status']}."
        raise FtlError("conflict", {"what": text}, message=text)
    task = env.store.task(cid, row["seq"])
    if task["status"] != "running" or task["attempts"] != row["attempt"]:
        text = (f"Workspace {row['workspace_id']} attempt {row['attempt']} is stale: task {row['seq']} "
                f"is {task['status']} at attempt {task['attempts']}.")
        raise FtlError("conflict", {"what": text}, message=text)
    return cid, row


@command(cli, "complete")
@click.argument("ref", metavar="ID")
@click.option("--delivered", required=True, help="What the attempt delivered (kept as lineage for children).")
@click.option("--utilized", default=None, help="JSON array of the memory entries that helped.")
def complete(env: Env, ref: str, delivered: str, utilized: str | None) -> Reply:
    """Complete workspace ID (001-slug, a seq, or .../001_slug_active.xml) and its task.

    The workspace must be the open attempt of a running task; the task goes running ->
    complete with `delivered`. FTL accepted any order and repeat calls (§5.3). data: the
    workspace object. Unknown ID -> NOT_FOUND; finished or stale attempt -> CONFLICT.
    """
    items = parse_json_option(utilized, "--utilized", list) if utilized is not None else []
    return _finish(env, ref, "complete", {"delivered": delivered, "utilized": items})


@command(cli, "block")
@click.argument("ref", metavar="ID")
@click.option("--reason", required=True, help="Why the attempt failed (first line shown to siblings).")
def block(env: Env, ref: str, reason: str) -> Reply:
    """Block workspace ID and its task ("blocking is success": the reason becomes knowledge).

    The task goes running -> blocked with the reason; delivered is "BLOCKED: <reason>" as in
    FTL. data: the workspace object. Unknown ID -> NOT_FOUND; finished or stale attempt ->
    CONFLICT.
    """
    return _finish(env, ref, "blocked", {"delivered": f"BLOCKED: {reason}", "reason": reason})


def _finish(env: Env, ref: str, status: str, result: dict) -> Reply:
    """End the open attempt of workspace ``ref``: the task and the workspace row both move to
    ``status`` (complete | blocked); ``result`` carries ``delivered`` and, when blocked, ``reason``."""
    cid, row = _open_attempt(env, ref)
    env.store.transition_task(cid, row["seq"], status, reason=result.get("reason"),
                              delivered=result["delivered"])
    env.store.finish_workspace(cid, row["workspace_id"], row["attempt"], status, result)
    done = _find(env, cid, row["workspace_id"])
    return Reply(view(done), ftl=ftl_view(done), ftl_indent=None)


@command(cli, "parse")
@click.argument("ref", metavar="ID")
@click.option("--campaign-id", default=None, help="Campaign (default: active, else newest).")
def parse(env: Env, ref: str, campaign_id: str | None) -> Reply:
    """The latest attempt of workspace ID (001-slug, a seq, or .../001_slug_active.xml).

    data: the workspace object. Unknown ID -> NOT_FOUND, exit 2 (FTL printed {"error"} and
    exited 0).
    """
    campaign = env.campaign(campaign_id)
    try:
        if campaign is None:
            raise FtlError("not_found", {"what": "campaign"}, message="The store has no campaign yet.")
        row = _find(env, campaign["campaign_id"], ref)
    except FtlError as error:
        if error.error_type != "not_found":
            raise
        raise FtlRefusal("not_found", error.details, message=error.message, ftl_exit=0,
                         ftl_payload={"error": f"Workspace not found: {_ftl_id(ref)}"}) from None
    return Reply(view(row), ftl=ftl_view(row))


def _ftl_id(ref: str) -> str:
    """The workspace id FTL derived from an ID argument (a virtual path gives seq-slug)."""
    if "/" in ref or ref.endswith(".xml"):
        parts = ref.rsplit("/", 1)[-1].removesuffix(".xml").rsplit("_", 1)
        if len(parts) == 2 and "_" in parts[0]:
            seq, slug = parts[0].split("_", 1)
            return f"{seq}-{slug}"
    return ref


@command(cli, "list")
@click.option("--status", type=click.Choice(["active", "built", "complete", "blocked", "cancelled",
                                             "abandoned"]), default=None, help="Only this status.")
@click.option("--campaign-id", default=None, help="Only this campaign (default: every campaign).")
def list_(env: Env, status: str | None, campaign_id: str | None) -> Reply:
    """Workspaces (every attempt), newest first.

    data: {"items": [workspace, ...]}. Every campaign unless --campaign-id, as in FTL.
    """
    campaigns = ([env.store.get_campaign(campaign_id)] if campaign_id else env.store.list_campaigns())
    rows = [r for c in campaigns for r in env.store.workspaces(c["campaign_id"])
            if status is None or r["status"] == status]
    rows.sort(key=lambda r: (r["created_at"], r["attempt"]), reverse=True)
    return Reply(wrap([view(r) for r in rows]), ftl=[ftl_view(r) for r in rows])


@command(cli, "get-injected")
@click.option("--workspace", "ref", required=True,
              help="Workspace ID or path; a '*' matches by prefix (e.g. '1-*').")
def get_injected(env: Env, ref: str) -> Reply:
    """The memory entries injected into a workspace's prior knowledge, for feedback-batch.

    data: {"items": [{name, type}]}: failures, patterns and sibling failures, each once
    (FTL get-injected). Workspaces of the active campaign, else the newest; unknown IDs give [].
    """
    campaign = env.campaign(None)
    rows = [] if campaign is None else env.store.workspaces(campaign["campaign_id"])
    if "*" in ref:
        prefix = ref.replace("*", "")
        chosen = [r for r in rows if r["workspace_id"].startswith(prefix)]
    else:
        try:
            seq, workspace_id = parse_workspace_ref(ref)
        except FtlError:
            seq, workspace_id = None, None
        chosen = [r for r in rows if r["seq"] == seq and workspace_id in (None, r["workspace_id"])]
        chosen = chosen[-1:]  # the latest attempt
    injected, seen = [], set()
    for row in chosen:
        prior = (row["spec"] or {}).get("prior_knowledge") or {}
        for key, kind in (("failures", "failure"), ("patterns", "pattern"), ("sibling_failures", "failure")):
            for entry in prior.get(key) or []:
                if (entry.get("name"), kind) not in seen:
                    seen.add((entry.get("name"), kind))
                    injected.append({"name": entry.get("name"), "type": kind})
    return Reply(wrap(injected), ftl=injected, ftl_indent=None)

