"""FTL-compatible ``observer.py``: learn from finished workspaces (FTL observer.py commands).

FTL observer.py (enzokro/crinzo-plugins ``ftl/lib/observer.py``, commit 89a2f8e): ``analyze
[--no-verify]``, ``verify-blocks``, ``score ID``, ``extract-failure ID``, ``list``. ``analyze``
runs ftl's observer (`ftl.server.tools.observer`, the OBSERVE state's tool) on the active
campaign (else the newest): failures and patterns into memory, co-occurrence links, the
builders' ``utilized`` feedback. ``score`` uses ftl's pattern score; ``extract-failure`` and
``verify-blocks`` follow FTL's rules. Workspaces are the latest attempt of each workspace id;
``--workspace-dir`` is accepted and ignored, as in FTL. Differences: docs/ftl-compat.md.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import click

from _common import Env, Reply, command, parse_workspace_ref, script_group, wrap
from ftl.errors import FtlError

cli = script_group("observer.py", "Learn from finished workspaces (FTL observer.py).")

VERIFY_TIMEOUT_S = 30  # FTL verify_block timeout
_ERROR_WORDS = ("FAIL", "ERROR", "EXCEPTION")
_WORKSPACE_DIR = click.option("--workspace-dir", default=None,
                              help="Accepted and ignored (FTL kept workspaces in the database too).")


def _latest_attempts(env: Env) -> list[dict]:
    """The latest attempt of every workspace id of every campaign, oldest first."""
    latest: dict[tuple[str, str], dict] = {}
    for campaign in env.store.list_campaigns():
        for row in env.store.workspaces(campaign["campaign_id"]):
            key = (campaign["campaign_id"], row["workspace_id"])
            if key not in latest or row["attempt"] > latest[key]["attempt"]:
                latest[key] = row
    return sorted(latest.values(), key=lambda r: r["created_at"])


def _by_status(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {"complete": [], "blocked": [], "active": []}
    for row in rows:
        status = {"built": "active"}.get(row["status"], row["status"])
        if status in groups:
            groups[status].append(row)
    return groups


def verify_block(env: Env, row: dict) -> dict[str, str]:
    """Re-run a blocked workspace's verify command (shell, in its directory, 30 s): CONFIRMED
    (it still fails, or passes while printing FAIL/ERROR/EXCEPTION), FALSE_POSITIVE (it passes
    now), INDETERMINATE (timed out), ERROR (could not run). FTL verify_block's rules."""
    spec = row["spec"] or {}
    command = spec.get("verify") or ""
    if not command:
        return {"status": "CONFIRMED", "reason": "No verify command", "output": ""}
    workdir = env.repo / spec["workdir"] if spec.get("workdir") else env.repo
    try:
        done = subprocess.run(command, shell=True, cwd=workdir, capture_output=True, text=True,
                              timeout=VERIFY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "INDETERMINATE", "reason": "Verify command timed out", "output": ""}
    except OSError as exc:
        return {"status": "ERROR", "reason": exc.strerror or "cannot run the verify command", "output": ""}
    output = done.stdout + done.stderr
    flagged = any(word in output.upper() for word in _ERROR_WORDS)
    if done.returncode == 0 and not flagged:
        return {"status": "FALSE_POSITIVE", "reason": "Tests pass now", "output": output}
    if done.returncode == 0:
        return {"status": "CONFIRMED", "reason": "Exit 0 but output contains errors", "output": output}
    return {"status": "CONFIRMED", "reason": f"exit {done.returncode}", "output": output}


@command(cli, "list")
@_WORKSPACE_DIR
def list_(env: Env, workspace_dir: str | None) -> Reply:
    """Workspaces by status. data: {complete: n, blocked: n, active: n} (latest attempts)."""
    groups = _by_status(_latest_attempts(env))
    return Reply({k: len(v) for k, v in groups.items()})


