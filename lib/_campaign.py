"""The commands of FTL-compatible ``campaign.py`` (``lib/campaign.py`` starts them): campaigns,
their task DAG and cascade handling over ftl's store.

A thin click front end (FTL campaign.py, ``shared/reference/ftl-behaviour.md`` §4.1 and §6):
every command prints one response-v2 envelope whose ``data`` is FTL's payload (see
``lib/_common.py`` for the output and exit-code contract). Task statuses are the store's
(pending, running, complete, blocked); FTL's ``in_progress`` is accepted as ``running``.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import date
from pathlib import Path
from typing import Any

import click

# The sibling _common module, however the script is started (python lib/x.py, runpy, tests).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (TASK_STATUS_ALIASES, Env, FtlRefusal, Reply, campaign_entry, command,
                     fingerprint, ftl_depends, ftl_seq_text, ftl_task, parse_json_text, plan_input,
                     read_stdin_json, replan_input, run, script_group, violation, wrap)
from ftl.errors import FtlError

cli = script_group("campaign.py", "Campaigns and their task DAG (FTL campaign.py).")


def _graph(rows: list[dict]) -> tuple[dict[str, list[str]], dict[str, str]]:
    return {r["seq"]: r["depends"] for r in rows}, {r["seq"]: r["status"] for r in rows}


@command(cli, "create")
@click.argument("objective")
@click.option("--framework", default=None, help="Framework name (e.g. fastapi); default: the plan's.")
def create(env: Env, objective: str, framework: str | None) -> Reply:
    """Create the active campaign.

    data: {id, campaign_id, objective, status: "active", flow, framework, created_at,
    finished_at, summary, tasks: [], counts}. A second active campaign is refused with
    CONFLICT naming the active one (FTL crashed on the unique index, §8.2 item 2).
    """
    campaign = env.store.create_campaign(objective, framework=framework)
    return Reply(campaign_entry(env.store, campaign), ftl={
        "id": campaign["campaign_id"], "objective": objective, "status": "active", "tasks": [],
        "framework": framework, "created_at": campaign["created_at"]})


@command(cli, "status", light=True)
@click.option("--campaign-id", default=None, help="Campaign to show (default: active, else newest).")
def status(env: Env, campaign_id: str | None) -> Reply:
    """The campaign's state.

    data: {id, campaign_id, status, objective, flow, framework, created_at, finished_at, tasks,
    summary, counts}, or {"status": "none"} when the store has no campaign. Without an active
    campaign the newest finished one is shown, so `status` after `complete` still reports the
    summary (FTL only looked at the active campaign and printed "none", §8.2 item 3).
    """
    campaign = env.campaign(campaign_id)
    if campaign is None:
        return Reply({"status": "none"})
    entry = campaign_entry(env.store, campaign)
    return Reply(entry, ftl={
        "status": entry["status"], "objective": entry["objective"], "framework": entry["framework"],
        "created_at": entry["created_at"], "tasks": [ftl_task(t) for t in entry["tasks"]],
        "summary": entry["summary"] or {}})


@command(cli, "add-tasks", light=True, bulk=True)
def add_tasks(env: Env) -> Reply:
    """Register the plan JSON on stdin as the active campaign's tasks (REGISTER).

    The plan is validated first (every violation with its JSON path; cycles, duplicate seqs
    and dangling dependencies included). data: {"status": "tasks_added", campaign_id, seqs,
    plan_version}. A campaign that already has tasks is refused (FTL replaced the task list
    and reset progress, §8.2 item 12); change tasks with merge-revised-plan.
    """
    from ftl.plan_rows import plan_rows

    source = "plan on standard input"
    sent = read_stdin_json(source)
    raw = plan_input(sent)
    campaign = env.active()
    cid = campaign["campaign_id"]
    versions = env.store.plan_versions(cid) if isinstance(raw, dict) else []
    if versions:
        raw = _complete_plan_record(env, cid, sent, raw, versions)
    # Lean validation into store rows, pydantic only for plans it declines (the same errors); the
    # parsed JSON is dropped before the rows are written (a 10,000-task plan: issue 11 item 4).
    rows = plan_rows(raw, source=source)
    del raw
    seqs = env.store.add_tasks(cid, rows)
    return Reply({"status": "tasks_added", "campaign_id": cid, "seqs": seqs,
                  "plan_version": env.store.plan_versions(cid)[-1]},
                 ftl={"status": "tasks_added"}, ftl_indent=None)


def _complete_plan_record(env: Env, cid: str, sent: dict, raw: dict, versions: list[int]) -> dict:
    """The plan ``raw`` with what FTL's plan record left out filled from the saved plan.

    FTL's REGISTER pipes `plan.py read --id N` here; FTL's record of a plan keeps only {id,
    campaign_id, objective, framework, idioms, tasks, status, created_at}, so the plan's campaign
    slug, framework confidence, schema version and extra fields (e.g. ``rationale``) are missing,
    and the same plan would be saved again as a new version without them. A record naming a
    saved version (``id`` N) gets every top-level field of version N it lacks; other input only
    the campaign slug and framework confidence of the latest version, as before (a new plan
    must not inherit another plan's extras).
    """
    version = sent.get("id")
    if type(version) is int and version in versions:
        saved = env.store.plan_header(cid, version)
    else:
        saved = env.store.latest_plan_fields(cid, ("campaign", "framework_confidence"))
    return {**{k: v for k, v in saved.items() if k not in raw}, **raw}


def _illegal(current: str, target: str, seq: str, error: FtlError) -> FtlError:
    """The store's invalid_state refusal as a user-facing illegal_transition with the legal moves."""
    from ftl.models import TaskStatus
    from ftl.store import TRANSITIONS

    legal = TRANSITIONS.get((TaskStatus(current), TaskStatus(target)), "absent")
    if legal is None:  # a legal move the store refused: unfinished dependencies
        text = error.message
    elif legal == "replan":
        text = (f"Task {seq} is blocked; only a re-plan re-opens it "
                "(campaign.py merge-revised-plan with a plan that lists the task).")
    elif legal == "resume":
        text = f"Task {seq} is running; only `ftl campaign resume` puts an interrupted attempt back."
    else:
        moves = sorted(to.value for (frm, to), reason in TRANSITIONS.items()
                       if frm.value == current and reason is None)
        text = (f"Task {seq} cannot go {current} -> {target}; from {current} it can go to "
                f"{', '.join(moves) or 'nothing (final)'}.")
    moves = sorted(to.value for (frm, to), reason in TRANSITIONS.items()
                   if frm.value == current and reason is None)
    return FtlError("illegal_transition", {"what": text, "seq": seq, "from_status": current,
                                           "to_status": target, "legal_moves": moves}, message=text)


@command(cli, "update-task", context_settings={"ignore_unknown_options": True})  # SEQ "-1" is an argument
@click.argument("seq")
@click.argument("status")
@click.option("--reason", default=None, help="Block reason (only with STATUS blocked).")
@click.option("--delivered", default=None, help="What the task delivered (complete or blocked).")
def update_task(env: Env, seq: str, status: str, reason: str | None, delivered: str | None) -> Reply:
    """Move task SEQ to STATUS along a legal transition only.

    STATUS: pending, running (FTL: in_progress), complete, blocked. Legal moves:
    pending->running (every dependency complete), running->complete, running->blocked,
    pending->blocked; a blocked task is re-opened only by merge-revised-plan. FTL accepted any
    string and any transition (§8.2 item 11). Setting the status a task already has is a no-op
    (changed: false). data: {task: SEQ (three digits), status, previous, changed}. Unknown seq
    -> NOT_FOUND; illegal move -> CONFLICT naming the legal ones (exit 2).
    """
    from ftl.models import TaskStatus, normalize_seq

    try:
        normalize_seq(seq)
    except ValueError as exc:
        raise violation("SEQ", str(exc), "pass the seq of one of the campaign's tasks, e.g. 001") from None
    target = TASK_STATUS_ALIASES.get(status.strip().lower(), status.strip().lower())
    valid = [s.value for s in TaskStatus]
    if target not in valid:
        raise violation("STATUS", f"{status!r} is not a task status",
                        f"use one of {', '.join(valid)} (in_progress means running)")
    if reason is not None and target != "blocked":
        raise violation("--reason", "is only meaningful with STATUS blocked", "drop --reason")
    if delivered is not None and target not in ("complete", "blocked"):
        raise violation("--delivered", "is only meaningful with STATUS complete or blocked",
                        "drop --delivered")
    cid = env.active()["campaign_id"]
    row = env.store.task(cid, seq)
    current = row["status"]
    echo = {"task": seq, "status": status}  # FTL printed the arguments as typed
    if current == target:
        return Reply({"task": row["seq"], "status": current, "previous": current, "changed": False},
                     ftl=echo, ftl_indent=None)
    try:
        new = env.store.transition_task(cid, row["seq"], target, reason=reason, delivered=delivered,
                                        worker="lib/campaign.py" if target == "running" else None)
    except FtlError as error:
        if error.error_type != "invalid_state":
            raise
        raise _illegal(current, target, row["seq"], error) from None
    return Reply({"task": new["seq"], "status": new["status"], "previous": current, "changed": True},
                 ftl=echo, ftl_indent=None)


@command(cli, "next-task", light=True, bulk=True)
def next_task(env: Env) -> Reply:
    """The first READY task: pending with every dependency complete, lowest seq.

    FTL returned the first pending task and ignored dependencies (§8.2 item 16). data: the
    task dict {seq, slug, type, depends, status, attempts, blocked_by, block_reason,
    delivered, spec, ...}, or {} when no task is ready or no campaign is active.
    """
    from ftl import dag

    campaign = env.active(required=False)
    if campaign is None:
        return Reply({}, ftl=None)
    rows = env.store.tasks(campaign["campaign_id"])
    ready = dag.ready_set(*_graph(rows))
    by_seq = {r["seq"]: r for r in rows}
    return Reply(by_seq[ready[0]] if ready else {}, ftl=ftl_task(by_seq[ready[0]]) if ready else None)


@command(cli, "ready-tasks", light=True, bulk=True)
def ready_tasks(env: Env) -> Reply:
    """Every ready task (pending, every dependency complete), in seq order (FTL §6.5).

    data: {"items": [task dict, ...]}; empty when none is ready or no campaign is active.
    """
    campaign = env.active(required=False)
    if campaign is None:
        return Reply(wrap([]), ftl=[])
    chosen = env.store.ready_tasks(campaign["campaign_id"])  # SQLite finds them; specs of those only
    return Reply(wrap(chosen), ftl=lambda: [ftl_task(r) for r in chosen])


@command(cli, "cascade-status", light=True, bulk=True)
def cascade_status(env: Env) -> Reply:
    """Progress of the active campaign's DAG (FTL cascade-status §6.5, defects §8.2-10 fixed).

    data: {state, complete, blocked, pending, running, ready, unreachable: [{seq, blocked_by:
    [root seqs]}]} with state complete | in_progress | all_blocked | stuck, or {"state":
    "none"} without an active campaign. Unreachable is transitive and uses three-digit seqs
    (FTL saw only direct children and mixed unpadded numbers); an all-blocked campaign is
    "all_blocked", not "complete".
    """
    from ftl import dag

    campaign = env.active(required=False)
    if campaign is None:
        return Reply({"state": "none"})
    result = dag.cascade_status(*env.store.task_graph(campaign["campaign_id"]))
    ftl = {"state": result["state"], "complete": result["complete"], "blocked": result["blocked"],
           "pending": result["pending"], "ready": result["ready"],
           "unreachable": [{"seq": u["seq"], "blocked_by": [ftl_seq_text(s) for s in u["blocked_by"]]}
                           for u in result["unreachable"]]}
    return Reply(result, ftl=ftl)


@command(cli, "cascade-analysis")
@click.option("--campaign-id", default=None, help="Campaign to analyse (default: the active one).")
def cascade_analysis(env: Env, campaign_id: str | None) -> Reply:
    """For each blocked root task: what it costs and whether to retry, re-plan or propagate.

    FTL's ERROR handler called this command but it never existed (§8.2 item 4). Uses
    replan_threshold and seconds_per_budget from ftl.toml. data: {state, roots: [{seq, slug,
    reason, transient, unreachable, already_blocked, impact, recommendation}],
    unreachable_count, recommendation: none | retry | replan | propagate, critical_path:
    {length_s, path}, estimated_durations, replan_threshold}. No active campaign -> NOT_FOUND.
    """
    from ftl.server.tools.cascade import CascadeArgs, cascade_analysis as analyse
    from ftl.server.tools.context import ToolContext

    if campaign_id is None:
        campaign_id = env.active()["campaign_id"]
    else:
        env.store.get_campaign(campaign_id)
    config = env.config
    args = CascadeArgs(campaign_id=campaign_id, replan_threshold=config.replan_threshold,
                       seconds_per_budget=config.seconds_per_budget)
    return Reply(analyse(args, ToolContext(repo=env.repo)))


@command(cli, "propagate-blocks")
def propagate_blocks(env: Env) -> Reply:
    """Mark every unreachable pending task blocked, naming its root blocks.

    data: {propagated: [seq, ...], details: [{seq, blocked_by: [root seqs]}], skipped: [seq
    whose status changed meanwhile]}. One pass reaches the whole downstream closure; unlike
    FTL (§6.6) it also propagates while other branches are still ready, since those tasks can
    never run either way. No active campaign -> {propagated: [], details: [], skipped: []}.
    """
    from ftl import dag

    campaign = env.active(required=False)
    result: dict[str, Any] = {"propagated": [], "details": [], "skipped": []}
    if campaign is None:
        return Reply(result, ftl={"propagated": []}, ftl_indent=None)
    cid = campaign["campaign_id"]
    for seq, roots in dag.propagate_blocks(*_graph(env.store.tasks(cid))):
        try:
            env.store.transition_task(cid, seq, "blocked", blocked_by=roots,
                                      reason=f"unreachable: blocked by {', '.join(roots)}")
        except FtlError as error:
            if error.error_type != "invalid_state":  # started or blocked by someone else meanwhile
                raise
            result["skipped"].append(seq)
            continue
        result["propagated"].append(seq)
        result["details"].append({"seq": seq, "blocked_by": roots})
    return Reply(result, ftl={"propagated": result["propagated"]}, ftl_indent=None)


def _outcome(counts: dict[str, int]) -> str:
    if counts["complete"] == counts["total"]:
        return "complete"
    return "partial" if counts["complete"] else "blocked"


@command(cli, "complete")
@click.option("--summary", default=None, help="Summary text, or a JSON object merged into the summary.")
def complete(env: Env, summary: str | None) -> Reply:
    """Finish the active campaign (status complete); the row stays as its archive.

    The summary always holds the task counts from the store {total, complete, blocked,
    pending, running} and outcome complete | partial | blocked; --summary adds `text` (plain
    text) or its keys (a JSON object; the counts win). FTL replaced the counts by the text and
    so archived "complete" whatever was blocked (§8.2 item 16). data: {status: "complete", id,
    campaign_id, objective, completed_at, summary, outcome, fingerprint}.
    """
    campaign = env.active()
    cid = campaign["campaign_id"]
    counts = env.store.counts(cid)
    extra: dict[str, Any] = {}
    if summary is not None:
        try:
            parsed = json.loads(summary)
        except ValueError:
            parsed = None
        extra = parsed if isinstance(parsed, dict) else {"text": summary}
    outcome = _outcome(counts)
    record = {**extra, **{k: counts[k] for k in ("total", "complete", "blocked", "pending", "running")},
              "outcome": outcome}
    finished = env.store.finish_campaign(cid, "complete", record)
    prints = _ftl_fingerprint(env, finished)
    return Reply({"status": finished["status"], "id": cid, "campaign_id": cid,
                  "objective": finished["objective"], "completed_at": finished["finished_at"],
                  "summary": finished["summary"], "outcome": outcome, "fingerprint": prints},
                 ftl={"status": "complete", "objective": finished["objective"],
                      "completed_at": finished["finished_at"], "summary": finished["summary"],
                      "fingerprint": prints})


@command(cli, "active")
def active(env: Env) -> Reply:
    """The active campaign.

    data: {id, campaign_id, status, objective, flow, framework, created_at, finished_at,
    summary, tasks, counts}, or {} when none is active (FTL printed null).
    """
    campaign = env.active(required=False)
    if campaign is None:
        return Reply({}, ftl=None)
    entry = campaign_entry(env.store, campaign)
    return Reply(entry, ftl={"id": entry["id"], "status": entry["status"], "objective": entry["objective"],
                             "framework": entry["framework"], "created_at": entry["created_at"],
                             "tasks": [ftl_task(t) for t in entry["tasks"]]})


def _finished(env: Env) -> list[dict]:
    return [c for c in env.store.list_campaigns() if c["status"] != "active"]


@command(cli, "history")
def history(env: Env) -> Reply:
    """Finished campaigns, newest first.

    data: {"archives": [{id, objective, status, completed_at, summary, outcome}]} where status
    is complete | returned | cancelled and outcome comes from the summary's counts.
    """
    archives = []
    for c in _finished(env):
        summary = c["summary"] if isinstance(c["summary"], dict) else {}
        archives.append({"id": c["campaign_id"], "objective": c["objective"], "status": c["status"],
                         "completed_at": c["finished_at"], "summary": c["summary"],
                         "outcome": summary.get("outcome")})
    ftl = [{"objective": a["objective"], "completed_at": a["completed_at"], "summary": a["summary"] or {}}
           for a in archives if a["status"] == "complete"]
    return Reply({"archives": archives}, ftl={"archives": ftl})


def _date(ctx: click.Context, param: click.Parameter, value: str | None) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date like 2026-01-31", ctx=ctx, param=param) from None


@command(cli, "export")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--start", callback=_date, help="First completion date to include (YYYY-MM-DD, UTC).")
@click.option("--end", callback=_date, help="Last completion date to include (YYYY-MM-DD, UTC).")
def export(env: Env, out: Path, start: date | None, end: date | None) -> Reply:
    """Write finished campaigns to OUT (JSON) and print them.

    OUT is relative to the current directory. Filter: completion date (UTC) between --start
    and --end, inclusive. data: {"campaigns": [{id, objective, framework, status,
    completed_at, tasks, summary, fingerprint}], "written": OUT, "count": n}; the file holds
    {"campaigns": [...]}.
    """
    campaigns, ftl = [], []
    for c in _finished(env):
        day = date.fromisoformat((c["finished_at"] or c["updated_at"])[:10])
        if (start and day < start) or (end and day > end):
            continue
        campaigns.append({"id": c["campaign_id"], "objective": c["objective"],
                          "framework": c["framework"], "status": c["status"],
                          "completed_at": c["finished_at"], "tasks": env.store.tasks(c["campaign_id"]),
                          "summary": c["summary"], "fingerprint": _ftl_fingerprint(env, c)})
        if c["status"] == "complete":
            ftl.append({"objective": c["objective"], "framework": c["framework"],
                        "completed_at": c["finished_at"],
                        "tasks": [ftl_task(t) for t in campaigns[-1]["tasks"]],
                        "summary": c["summary"] or {}, "fingerprint": campaigns[-1]["fingerprint"]})
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"campaigns": campaigns}, indent=2, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise FtlError("conflict", {"what": f"Cannot write {out.name}: {exc.strerror or 'OS error'}."},
                       message=f"Cannot write {out.name}: {exc.strerror or 'OS error'}.") from None
    return Reply({"campaigns": campaigns, "written": str(out), "count": len(campaigns)},
                 ftl={"campaigns": ftl})


