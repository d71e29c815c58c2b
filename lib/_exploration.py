"""FTL-compatible ``exploration.py``: explorer results and the aggregated exploration.

FTL exploration.py (``shared/reference/ftl-behaviour.md`` §4.4, §5.5) over ftl's store.
Sessions: FTL grouped explorer results under a random 8-character session id; in ftl they
belong to a campaign, so the session id is the campaign id (``orchestration.py create-session``
prints the active campaign's id). Results are written to the active campaign only; the read
commands accept any campaign id. Output and exit codes: see ``lib/_common.py``.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import click

from _common import (EXPLORER_MODES, Env, Reply, command, explorer_progress, read_stdin_json,
                     script_group, violation)
from ftl.errors import FtlError
from ftl.store import format_ts

cli = script_group("exploration.py", "Explorer results and aggregated explorations (FTL exploration.py).")

_RANK = {"ok": 3, "partial": 2, "error": 1}
_SESSION = click.option("--session", "session", required=True,
                        help="Session id = campaign id (orchestration.py create-session).")
_CAMPAIGN_OPTION = click.option("--campaign-id", default=None,
                                help="Campaign (default: active, else the newest exploration).")

MISSING: dict[str, dict[str, Any]] = {
    "structure": {"status": "missing"},
    "pattern": {"status": "missing", "framework": "none", "confidence": 0.5,
                "idioms": {"required": [], "forbidden": []}},
    "memory": {"status": "missing", "failures": [], "patterns": [],
               "total_in_memory": {"failures": 0, "patterns": 0}, "similar_campaigns": []},
    "delta": {"status": "missing", "candidates": []},
}


def _session_campaign(env: Env, session: str, *, write: bool = False) -> dict:
    """The campaign a session id names: a campaign id names that campaign; any other id (FTL's
    random session ids, drawn before the campaign existed) names the active campaign. Writes go
    to the active campaign only.

    Raises: FtlError(not_found) without an active campaign for a non-campaign id;
    FtlError(conflict) for a write to a finished campaign's session.
    """
    try:
        campaign = env.store.get_campaign(session)
    except FtlError as error:
        if error.error_type != "not_found":
            raise
        active = env.active(required=False)
        if active is None:
            # FTL 89a2f8e's TASK flow wrote results with no campaign (stored by session, then
            # unreachable: its workspaces came out empty); here they belong to a campaign.
            text = (f"No campaign is active, and explorer results belong to one: session {session} "
                    "names the active campaign. Run `campaign.py create OBJECTIVE` before the "
                    "explorers (FTL's TASK flow does so at INIT from d1d2646 on).")
            raise FtlError("not_found", {"what": "active campaign"}, message=text)
        return active
    if write and campaign["status"] != "active":
        text = (f"Session {session} is the finished campaign {session}; results are written to the "
                "active campaign only.")
        raise FtlError("conflict", {"what": text}, message=text)
    return campaign


@command(cli, "write-result")
@_SESSION
@click.option("--mode", required=True, help="structure | pattern | memory | delta.")
def write_result(env: Env, session: str, mode: str) -> Reply:
    """Store one explorer result (JSON object on stdin) for the session.

    The result is validated: mode must be one of the four (FTL accepted any, §4.4) and match
    the result's own `mode` if it has one; `status` ok | partial | error is required (FTL
    defaulted "ok", which let an empty result count toward the quorum). A pattern result gets
    confidence 0.5 when absent, as in FTL. Duplicates are kept; aggregation picks the best.
    data: {session_id, mode, status: "written", result_status}.
    """
    from pydantic import ValidationError

    from ftl.models import ExplorerResult
    from ftl.validation import json_path

    if mode not in EXPLORER_MODES:
        raise violation("--mode", f"{mode!r} is not an explorer mode", f"use one of {', '.join(EXPLORER_MODES)}")
    result = read_stdin_json("explorer result on standard input")
    if not isinstance(result, dict):
        raise violation("$", "an explorer result must be a JSON object", 'send {"mode", "status", ...}')
    if result.setdefault("mode", mode) != mode:
        raise violation("$.mode", f"the result says mode {result['mode']!r} but --mode is {mode!r}",
                        "make them agree")
    try:
        ExplorerResult.model_validate(result)
    except ValidationError as exc:
        violations = [{"path": json_path(e["loc"]), "message": e["msg"],
                       "fix": "status must be ok, partial or error"} for e in exc.errors()]
        raise FtlError("schema_invalid", {"count": len(violations), "violations": violations}) from None
    if mode == "pattern" and result.get("confidence") is None:
        result["confidence"] = 0.5
    campaign = _session_campaign(env, session, write=True)
    env.store.record_explorer_result(campaign["campaign_id"], mode, result)
    return Reply({"session_id": session, "mode": mode, "status": "written",
                  "result_status": result["status"]},
                 ftl={"session_id": session, "mode": mode, "status": "written"}, ftl_indent=None)


@command(cli, "session-status")
@_SESSION
def session_status(env: Env, session: str) -> Reply:
    """Which explorer modes have a usable result.

    Only distinct modes with an ok or partial result count (FTL counted error rows and
    duplicates, §8.2 item 5); the quorum (explorer_quorum in ftl.toml, default 3) or both
    structure and delta meets it. data: {session_id, completed: [modes], missing: [modes],
    failed: [modes with only error results], total: len(completed), rows, quorum_required,
    quorum_met}.
    """
    campaign = _session_campaign(env, session)
    progress = explorer_progress(env.store.explorer_results(campaign["campaign_id"]),
                                 env.explorer_settings()[0])
    progress.pop("modes")
    return Reply({"session_id": session, **progress, "total": len(progress["completed"])},
                 ftl={"completed": _by_first_row(progress["completed"],
                                                 env.store.explorer_results(campaign["campaign_id"])),
                      "missing": progress["missing"],
                      "total": len(progress["completed"]), "quorum_met": progress["quorum_met"]})


def _by_first_row(modes: list[str], rows: list[dict]) -> list[str]:
    """``modes`` in the order their first result row was written (FTL listed rows in order)."""
    order = {}
    for index, row in enumerate(rows):
        order.setdefault(row["mode"], index)
    return sorted(modes, key=lambda m: order.get(m, len(rows)))


def _git_sha(env: Env, *, ftl: bool = False) -> str:
    """``git rev-parse --short HEAD`` of the repository; "unknown" when git cannot tell (FTL's
    value, with ``ftl=True``: "" when git runs but fails, "unknown" only when it cannot run)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=env.repo, capture_output=True,
                              text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if ftl:
        return done.stdout.strip()
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def _best_per_mode(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per mode, the result with the best status (ok > partial > error > anything else), the
    newer row on a tie (rows oldest first)."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        result = row["result"] if isinstance(row["result"], dict) else {}
        current = best.get(row["mode"])
        if current is None or _RANK.get(result.get("status"), 0) >= _RANK.get(current.get("status"), 0):
            best[row["mode"]] = result
    return best


def aggregate(rows: list[dict], objective: str) -> dict[str, Any]:
    """FTL's aggregation of explorer result rows (oldest first) into an exploration.

    Per mode the best status wins (ok > partial > error > anything else), the newer row on a
    tie. A mode without a row is ``{mode, status: "error", error: "no result"}``, as in the
    EXPLORE state, so a planner sees what is missing. Returns ``{_meta: {version: "1.0",
    objective, modes_completed}, structure, pattern, memory, delta}``.
    """
    best = _best_per_mode(rows)
    exploration: dict[str, Any] = {"_meta": {
        "version": "1.0", "objective": objective,
        "modes_completed": sorted(m for m, r in best.items() if r.get("status") in ("ok", "partial"))}}
    for mode in EXPLORER_MODES:
        exploration[mode] = best.get(mode) or {"mode": mode, "status": "error", "error": "no result"}
    return exploration


@command(cli, "aggregate-session")
@_SESSION
@click.option("--objective", default=None, help="Objective for _meta (default: the campaign's).")
def aggregate_session(env: Env, session: str, objective: str | None) -> Reply:
    """Aggregate the session's explorer results (print only; store it with `write`).

    data: {_meta: {version, objective, modes_completed, created_at, git_sha}, structure,
    pattern, memory, delta}; see `aggregate` for the rules.
    """
    campaign = _session_campaign(env, session)
    rows = env.store.explorer_results(campaign["campaign_id"])
    exploration = aggregate(rows, objective if objective is not None else campaign["objective"])
    exploration["_meta"].update({"created_at": format_ts(_now()), "git_sha": _git_sha(env)})
    return Reply(exploration, ftl=ftl_aggregate(rows, objective, {**exploration["_meta"],
                                                                  "ftl_git_sha": _git_sha(env, ftl=True)}))


#: FTL's explorer-result defaults, applied by its aggregation to every result (EXPLORER_SCHEMAS).
FTL_DEFAULTS: dict[str, dict[str, Any]] = {
    "structure": {"directories": {}, "entry_points": [], "test_patterns": [], "config_files": []},
    "pattern": {"framework": None, "confidence": 0.5, "idioms": {"required": [], "forbidden": []}},
    "memory": {"relevant_failures": [], "relevant_patterns": [], "similar_campaigns": []},
    "delta": {"candidates": [], "candidate_files": []},
}


def ftl_coerced(result: dict[str, Any]) -> dict[str, Any]:
    """A result as FTL's aggregation leaves it: missing keys get `FTL_DEFAULTS`; a structure's
    ``directories`` list becomes ``{str(item): true}``; a pattern's framework is text and its
    confidence a float (0.5 when null); a delta's single candidate becomes a list."""
    import copy

    mode = result.get("mode")
    out = copy.deepcopy(result)
    for key, default in FTL_DEFAULTS.get(mode, {}).items():
        out.setdefault(key, copy.deepcopy(default))
    if mode == "structure" and isinstance(out.get("directories"), list):
        out["directories"] = {str(item): True for item in out["directories"]}
    if mode == "pattern":
        if out.get("framework") is not None:
            out["framework"] = str(out["framework"])
        out["confidence"] = 0.5 if out.get("confidence") is None else float(out["confidence"])
    if mode == "delta" and not isinstance(out.get("candidates"), list):
        value = out.get("candidates")
        out["candidates"] = [value] if value else []
    return out


def ftl_aggregate(rows: list[dict], objective: str | None, meta: dict[str, Any]) -> dict[str, Any]:
    """FTL's aggregation: ``{_meta: {version, created_at, git_sha, objective}, <mode>: result}``
    for the modes that have a result only; a mode whose best result is not ok/partial shows as
    ``{mode, status: "error", _error, ...its directories/framework/confidence/candidates/idioms}``."""
    best = _best_per_mode(rows)
    out: dict[str, Any] = {"_meta": {"version": "1.0", "created_at": meta["created_at"],
                                     "git_sha": meta.get("ftl_git_sha", meta["git_sha"]), "objective": objective}}
    for mode, result in best.items():
        result = ftl_coerced(result)
        if result.get("status") in ("ok", "partial"):
            out[mode] = result
        else:
            entry = {"mode": mode, "status": "error", "_error": result.get("error", "unknown error")}
            entry.update({k: result[k] for k in ("directories", "framework", "confidence", "candidates",
                                                  "idioms") if k in result})
            out[mode] = entry
    return out


def _lines_as_results(text: str) -> list[dict]:
    """Explorer outputs, one per line of ``text``: the line's JSON, or the first JSON object in it
    (fenced or bare). Lines without a JSON object are skipped, as in FTL."""
    import json
    import re

    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        candidates = [line]
        fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", line)
        if fenced:
            candidates.append(fenced.group(1))
        if "{" in line and "}" in line:
            candidates.append(line[line.index("{"):line.rindex("}") + 1])
        for candidate in candidates:
            try:
                value = json.loads(candidate)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict):
                found.append(value)
                break
    return found


