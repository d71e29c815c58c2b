"""`ftl campaign status` says why a task is blocked, and whether a process is driving the campaign
(an active one that nobody runs was interrupted: resume it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ftl.engine.run_lock import LOCK_FILE, RunLock, holder
from ftl.engine.status import campaign_status
from ftl.errors import FtlError
from ftl.models import Plan
from ftl.store import Store
from ftl.surfaces.cli import main

TOKEN = "ghp_" + "a1B2" * 9  # a GitHub token shape the scrubber knows


def _blocked_campaign(repo: Path) -> str:
    plan = Plan.model_validate({"objective": "ship it", "tasks": [
        {"seq": "001", "slug": "parser", "verify": "true", "depends": []},
        {"seq": "002", "slug": "lexer", "verify": "true", "depends": []},
        {"seq": "003", "slug": "cli", "verify": "true", "depends": ["002"]}]})
    with Store.for_repo(repo) as store:
        cid = store.create_campaign("ship it", plan=plan)["campaign_id"]
        store.add_tasks(cid, plan)
        for seq in ("001", "002"):
            store.transition_task(cid, seq, "running", worker="w1")
        store.transition_task(cid, "001", "complete", delivered="done")
        store.transition_task(cid, "002", "blocked",
                              reason=f"verify_failed: exit 1\nAuthorization: token {TOKEN}")
        store.transition_task(cid, "003", "blocked", blocked_by=["002"], reason="cascade")
    return cid


def test_status_gives_each_blocked_tasks_reason_scrubbed(tmp_path: Path) -> None:
    _blocked_campaign(tmp_path)
    tasks = {t["seq"]: t for t in campaign_status(tmp_path)["tasks"]}
    assert tasks["001"]["block_reason"] is None and tasks["001"]["blocked_by"] == []
    assert tasks["002"]["block_reason"].startswith("verify_failed: exit 1")
    assert TOKEN not in tasks["002"]["block_reason"] and "[REDACTED]" in tasks["002"]["block_reason"]
    assert tasks["003"]["blocked_by"] == ["002"]


def test_the_status_text_puts_the_reason_on_the_tasks_own_line(tmp_path: Path) -> None:
    _blocked_campaign(tmp_path)
    result = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.startswith("  0")}
    assert rows["001"].rstrip().endswith("complete")
    assert "(verify_failed: exit 1 Authorization: token [REDACTED])" in rows["002"]
    assert "after 002" in rows["003"] and TOKEN not in result.output
    data = json.loads(CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path),
                                                "--json"]).output)["data"]
    assert [t["block_reason"] is not None for t in data["tasks"]] == [False, True, True]


def _hold_lock(path: Path) -> subprocess.Popen:
    """A process that holds the run lock at ``path`` (as a running campaign does) until killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    holder_code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                   "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, b'%d\\n' % os.getpid(), 0); "
                   "print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", holder_code, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_holder_is_read_from_the_kernel_without_taking_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / ".ftl" / LOCK_FILE
    assert holder(lock) is None  # no file
    proc = _hold_lock(lock)
    try:
        assert holder(lock) == proc.pid
        other = RunLock(lock)  # a run starting now still finds the lock held by the first
        with pytest.raises(FtlError) as raised:
            other.acquire(lambda: "c-1")
        assert raised.value.error_type == "conflict" and str(proc.pid) in raised.value.message
    finally:
        proc.kill()
        proc.wait()
    assert holder(lock) is None  # the kernel dropped it with the process (kill -9 included)


