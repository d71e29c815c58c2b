"""FTL-compatible ``plan.py``: the plan versions of a campaign, over ftl's store.

Plan ids: FTL numbered plans globally and never linked them to a campaign (§4.3). In ftl a plan
is a version of one campaign's plan (1, 2, ... ; a re-plan merge adds one), so ``--id N`` means
version N of the active campaign, or of ``--campaign-id``. A plan's status is derived, never
stale (FTL's flow never called ``mark-executed``, §8.2 item 16): a version marked with ``mark-executed`` is
``executed``; otherwise the latest version of an active campaign is ``active``, the latest of a
finished campaign ``executed``, every older one ``superseded``. ``get-active`` finds no plan
once the latest version is marked executed, as in FTL.

Plan object: the validated plan (``_schema_version, objective, campaign, framework,
framework_confidence, idioms, tasks`` with three-digit seqs and list depends) plus ``id`` (=
``version``), ``campaign_id`` and ``status``. The store keeps no per-version creation time, so
FTL's ``created_at`` is absent. Output and exit codes: see ``lib/_common.py``.
"""

from __future__ import annotations

from typing import Any

import click

from _common import (PLAN_VERSION, Env, FtlRefusal, Reply, command, ftl_plan_task, plan_input,
                     read_stdin_json, script_group, wrap)
from ftl.errors import FtlError

cli = script_group("plan.py", "Plan versions of a campaign (FTL plan.py).")

STATUSES = ("active", "executed", "superseded")


def _status(campaign: dict, version: int, latest: int, executed: set[int]) -> str:
    """active | executed | superseded (module docstring)."""
    if version in executed:
        return "executed"
    if version != latest:
        return "superseded"
    return "active" if campaign["status"] == "active" else "executed"


def _plan_object(campaign: dict, plan, version: int, status: str) -> dict[str, Any]:
    return {**plan.model_dump(mode="json", by_alias=True), "id": version, "version": version,
            "campaign_id": campaign["campaign_id"], "status": status}


def _ftl_plan(env: Env, campaign: dict, plan, version: int, status: str) -> dict[str, Any]:
    """FTL's plan record: {id, campaign_id (as the plan gave it), objective, framework, idioms,
    tasks (as the planner wrote them), status, created_at}."""
    extra = plan.model_extra or {}
    return {"id": version, "campaign_id": extra.get("campaign_id"), "objective": plan.objective,
            "framework": plan.framework, "idioms": plan.idioms.model_dump(mode="json"),
            "tasks": [ftl_plan_task(t) for t in plan.tasks],
            "status": status,
            "created_at": env.store.plan_saved_at(campaign["campaign_id"], version)}


def _missing(plan_id: int, error: FtlError) -> FtlRefusal:
    return FtlRefusal(error.error_type, error.details, message=error.message,
                      ftl_payload={"error": f"Plan {plan_id} not found"})


def _campaign(env: Env, campaign_id: str | None) -> dict:
    campaign = env.store.get_campaign(campaign_id) if campaign_id else env.active(required=False)
    if campaign is None:
        raise FtlError("not_found", {"what": "active campaign"},
                       message="No campaign is active; pass --campaign-id or start one with "
                               "`campaign.py create OBJECTIVE`.")
    return campaign


_CAMPAIGN_OPTION = click.option("--campaign-id", default=None, help="Campaign (default: the active one).")


@command(cli, "write")
def write(env: Env) -> Reply:
    """Validate the plan JSON on stdin and save it as the active campaign's next version.

    Every violation is reported with its JSON path (FTL stored anything and crashed on null,
    §8.2 item 6). data: {"id": N, "campaign_id"}. No active campaign -> NOT_FOUND.
    """
    from ftl.validation import parse_plan

    plan = parse_plan(plan_input(read_stdin_json("plan on standard input")), source="plan on standard input")
    cid = env.active()["campaign_id"]
    version = env.store.save_plan(cid, plan)
    return Reply({"id": version, "campaign_id": cid}, ftl={"id": version}, ftl_indent=None)


