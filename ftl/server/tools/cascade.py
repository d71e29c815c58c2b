"""The cascade-analysis tool: for each blocked root task, what it costs and what to do about it.

FTL's ERROR handler for ``cascade_stuck`` called ``campaign.py cascade-analysis``, a command that
never existed (``shared/reference/ftl-behaviour.md`` §2.3, §8.2 item 4). This is that analysis:
it reads the campaign's tasks from the store and uses the graph functions of `ftl.dag`
(cascade_status, unreachable, critical_path, critical_path_impact).
"""

from __future__ import annotations

import graphlib
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ftl import dag
from ftl.config import Config
from ftl.errors import REGISTRY, FtlError
from ftl.events import ms_between
from ftl.server.tools.context import ToolContext

__all__ = ["CascadeArgs", "cascade_analysis", "analyze_tasks", "looks_transient", "task_durations"]

# Block reasons that name a cause worth one more attempt later (FTL transient classes:
# timeouts, network errors, rate limits, lock contention). Not "lockfile": a package manager's
# stale lock file (yarn / pnpm --frozen-lockfile) needs a change, not another attempt.
_TRANSIENT_RE = re.compile(
    r"time[ds]?[ _-]?out|timed out|network|connection (?:refused|reset|aborted)|unreachable host|"
    r"rate[ _-]?limit|too many requests|\b429\b|\block(?:ed by|_contention| contention)?\b|"
    r"database is locked|temporar(?:y|ily)|unavailable|try again", re.IGNORECASE)
_DEFAULT_SECONDS_PER_BUDGET = Config.model_fields["seconds_per_budget"].default


class CascadeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    campaign_id: str = Field(min_length=1, description="The campaign to analyse.")
    replan_threshold: int = Field(2, ge=1, description="Unreachable tasks one root must cause "
                                                       "for a re-plan (FTL: 2).")
    seconds_per_budget: float = Field(_DEFAULT_SECONDS_PER_BUDGET, gt=0,
                                      description="Estimated s per budget unit for tasks without "
                                                  "a recorded duration.")
    planner_available: bool = Field(True, description="Whether a re-plan can be asked for (a "
                                                      "planner command or an unused revised plan).")
    replans_left: int | None = Field(None, ge=0, description="Re-plans the campaign may still "
                                                             "make (None: not limited).")


def looks_transient(reason: str | None) -> bool:
    """True when a block reason names a transient cause (timeout, network, rate limit, lock).

    A reason that starts with a transient `ftl.errors` kind (``"rate_limited: ..."``) is
    transient. After a structural kind (``"verify_failed: ..."``) only the rest of the first
    line, the message, is read for such words (not the kind's own name, so a structural
    ``approval_timeout`` stays structural, nor the command output below it, where "timeout" may
    be a test name); any other reason is read whole.
    """
    text = (reason or "").strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix.strip() in REGISTRY:
        if REGISTRY[prefix.strip()].transient:
            return True
        text = rest.splitlines()[0] if rest.strip() else ""
    return bool(_TRANSIENT_RE.search(text))


def _seconds(start: str | None, end: str | None) -> float | None:
    span = ms_between(start, end)
    return span / 1000 if span is not None and span >= 0 else None


def task_durations(tasks: list[dict[str, Any]],
                   seconds_per_budget: float) -> tuple[dict[str, float], list[str]]:
    """Duration of every task in s: recorded (``finished_at - started_at``) when known, else an
    estimate: the task's ``timeout_s``, or ``budget x seconds_per_budget`` (budget default 5).

    Returns:
        ``({seq: seconds}, [seqs whose duration is an estimate])``.
    """
    durations: dict[str, float] = {}
    estimated: list[str] = []
    for task in tasks:
        recorded = _seconds(task.get("started_at"), task.get("finished_at"))
        if recorded is not None and task.get("status") == "complete":
            durations[task["seq"]] = recorded
            continue
        spec = task.get("spec") if isinstance(task.get("spec"), dict) else {}
        timeout_s = spec.get("timeout_s")
        if isinstance(timeout_s, (int, float)) and timeout_s > 0:
            durations[task["seq"]] = float(timeout_s)
        else:
            budget = spec.get("budget") if isinstance(spec.get("budget"), (int, float)) else 5
            durations[task["seq"]] = float(budget) * seconds_per_budget
        estimated.append(task["seq"])
    return durations, estimated


#: Runs of a task (its first and one retry) after which a transient-looking root is no longer
#: retried by CASCADE but handled like a structural one.
MAX_ROOT_ATTEMPTS = 2


