"""Tests for the FTL-compatible scripts in lib/: each runs as a real subprocess
(``python lib/<script>.py --repo TMP ...``) and must print exactly one response-v2 envelope with
the documented ``data`` shape; bad input must give ``success: false``, an error code and exit 2,
never a traceback. A few pure helpers of lib/_common.py are tested in process."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parent.parent
LIB = REPO_ROOT / "lib"


# --------------------------------------------------------------------------- harness

def call(repo: Path, script: str, *args: str, stdin: str | None = None) -> tuple[int, dict[str, Any]]:
    """Run one lib script; check the envelope contract; return (exit code, envelope)."""
    proc = subprocess.run([sys.executable, str(LIB / f"{script}.py"), "--repo", str(repo), *args],
                          input=stdin if stdin is not None else "", capture_output=True, text=True,
                          cwd=repo, timeout=60)
    where = f"{script} {' '.join(args)}"
    assert "Traceback" not in proc.stdout and "Traceback" not in proc.stderr, where
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"{where}: expected one JSON line, got {proc.stdout!r}"
    payload = json.loads(lines[0])
    assert isinstance(payload["data"], dict), where
    assert payload["meta"]["version"] == "response-v2", where
    if payload["success"]:
        assert payload["error"] is None and proc.returncode == 0, where
    else:
        assert payload["error"] and proc.returncode in (1, 2), where
        for key in ("error_code", "error_type", "details", "remediation"):
            assert key in payload["data"], f"{where}: no data.{key}"
    return proc.returncode, payload


def ok(repo: Path, script: str, *args: str, stdin: str | None = None) -> dict[str, Any]:
    code, payload = call(repo, script, *args, stdin=stdin)
    assert payload["success"], payload
    return payload["data"]


def refused(repo: Path, script: str, *args: str, stdin: str | None = None) -> dict[str, Any]:
    """A bad-input call: success false, exit 2; returns data (error_code, details, ...)."""
    code, payload = call(repo, script, *args, stdin=stdin)
    assert not payload["success"] and code == 2, (script, args, payload)
    return payload["data"]


def in_parallel(*thunks):
    """Run independent subprocess checks concurrently (startup time dominates)."""
    with ThreadPoolExecutor(max_workers=6) as pool:
        return [f.result() for f in [pool.submit(t) for t in thunks]]


def task(seq: str, depends: Any = "none", **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "slug": f"task-{seq}", "verify": "true", "depends": depends, **extra}


DIAMOND = {"objective": "ship the parser", "framework": "none", "tasks": [
    task("001", delta=["src/a.py"]), task("002", "001"), task("003", ["001"]), task("004", ["002", "003"])]}


def campaign_with_tasks(repo: Path, plan: dict | None = None) -> str:
    cid = ok(repo, "campaign", "create", "ship the parser")["id"]
    ok(repo, "campaign", "add-tasks", stdin=json.dumps(plan or DIAMOND))
    return cid


# --------------------------------------------------------------------------- campaign.py

def test_campaign_commands_follow_a_campaign_from_create_to_export(tmp_path: Path) -> None:
    created = ok(tmp_path, "campaign", "create", "ship the parser", "--framework", "pytest")
    assert created["status"] == "active" and created["tasks"] == [] and created["framework"] == "pytest"
    cid = created["id"]
    added = ok(tmp_path, "campaign", "add-tasks", stdin=json.dumps(DIAMOND))
    assert added == {"status": "tasks_added", "campaign_id": cid, "seqs": ["001", "002", "003", "004"],
                     "plan_version": 1}

    status, active, first, ready = in_parallel(
        lambda: ok(tmp_path, "campaign", "status"), lambda: ok(tmp_path, "campaign", "active"),
        lambda: ok(tmp_path, "campaign", "next-task"), lambda: ok(tmp_path, "campaign", "ready-tasks"))
    assert status["counts"]["pending"] == 4 and active["id"] == cid
    assert first["seq"] == "001" and [t["seq"] for t in ready["items"]] == ["001"]

    assert ok(tmp_path, "campaign", "update-task", "1", "in_progress") == {
        "task": "001", "status": "running", "previous": "pending", "changed": True}
    ok(tmp_path, "campaign", "update-task", "001", "complete", "--delivered", "parser skeleton")
    again, ready, first = in_parallel(
        lambda: ok(tmp_path, "campaign", "update-task", "001", "complete"),
        lambda: ok(tmp_path, "campaign", "ready-tasks"), lambda: ok(tmp_path, "campaign", "next-task"))
    assert again["changed"] is False
    assert [t["seq"] for t in ready["items"]] == ["002", "003"]
    assert first["seq"] == "002"  # dependencies honoured, unlike FTL

    ok(tmp_path, "campaign", "update-task", "002", "running")
    ok(tmp_path, "campaign", "update-task", "002", "blocked", "--reason", "API contract unclear")
    cascade, analysis, replan = in_parallel(
        lambda: ok(tmp_path, "campaign", "cascade-status"),
        lambda: ok(tmp_path, "campaign", "cascade-analysis"),
        lambda: ok(tmp_path, "campaign", "get-replan-input"))
    assert cascade["state"] == "in_progress" and cascade["unreachable"] == [{"seq": "004", "blocked_by": ["002"]}]
    assert [r["seq"] for r in analysis["roots"]] == ["002"] and analysis["unreachable_count"] == 1
    assert replan["completed_tasks"] == [{"seq": "001", "slug": "task-001", "delivered": "parser skeleton"}]
    assert replan["blocked_tasks"][0]["reason"] == "API contract unclear"
    assert {t["seq"] for t in replan["remaining_tasks"]} == {"003", "004"}
    assert "verify" in replan["remaining_tasks"][0]  # full specs, unlike FTL

    propagated = ok(tmp_path, "campaign", "propagate-blocks")
    assert propagated["propagated"] == ["004"] and propagated["details"][0]["blocked_by"] == ["002"]

    revised = {"objective": "ship the parser", "tasks": [
        task("002", "001", verify="pytest -q tests/test_api.py"), task("004", ["002", "003"]), task("005", "004")]}
    (tmp_path / "revised.json").write_text(json.dumps(revised))
    merged = ok(tmp_path, "campaign", "merge-revised-plan", "revised.json")
    assert merged == {"merged": 2, "unchanged": 2, "added": 1, "plan_version": 2}
    assert ok(tmp_path, "campaign", "cascade-status")["unreachable"] == []

    done = ok(tmp_path, "campaign", "complete", "--summary", "stopped early")
    assert done["status"] == "complete" and done["outcome"] == "partial"
    assert done["summary"]["text"] == "stopped early" and done["summary"]["complete"] == 1
    assert done["fingerprint"]["task_count"] == 5 and len(done["fingerprint"]["objective_hash"]) == 8

    after, history, exported, none_exported, nothing_active = in_parallel(
        lambda: ok(tmp_path, "campaign", "status"), lambda: ok(tmp_path, "campaign", "history"),
        lambda: ok(tmp_path, "campaign", "export", "out.json", "--start", "2000-01-01"),
        lambda: ok(tmp_path, "campaign", "export", "none.json", "--end", "2000-01-01"),
        lambda: ok(tmp_path, "campaign", "active"))
    assert after["status"] == "complete" and after["summary"]["outcome"] == "partial"  # FTL: "none"
    assert [a["id"] for a in history["archives"]] == [cid]
    assert exported["count"] == 1 and json.loads((tmp_path / "out.json").read_text())["campaigns"][0]["id"] == cid
    assert none_exported["count"] == 0
    assert nothing_active == {}


def test_campaign_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    errors = in_parallel(
        lambda: refused(tmp_path, "campaign", "add-tasks", stdin=json.dumps(DIAMOND)),
        lambda: refused(tmp_path, "campaign", "nonsense"),
        lambda: refused(tmp_path, "campaign", "update-task"),
        lambda: refused(tmp_path, "campaign"),
        lambda: refused(tmp_path, "campaign", "export", "x.json", "--start", "2026-02-30"))
    assert errors[0]["error_code"] == "NOT_FOUND"  # no active campaign
    assert all(e["error_code"] == "VALIDATION_ERROR" for e in errors[1:])
    assert errors[2]["details"]["violations"][0]["path"] == "SEQ"

    campaign_with_tasks(tmp_path)
    errors = in_parallel(
        lambda: refused(tmp_path, "campaign", "add-tasks", stdin='{"objective": "x", "tasks": ['),
        lambda: refused(tmp_path, "campaign", "add-tasks", stdin="null"),
        lambda: refused(tmp_path, "campaign", "add-tasks", stdin=json.dumps(DIAMOND)),
        lambda: refused(tmp_path, "campaign", "update-task", "001", "complete"),
        lambda: refused(tmp_path, "campaign", "update-task", "004", "running"),
        lambda: refused(tmp_path, "campaign", "update-task", "042", "running"),
        lambda: refused(tmp_path, "campaign", "update-task", "001", "finished"),
        lambda: refused(tmp_path, "campaign", "create", "second"),
        lambda: refused(tmp_path, "campaign", "merge-revised-plan", "missing.json"))
    bad_json, null_plan, twice, illegal, not_ready, unknown_seq, bad_status, second, missing = errors
    assert bad_json["details"]["violations"][0]["line"] == 1
    assert null_plan["error_code"] == "VALIDATION_ERROR"
    assert twice["error_code"] == "CONFLICT"  # add-tasks never resets progress (FTL did)
    assert illegal["error_code"] == "INVALID_STATE_TRANSITION" and "running" in illegal["details"]["what"]
    assert illegal["details"]["legal_moves"] == ["blocked", "running"]
    assert not_ready["error_code"] == "INVALID_STATE_TRANSITION" and "002" in not_ready["details"]["what"]
    assert unknown_seq["error_code"] == "NOT_FOUND"
    assert bad_status["details"]["violations"][0]["path"] == "STATUS"
    assert second["error_code"] == "CONFLICT"
    assert missing["error_code"] == "NOT_FOUND"

    cyclic = {"objective": "x", "tasks": [task("001", "002"), task("002", "001")]}
    (tmp_path / "cyclic.json").write_text(json.dumps(cyclic))
    cycle = refused(tmp_path, "campaign", "merge-revised-plan", "cyclic.json")
    assert cycle["error_code"] == "CIRCULAR_DEPENDENCY"


# --------------------------------------------------------------------------- workspace.py

def test_workspace_lifecycle_moves_the_task_with_it(tmp_path: Path) -> None:
    cid = campaign_with_tasks(tmp_path)
    created = ok(tmp_path, "workspace", "create", "--plan-id", "1")
    assert [w["workspace_id"] for w in created["created"]] == ["001-task-001"]  # only the ready task
    assert {s["seq"] for s in created["skipped"]} == {"002", "003", "004"}
    ws = created["created"][0]
    assert ws["id"] == ws["workspace_id"] and ws["status"] == "active" and ws["attempt"] == 1
    assert ws["campaign_id"] == cid and ws["delta"] == ["src/a.py"] and ws["verify"] == "true"
    again = ok(tmp_path, "workspace", "create", "--plan-id", "1", "--task", "1")
    assert again["created"][0]["created_at"] == ws["created_at"]  # idempotent while open
    assert ok(tmp_path, "campaign", "status")["tasks"][0]["status"] == "running"

    done = ok(tmp_path, "workspace", "complete", "001-task-001", "--delivered", "wrote the lexer",
              "--utilized", "[]")
    assert done["status"] == "complete" and done["delivered"] == "wrote the lexer" and done["completed_at"]
    second = ok(tmp_path, "workspace", "create", "--plan-id", "1", "--task", "002")["created"][0]
    assert second["lineage"]["parent"] == "001-task-001"
    assert second["lineage"]["prior_delivery"] == "wrote the lexer"
    blocked = ok(tmp_path, "workspace", "block", "2", "--reason", "schema missing")
    assert blocked["status"] == "blocked" and blocked["delivered"] == "BLOCKED: schema missing"
    sibling = ok(tmp_path, "workspace", "create", "--plan-id", "1", "--task", "3")["created"][0]
    assert sibling["prior_knowledge"]["sibling_failures"][0]["trigger"] == "schema missing"

    by_path, by_seq, listed, complete_only = in_parallel(
        lambda: ok(tmp_path, "workspace", "parse", ".ftl/workspace/002_task-002_blocked.xml"),
        lambda: ok(tmp_path, "workspace", "parse", "1"),
        lambda: ok(tmp_path, "workspace", "list"),
        lambda: ok(tmp_path, "workspace", "list", "--status", "complete"))
    assert by_path["workspace_id"] == "002-task-002" and by_seq["workspace_id"] == "001-task-001"
    assert len(listed["items"]) == 3 and listed["items"][0]["workspace_id"] == "003-task-003"
    assert [w["workspace_id"] for w in complete_only["items"]] == ["001-task-001"]
    statuses = {t["seq"]: t["status"] for t in ok(tmp_path, "campaign", "status")["tasks"]}
    assert statuses == {"001": "complete", "002": "blocked", "003": "running", "004": "pending"}


def test_workspace_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    assert refused(tmp_path, "workspace", "create", "--plan-id", "1")["error_code"] == "NOT_FOUND"
    campaign_with_tasks(tmp_path)
    ok(tmp_path, "workspace", "create", "--plan-id", "1")
    ok(tmp_path, "workspace", "complete", "001-task-001", "--delivered", "x")
    errors = in_parallel(
        lambda: refused(tmp_path, "workspace", "complete", "001-task-001", "--delivered", "again"),
        lambda: refused(tmp_path, "workspace", "create", "--plan-id", "9"),
        lambda: refused(tmp_path, "workspace", "create", "--plan-id", "1", "--task", "004"),
        lambda: refused(tmp_path, "workspace", "create", "--plan-id", "1", "--task", "001"),
        lambda: refused(tmp_path, "workspace", "parse", "no such thing"),
        lambda: refused(tmp_path, "workspace", "parse", "009-nothing"),
        lambda: refused(tmp_path, "workspace", "list", "--status", "sleeping"))
    codes = [e["error_code"] for e in errors]
    assert codes == ["CONFLICT", "NOT_FOUND", "INVALID_STATE_TRANSITION", "CONFLICT", "VALIDATION_ERROR",
                     "NOT_FOUND", "VALIDATION_ERROR"]


# --------------------------------------------------------------------------- plan.py

def test_plan_versions_and_their_status(tmp_path: Path) -> None:
    assert refused(tmp_path, "plan", "get-active")["error_code"] == "NOT_FOUND"
    cid = ok(tmp_path, "campaign", "create", "ship the parser")["id"]
    assert ok(tmp_path, "plan", "write", stdin=json.dumps(DIAMOND)) == {"id": 1, "campaign_id": cid}
    long = dict(DIAMOND, objective="x" * 80)
    assert ok(tmp_path, "plan", "write", stdin=json.dumps(long))["id"] == 2
    first, active, listed, superseded = in_parallel(
        lambda: ok(tmp_path, "plan", "read", "--id", "1"), lambda: ok(tmp_path, "plan", "get-active"),
        lambda: ok(tmp_path, "plan", "list"), lambda: ok(tmp_path, "plan", "list", "--status", "superseded"))
    assert first["id"] == 1 and first["status"] == "superseded" and first["campaign_id"] == cid
    assert first["tasks"][1]["depends"] == ["001"]  # normalised
    assert active["id"] == 2 and active["status"] == "active"
    assert [p["id"] for p in listed["items"]] == [2, 1] and listed["items"][0]["objective"] == "x" * 50 + "..."
    assert listed["items"][0]["task_count"] == 4
    assert [p["id"] for p in superseded["items"]] == [1]

    errors = in_parallel(
        lambda: refused(tmp_path, "plan", "write", stdin="null"),
        lambda: refused(tmp_path, "plan", "write", stdin=json.dumps({"objective": "x", "tasks": [{"seq": "1"}]})),
        lambda: refused(tmp_path, "plan", "read", "--id", "5"),
        lambda: refused(tmp_path, "plan", "read"))
    assert errors[0]["error_code"] == "VALIDATION_ERROR"
    paths = {v["path"] for v in errors[1]["details"]["violations"]}
    assert {"$.tasks[0].slug", "$.tasks[0].verify"} <= paths
    assert errors[2]["error_code"] == "NOT_FOUND" and errors[3]["error_code"] == "VALIDATION_ERROR"
    ok(tmp_path, "campaign", "complete")
    assert ok(tmp_path, "plan", "read", "--id", "2", "--campaign-id", cid)["status"] == "executed"


def test_mark_executed_is_honoured_by_read_list_and_get_active(tmp_path: Path) -> None:
    ok(tmp_path, "campaign", "create", "ship the parser")
    ok(tmp_path, "plan", "write", stdin=json.dumps(DIAMOND))
    ok(tmp_path, "plan", "write", stdin=json.dumps(DIAMOND))
    marked = ok(tmp_path, "plan", "mark-executed", "--id", "1")
    assert marked["status"] == "executed" and marked["id"] == 1
    assert ok(tmp_path, "plan", "mark-executed", "--id", "1")["executed_at"] == marked["executed_at"]
    assert ok(tmp_path, "plan", "read", "--id", "1")["status"] == "executed"  # not superseded
    assert ok(tmp_path, "plan", "get-active")["id"] == 2
    ok(tmp_path, "plan", "mark-executed", "--id", "2")
    assert refused(tmp_path, "plan", "get-active")["error_code"] == "NOT_FOUND"
    assert [p["id"] for p in ok(tmp_path, "plan", "list", "--status", "executed")["items"]] == [2, 1]
    assert ok(tmp_path, "plan", "list", "--status", "active")["items"] == []
    assert refused(tmp_path, "plan", "mark-executed", "--id", "3")["error_code"] == "NOT_FOUND"


# --------------------------------------------------------------------------- exploration.py

def test_exploration_session_counts_distinct_usable_modes(tmp_path: Path) -> None:
    ok(tmp_path, "campaign", "create", "add a lexer")
    session = ok(tmp_path, "orchestration", "create-session")["session_id"]

    def write(mode: str, result: dict) -> dict:
        return ok(tmp_path, "exploration", "write-result", "--session", session, "--mode", mode,
                  stdin=json.dumps(result))

    assert write("structure", {"status": "ok", "directories": {"src": True}}) == {
        "session_id": session, "mode": "structure", "status": "written", "result_status": "ok"}
    write("memory", {"status": "error", "error": "no store"})
    in_parallel(lambda: write("memory", {"status": "error", "error": "again"}),
                lambda: write("pattern", {"mode": "pattern", "status": "partial", "framework": "none"}))
    status, checked = in_parallel(
        lambda: ok(tmp_path, "exploration", "session-status", "--session", session),
        lambda: ok(tmp_path, "orchestration", "check-explorers", "--session", session))
    # FTL would count 4 rows and call the quorum met.
    assert status["completed"] == ["structure", "pattern"] and status["quorum_met"] is False
    assert status["failed"] == ["memory"] and status["rows"] == 4
    assert checked["modes"] == {"structure": "complete", "pattern": "complete", "memory": "error", "delta": "pending"}
    assert checked["total"] == 4 and checked["completed"] == 2 and not checked["quorum_met"]

    write("delta", {"status": "ok", "candidates": [{"path": "src/lexer.py"}]})
    assert ok(tmp_path, "orchestration", "check-explorers", "--session", session)["quorum_met"]  # structure+delta
    aggregated = ok(tmp_path, "exploration", "aggregate-session", "--session", session)
    assert aggregated["_meta"]["objective"] == "add a lexer" and aggregated["_meta"]["git_sha"] == "unknown"
    assert aggregated["_meta"]["modes_completed"] == ["delta", "pattern", "structure"]
    assert aggregated["pattern"]["confidence"] == 0.5 and aggregated["memory"]["error"] == "again"

    assert ok(tmp_path, "exploration", "get-delta") == {"status": "missing", "candidates": []}
    assert ok(tmp_path, "exploration", "read") == {}
    assert ok(tmp_path, "exploration", "write", stdin=json.dumps(aggregated))["modes"] == [
        "structure", "pattern", "memory", "delta"]
    read, structure, pattern, memory, delta = in_parallel(
        *[lambda c=c: ok(tmp_path, "exploration", c)
          for c in ("read", "get-structure", "get-pattern", "get-memory", "get-delta")])
    assert read["structure"] == structure and structure["directories"] == {"src": True}
    assert pattern["framework"] == "none"
    assert memory["similar_campaigns"] == [] and delta["candidates"] == [{"path": "src/lexer.py"}]


def test_exploration_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    ok(tmp_path, "campaign", "create", "add a lexer")
    session = ok(tmp_path, "orchestration", "create-session")["session_id"]
    errors = in_parallel(
        lambda: refused(tmp_path, "exploration", "write-result", "--session", session, "--mode", "vibes",
                        stdin='{"status": "ok"}'),
        lambda: refused(tmp_path, "exploration", "write-result", "--session", session, "--mode", "delta",
                        stdin='{"candidates": []}'),
        lambda: refused(tmp_path, "exploration", "write-result", "--session", session, "--mode", "delta",
                        stdin='{"mode": "pattern", "status": "ok"}'),
        lambda: refused(tmp_path, "exploration", "write", stdin='["not", "an", "object"]'),
        lambda: refused(tmp_path, "exploration", "write", stdin='{"structur": {}}'))
    codes = [e["error_code"] for e in errors]
    assert codes == ["VALIDATION_ERROR"] * 5
    assert errors[1]["details"]["violations"][0]["path"] == "$.status"
    # An FTL session id drawn before the campaign existed names the active campaign.
    ok(tmp_path, "exploration", "write-result", "--session", "1a2b3c4d", "--mode", "delta",
       stdin='{"status": "ok", "candidates": []}')
    assert ok(tmp_path, "exploration", "session-status", "--session", session)["completed"] == ["delta"]
    ok(tmp_path, "campaign", "complete")
    assert refused(tmp_path, "exploration", "write-result", "--session", session, "--mode", "delta",
                   stdin='{"status": "ok"}')["error_code"] == "CONFLICT"
    assert refused(tmp_path, "exploration", "session-status", "--session", "c-unknown")["error_code"] == "NOT_FOUND"


# --------------------------------------------------------------------------- orchestration.py

def test_orchestration_transitions_and_state_events(tmp_path: Path) -> None:
    from ftl.events import read_events

    assert len(ok(tmp_path, "orchestration", "create-session")["session_id"]) == 8  # before any campaign
    cid = ok(tmp_path, "campaign", "create", "add a lexer")["id"]
    valid, invalid, lower, unknown = in_parallel(
        lambda: ok(tmp_path, "orchestration", "validate-transition", "PLAN", "REGISTER"),
        lambda: ok(tmp_path, "orchestration", "validate-transition", "COMPLETE", "PLAN"),
        lambda: ok(tmp_path, "orchestration", "validate-transition", "execute", "error"),
        lambda: refused(tmp_path, "orchestration", "validate-transition", "PLAN", "NAPPING"))
    assert valid["valid"] and valid["reason"] == "" and valid["transitions"][0]["trigger"] == "register"
    assert not invalid["valid"] and "COMPLETE" in invalid["reason"] and invalid["reachable"] == []
    assert lower["valid"] and lower["transitions"][0]["trigger"] == "fail"
    assert unknown["details"]["violations"][0]["path"] == "TO"

    event = ok(tmp_path, "orchestration", "emit-state", "explore", "--meta", '{"note": "three modes"}')
    assert event["event"] == "STATE_ENTRY" and event["state"] == "EXPLORE" and event["note"] == "three modes"
    assert event["timestamp"] == event["ts"] and event["campaign_id"] == cid
    second = ok(tmp_path, "orchestration", "emit-state", "PLAN")
    logged = list(read_events(tmp_path / ".ftl" / "events" / f"{cid}.jsonl"))
    assert [(e["seq"], e["state"]) for e in logged] == [(1, "EXPLORE"), (2, "PLAN")] and second["seq"] == 2

    errors = in_parallel(
        lambda: refused(tmp_path, "orchestration", "emit-state", "DANCING"),
        lambda: refused(tmp_path, "orchestration", "emit-state", "PLAN", "--meta", '{"seq": 9}'),
        lambda: refused(tmp_path, "orchestration", "emit-state", "PLAN", "--meta", "{oops"),
        lambda: refused(tmp_path, "orchestration", "check-explorers"))
    assert [e["details"]["violations"][0]["path"] for e in errors] == ["STATE", "--meta", "--meta", "--session"]


# --------------------------------------------------------------------------- _common.py in process

@pytest.fixture(scope="module")
def lib_loader():
    """Load lib scripts in process; undo their sys.path, sys.modules and logging changes after."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    raise_exceptions = logging.raiseExceptions

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"ftl_lib_{name.strip('_')}", LIB / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    yield load
    sys.path[:] = saved_path
    # Every lib module goes, _campaign & co. too: one left behind keeps the old _common's
    # classes, which a later test's fresh _common would not catch (FtlRefusal).
    for name in set(sys.modules) - saved_modules:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if name.startswith("ftl_lib_") or Path(file).parent == LIB:
            del sys.modules[name]
    logging.raiseExceptions = raise_exceptions