@command(cli, "aggregate")
@click.option("--objective", default=None, help="Objective for _meta.")
def aggregate_stdin(env: Env, objective: str | None) -> Reply:
    """Aggregate explorer outputs given on stdin, one JSON object per line (FTL aggregate).

    Results without a known `mode` are dropped. data: as aggregate-session.
    """
    text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    rows = [{"mode": r["mode"], "result": r} for r in _lines_as_results(text) if r.get("mode") in EXPLORER_MODES]
    exploration = aggregate(rows, objective or "")
    exploration["_meta"].update({"created_at": format_ts(_now()), "git_sha": _git_sha(env)})
    return Reply(exploration, ftl=ftl_aggregate(rows, objective, {**exploration["_meta"],
                                                                  "ftl_git_sha": _git_sha(env, ftl=True)}))


@command(cli, "clear-session")
@_SESSION
def clear_session(env: Env, session: str) -> Reply:
    """Delete the session's explorer results. data: {"cleared": n}."""
    campaign = _session_campaign(env, session)
    return Reply({"cleared": env.store.clear_explorer_results(campaign["campaign_id"])}, ftl_indent=None)


@command(cli, "clear")
def clear(env: Env) -> Reply:
    """Delete every stored exploration (explorer results stay). data: {"cleared": n}."""
    return Reply({"cleared": env.store.clear_explorations()}, ftl_indent=None)


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


