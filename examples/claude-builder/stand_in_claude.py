#!/usr/bin/env python3
"""A stand-in for the ``claude`` CLI: replays stream-json scenarios, offline and free.

It accepts the argv ftl's Claude builder passes (``-p --output-format stream-json --verbose
--max-turns N [--agent A] [--model M] [--resume ID] ...``), reads the prompt (the task's
workspace as a JSON block) on stdin, and prints events in the CLI's own line format (the shapes
recorded from Claude Code 2.1.329: ``system/init``, ``assistant``, ``user``, ``result``).

Scenario per task: ``FTL_STAND_IN_SCENARIOS`` is a JSON object ``{slug: scenario, "*": default}``
(default ``success``). Scenarios:

* ``success``: writes the task's ``creates`` files, then a ``success`` result with a cost;
* ``max_turns``: a result ``error_max_turns`` after ``--max-turns`` turns;
* ``rate_limit_once``: first run an ``API Error: 429`` with ``retry-after: 1``, then success;
* ``usage_limit_once``: first run ``Claude AI usage limit reached|<epoch now + 2 s>``, then success;
* ``stall_once``: first run goes silent after ``init`` (ftl must kill it); a run with
  ``--resume <that session>`` succeeds;
* ``malformed``: success with broken lines and unknown event types mixed in;
* ``crash``: stops mid-stream without a result (exit 3);
* ``denied``: the permission settings refuse the agent's ``Bash`` call (a ``permission_denials``
  entry in the result); the agent reports itself blocked;
* ``not_logged_in``: the real CLI's reply when it has no credentials.

As a planner (the prompt holds ``{"mode", "objective", ...}``; scenario key ``planner``):
``plan`` (default) answers a one-task plan; ``clarify_once`` first asks a question
(Confidence: CLARIFY), then plans; ``max_turns`` runs out of turns (paid, no answer).

``FTL_STAND_IN_WORK_S`` (default 0): seconds a successful run spends "working";
``FTL_STAND_IN_RESET_S`` (default 2): how far ahead the usage limit resets.

Every run appends ``{"argv", "cwd", "slug", "scenario", "run"}`` to
``$FTL_STAND_IN_LOG/argv.jsonl`` when that folder is set (tests read it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _session(slug: str, run: int) -> str:
    digest = hashlib.sha1(f"{slug}:{run}".encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _usage(scale: int) -> dict:
    return {"input_tokens": 1200 * scale, "output_tokens": 340 * scale,
            "cache_read_input_tokens": 5000 * scale, "cache_creation_input_tokens": 800 * scale}


def _result(session: str, subtype: str, *, cost: float, turns: int, text: str,
            is_error: bool = False, api_error_status: int | None = None) -> dict:
    return {"type": "result", "subtype": subtype, "is_error": is_error, "duration_ms": 900,
            "duration_api_ms": 700 * max(1, turns), "num_turns": turns, "result": text,
            "session_id": session, "total_cost_usd": cost, "usage": _usage(max(1, turns)),
            "api_error_status": api_error_status, "terminal_reason": "api_error" if is_error else None}


_replies = 0


def _assistant(session: str, text: str, error: str | None = None) -> dict:
    global _replies
    _replies += 1  # each API reply has its own message id
    event = {"type": "assistant", "session_id": session,
             "message": {"id": f"msg_{session[:8]}_{_replies}", "role": "assistant",
                         "content": [{"type": "text", "text": text}], "usage": _usage(1)}}
    if error:
        event.update(error=error, is_api_error_message=True)
    return event


def _write_files(workspace: dict) -> list[str]:
    written = []
    for path in workspace.get("creates") or []:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"\W", "_", workspace.get("slug") or "task")
        target.write_text(f"{name.upper()} = {int(workspace.get('seq') or 0)}\n"
                          if target.suffix == ".py" else f"written for {name}\n")
        written.append(path)
    return written


def _succeed(session: str, workspace: dict, noisy: bool = False) -> int:
    _emit(_assistant(session, f"Working on {workspace.get('workspace_id')}."))
    time.sleep(float(os.environ.get("FTL_STAND_IN_WORK_S") or 0))  # the agent at work
    if noisy:
        sys.stdout.write("this is not json\n{\"type\": \"assistant\", \"message\": \n")
        _emit({"type": "telemetry_v9", "payload": {"x": 1}})
        sys.stdout.write("[1, 2, 3]\n")
        sys.stdout.flush()
    written = _write_files(workspace)
    _emit({"type": "user", "session_id": session,
           "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                     "content": f"wrote {', '.join(written)}"}]}})
    report = {"status": "complete", "delivered": f"created {', '.join(written) or 'nothing'}",
              "utilized": []}
    _emit(_assistant(session, json.dumps(report)))
    seq = int(workspace.get("seq") or 1)
    _emit(_result(session, "success", cost=round(0.01 + 0.0025 * seq, 4), turns=3,
                  text=json.dumps(report)))
    return 0


def _plan(session: str, planning: dict, clarify: bool) -> int:
    """The planner's answer: a one-task plan, or (``clarify``) a CLARIFY with a question."""
    if clarify:
        text = "Confidence: CLARIFY\n\n## Questions\n1. Which module should hold the greeting?\n"
    else:
        text = json.dumps({"objective": planning.get("objective"), "tasks": [
            {"seq": "001", "slug": "planned", "type": "BUILD", "delta": [],
             "creates": ["app/planned.py"], "verify": "test -f app/planned.py", "budget": 1,
             "depends": "none"}]})
    _emit(_assistant(session, text))
    _emit(_result(session, "success", cost=0.031, turns=2, text=text))
    return 0