def _ftl_fingerprint(env: Env, campaign: dict) -> dict[str, Any]:
    """FTL's fingerprint: as `fingerprint`, with delta files sorted (FTL used a sorted set)."""
    found = fingerprint(env.store, campaign)
    return {**found, "delta_files": sorted(found["delta_files"])}


@command(cli, "fingerprint")
def fingerprint_cmd(env: Env) -> Reply:
    """The active campaign's fingerprint, for similarity with earlier campaigns.

    data: {framework ("none" when unset), task_count, task_types, delta_files (<= 20, from the
    campaign's exploration), objective_hash (md5[:8]), objective_preview (<= 100 chars)}, or
    {} without an active campaign.
    """
    campaign = env.active(required=False)
    found = _ftl_fingerprint(env, campaign) if campaign else {}
    return Reply(found, ftl=found)


#: FTL find-similar weights: objective 0.6, delta files 0.3, task count 0.1.
_SIMILARITY_WEIGHTS = (0.6, 0.3, 0.1)


def similarity(current: dict[str, Any], other: dict[str, Any]) -> float:
    """FTL's campaign similarity of two fingerprints, in [0, 1]: 0.6 x objective similarity
    (difflib's ratio of the lower-cased previews, FTL's rule without embeddings) + 0.3 x
    delta-file Jaccard + 0.1 x (1 - task-count difference / larger count)."""
    from difflib import SequenceMatcher

    preview_a, preview_b = current["objective_preview"].lower(), other["objective_preview"].lower()
    objective = SequenceMatcher(None, preview_a, preview_b).ratio() if preview_a and preview_b else 0.0
    files_a, files_b = set(current["delta_files"]), set(other["delta_files"])
    files = len(files_a & files_b) / len(files_a | files_b) if files_a and files_b else 0.0
    count_a, count_b = current["task_count"], other["task_count"]
    count = 1.0 - abs(count_a - count_b) / max(count_a, count_b) if count_a > 0 and count_b > 0 else 0.0
    w_objective, w_files, w_count = _SIMILARITY_WEIGHTS
    return w_objective * objective + w_files * files + w_count * count


