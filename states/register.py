"""REGISTER: store the plan's DAG as one row per task, after cycle and dependency checks.

Idempotent for resume: a campaign whose tasks are already registered keeps them (FTL's
add-tasks replaced the task list and lost progress; ftl refuses to).
"""

from __future__ import annotations

from typing import Any

from ftl import dag
from ftl import events as ev
from ftl.errors import FtlError
from ftl.models import Plan
from ftl.engine.runner import Next, Run


def enter(run: Run) -> Next:
    plan = run.current_plan
    if plan is None:
        raise FtlError("invalid_state", {"trigger": "register", "state": "REGISTER"})
    deps = {task.seq: task.depends for task in plan.tasks}
    cycle = dag.find_cycle(deps)
    if cycle:
        raise FtlError("cycle_detected", {"cycle": dag.format_cycle(cycle)})
    if not run.store.tasks(run.campaign_id):
        run.log.emit(ev.PLAN_REGISTERED, **registered(plan))
        run.store.add_tasks(run.campaign_id, plan)
    return Next("execute")


def registered(plan: Plan) -> dict[str, Any]:
    """``PLAN_REGISTERED`` fields: the task count, seqs, slugs and dependencies, so that a
    postmortem can draw the DAG from the log alone."""
    return {"tasks": len(plan.tasks), "seqs": [task.seq for task in plan.tasks],
            "slugs": {task.seq: task.slug for task in plan.tasks},
            "depends": {task.seq: list(task.depends) for task in plan.tasks}}
