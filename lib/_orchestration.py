"""FTL-compatible ``orchestration.py``: explorer sessions, the transition table and state events.

FTL orchestration.py (``shared/reference/ftl-behaviour.md`` §4.5). Sessions are campaigns (see
``lib/exploration.py``); transitions are checked against ftl's one state machine table
(`ftl.engine.machine.TRANSITIONS`), which FTL's unused validate-transition contradicted (§8.2 item
17); emitted states go to the campaign's event log (``.ftl/events/<campaign_id>.jsonl``), where
FTL's events only ever reached a table nobody read. Output and exit codes: see
``lib/_common.py``.
"""

from __future__ import annotations

from typing import Any

import click

from _common import (Env, FtlRefusal, Reply, command, explorer_progress, parse_json_option, script_group,
                     violation)
from ftl.errors import FtlError

cli = script_group("orchestration.py", "Explorer sessions, transitions and state events (FTL orchestration.py).")


@command(cli, "create-session")
def create_session(env: Env) -> Reply:
    """The explorer session id: the active campaign's id, or, before any campaign is created
    (FTL's INIT draws the session first), a fresh 8-character id that names the campaign
    active when explorers write (see lib/exploration.py).

    data: {"session_id": id}. FTL also deleted old sessions' results; here results stay with
    their campaign.
    """
    import uuid

    campaign = env.active(required=False)
    session = campaign["campaign_id"] if campaign else uuid.uuid4().hex[:8]
    return Reply({"session_id": session}, ftl_indent=None)


def _session_campaign_id(env: Env, session: str) -> str:
    """A campaign id names itself; any other session id names the active campaign."""
    try:
        return env.store.get_campaign(session)["campaign_id"]
    except FtlError as error:
        if error.error_type != "not_found":
            raise
        return env.active()["campaign_id"]


@command(cli, "check-explorers")
@click.option("--session", "session", required=True, help="Session id = campaign id.")
def check_explorers(env: Env, session: str) -> Reply:
    """Explorer progress of the session.

    A mode is "complete" only with an ok or partial result, "error" with error results only,
    else "pending"; the quorum counts distinct complete modes (FTL counted error and duplicate
    rows, §8.2 item 5). data: {session_id, total: 4, completed: n, quorum_met,
    quorum_required, modes: {structure, pattern, memory, delta}, missing: [modes], rows}.
    """
    cid = _session_campaign_id(env, session)
    progress = explorer_progress(env.store.explorer_results(cid), env.explorer_settings()[0])
    return Reply({"session_id": session, "total": len(progress["modes"]),
                  "completed": len(progress["completed"]), "quorum_met": progress["quorum_met"],
                  "quorum_required": progress["quorum_required"], "modes": progress["modes"],
                  "missing": progress["missing"], "rows": progress["rows"]},
                 ftl={"total": len(progress["modes"]), "completed": len(progress["completed"]),
                      "quorum_met": progress["quorum_met"], "modes": progress["modes"],
                      "session_id": session})


@command(cli, "wait-explorers")
@click.option("--session", "session", required=True, help="Session id (create-session).")
@click.option("--required", type=click.IntRange(min=0), default=None,
              help="Modes needed (default: explorer_quorum of ftl.toml, 3).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait (default: explorer_timeout_s of ftl.toml, 300).")