def _threshold(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A similarity threshold: any number but NaN, which compares false with every similarity
    (FTL accepted it and silently found nothing). Above 1 or below 0 are kept, as in FTL."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number to compare similarities with; use e.g. 0.5",
                                 ctx=ctx, param=param)
    return value


@command(cli, "find-similar")
@click.option("--threshold", type=float, callback=_threshold, default=0.5, show_default=True,
              help="Minimum similarity (similarities are 0..1; above 1 matches nothing, as in FTL).")
@click.option("--max", "max_results", type=click.IntRange(min=0), default=5, show_default=True,
              help="Most results.")
def find_similar(env: Env, threshold: float, max_results: int) -> Reply:
    """Finished campaigns similar to the active one (same framework unless it is "none").

    data: {"items": [{archive (campaign id), similarity, fingerprint, outcome (complete |
    partial), objective (<= 100 chars), patterns_from: [memory patterns it produced]}]},
    most similar first; [] without an active campaign.
    """
    campaign = env.active(required=False)
    if campaign is None:
        return Reply(wrap([]), ftl=[])
    current = _ftl_fingerprint(env, campaign)
    from ftl.memory import MemoryStore

    patterns = MemoryStore(env.store).entries("pattern")
    found = []
    for other in _finished(env):
        theirs = _ftl_fingerprint(env, other)
        if current["framework"] != "none" and theirs["framework"] != current["framework"]:
            continue
        score = similarity(current, theirs)
        if score >= threshold:
            summary = other["summary"] if isinstance(other["summary"], dict) else {}
            found.append({"archive": other["campaign_id"], "similarity": round(score, 3), "fingerprint": theirs,
                          "outcome": "complete" if summary.get("outcome", "complete") == "complete" else "partial",
                          "objective": other["objective"][:100],
                          "patterns_from": [p["name"] for p in patterns
                                            if p.get("campaign_id") == other["campaign_id"]]})
    found.sort(key=lambda item: -item["similarity"])
    return Reply(wrap(found[:max_results]), ftl=found[:max_results])