@pytest.fixture(scope="module")
def common(lib_loader):
    return lib_loader("_common")


def test_unexpected_exception_prints_internal_failure_and_logs_the_trace(common, tmp_path, capsys) -> None:
    group = common.script_group("boom.py", "test group")

    @common.command(group, "explode")
    def explode(env):
        raise RuntimeError("secret internals")

    with pytest.raises(SystemExit) as exit_info:
        common.run(group, ["--repo", str(tmp_path), "explode"])
    out, err = capsys.readouterr()
    payload = json.loads(out)
    assert exit_info.value.code == 1 and not payload["success"]
    assert payload["data"]["error_code"] == "INTERNAL_ERROR"
    assert "secret internals" not in out + err and "Traceback" not in out + err
    log = (tmp_path / ".ftl" / "lib.log").read_text()
    assert payload["data"]["details"]["correlation_id"] in log and "RuntimeError: secret internals" in log


def test_a_light_command_that_fails_still_logs_the_trace(common, tmp_path, capsys) -> None:
    # light commands set up logging only on failure (cold start, issue 11 item 1)
    group = common.script_group("boom.py", "test group")

    @common.command(group, "explode", light=True)
    def explode(env):
        raise RuntimeError("secret internals")

    with pytest.raises(SystemExit) as exit_info:
        common.run(group, ["--repo", str(tmp_path), "explode"])
    out, err = capsys.readouterr()
    payload = json.loads(out)
    assert exit_info.value.code == 1 and "Traceback" not in out + err
    log = (tmp_path / ".ftl" / "lib.log").read_text()
    assert payload["data"]["details"]["correlation_id"] in log and "RuntimeError: secret internals" in log