@command(cli, "write")
def write(env: Env) -> Reply:
    """Store the aggregated exploration on stdin for the active campaign.

    Keys allowed: _meta, structure, pattern, memory, delta, each a JSON object (FTL stored
    anything). data: {campaign_id, status: "written", modes: [sections present]}.
    """
    exploration = read_stdin_json("exploration on standard input")
    if not isinstance(exploration, dict):
        raise violation("$", "an exploration must be a JSON object", "send {_meta, structure, pattern, memory, delta}")
    allowed = ("_meta",) + EXPLORER_MODES
    problems = [{"path": f"$.{key}", "message": "unknown section", "fix": f"use {', '.join(allowed)}"}
                for key in exploration if key not in allowed]
    problems += [{"path": f"$.{key}", "message": "must be a JSON object", "fix": "send an object"}
                 for key in allowed if key in exploration and not isinstance(exploration[key], dict)]
    if problems:
        raise FtlError("schema_invalid", {"count": len(problems), "violations": problems})
    cid = env.active()["campaign_id"]
    row_id = env.store.save_exploration(cid, exploration)
    return Reply({"campaign_id": cid, "status": "written", "id": row_id,
                  "modes": [m for m in EXPLORER_MODES if m in exploration]},
                 ftl={"id": row_id}, ftl_indent=None)