@command(cli, "get-replan-input")
def get_replan_input(env: Env) -> Reply:
    """What a re-planner needs (FTL get-replan-input §6.7).

    data: {mode: "replan", objective, framework, completed_count, blocked_count,
    pending_count, completed_tasks: [{seq, slug, delivered}], blocked_tasks: [{seq, slug,
    reason}], remaining_tasks: [full task spec]}; {} without an active campaign. FTL lost the
    delivered/reason texts to a failed import and dropped the remaining specs (§8.2 item 9).
    """
    campaign = env.active(required=False)
    if campaign is None:
        return Reply({})
    found = replan_input(env.store, campaign["campaign_id"])
    ftl = {**found, "remaining_tasks": [
        {"seq": t["seq"], "slug": t["slug"], "type": t.get("type", "BUILD"),
         "depends": ftl_depends(t.get("depends") or [])}
        for t in found["remaining_tasks"]]}
    return Reply(found, ftl=ftl)


@command(cli, "merge-revised-plan")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def merge_revised_plan(env: Env, path: Path) -> Reply:
    """Merge the revised plan at PATH into the active campaign and save it as a new plan version.

    Complete and running tasks never change; a blocked or pending task listed in the revision
    takes its revised spec (every field) and is pending; new seqs are added (up to
    max_replan_new_tasks). The revision may list only the tasks it changes or adds; the
    merged graph is checked. FTL kept only `depends`, dropped new tasks, never updated the plan
    and exited 0 on errors (§8.2 item 8). data: {merged, unchanged, added, plan_version}.
    Invalid plan, cycle or unknown dependency -> failure envelope, nothing saved (exit 2).
    """
    try:
        campaign = env.active()
        cid = campaign["campaign_id"]
        plan = _load_revision(env, cid, path)
        merged = env.store.merge_revised_plan(cid, plan, max_new_tasks=env.config.max_replan_new_tasks)
    except FtlRefusal:
        raise
    except FtlError as error:  # FTL printed {"error", "merged": 0, "unchanged": 0} and exited 0
        raise FtlRefusal(error.error_type, error.details, message=error.message, ftl_exit=0,
                         ftl_indent=2, ftl_payload={"error": _merge_error_text(error), "merged": 0,
                                                    "unchanged": 0}) from None
    ftl = {"merged": merged["merged"], "unchanged": merged["unchanged"]}
    if merged["added"]:
        ftl["added"] = merged["added"]  # FTL ignored new tasks (docs/ftl-compat.md)
    return Reply(merged, ftl=ftl)