def test_scripts_run_without_the_package_installed(tmp_path: Path) -> None:
    # Drop the editable-install finder: lib/_common.py must find ftl beside it on its own.
    code = (
        "import runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        f"sys.argv = [{str(LIB / 'campaign.py')!r}, '--repo', {str(tmp_path)!r}, 'cascade-analysis']\n"
        f"runpy.run_path({str(LIB / 'campaign.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    payload = json.loads(proc.stdout)
    assert proc.returncode == 2 and payload["data"]["error_code"] == "NOT_FOUND", proc.stderr


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_workspace_refs_parse_or_fail_with_a_violation(common, text: str) -> None:
    from ftl.errors import FtlError

    try:
        seq, workspace_id = common.parse_workspace_ref(text)
    except FtlError as error:
        assert error.error_type == "schema_invalid" and error.details["violations"][0]["path"] == "ID"
    else:
        assert seq.isdigit() and len(seq) >= 3
        assert workspace_id is None or workspace_id.startswith(f"{seq}-")


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 999), st.from_regex(r"[a-z0-9]{1,8}(-[a-z0-9]{1,8}){0,2}", fullmatch=True),
       st.sampled_from(["active", "complete", "blocked"]))
def test_workspace_ref_forms_agree(common, number: int, slug: str, status: str) -> None:
    expected = (f"{number:03d}", f"{number:03d}-{slug}")
    assert common.parse_workspace_ref(f"{number}-{slug}") == expected
    assert common.parse_workspace_ref(f".ftl/workspace/{number:03d}_{slug}_{status}.xml") == expected


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=60), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10).map(json.dumps)))
def test_json_input_parses_or_fails_with_a_violation(common, text: str) -> None:
    from ftl.errors import FtlError

    try:
        value = common.parse_json_text(text, "standard input")
    except FtlError as error:
        assert error.error_type == "schema_invalid" and error.details["violations"][0]["path"] == "$"
    else:
        assert json.dumps(value, sort_keys=True) == json.dumps(json.loads(text), sort_keys=True)