def main() -> int:
    argv = sys.argv[1:]
    prompt = sys.stdin.read()
    block = re.search(r"```json\n(.*?)\n```", prompt, re.S)
    workspace = json.loads(block.group(1)) if block else {}
    planning = "mode" in workspace and "objective" in workspace and "seq" not in workspace
    slug = "planner" if planning else (workspace.get("slug") or "task")
    scenarios = json.loads(os.environ.get("FTL_STAND_IN_SCENARIOS") or "{}")
    scenario = scenarios.get(slug) or scenarios.get("*") or "success"
    log_dir = os.environ.get("FTL_STAND_IN_LOG")
    runs = 1
    if log_dir:
        log = Path(log_dir) / "argv.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        if log.exists():
            runs += sum(1 for line in log.read_text().splitlines() if json.loads(line)["slug"] == slug)
        with log.open("a") as handle:
            handle.write(json.dumps({"argv": argv, "cwd": os.getcwd(), "slug": slug,
                                     "scenario": scenario, "run": runs, "t": time.time()}) + "\n")
    resume = _flag(argv, "--resume")
    session = resume or _session(slug, runs)
    _emit({"type": "system", "subtype": "init", "session_id": session, "cwd": os.getcwd(),
           "model": _flag(argv, "--model") or "claude-stand-in", "tools": ["Read", "Edit", "Write"],
           "permissionMode": _flag(argv, "--permission-mode") or "default",
           "claude_code_version": "2.1.329"})
    first = runs == 1
    if planning and scenario != "max_turns":
        return _plan(session, workspace, clarify=scenario == "clarify_once" and first)
    if scenario == "not_logged_in":
        _emit(_assistant(session, "Not logged in · Please run /login", error="authentication_failed"))
        _emit(_result(session, "success", cost=0, turns=1, is_error=True,
                      text="Not logged in · Please run /login"))
        return 1
    if scenario == "max_turns":
        turns = int(_flag(argv, "--max-turns") or 1)
        _emit(_assistant(session, "Still exploring the code base."))
        _emit(_result(session, "error_max_turns", cost=0.05, turns=turns, is_error=True, text=""))
        return 1
    if scenario == "rate_limit_once" and first:
        message = ('API Error: 429 {"type":"error","error":{"type":"rate_limit_error",'
                   '"message":"Number of requests exceeded"}} retry-after: 1')
        _emit(_assistant(session, message, error="rate_limit"))
        _emit(_result(session, "success", cost=0.001, turns=1, is_error=True, text=message,
                      api_error_status=429))
        return 1
    if scenario == "usage_limit_once" and first:
        message = ("Claude AI usage limit reached|"
                   f"{int(time.time() + float(os.environ.get('FTL_STAND_IN_RESET_S') or 2))}")
        _emit(_assistant(session, message, error="rate_limit"))
        _emit(_result(session, "success", cost=0.002, turns=1, is_error=True, text=message))
        return 1
    if scenario == "stall_once" and not resume:
        _emit(_assistant(session, "Reading the files first."))
        time.sleep(3600)  # silent until ftl stops the process group
        return 1
    if scenario == "denied":
        _emit(_assistant(session, "Running the tests first."))
        _emit({"type": "user", "session_id": session,
               "message": {"role": "user", "content": [{
                   "type": "tool_result", "tool_use_id": "toolu_bash_1", "is_error": True,
                   "content": "Claude requested permissions to use Bash, but you haven't granted it yet."}]}})
        report = {"status": "blocked", "reason": "could not run the test suite", "utilized": []}
        _emit(_assistant(session, json.dumps(report)))
        result = _result(session, "success", cost=0.012, turns=2, text=json.dumps(report))
        result["permission_denials"] = [{"tool_name": "Bash", "tool_use_id": "toolu_bash_1",
                                         "tool_input": {"command": "pytest -q",
                                                        "description": "Run the tests"}}]
        _emit(result)
        return 0
    if scenario == "crash":
        _emit(_assistant(session, "Starting."))
        sys.stdout.write('{"type": "assistant", "message": {"content": [{"type": "te')
        sys.stdout.flush()
        os._exit(3)
    return _succeed(session, workspace, noisy=scenario == "malformed")


if __name__ == "__main__":
    sys.exit(main())