def analyze_tasks(tasks: list[dict[str, Any]], replan_threshold: int = 2,
                  seconds_per_budget: float = _DEFAULT_SECONDS_PER_BUDGET, *,
                  planner_available: bool = True, replans_left: int | None = None) -> dict[str, Any]:
    """Cascade analysis over task rows (the store's ``tasks()`` dicts); pure.

    A root is a blocked task none of whose ancestors is blocked (`ftl.dag.unreachable`'s
    definition): where a block started, not where it was propagated to. For each root:

    * ``unreachable``: pending tasks that can never run because of it (transitively);
      ``already_blocked``: its descendants already marked blocked by propagation;
    * ``impact``: `ftl.dag.critical_path_impact` with `task_durations` (s);
    * ``retryable``: the block looks transient (`looks_transient`) and the task has run fewer
      than `MAX_ROOT_ATTEMPTS` times (its ``attempts``), so one more run is due;
    * ``recommendation``: ``retry`` when retryable, else ``replan`` when it leaves at least
      ``replan_threshold`` tasks unreachable (FTL CASCADE: stuck and >= 2 unreachable) and a
      re-plan is possible, else ``propagate``. Retry comes first on purpose: re-planning around
      a network error or a rate limit would drop a task that only needs another go.

    The overall recommendation, which the CASCADE state carries out as it is (issue 15 item 5):
    ``none`` without roots; when the tasks made unreachable by roots that are not retryable
    reach the threshold: ``replan`` if ``planner_available`` and ``replans_left`` is None or
    positive, ``stuck`` if a planner is available but no re-plan is left (CASCADE raises
    ``cascade_stuck``); otherwise ``retry`` if a root is retryable; else ``propagate``.

    Args:
        tasks: the store's task rows (``seq, slug, status, depends, attempts, block_reason,
            spec, started_at, finished_at``).
        replan_threshold: unreachable tasks that call for a re-plan.
        seconds_per_budget: estimate per budget unit for tasks without a duration, s.
        planner_available: a planner command or an unused revised plan exists.
        replans_left: re-plans the campaign may still make (None: not limited).
    Returns:
        ``{"state", "roots": [{seq, slug, reason, transient, retryable, attempts, unreachable,
        already_blocked, impact, recommendation}], "unreachable_count", "recommendation",
        "critical_path": {"length_s", "path"}, "estimated_durations": [seq],
        "replan_threshold", "planner_available", "replans_left"}``.
    """
    can_replan = planner_available and (replans_left is None or replans_left > 0)
    deps = {t["seq"]: list(t.get("depends") or []) for t in tasks}
    status = {t["seq"]: t["status"] for t in tasks}
    by_seq = {t["seq"]: t for t in tasks}
    cascade = dag.cascade_status(deps, status)
    unreachable = dag.unreachable(deps, status)
    blocked = {seq for seq, s in status.items() if s == "blocked"}
    roots = sorted((seq for seq in blocked if not dag.ancestors(deps, seq) & blocked), key=dag.seq_key)
    durations, estimated = task_durations(tasks, seconds_per_budget)
    length, path = dag.critical_path(deps, durations)

    root_entries = []
    for seq in roots:
        reason = by_seq[seq].get("block_reason") or ""
        caused = [s for s, causes in unreachable.items() if seq in causes]
        downstream = dag.descendants(deps, seq)
        transient = looks_transient(reason)
        attempts = int(by_seq[seq].get("attempts") or 0)
        retryable = transient and attempts < MAX_ROOT_ATTEMPTS
        if retryable:
            recommendation = "retry"
        elif len(caused) >= replan_threshold and can_replan:
            recommendation = "replan"
        else:
            recommendation = "propagate"
        root_entries.append({
            "seq": seq, "slug": by_seq[seq].get("slug"), "reason": reason[:1000],
            "transient": transient, "retryable": retryable, "attempts": attempts,
            "unreachable": caused,
            "already_blocked": sorted((s for s in downstream if s in blocked), key=dag.seq_key),
            "impact": dag.critical_path_impact(deps, durations, seq),
            "recommendation": recommendation})

    retryable_roots = {r["seq"] for r in root_entries if r["retryable"]}
    structural_loss = [s for s, causes in unreachable.items() if set(causes) - retryable_roots]
    if not root_entries:
        overall = "none"
    elif len(structural_loss) >= replan_threshold and can_replan:
        overall = "replan"
    elif len(structural_loss) >= replan_threshold and planner_available:
        overall = "stuck"
    elif retryable_roots:
        overall = "retry"
    else:
        overall = "propagate"
    return {"state": cascade["state"], "roots": root_entries, "unreachable_count": len(unreachable),
            "recommendation": overall, "critical_path": {"length_s": length, "path": path},
            "estimated_durations": estimated, "replan_threshold": replan_threshold,
            "planner_available": planner_available, "replans_left": replans_left}


def cascade_analysis(args: CascadeArgs, ctx: ToolContext) -> dict[str, Any]:
    """Analyse a campaign's blocked roots (see `analyze_tasks` for the result and the rules).

    Raises:
        FtlError(not_found): no store yet, or no such campaign.
        FtlError(cycle_detected): the stored task graph has a cycle (cannot happen for tasks
            registered through the store, which refuses cycles).
    """
    if not ctx.store_path.exists():
        raise FtlError("not_found", {"what": f"campaign {args.campaign_id} (no store yet)"})
    from ftl.store import Store

    with Store(ctx.store_path) as store:
        tasks = store.tasks(args.campaign_id)
    try:
        return analyze_tasks(tasks, args.replan_threshold, args.seconds_per_budget,
                             planner_available=args.planner_available,
                             replans_left=args.replans_left)
    except graphlib.CycleError as exc:
        cycle = exc.args[1] if len(exc.args) > 1 else []
        raise FtlError("cycle_detected", {"cycle": dag.format_cycle(cycle)}) from None