def _exploration(env: Env, campaign_id: str | None) -> tuple[dict | None, dict | None]:
    """(exploration, campaign): of --campaign-id, else the active campaign, else the newest."""
    if campaign_id:
        campaign = env.store.get_campaign(campaign_id)
        return env.store.exploration(campaign_id), campaign
    active = env.active(required=False)
    if active is not None:
        found = env.store.exploration(active["campaign_id"])
        if found is not None:
            return found, active
    return env.store.exploration(None), active


@command(cli, "read")
@_CAMPAIGN_OPTION
def read(env: Env, campaign_id: str | None) -> Reply:
    """The newest exploration of the campaign (FTL: of the given/active campaign, else any).

    data: {_meta, structure, pattern, memory, delta}, or {} when none exists (FTL: null).
    """
    found, _ = _exploration(env, campaign_id)
    if not found:
        return Reply({}, ftl=None)
    meta = found.get("_meta") if isinstance(found.get("_meta"), dict) else {}
    ftl = {"_meta": {"git_sha": meta.get("git_sha", ""), "objective": meta.get("objective", ""),
                     "created_at": meta.get("created_at", "")}}
    ftl.update({mode: found.get(mode) or {} for mode in EXPLORER_MODES})
    return Reply(found, ftl=ftl)


def _section(env: Env, campaign_id: str | None, mode: str) -> dict[str, Any]:
    found, _ = _exploration(env, campaign_id)
    section = (found or {}).get(mode)
    return dict(section) if isinstance(section, dict) else dict(MISSING[mode])


@command(cli, "get-structure")
@_CAMPAIGN_OPTION
def get_structure(env: Env, campaign_id: str | None) -> Reply:
    """data: the structure section, or {"status": "missing"} without an exploration."""
    return Reply(_section(env, campaign_id, "structure"))


@command(cli, "get-pattern")
@_CAMPAIGN_OPTION
def get_pattern(env: Env, campaign_id: str | None) -> Reply:
    """data: the pattern section (confidence 0.5 when absent), or {status: "missing",
    framework: "none", confidence: 0.5, idioms: {required: [], forbidden: []}}."""
    section = _section(env, campaign_id, "pattern")
    if section.get("confidence") is None:
        section["confidence"] = 0.5
    return Reply(section)


@command(cli, "get-memory")
@_CAMPAIGN_OPTION
def get_memory(env: Env, campaign_id: str | None) -> Reply:
    """data: the memory section, or {status: "missing", failures: [], patterns: [],
    total_in_memory, similar_campaigns}.

    similar_campaigns is computed from the store's finished campaigns when the section lacks
    it (FTL's lookup always failed and gave [], §8.2 item 9).
    """
    section = _section(env, campaign_id, "memory")
    if "similar_campaigns" not in section or section.get("status") == "missing":
        section["similar_campaigns"] = _similar(env, campaign_id)
    return Reply(section)


def _similar(env: Env, campaign_id: str | None) -> list[dict]:
    from ftl.server.tools.context import ToolContext
    from ftl.server.tools.explorers import ExploreArgs, explore_memory

    campaign = env.campaign(campaign_id)
    if campaign is None:
        return []
    found = explore_memory(ExploreArgs(objective=campaign["objective"], campaign_id=campaign["campaign_id"]),
                           ToolContext(repo=env.repo))
    return found.get("similar_campaigns") or []


@command(cli, "get-delta")
@_CAMPAIGN_OPTION
def get_delta(env: Env, campaign_id: str | None) -> Reply:
    """data: the delta section, or {status: "missing", candidates: []} without an exploration."""
    return Reply(_section(env, campaign_id, "delta"))