def test_the_lock_table_parse_skips_waiters_and_other_files(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_FILE
    lock.write_text("")
    stat = os.stat(lock)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    table = tmp_path / "locks"
    table.write_text(f"1: POSIX  ADVISORY  WRITE 11 {device} 0 EOF\n"
                     f"2: FLOCK  ADVISORY  WRITE 12 {device}9 0 EOF\n"
                     f"3: -> FLOCK  ADVISORY  WRITE 13 {device} 0 EOF\n")
    assert holder(lock, locks=table) is None
    table.write_text(table.read_text() + f"4: FLOCK  ADVISORY  WRITE 14 {device} 0 EOF\n")
    assert holder(lock, locks=table) == 14
    # No lock table (not Linux): the pid the holder wrote, if that process is alive.
    lock.write_text(f"{os.getpid()}\n")
    assert holder(lock, locks=tmp_path / "none") == os.getpid()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lock.write_text(f"{dead}\n")
    assert holder(lock, locks=tmp_path / "none") is None


def test_an_active_campaign_nobody_runs_reads_as_interrupted(tmp_path: Path) -> None:
    plan = Plan.model_validate({"objective": "ship it", "tasks": [
        {"seq": "001", "slug": "parser", "verify": "true", "depends": []}]})
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("ship it", plan=plan)["campaign_id"]
        store.add_tasks(cid, plan)
        store.transition_task(cid, "001", "running", worker="w2")
    lock = tmp_path / ".ftl" / LOCK_FILE
    proc = _hold_lock(lock)
    try:
        driven = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path), "--json"])
        assert json.loads(driven.output)["data"]["campaign"]["run_pid"] == proc.pid
        text = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path)]).output
        assert "interrupted" not in text
    finally:
        proc.kill()
        proc.wait()
    data = campaign_status(tmp_path)
    assert data["campaign"]["status"] == "active" and data["campaign"]["run_pid"] is None
    text = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path)]).output
    assert "[active, interrupted]" in text and "continue with `ftl campaign resume`" in text
    assert "001 parser" in text and "interrupted (was running on w2)" in text


def test_a_long_reason_keeps_its_start_and_the_error_at_its_end(tmp_path: Path) -> None:
    plan = Plan.model_validate({"objective": "ship it", "tasks": [
        {"seq": "001", "slug": "parser", "verify": "true", "depends": []}]})
    output = "\n".join(f"  frame {n}" for n in range(40)) + "\nModuleNotFoundError: No module named 'yaml'"
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("ship it", plan=plan)["campaign_id"]
        store.add_tasks(cid, plan)
        store.transition_task(cid, "001", "running", worker="w1")
        store.transition_task(cid, "001", "blocked", reason=f"dependency_missing: missing\n{output}")
    text = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path)]).output
    row = next(line for line in text.splitlines() if line.startswith("  001"))
    assert "(dependency_missing: missing frame 0" in row and "No module named 'yaml')" in row
    assert " ... " in row and len(row) < 320  # the seq, slug and status, then 240 of the reason


def test_a_returned_campaign_says_why_and_offers_no_empty_branch(tmp_path: Path) -> None:
    message = "Returned from ERROR (dependency_missing): A required dependency is missing: a plan."
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("add a pow function", inputs={"isolation": "worktree"})["campaign_id"]
        store.finish_campaign(cid, "returned", {"message": message, "tasks": []})
    data = campaign_status(tmp_path)["campaign"]
    assert data["status"] == "returned" and data["message"] == message
    text = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path)]).output
    assert f"  {message}" in text.splitlines()
    assert "work on branch" not in text  # nothing was integrated: nothing to land


def test_agent_spend_counts_a_reused_build_once() -> None:
    # A resume that verifies a build finished before the crash copies its result (cost
    # included) into the new attempt: the run was paid once.
    from ftl.engine.status import agent_spend

    paid = {"total_cost_usd": 0.02, "num_turns": 3}
    rows = [{"seq": "001", "result": paid},                                           # built, then a kill
            {"seq": "001", "result": {**paid, "reused_build": True}},                 # the resume's row
            {"seq": "001", "result": {"build": {**paid, "reused_build": True}, "verify": {}}},
            {"seq": "002", "result": {"build": {"total_cost_usd": 0.01, "num_turns": 1}}}]
    assert agent_spend(rows) == {"001": {"cost_usd": 0.02, "num_turns": 3},
                                 "002": {"cost_usd": 0.01, "num_turns": 1}}
