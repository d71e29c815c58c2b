"""FTL-compatible ``orchestration.py``: explorer sessions, the transition table and state events.

FTL orchestration.py (``shared/reference/ftl-behaviour.md`` §4.5). Sessions are campaigns (see
``lib/exploration.py``); transitions are checked against ftl's one state machine table
(`ftl.machine.TRANSITIONS`), which FTL's unused validate-transition contradicted (§8.2 item
17); emitted states go to the campaign's event log (``.ftl/events/<campaign_id>.jsonl``), where
FTL's events only ever reached a table nobody read. Output and exit codes: see
``lib/_common.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

# The sibling _common module, however the script is started (python lib/x.py, runpy, tests).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Env, Reply, command, explorer_progress, parse_json_option, run, script_group, violation

cli = script_group("orchestration.py", "Explorer sessions, transitions and state events (FTL orchestration.py).")


@command(cli, "create-session")
def create_session(env: Env) -> Reply:
    """The explorer session id of the active campaign: its campaign id.

    data: {"session_id": campaign_id}. FTL drew a random id and deleted old sessions' results;
    here results stay with their campaign. No active campaign -> NOT_FOUND.
    """
    return Reply({"session_id": env.active()["campaign_id"]})


@command(cli, "check-explorers")
@click.option("--session", "session", required=True, help="Session id = campaign id.")
def check_explorers(env: Env, session: str) -> Reply:
    """Explorer progress of the session.

    A mode is "complete" only with an ok or partial result, "error" with error results only,
    else "pending"; the quorum counts distinct complete modes (FTL counted error and duplicate
    rows, §8.2 item 5). data: {session_id, total: 4, completed: n, quorum_met,
    quorum_required, modes: {structure, pattern, memory, delta}, missing: [modes], rows}.
    """
    env.store.get_campaign(session)
    progress = explorer_progress(env.store.explorer_results(session), env.config.explorer_quorum)
    return Reply({"session_id": session, "total": len(progress["modes"]),
                  "completed": len(progress["completed"]), "quorum_met": progress["quorum_met"],
                  "quorum_required": progress["quorum_required"], "modes": progress["modes"],
                  "missing": progress["missing"], "rows": progress["rows"]})


def _state(value: str, where: str) -> str:
    from ftl.machine import State

    name = value.strip().upper()
    if name not in State.__members__:
        raise violation(where, f"{value!r} is not a state", f"use one of {', '.join(s.value for s in State)}")
    return name


def transitions_between(source: str, dest: str) -> list[dict[str, Any]]:
    """Every ``{flow, trigger, guard}`` of `ftl.machine.TRANSITIONS` moving ``source`` to ``dest``."""
    from ftl.machine import TRANSITIONS

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

    Valid iff some trigger of ftl.machine.TRANSITIONS does it (a guard may still refuse at run
    time; it is named). data: {valid, reason ("" when valid), transitions: [{flow, trigger,
    guard}], reachable: [states FROM can move to]}. Exit 0 either way; read data.valid (FTL
    exited 1 for invalid). An unknown state name -> VALIDATION_ERROR (exit 2).
    """
    from ftl.machine import TRANSITIONS

    source, dest = _state(source, "FROM"), _state(dest, "TO")
    found = transitions_between(source, dest)
    reachable = sorted({row["dest"] for rows in TRANSITIONS.values() for row in rows
                        if source in (row["source"] if isinstance(row["source"], list) else [row["source"]])})
    reason = "" if found else (f"no trigger moves {source} to {dest}; from {source} the machine can go to "
                               f"{', '.join(reachable) or 'nothing (final state)'}")
    return Reply({"valid": bool(found), "reason": reason, "transitions": found, "reachable": reachable})


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

    name = _state(state, "STATE")
    fields = parse_json_option(meta, "--meta") if meta is not None else {}
    clash = sorted({"ts", "seq", "campaign_id", "event", "state"} & fields.keys())
    if clash:
        raise violation("--meta", f"keys {', '.join(clash)} are reserved", "rename those keys")
    cid = env.active()["campaign_id"]
    path = events.log_path(env.repo, cid)
    with events.EventLog(path, cid) as log:
        record = log.emit(events.STATE_ENTRY, state=name, **fields)
    return Reply({**record, "timestamp": record["ts"], "log": path.name})


if __name__ == "__main__":
    run(cli)