def _merge_error_text(error: FtlError) -> str:
    """FTL's error text for the failures it reported (missing file, JSON, campaign, cycle);
    ftl's message otherwise, with its first violation (``<path>: <message>``) appended, since
    FTL output has no room for the envelope's ``details.violations``."""
    if error.error_type == "not_found" and "plan file" in str(error.details.get("what", "")):
        return "Revised plan not found"
    if error.error_type == "not_found":
        return "No active campaign"
    if error.error_type == "cycle_detected":
        return f"Cycle detected after merge: {error.details.get('cycle', '')}"
    violations = error.details.get("violations")
    first = violations[0] if isinstance(violations, list) and violations else None
    if isinstance(first, dict):
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        return f"{error.message} First: {first.get('path', '$')}: {first.get('message', '')}{more}"
    return error.message


#: FTL's revision fragments name a task by seq and give only what changes (often just depends).
_HEADER_KEYS = ("objective", "campaign", "framework", "framework_confidence", "idioms")


def _load_revision(env: Env, cid: str, path: Path):
    """Read a revised plan, complete it from the campaign's latest plan, and validate it.

    A revision may be a fragment: ``{"tasks": [{"seq": "002", "depends": "none"}]}`` (FTL's
    re-planner output). A task naming an existing seq takes the fields it gives over the current
    spec; a missing plan header (objective, framework, idioms, ...) comes from the latest plan.
    A new seq must be a whole task. The store checks the merged graph (FTL §6.8).
    Raises: FtlError(not_found | schema_invalid | cycle_detected).
    """
    from ftl.validation import parse_plan

    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        raise FtlError("not_found", {"what": f"plan file {path.name}"},
                       message=f"The revised plan {path.name} cannot be read.") from None
    raw = parse_json_text(text, f"plan file {path.name}")
    if isinstance(raw, dict):
        current = env.store.get_plan(cid).model_dump(mode="json", by_alias=True, exclude={"tasks"})
        specs = {r["seq"]: r["spec"] for r in env.store.tasks(cid)}
        raw = {**{k: current[k] for k in _HEADER_KEYS if k in current}, **plan_input(raw)}
        if isinstance(raw.get("tasks"), list):
            raw["tasks"] = [_complete_task(item, specs) for item in raw["tasks"]]
    return parse_plan(raw, source=f"plan file {path.name}", known_seqs=set(specs) if isinstance(raw, dict) else ())


def _complete_task(item: Any, specs: dict[str, dict]) -> Any:
    """A revision task over the current spec of the same seq (fields it gives win)."""
    from ftl.models import normalize_seq

    if not isinstance(item, dict) or "seq" not in item:
        return item
    try:
        seq = normalize_seq(item["seq"])
    except (TypeError, ValueError):
        return item
    return {**specs[seq], **item} if seq in specs else item