def _stdin_outcome(common, data: bytes) -> tuple[str, Any]:
    """What `read_stdin_json` makes of ``data``: ("value", repr with types) or ("error", the
    error's type, message and details)."""
    import io

    from ftl.errors import FtlError

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        try:
            value = common.read_stdin_json("plan on standard input")
        except FtlError as error:
            return "error", (error.error_type, error.message, error.details)
    return "value", _typed(value)


def _typed(value: Any) -> Any:
    """``value`` with every number tagged by its type (1 and 1.0 compare equal in Python)."""
    if isinstance(value, dict):
        return {"dict": [(k, _typed(v)) for k, v in value.items()]}
    if isinstance(value, list):
        return {"list": [_typed(v) for v in value]}
    return type(value).__name__, repr(value)


def _json_outcome(common, data: bytes) -> tuple[str, Any]:
    """What the json path alone (before orjson was tried first) makes of ``data``."""
    from ftl.errors import FtlError

    try:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise common.violation("$", "the plan on standard input is not UTF-8 text", "send UTF-8 JSON") from None
        value = common.parse_json_text(text, "plan on standard input")
    except FtlError as error:
        return "error", (error.error_type, error.message, error.details)
    return "value", _typed(value)


_JSON_NUMBERS = st.one_of(
    st.integers(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
    st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "-0", "-0.0", "1E2", "5e-324", "0.1e1",
                     "18446744073709551615", "18446744073709551616", "-9223372036854775809",
                     "9223372036854775807", "123456789012345678901234567890.5", "1.00000000000000011102230246"]))