@command(cli, "read")
@click.option("--id", "plan_id", type=PLAN_VERSION, required=True, help="Plan version N.")
@_CAMPAIGN_OPTION
def read(env: Env, plan_id: int, campaign_id: str | None) -> Reply:
    """Plan version N. data: the plan object. Unknown version -> NOT_FOUND (exit 2)."""
    campaign = _campaign(env, campaign_id)
    cid = campaign["campaign_id"]
    try:
        plan = env.store.get_plan(cid, plan_id)
    except FtlError as error:
        raise _missing(plan_id, error) from None
    status = _status(campaign, plan_id, env.store.plan_versions(cid)[-1], env.store.executed_plan_versions(cid))
    return Reply(_plan_object(campaign, plan, plan_id, status), ftl=_ftl_plan(env, campaign, plan, plan_id, status))


@command(cli, "get-active")
@_CAMPAIGN_OPTION
def get_active(env: Env, campaign_id: str | None) -> Reply:
    """The latest plan version of the campaign while it is active. data: the plan object.

    No active campaign, no plan yet, or the latest version is not active (marked executed, or
    the campaign finished) -> NOT_FOUND (exit 2; FTL: ``{"error": "No active plan found"}``, exit 1).
    """
    campaign = _campaign(env, campaign_id)
    cid = campaign["campaign_id"]
    versions = env.store.plan_versions(cid)
    status = versions and _status(campaign, versions[-1], versions[-1], env.store.executed_plan_versions(cid))
    if status != "active":
        what = f"an active plan of campaign {cid}"
        hint = (f"Campaign {cid} has no plan yet; send one with `plan.py write`." if not versions else
                f"Plan {versions[-1]} of campaign {cid} is {status}; send a new one with `plan.py write`.")
        raise FtlRefusal("not_found", {"what": what}, message=hint,
                         ftl_payload={"error": "No active plan found"})
    plan = env.store.get_plan(cid, versions[-1])
    return Reply(_plan_object(campaign, plan, versions[-1], status),
                 ftl=_ftl_plan(env, campaign, plan, versions[-1], status))


@command(cli, "mark-executed")
@click.option("--id", "plan_id", type=PLAN_VERSION, required=True, help="Plan version N.")
@_CAMPAIGN_OPTION
def mark_executed(env: Env, plan_id: int, campaign_id: str | None) -> Reply:
    """Mark plan version N executed: its status reads ``executed`` from now on and ``get-active``
    no longer returns it (FTL ``plan.py mark-executed``; marking twice is harmless).

    data: {"id": N, "campaign_id", "status": "executed", "executed_at": RFC 3339 UTC}; FTL output
    ``{"status": "executed", "id": N}``. Unknown version -> NOT_FOUND (exit 2; FTL crashed:
    nothing on stdout, exit 1).
    """
    cid = _campaign(env, campaign_id)["campaign_id"]
    executed_at = env.store.mark_plan_executed(cid, plan_id)  # FTL crashed here: "Error: ..." on stderr
    return Reply({"id": plan_id, "campaign_id": cid, "status": "executed", "executed_at": executed_at},
                 ftl={"status": "executed", "id": plan_id}, ftl_indent=None)


@command(cli, "list")
@click.option("--status", type=click.Choice(STATUSES), default=None, help="Only this status.")
@_CAMPAIGN_OPTION
def list_(env: Env, status: str | None, campaign_id: str | None) -> Reply:
    """The campaign's plan versions, newest first.

    data: {"items": [{id, campaign_id, objective (first 50 chars, "..." when cut), framework,
    status, task_count}]}.
    """
    campaign = _campaign(env, campaign_id)
    cid = campaign["campaign_id"]
    versions = env.store.plan_versions(cid)
    executed = env.store.executed_plan_versions(cid)
    items, ftl = [], []
    for version in versions:
        state = _status(campaign, version, versions[-1], executed)
        if status is not None and state != status:
            continue
        plan = env.store.get_plan(cid, version)
        objective = plan.objective if len(plan.objective) <= 50 else plan.objective[:50] + "..."
        items.insert(0, {"id": version, "campaign_id": cid, "objective": objective,
                         "framework": plan.framework, "status": state, "task_count": len(plan.tasks)})
        ftl.append({"id": version, "objective": objective, "framework": plan.framework, "status": state,
                    "task_count": len(plan.tasks), "created_at": env.store.plan_saved_at(cid, version)})
    return Reply(wrap(items), ftl=ftl)  # FTL listed oldest first