@command(cli, "verify-blocks")
@_WORKSPACE_DIR
def verify_blocks(env: Env, workspace_dir: str | None) -> Reply:
    """Re-run the verify command of every blocked workspace.
    data: {"items": [{workspace, status, reason, output}]}."""
    found = [{"workspace": row["workspace_id"], **verify_block(env, row)}
             for row in _by_status(_latest_attempts(env))["blocked"]]
    return Reply(wrap(found), ftl=found)


@command(cli, "analyze")
@_WORKSPACE_DIR
@click.option("--no-verify", is_flag=True, help="Do not re-run blocked workspaces' verify commands.")
def analyze(env: Env, workspace_dir: str | None, no_verify: bool) -> Reply:
    """Learn from the active campaign (else the newest): extract failures and patterns into
    memory, link co-occurring failures, count builders' utilized feedback.

    data: {workspaces: {complete, blocked, active}, verified: [{workspace, status, reason}],
    failures_extracted: [{name, trigger, result}], patterns_extracted: [{name, score,
    breakdown, result}], relationships_added: n, feedback_recorded: {helped, not_helped}}.
    FTL output: FTL's shape (``failures_extracted: [{name, result}]``, ``result`` ``added`` or
    ``merged:<name>``, breakdown keys as in `ftl_breakdown`). No campaign -> NOT_FOUND.
    """
    from ftl.server.tools.context import ToolContext
    from ftl.server.tools.observer import ObserveArgs, observer

    campaign = env.campaign(None)
    if campaign is None:
        raise FtlError("not_found", {"what": "campaign"}, message="The store has no campaign yet.")
    rows = [r for r in _latest_attempts(env) if r["campaign_id"] == campaign["campaign_id"]]
    groups = _by_status(rows)
    verified = [] if no_verify else [
        {"workspace": row["workspace_id"], **{k: v for k, v in verify_block(env, row).items() if k != "output"}}
        for row in groups["blocked"]]
    env.close()  # the observer opens the store itself
    found = observer(ObserveArgs(campaign_id=campaign["campaign_id"]), ToolContext(repo=env.repo))
    counts = {k: len(v) for k, v in groups.items()}
    ftl = {"workspaces": counts, "verified": verified,
           "failures_extracted": [{"name": f["name"], "result": _ftl_result(f)}
                                  for f in found["failures_extracted"]],
           "patterns_extracted": [{"name": p["name"], "score": p["score"],
                                   "breakdown": ftl_breakdown(p["breakdown"]), "result": _ftl_result(p)}
                                  for p in found["patterns_extracted"]],
           "relationships_added": found["relationships_added"],
           "feedback_recorded": found["feedback_recorded"]}
    return Reply({"workspaces": counts, "verified": verified,
                  "failures_extracted": found["failures_extracted"],
                  "patterns_extracted": found["patterns_extracted"],
                  "relationships_added": found["relationships_added"],
                  "feedback_recorded": found["feedback_recorded"]}, ftl=ftl)


def _ftl_result(extracted: dict) -> str:
    """FTL's add result: ``added`` or ``merged:<name>`` (FTL had no "unchanged": adding an entry
    again merged it)."""
    return "added" if extracted["result"] == "added" else f"merged:{extracted['name']}"


#: ftl's breakdown keys under FTL's names (FTL observer score_workspace).
_FTL_BREAKDOWN_KEYS = {"clean_first_try": "first_try_success"}


def ftl_breakdown(breakdown: dict[str, int]) -> dict[str, int]:
    """A score breakdown with FTL's key names, in FTL's order (blocked_then_fixed,
    first_try_success, ..., multi_file)."""
    return {_FTL_BREAKDOWN_KEYS.get(k, k): v for k, v in breakdown.items()}


def _workspace(env: Env, ref: str) -> dict:
    seq, workspace_id = parse_workspace_ref(ref)
    rows = [r for r in _latest_attempts(env) if r["seq"] == seq
            and workspace_id in (None, r["workspace_id"])]
    if not rows:
        raise FtlError("not_found", {"what": f"workspace {ref}"}, message=f"Workspace not found: {ref}")
    return rows[-1]