_JSON_TEXTS = st.recursive(
    st.one_of(st.none().map(json.dumps), st.booleans().map(json.dumps), _JSON_NUMBERS.map(str),
              st.text(max_size=6).map(json.dumps), st.sampled_from(['"\\ud800"', '"\\u00e9\\n"', '"\\/"'])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(st.tuples(st.text(max_size=3).map(json.dumps), inner), max_size=4).map(
            lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}")),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    _JSON_TEXTS.map(str.encode),
    st.tuples(st.sampled_from([b"", b"\xef\xbb\xbf", b" \t\r\n"]), _JSON_TEXTS.map(str.encode),
              st.sampled_from([b"", b"\n", b" x", b",", b"\x0c", b"]"])).map(b"".join),
    st.binary(max_size=24)))
def test_stdin_json_reads_as_the_json_module_did(common, data: bytes) -> None:
    # orjson reads stdin first (issue 11 item 4); every value, number type and error (wording,
    # line, column) must stay what json gave: big integers, 1e400, NaN, lone surrogates, BOMs,
    # trailing garbage and invalid UTF-8 included.
    assert _stdin_outcome(common, data) == _json_outcome(common, data)


def test_stdin_json_keeps_integers_past_64_bits_exact(common) -> None:
    data = b'{"a": [18446744073709551616, -9223372036854775809, 1e400], "b": "x"}'
    kind, value = _stdin_outcome(common, data)
    assert kind == "value" and value == _json_outcome(common, data)[1]
    assert ("int", "18446744073709551616") in value["dict"][0][1]["list"]
    assert common._orjson_value(data) is common._NOT_READ  # the json path read it


def test_wrap_keeps_objects_and_wraps_arrays_and_null(common) -> None:
    assert common.wrap({"a": 1}) == {"a": 1}
    assert common.wrap([1, 2]) == {"items": [1, 2]}
    assert common.wrap(None) == {}


def test_every_command_help_names_its_output(lib_loader) -> None:
    # Click renders the help from the docstrings; each command's help must say what it prints.
    for script in ("campaign", "workspace", "plan", "exploration", "orchestration"):
        group: click.Group = lib_loader(script).cli
        for name, cmd in group.commands.items():
            assert cmd.help and "data" in cmd.help, f"{script} {name}: help does not describe data"