@click.option("--poll-interval", "poll_s", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Seconds between checks.")
def wait_explorers(env: Env, session: str, required: int | None, timeout_s: float | None,
                   poll_s: float) -> Reply:
    """Wait until the explorers of the session meet the quorum, or the timeout.

    A mode counts once, with an ok or partial result (FTL also counted error rows). data:
    {status: all_complete | quorum_met | timeout (some done) | quorum_failure (none done),
    completed: [modes], missing: [modes], elapsed (s), session_id}. FTL output mode exits 1
    on timeout, as FTL did; the envelope exits 0.
    """
    import time

    cid = _session_campaign_id(env, session)
    quorum, default_timeout_s = env.explorer_settings()
    required = quorum if required is None else required
    timeout_s = default_timeout_s if timeout_s is None else timeout_s
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        progress = explorer_progress(env.store.explorer_results(cid), required)
        done, missing = progress["completed"], progress["missing"]
        if len(done) >= len(progress["modes"]):
            status = "all_complete"
        elif len(done) >= required:
            status = "quorum_met"
        elif elapsed >= timeout_s:
            status = "timeout" if done else "quorum_failure"
        else:
            time.sleep(min(poll_s, max(0.0, timeout_s - elapsed)))
            continue
        rows = env.store.explorer_results(cid)
        first = {}
        for index, row in enumerate(rows):
            first.setdefault(row["mode"], index)
        done = sorted(done, key=lambda m: first.get(m, len(rows)))  # FTL: in the order written
        result = {"status": status, "completed": done, "missing": [] if status == "all_complete" else missing,
                  "elapsed": round(elapsed, 2), "session_id": session}
        return Reply(result, ftl_exit=1 if status == "timeout" else 0)


def _state(value: str, where: str, why: str = "") -> str:
    """``value`` as a machine state name (case-blind). Raises: FtlError(schema_invalid) naming
    the states, and ``why`` only they are accepted when given."""
    from ftl.engine.machine import State

    name = value.strip().upper()
    if name not in State.__members__:
        states = ", ".join(s.value for s in State)
        because = f" ({why})" if why else ""
        raise violation(where, f"{value!r} is not a state of ftl's machine: {states}{because}",
                        f"use one of {states}")
    return name


def transitions_between(source: str, dest: str) -> list[dict[str, Any]]:
    """Every ``{flow, trigger, guard}`` of `ftl.engine.machine.TRANSITIONS` moving ``source`` to ``dest``."""
    from ftl.engine.machine import TRANSITIONS

    found = []
    for flow, rows in TRANSITIONS.items():
        for row in rows:
            sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
            if source in sources and row["dest"] == dest:
                found.append({"flow": flow.value, "trigger": row["trigger"], "guard": row.get("conditions")})
    return found


@command(cli, "validate-transition")
@click.argument("source", metavar="FROM")
@click.argument("dest", metavar="TO")
def validate_transition(env: Env, source: str, dest: str) -> Reply:
    """Whether the state machine can move FROM to TO (either flow; state names any case).

    Valid iff some trigger of ftl.engine.machine.TRANSITIONS does it (a guard may still refuse at run
    time; it is named). data: {valid, reason ("" when valid), transitions: [{flow, trigger,
    guard}], reachable: [states FROM can move to]}. Exit 0 either way; read data.valid (the FTL
    output mode exits 1 for invalid, as FTL did). An unknown state name -> VALIDATION_ERROR
    (exit 2; FTL output mode: {"valid": false, "reason": "Unknown state: X"}, exit 1).
    """
    from ftl.engine.machine import TRANSITIONS

    for value in (source, dest):
        if value.strip().upper() not in _STATE_NAMES():
            raise FtlRefusal("schema_invalid", {"count": 1, "violations": [{
                "path": "FROM" if value is source else "TO", "message": f"{value!r} is not a state",
                "fix": "use a state of the machine (INIT, EXPLORE, PLAN, ...)"}]},
                message=f"Unknown state: {value}",
                ftl_payload={"valid": False, "reason": f"Unknown state: {value}"}, ftl_indent=2)
    source, dest = _state(source, "FROM"), _state(dest, "TO")
    found = transitions_between(source, dest)
    reachable = sorted({row["dest"] for rows in TRANSITIONS.values() for row in rows
                        if source in (row["source"] if isinstance(row["source"], list) else [row["source"]])})
    reason = "" if found else (f"no trigger moves {source} to {dest}; from {source} the machine can go to "
                               f"{', '.join(reachable) or 'nothing (final state)'}")
    # FTL's wording; the list of valid targets is ftl's machine's (it has ERROR, CASCADE, ...)
    ftl_reason = "" if found else f"Invalid transition {source} -> {dest}. Valid: {reachable}"
    return Reply({"valid": bool(found), "reason": reason, "transitions": found, "reachable": reachable},
                 ftl={"valid": bool(found), "reason": ftl_reason}, ftl_exit=0 if found else 1)


def _STATE_NAMES() -> set[str]:  # noqa: N802 - reads as the constant it stands for
    from ftl.engine.machine import State

    return set(State.__members__)


@command(cli, "emit-state")
@click.argument("state")
@click.option("--meta", default=None, help="JSON object of extra event fields.")
def emit_state(env: Env, state: str, meta: str | None) -> Reply:
    """Append a STATE_ENTRY event for STATE to the active campaign's event log.

    STATE must be a machine state (FTL took any text). --meta keys become event fields
    (reserved: ts, seq, campaign_id, event, state). data: the written event {ts, seq,
    campaign_id, event: "STATE_ENTRY", state, ...meta} plus FTL's `timestamp` (= ts) and
    `log` (the log file name). No active campaign -> NOT_FOUND.
    """
    from ftl import events

    name = _state(state, "STATE", why="STATE_ENTRY events go to the campaign's event log, which "
                                      "`ftl replay` checks against the machine's transitions")
    fields = parse_json_option(meta, "--meta") if meta is not None else {}
    clash = sorted({"ts", "seq", "campaign_id", "event", "state"} & fields.keys())
    if clash:
        raise violation("--meta", f"keys {', '.join(clash)} are reserved", "rename those keys")
    cid = env.active()["campaign_id"]
    path = events.log_path(env.repo, cid)
    with events.EventLog(path, cid) as log:
        record = log.emit(events.STATE_ENTRY, state=name, **fields)
    return Reply({**record, "timestamp": record["ts"], "log": path.name},
                 ftl={"event": "STATE_ENTRY", "state": state, "timestamp": record["ts"], **fields})