def _observer_view(row: dict) -> dict[str, Any]:
    """FTL observer's workspace dict: {id, workspace_id, status, delivered, objective, delta,
    verify, budget, idioms, created_at}."""
    from _workspace import view  # the sibling lib/_workspace.py

    spec, full = row["spec"] or {}, view(row)
    idioms = spec.get("idioms") or {}
    return {"id": row["workspace_id"], "workspace_id": row["workspace_id"], "status": full["status"],
            "delivered": full["delivered"], "objective": spec.get("objective", ""),
            "delta": spec.get("delta", []), "verify": spec.get("verify", ""),
            "budget": spec.get("budget", 5),
            "idioms": idioms if (idioms.get("required") or idioms.get("forbidden")) else {},
            "created_at": row["created_at"]}


@command(cli, "score")
@click.argument("ref", metavar="ID")
def score(env: Env, ref: str) -> Reply:
    """Score workspace ID for pattern extraction with ftl's observer rules (blocked then fixed
    +3, clean first try +2, more than one file +1; a pattern needs 3).
    data: {score, breakdown, workspace: as ``workspace.py parse`` prints it}; FTL output names ``clean_first_try`` FTL's
    ``first_try_success``."""
    from ftl.server.tools.observer import score_pattern

    row = _workspace(env, ref)
    task = env.store.task(row["campaign_id"], row["seq"])
    attempts = env.store.workspaces(row["campaign_id"], seq=row["seq"])
    from _workspace import ftl_view, view  # the sibling lib/_workspace.py

    points, breakdown = score_pattern(task, attempts)
    # FTL's score printed the parsed workspace, as `workspace.py parse` does
    return Reply({"score": points, "breakdown": breakdown, "workspace": view(row)},
                 ftl={"score": points, "breakdown": ftl_breakdown(breakdown), "workspace": ftl_view(row)})


def generalize_to_regex(trigger: str) -> str:
    """A regular expression matching ``trigger`` and its variants (FTL's rule): quoted strings
    match anything, digit runs any number, whitespace runs any whitespace; the rest literally."""
    parts = re.split(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\d+|\s+)", trigger)
    out = []
    for part in parts:
        if not part:
            continue
        if part[0] in "'\"" and len(part) >= 2 and part[-1] == part[0]:
            out.append(".*")
        elif part.isdigit():
            out.append(r"\d+")
        elif part.isspace():
            out.append(r"\s+")
        else:
            out.append(re.escape(part))
    return "".join(out)


def _slug(text: str) -> str:
    text = re.sub(r"[^a-z0-9\s-]", "", text.lower())
    return re.sub(r"-+", "-", re.sub(r"[\s_]+", "-", text)).strip("-")[:40]


@command(cli, "extract-failure")
@click.argument("ref", metavar="ID")
def extract_failure(env: Env, ref: str) -> Reply:
    """The failure entry a blocked workspace ID teaches (FTL's rules): trigger = the first line
    after "BLOCKED:" in delivered; name = its slug; fix = "Attempted: <text after Tried:>" or
    "UNKNOWN"; match = `generalize_to_regex`; cost = budget x 1000 tokens.
    data: {name, trigger, fix, match, cost, source: [workspace id]}."""
    row = _workspace(env, ref)
    view = _observer_view(row)
    delivered = view["delivered"]
    trigger = delivered.split("BLOCKED:", 1)[1].strip().split("\n")[0] if "BLOCKED:" in delivered else ""
    trigger = trigger or (delivered[:100] if delivered else "Unknown error")
    fix = "UNKNOWN"
    if "Tried:" in delivered:
        tried = delivered.split("Tried:", 1)[1].split("Unknown:")[0].strip()
        if tried:
            fix = f"Attempted: {tried[:200]}"
    return Reply({"name": _slug(trigger[:50]), "trigger": trigger, "fix": fix,
                  "match": generalize_to_regex(trigger), "cost": view["budget"] * 1000,
                  "source": [row["workspace_id"]]})

