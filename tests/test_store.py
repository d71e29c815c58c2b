"""Tests for ftl.store: round trips, the task transition table, atomicity across processes and
threads, crash survival (SIGKILL mid-write), the re-plan merge, and unreadable files."""

from __future__ import annotations

import json

import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ftl
from ftl import dag
from ftl.errors import FtlError
from ftl.models import Plan, TaskStatus
from ftl.store import SCHEMA_VERSION, TRANSITIONS, Store, format_ts
from ftl.memory import MemoryStore

REPO_ROOT = Path(ftl.__file__).resolve().parent.parent


class FakeClock:
    """Deterministic clock: every reading is one second after the previous one."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 21, 4, 15, 3, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def task(seq: str, depends=(), slug: str | None = None, verify: str = "true", **extra) -> dict:
    return {"seq": seq, "slug": slug or f"task-{seq}", "verify": verify, "depends": list(depends), **extra}


def plan(*tasks: dict, objective: str = "ship it", framework: str | None = None) -> Plan:
    return Plan.model_validate({"objective": objective, "framework": framework, "tasks": list(tasks)})


def chain_plan() -> Plan:
    """001 <- 002 <- 003, and 004 independent."""
    return plan(task("001"), task("002", ["001"]), task("003", ["002"]), task("004"))


@pytest.fixture
def store(tmp_path: Path):
    with Store.for_repo(tmp_path, clock=FakeClock()) as s:
        yield s


@pytest.fixture
def campaign(store: Store) -> str:
    cid = store.create_campaign("ship it")["campaign_id"]
    store.add_tasks(cid, chain_plan())
    return cid


def error_of(excinfo) -> FtlError:
    return excinfo.value


# ----------------------------------------------------------------------------- opening

def test_opens_wal_store_with_current_schema(tmp_path: Path):
    with Store.for_repo(tmp_path) as s:
        assert s.path == tmp_path / ".ftl" / "ftl.db" and s.path.exists()
        assert s.schema_version() == SCHEMA_VERSION
        assert s.integrity_check() == "ok"
    conn = sqlite3.connect(tmp_path / ".ftl" / "ftl.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"campaign", "plan", "task", "workspace", "explorer_result", "exploration", "memory"} <= tables


def test_reopening_does_not_migrate_again_and_keeps_rows(tmp_path: Path):
    with Store.for_repo(tmp_path) as s:
        cid = s.create_campaign("keep me")["campaign_id"]
    with Store.for_repo(tmp_path) as s:
        assert s.get_campaign(cid)["objective"] == "keep me"
        assert s.schema_version() == SCHEMA_VERSION


def test_garbage_file_is_a_conflict_without_absolute_path(tmp_path: Path):
    db = tmp_path / ".ftl" / "ftl.db"
    db.parent.mkdir()
    db.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(FtlError) as excinfo:
        Store(db)
    err = error_of(excinfo)
    assert err.error_type == "conflict"
    assert ".ftl/ftl.db" in err.message and str(tmp_path) not in err.message


def test_newer_schema_is_refused(tmp_path: Path):
    db = tmp_path / "ftl.db"
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(FtlError) as excinfo:
        Store(db)
    assert error_of(excinfo).error_type == "conflict"
    assert "newer" in error_of(excinfo).message


def test_closed_store_refuses_calls(tmp_path: Path):
    s = Store(tmp_path / "ftl.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(FtlError) as excinfo:
        s.list_campaigns()
    assert error_of(excinfo).error_type == "invalid_state"


def test_timestamps_are_rfc3339_utc_with_z():
    assert format_ts(datetime(2026, 1, 2, 3, 4, 5, 678_900, tzinfo=timezone.utc)) == "2026-01-02T03:04:05.678Z"
    plus_two = timezone(timedelta(hours=2))
    assert format_ts(datetime(2026, 1, 2, 5, 4, 5, tzinfo=plus_two)) == "2026-01-02T03:04:05.000Z"


# ----------------------------------------------------------------------------- campaigns

def test_campaign_round_trip(store: Store):
    created = store.create_campaign("build the thing", plan=plan(task("001"), framework="fastapi"))
    cid = created["campaign_id"]
    assert re.fullmatch(r"c-20261121-0415\d\d-[0-9a-f]{4}", cid)
    assert created["status"] == "active" and created["flow"] == "campaign"
    assert created["framework"] == "fastapi"  # from the plan
    assert created["created_at"].endswith("Z") and created["finished_at"] is None
    assert store.get_plan(cid).tasks[0].seq == "001"
    assert store.active_campaign()["campaign_id"] == cid

    assert created["id"] == cid and created["error"] is None and created["inputs"] == {}

    error = {"error_type": "timeout", "details": {"what": "explore"}}
    store.save_machine(cid, "ERROR", {"iteration_count": 3, "clarify_count": 1, "prior_ready_count": 2},
                       error=error)
    store.save_inputs(cid, {"plan_input": {"objective": "x"}, "revised_plan_input": None})
    store.set_framework(cid, "django")
    got = store.get_campaign(cid)
    assert got["machine_state"] == "ERROR" and got["error"] == error
    assert got["tracked"] == {"iteration_count": 3, "clarify_count": 1, "prior_ready_count": 2}
    assert got["inputs"] == {"plan_input": {"objective": "x"}, "revised_plan_input": None}
    assert got["framework"] == "django"
    store.save_machine(cid, "EXECUTE", {"iteration_count": 4})
    got = store.get_campaign(cid)
    assert got["machine_state"] == "EXECUTE" and got["error"] is None  # error cleared

    done = store.finish_campaign(cid, "complete", {"complete": 1, "blocked": 0})
    assert done["status"] == "complete" and done["summary"] == {"complete": 1, "blocked": 0}
    assert done["finished_at"].endswith("Z")
    assert store.active_campaign() is None
    assert store.latest_campaign()["campaign_id"] == cid


def test_create_campaign_saves_its_inputs_in_the_same_transaction(store: Store):
    inputs = {"plan_input": {"objective": "x", "tasks": []}, "revised_plan_input": None}
    created = store.create_campaign("x", inputs=inputs)
    assert created["inputs"] == inputs
    assert store.get_campaign(created["id"])["inputs"] == inputs
    store.finish_campaign(created["id"], "complete", {})
    with pytest.raises(FtlError) as excinfo:
        store.create_campaign("y", inputs=["not", "an", "object"])
    assert error_of(excinfo).details["violations"][0]["path"] == "inputs"
    assert store.active_campaign() is None  # nothing created


def test_second_active_campaign_is_refused(store: Store):
    first = store.create_campaign("one")["campaign_id"]
    with pytest.raises(FtlError) as excinfo:
        store.create_campaign("two")
    assert error_of(excinfo).error_type == "conflict" and first in error_of(excinfo).message
    store.finish_campaign(first, "cancelled", {})
    second = store.create_campaign("two", flow="task")["campaign_id"]
    assert [c["campaign_id"] for c in store.list_campaigns()] == [second, first]
    assert [c["campaign_id"] for c in store.list_campaigns("cancelled")] == [first]
    assert store.latest_campaign()["campaign_id"] == second


def test_campaign_errors(store: Store):
    with pytest.raises(FtlError) as excinfo:
        store.get_campaign("c-nope")
    assert error_of(excinfo).error_type == "not_found"
    assert error_of(excinfo).details == {"what": "campaign c-nope"}
    for call in (lambda: store.create_campaign("  "), lambda: store.create_campaign("x", flow="other"),
                 lambda: store.list_campaigns("done")):
        with pytest.raises(FtlError) as excinfo:
            call()
        assert error_of(excinfo).error_type == "schema_invalid"
    cid = store.create_campaign("x")["campaign_id"]
    with pytest.raises(FtlError) as excinfo:
        store.save_machine(cid, "PLAN", {"bad": object()})
    assert error_of(excinfo).error_type == "schema_invalid"
    with pytest.raises(FtlError) as excinfo:
        store.finish_campaign(cid, "active", {})
    assert error_of(excinfo).error_type == "schema_invalid"
    store.finish_campaign(cid, "returned", {"reason": "quorum"})
    with pytest.raises(FtlError) as excinfo:
        store.finish_campaign(cid, "complete", {})
    assert error_of(excinfo).error_type == "invalid_state"
    assert error_of(excinfo).details == {"trigger": "finish:complete", "state": "returned"}


# ----------------------------------------------------------------------------- plans and tasks

def test_plan_versions(store: Store):
    cid = store.create_campaign("x")["campaign_id"]
    with pytest.raises(FtlError) as excinfo:
        store.get_plan(cid)
    assert error_of(excinfo).error_type == "not_found"
    assert store.save_plan(cid, plan(task("001"))) == 1
    assert store.save_plan(cid, plan(task("001"), task("002"))) == 2
    assert len(store.get_plan(cid).tasks) == 2
    assert len(store.get_plan(cid, 1).tasks) == 1
    assert store.plan_versions(cid) == [1, 2]
    with pytest.raises(FtlError) as excinfo:
        store.get_plan(cid, 7)
    assert error_of(excinfo).error_type == "not_found"


def test_add_tasks_round_trip(store: Store):
    cid = store.create_campaign("x")["campaign_id"]
    p = plan(task("10", ["2"]), task("2", type="SPEC", delta=["a.py"]), task("1"), framework="flask")
    assert store.add_tasks(cid, p) == ["001", "002", "010"]
    rows = store.tasks(cid)
    assert [r["seq"] for r in rows] == ["001", "002", "010"]  # int order, not plan order
    by_seq = {r["seq"]: r for r in rows}
    assert by_seq["010"]["depends"] == ["002"]
    assert by_seq["002"]["type"] == "SPEC" and by_seq["002"]["spec"]["delta"] == ["a.py"]
    assert all(r["status"] == "pending" and r["attempts"] == 0 and r["blocked_by"] == [] for r in rows)
    assert store.task(cid, 2)["slug"] == "task-2"
    assert store.get_plan(cid) == p and store.plan_versions(cid) == [1]
    assert store.get_campaign(cid)["framework"] == "flask"
    assert store.counts(cid) == {"pending": 3, "running": 0, "complete": 0, "blocked": 0, "total": 3}


def test_add_tasks_twice_is_refused_and_keeps_progress(store: Store, campaign: str):
    store.transition_task(campaign, "001", "running")
    store.transition_task(campaign, "001", "complete")
    with pytest.raises(FtlError) as excinfo:
        store.add_tasks(campaign, chain_plan())
    assert error_of(excinfo).error_type == "conflict"
    assert store.task(campaign, "001")["status"] == "complete"


def test_add_tasks_same_plan_as_create_is_not_saved_twice(store: Store):
    p = chain_plan()
    cid = store.create_campaign("x", plan=p)["campaign_id"]
    store.add_tasks(cid, p)
    assert store.plan_versions(cid) == [1]


@pytest.mark.parametrize("tasks, error_type, fragment", [
    ((task("001", ["002"]), task("002", ["001"])), "cycle_detected", "001 -> 002 -> 001"),
    ((task("001"), task("002", ["009"])), "schema_invalid", "009"),
    ((task("001"), task("001", slug="again")), "schema_invalid", "more than one task"),
])
def test_add_tasks_rejects_bad_graphs_and_saves_nothing(store: Store, tasks, error_type, fragment):
    cid = store.create_campaign("x")["campaign_id"]
    with pytest.raises(FtlError) as excinfo:
        store.add_tasks(cid, plan(*tasks))
    err = error_of(excinfo)
    assert err.error_type == error_type
    assert fragment in str(err.details)
    assert store.tasks(cid) == [] and store.plan_versions(cid) == []


def test_unknown_task_is_not_found(store: Store, campaign: str):
    for call in (lambda: store.task(campaign, "099"), lambda: store.transition_task(campaign, "099", "running"),
                 lambda: store.tasks("c-missing")):
        with pytest.raises(FtlError) as excinfo:
            call()
        assert error_of(excinfo).error_type == "not_found"


# ----------------------------------------------------------------------------- transitions

STATUSES = [s.value for s in TaskStatus]
REASON = {("blocked", "pending"): "replan", ("running", "pending"): "resume"}


def put_in(store: Store, cid: str, seq: str, status: str) -> None:
    """Bring a dependency-free pending task to ``status`` by legal steps."""
    if status in ("running", "complete"):
        store.transition_task(cid, seq, "running")
    if status == "complete":
        store.transition_task(cid, seq, "complete")
    if status == "blocked":
        store.transition_task(cid, seq, "blocked", reason="dependency blocked", blocked_by=["9"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(STATUSES), min_size=1, max_size=12))
def test_blocked_seqs_are_the_blocked_tasks_read_through_their_index(statuses: list[str]) -> None:
    """BUILD lists the blocked tasks for every task's workspace: from the partial index
    (``INDEXED BY``: no such index is an error, not a silent pass over every row)."""
    with tempfile.TemporaryDirectory() as tmp, Store.for_repo(Path(tmp), clock=FakeClock()) as store:
        cid = store.create_campaign("ship it")["campaign_id"]
        store.add_tasks(cid, plan(*(task(f"{i + 1:03d}") for i in range(len(statuses)))))
        for number, status in enumerate(statuses, 1):
            put_in(store, cid, f"{number:03d}", status)
        depends, status_of = store.task_graph(cid)
        assert store.blocked_seqs(cid) == [seq for seq in depends if status_of[seq] == "blocked"]


@pytest.mark.parametrize("source", STATUSES)
@pytest.mark.parametrize("target", STATUSES)
def test_transition_matrix(store: Store, source: str, target: str):
    cid = store.create_campaign("x")["campaign_id"]
    store.add_tasks(cid, plan(task("001")))
    put_in(store, cid, "001", source)
    legal = (TaskStatus(source), TaskStatus(target)) in TRANSITIONS
    reason = REASON.get((source, target), "why")
    if legal:
        row = store.transition_task(cid, "1", target, reason=reason, delivered="out", worker="w1")
        assert row["status"] == target
        assert store.task(cid, "001")["status"] == target
    else:
        with pytest.raises(FtlError) as excinfo:
            store.transition_task(cid, "001", target, reason=reason)
        err = error_of(excinfo)
        assert err.error_type == "invalid_state"
        assert err.details == {"trigger": f"{source}->{target}", "state": source}
        assert store.task(cid, "001")["status"] == source


def test_the_table_has_exactly_the_six_legal_transitions():
    assert {(a.value, b.value) for a, b in TRANSITIONS} == {
        ("pending", "running"), ("running", "complete"), ("running", "blocked"),
        ("pending", "blocked"), ("blocked", "pending"), ("running", "pending")}


@pytest.mark.parametrize("source, target", [("blocked", "pending"), ("running", "pending")])
@pytest.mark.parametrize("reason", [None, "because"])
def test_reopening_transitions_need_their_reason(store: Store, source, target, reason):
    cid = store.create_campaign("x")["campaign_id"]
    store.add_tasks(cid, plan(task("001")))
    put_in(store, cid, "001", source)
    with pytest.raises(FtlError) as excinfo:
        store.transition_task(cid, "001", target, reason=reason)
    assert error_of(excinfo).error_type == "invalid_state"
    assert error_of(excinfo).details["trigger"] == f"{source}->{target}"


def test_unknown_target_status_is_invalid_state(store: Store, campaign: str):
    with pytest.raises(FtlError) as excinfo:
        store.transition_task(campaign, "001", "in_progress")
    assert error_of(excinfo).details == {"trigger": "pending->in_progress", "state": "pending"}


def test_transition_fields(store: Store, campaign: str):
    started = store.transition_task(campaign, "001", TaskStatus.RUNNING, worker="pid-7")
    assert started["attempts"] == 1 and started["worker"] == "pid-7"
    assert started["started_at"].endswith("Z") and started["finished_at"] is None
    blocked = store.transition_task(campaign, "001", "blocked", reason="verify failed", delivered="BLOCKED: x")
    assert blocked["block_reason"] == "verify failed" and blocked["finished_at"].endswith("Z")
    reopened = store.transition_task(campaign, "001", "pending", reason="replan")
    assert reopened["block_reason"] is None and reopened["blocked_by"] == [] and reopened["finished_at"] is None
    again = store.transition_task(campaign, "001", "running")
    assert again["attempts"] == 2
    done = store.transition_task(campaign, "001", "complete", delivered="added auth")
    assert done["delivered"] == "added auth"
    cascade = store.transition_task(campaign, "003", "blocked", reason="parent blocked", blocked_by=["2"])
    assert cascade["blocked_by"] == ["002"] and cascade["attempts"] == 0


def test_start_needs_complete_dependencies(store: Store, campaign: str):
    with pytest.raises(FtlError) as excinfo:
        store.transition_task(campaign, "002", "running")
    assert error_of(excinfo).error_type == "invalid_state" and "001" in error_of(excinfo).message
    store.transition_task(campaign, "001", "running")
    store.transition_task(campaign, "001", "complete")
    assert store.transition_task(campaign, "002", "running")["status"] == "running"


def test_reset_running_returns_in_flight_tasks_and_abandons_their_workspaces(store: Store, campaign: str):
    store.transition_task(campaign, "001", "running")
    store.transition_task(campaign, "004", "running")
    store.record_workspace(campaign, {"workspace_id": "001-task-001", "seq": "001", "attempt": 1})
    assert store.reset_running(campaign) == ["001", "004"]
    rows = {r["seq"]: r for r in store.tasks(campaign)}
    assert rows["001"]["status"] == rows["004"]["status"] == "pending"
    assert rows["001"]["attempts"] == 1 and rows["001"]["worker"] is None
    assert store.workspaces(campaign, "1")[0]["status"] == "abandoned"
    assert store.reset_running(campaign) == []


# ----------------------------------------------------------------------------- processes and threads

def _race_worker(db: str, cid: str, seqs: list[str], barrier, results) -> None:
    with Store(Path(db)) as s:
        for seq in seqs:
            barrier.wait()
            try:
                s.transition_task(cid, seq, "running", worker=str(os.getpid()))
                results.put((seq, "won"))
            except FtlError as exc:
                results.put((seq, exc.error_type))


def _memory_worker(db: str, count: int, barrier) -> None:
    with Store(Path(db)) as s:
        barrier.wait()
        for i in range(count):
            MemoryStore(s).record({"name": "shared", "type": "failure", "trigger": "t", "fix": "f", "source": [f"{os.getpid()}-{i}"]})


def _spawn_all(target, arg_sets) -> None:
    procs = [multiprocessing.get_context("spawn").Process(target=target, args=args) for args in arg_sets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0


def test_two_processes_racing_to_start_a_task_exactly_one_wins(tmp_path: Path):
    db = tmp_path / "ftl.db"
    seqs = ["001", "002", "003", "004"]
    with Store(db) as s:
        cid = s.create_campaign("race")["campaign_id"]
        s.add_tasks(cid, plan(*(task(q) for q in seqs)))
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(str(db), cid, seqs, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in range(2 * len(seqs))]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for seq in seqs:
        assert sorted(o for q, o in outcomes if q == seq) == ["invalid_state", "won"]
    with Store(db) as s:
        assert all(r["status"] == "running" and r["attempts"] == 1 for r in s.tasks(cid))


def test_two_processes_lose_no_read_modify_write_update(tmp_path: Path):
    db = tmp_path / "ftl.db"
    Store(db).close()
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    _spawn_all(_memory_worker, [(str(db), 25, barrier), (str(db), 25, barrier)])
    with Store(db) as s:
        [entry] = MemoryStore(s).entries("failure")
    assert entry["occurrences"] == 50 and len(entry["source"]) == 50


def test_threads_share_one_store(store: Store, campaign: str):
    winners: list[int] = []
    barrier = threading.Barrier(8)

    def work(n: int) -> None:
        barrier.wait()
        try:
            store.transition_task(campaign, "004", "running")
            winners.append(n)
        except FtlError as exc:
            assert exc.error_type == "invalid_state"
        for i in range(10):
            MemoryStore(store).record({"name": "m", "type": "pattern", "trigger": "t", "insight": "i", "source": [f"{n}"]})

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert MemoryStore(store).entries("pattern")[0]["occurrences"] == 80


CRASH_CHILD = """
import sys
from pathlib import Path
from ftl.store import Store
s = Store(Path(sys.argv[1]))
cid = sys.argv[2]
i = 0
while True:
    s.save_machine(cid, "EXECUTE", {"iteration_count": i})
    s.record_explorer_result(cid, "structure", {"mode": "structure", "status": "ok", "i": i})
    print(i, flush=True)
    i += 1
"""


def test_campaign_survives_sigkill_mid_write(tmp_path: Path):
    db = tmp_path / ".ftl" / "ftl.db"
    with Store(db) as s:
        cid = s.create_campaign("crash me")["campaign_id"]
        s.add_tasks(cid, chain_plan())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(db), cid],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    last = -1
    try:
        for line in child.stdout:
            last = int(line)
            if last >= 40:
                break
        child.send_signal(signal.SIGKILL)  # mid-loop: it is committing the next rows right now
        child.wait(30)
        assert last >= 40, f"child never reached the write loop: {child.stderr.read()[-2000:]}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    with Store(db) as s:
        assert s.integrity_check() == "ok"
        assert s.active_campaign()["campaign_id"] == cid
        assert s.get_campaign(cid)["tracked"]["iteration_count"] >= last
        indices = [r["result"]["i"] for r in s.explorer_results(cid)]
        assert indices[: last + 1] == list(range(last + 1))
        assert [r["seq"] for r in s.tasks(cid)] == ["001", "002", "003", "004"]


# ----------------------------------------------------------------------------- merge

def test_merge_keeps_complete_reopens_blocked_with_new_spec_and_adds(store: Store, campaign: str):
    store.transition_task(campaign, "001", "running")
    store.transition_task(campaign, "001", "complete", delivered="done")
    store.transition_task(campaign, "002", "running")
    store.transition_task(campaign, "002", "blocked", reason="verify failed")
    store.transition_task(campaign, "003", "blocked", reason="parent", blocked_by=["002"])
    revised = plan(
        task("001", verify="changed-but-ignored"),
        task("002", ["001"], slug="retry-two", verify="pytest -k two", delta=["two.py"]),
        task("003", ["005"]),
        task("005", ["001"], slug="new-five"),
        objective="ship it, revised")
    result = store.merge_revised_plan(campaign, revised, max_new_tasks=3)
    assert result == {"merged": 2, "unchanged": 2, "added": 1, "plan_version": 2}
    rows = {r["seq"]: r for r in store.tasks(campaign)}
    assert rows["001"]["status"] == "complete" and rows["001"]["spec"]["verify"] == "true"
    assert rows["002"]["status"] == "pending" and rows["002"]["slug"] == "retry-two"
    assert rows["002"]["spec"]["verify"] == "pytest -k two" and rows["002"]["spec"]["delta"] == ["two.py"]
    assert rows["002"]["block_reason"] is None and rows["002"]["revised_at"].endswith("Z")
    assert rows["002"]["attempts"] == 1
    assert rows["003"]["status"] == "pending" and rows["003"]["depends"] == ["005"]
    assert rows["003"]["blocked_by"] == []
    assert rows["004"]["status"] == "pending" and rows["004"]["revised_at"] is None  # absent: unchanged
    assert rows["005"]["status"] == "pending" and rows["005"]["slug"] == "new-five"
    saved = store.get_plan(campaign)
    assert saved.objective == "ship it, revised"
    assert [t.seq for t in saved.tasks] == ["001", "002", "003", "004", "005"]
    assert saved.task("001").verify == "true"
    assert len(store.get_plan(campaign, 1).tasks) == 4


def test_merge_saves_the_tracked_variables_with_the_merge(store: Store, campaign: str):
    store.save_machine(campaign, "CASCADE", {"replan_count": 0, "iteration_count": 2})
    store.transition_task(campaign, "001", "running")
    store.transition_task(campaign, "001", "blocked", reason="x")
    tracked = {"replan_count": 1, "iteration_count": 2, "replan_merged": True}
    store.merge_revised_plan(campaign, plan(task("001", verify="fixed")), max_new_tasks=0, tracked=tracked)
    got = store.get_campaign(campaign)
    assert got["tracked"] == tracked and got["machine_state"] == "CASCADE"
    assert store.task(campaign, "001")["status"] == "pending"


def test_a_rejected_merge_leaves_the_tracked_variables_alone(store: Store, campaign: str):
    store.save_machine(campaign, "CASCADE", {"replan_count": 0})
    with pytest.raises(FtlError):
        store.merge_revised_plan(campaign, plan(task("002", ["042"])), max_new_tasks=0,
                                 tracked={"replan_count": 1, "replan_merged": True})
    assert store.get_campaign(campaign)["tracked"] == {"replan_count": 0}
    with pytest.raises(FtlError) as excinfo:
        store.merge_revised_plan(campaign, plan(task("004")), max_new_tasks=0, tracked=["x"])
    assert error_of(excinfo).error_type == "schema_invalid"
    assert store.plan_versions(campaign) == [1]


def test_merge_counts_identical_pending_task_as_unchanged(store: Store, campaign: str):
    result = store.merge_revised_plan(campaign, plan(task("004"), task("003", ["002"], verify="new")),
                                      max_new_tasks=0)
    assert result == {"merged": 1, "unchanged": 3, "added": 0, "plan_version": 2}
    assert store.task(campaign, "004")["revised_at"] is None
    assert store.task(campaign, "003")["spec"]["verify"] == "new"


@pytest.mark.parametrize("revised, error_type, fragment", [
    # 001 is complete and keeps depending on nothing; 002 -> 003 -> 002 is new
    (plan(task("002", ["003"]), task("003", ["002"])), "cycle_detected", "002 -> 003 -> 002"),
    (plan(task("002", ["042"])), "schema_invalid", "042"),
    (plan(task("005"), task("006"), task("007")), "schema_invalid", "limit is 2"),
])
def test_merge_rejections_save_nothing(store: Store, campaign: str, revised, error_type, fragment):
    store.transition_task(campaign, "001", "running")
    store.transition_task(campaign, "001", "complete")
    store.transition_task(campaign, "002", "running")
    store.transition_task(campaign, "002", "blocked", reason="x")
    before = store.tasks(campaign)
    with pytest.raises(FtlError) as excinfo:
        store.merge_revised_plan(campaign, revised, max_new_tasks=2)
    assert error_of(excinfo).error_type == error_type
    assert fragment in error_of(excinfo).message + str(error_of(excinfo).details)
    assert store.tasks(campaign) == before
    assert store.plan_versions(campaign) == [1]


def test_merge_never_changes_a_running_task(store: Store, campaign: str):
    store.transition_task(campaign, "004", "running")
    result = store.merge_revised_plan(campaign, plan(task("004", verify="other")), max_new_tasks=0)
    assert result["merged"] == 0
    assert store.task(campaign, "004")["status"] == "running"
    assert store.task(campaign, "004")["spec"]["verify"] == "true"


def test_merge_needs_an_active_campaign_with_tasks(store: Store):
    cid = store.create_campaign("x")["campaign_id"]
    with pytest.raises(FtlError) as excinfo:
        store.merge_revised_plan(cid, plan(task("001")), max_new_tasks=5)
    assert error_of(excinfo).error_type == "conflict"
    store.finish_campaign(cid, "cancelled", {})
    with pytest.raises(FtlError) as excinfo:
        store.add_tasks(cid, plan(task("001")))
    assert error_of(excinfo).error_type == "conflict"


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_generated_dags_register_and_a_back_edge_is_a_cycle(data):
    size = data.draw(st.integers(min_value=2, max_value=8))
    tasks = []
    for i in range(1, size + 1):
        deps = data.draw(st.sets(st.integers(min_value=1, max_value=i - 1), max_size=3)) if i > 1 else set()
        tasks.append(task(f"{i:03d}", [f"{d:03d}" for d in sorted(deps)]))
    # force a path 001 -> ... -> last so a back edge from 001 to the last task closes a cycle
    for i in range(1, size):
        tasks[i]["depends"] = sorted(set(tasks[i]["depends"]) | {f"{i:03d}"})
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "ftl.db") as s:
        cid = s.create_campaign("dag")["campaign_id"]
        assert s.add_tasks(cid, plan(*tasks)) == [f"{i:03d}" for i in range(1, size + 1)]
        s.finish_campaign(cid, "cancelled", {})
        cyclic = [dict(t) for t in tasks]
        cyclic[0]["depends"] = [f"{size:03d}"]
        cid = s.create_campaign("dag with cycle")["campaign_id"]
        with pytest.raises(FtlError) as excinfo:
            s.add_tasks(cid, plan(*cyclic))
        assert excinfo.value.error_type == "cycle_detected"
        assert s.tasks(cid) == []


# ----------------------------------------------------------------------------- workspaces

def test_workspace_lifecycle(store: Store, campaign: str):
    ws = {"workspace_id": "001-task-001", "seq": "1", "attempt": 1, "verify": "true", "delta": ["a.py"]}
    store.record_workspace(campaign, ws)
    store.record_workspace(campaign, {"workspace_id": "004-task-004", "seq": "004", "attempt": 1})
    with pytest.raises(FtlError) as excinfo:
        store.record_workspace(campaign, ws)
    assert error_of(excinfo).error_type == "conflict"
    store.finish_workspace(campaign, "001-task-001", 1, "blocked", {"exit_code": 1})
    with pytest.raises(FtlError) as excinfo:
        store.finish_workspace(campaign, "001-task-001", 1, "complete", {})
    assert error_of(excinfo).details == {"trigger": "blocked->complete", "state": "blocked"}
    store.record_workspace(campaign, {**ws, "attempt": 2})
    store.finish_workspace(campaign, "001-task-001", 2, "complete", {"exit_code": 0})
    store.record_workspace(campaign, {**ws, "attempt": 3})
    store.finish_workspace(campaign, "001-task-001", 3, "built", {"build": "ok"})
    with pytest.raises(FtlError) as excinfo:
        store.finish_workspace(campaign, "001-task-001", 3, "built", {})
    assert error_of(excinfo).details == {"trigger": "built->built", "state": "built"}
    store.finish_workspace(campaign, "001-task-001", 3, "complete", {"verify": "ok"})
    rows = store.workspaces(campaign, "001")
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "blocked"), (2, "complete"), (3, "complete")]
    assert rows[0]["spec"]["delta"] == ["a.py"] and rows[0]["result"] == {"exit_code": 1}
    assert rows[1]["seq"] == "001" and rows[1]["finished_at"].endswith("Z")
    assert len(store.workspaces(campaign)) == 4


def test_only_a_second_row_of_a_workspace_attempt_is_called_already_recorded(tmp_path: Path) -> None:
    """The insert's primary key says "already recorded"; another constraint (the campaign's row
    gone behind the store's back) keeps the store's own wording."""
    db = tmp_path / "ftl.db"
    with Store(db) as s:
        cid = s.create_campaign("o", flow="task")["campaign_id"]
        s.record_workspace(cid, {"workspace_id": "w1", "seq": 1, "attempt": 1})
        with pytest.raises(FtlError) as again:
            s.record_workspace(cid, {"workspace_id": "w1", "seq": 1, "attempt": 1})
        assert "already recorded" in again.value.message
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("DELETE FROM workspace")
        other.execute("DELETE FROM campaign")
        other.close()
        with pytest.raises(FtlError) as gone:
            s.record_workspace(cid, {"workspace_id": "w2", "seq": 1, "attempt": 1})
        assert gone.value.error_type == "conflict" and "already recorded" not in gone.value.message


def test_a_reused_build_is_recorded_as_built_in_one_step(store: Store, campaign: str):
    ws = {"workspace_id": "004-task-004", "seq": "004", "attempt": 2}
    store.record_workspace(campaign, ws, built={"delivered": "x", "reused_build": True})
    [row] = store.workspaces(campaign, "004")
    assert row["status"] == "built" and row["result"] == {"delivered": "x", "reused_build": True}
    assert row["finished_at"].endswith("Z")
    store.reset_running(campaign)  # a crash now keeps it
    assert store.workspaces(campaign, "004")[0]["status"] == "built"
    store.finish_workspace(campaign, "004-task-004", 2, "complete", {"verify": "ok"})
    with pytest.raises(FtlError) as excinfo:
        store.record_workspace(campaign, {**ws, "attempt": 3}, built=["x"])
    assert error_of(excinfo).error_type == "schema_invalid"


def test_reset_running_keeps_built_workspaces(store: Store, campaign: str):
    store.transition_task(campaign, "004", "running")
    store.record_workspace(campaign, {"workspace_id": "004-task-004", "seq": "004", "attempt": 1})
    store.finish_workspace(campaign, "004-task-004", 1, "built", {"delivered": "x"})
    assert store.reset_running(campaign) == ["004"]
    [row] = store.workspaces(campaign, "004")
    assert row["status"] == "built" and row["result"] == {"delivered": "x"}


@pytest.mark.parametrize("call, error_type", [
    (lambda s, c: s.record_workspace(c, {"seq": "001", "attempt": 1}), "schema_invalid"),
    (lambda s, c: s.record_workspace(c, {"workspace_id": "w", "seq": "x", "attempt": 1}), "schema_invalid"),
    (lambda s, c: s.record_workspace(c, {"workspace_id": "w", "seq": "1", "attempt": 0}), "schema_invalid"),
    (lambda s, c: s.record_workspace(c, {"workspace_id": "w", "seq": "1", "attempt": 1, "status": "complete"}),
     "schema_invalid"),
    (lambda s, c: s.record_workspace("c-missing", {"workspace_id": "w", "seq": "1", "attempt": 1}), "not_found"),
    (lambda s, c: s.finish_workspace(c, "nope", 1, "complete", {}), "not_found"),
    (lambda s, c: s.finish_workspace(c, "nope", 1, "done", {}), "schema_invalid"),
])
def test_workspace_errors(store: Store, campaign: str, call, error_type):
    with pytest.raises(FtlError) as excinfo:
        call(store, campaign)
    assert error_of(excinfo).error_type == error_type


# ----------------------------------------------------------------------------- exploration and memory

def test_explorer_results_and_exploration(store: Store, campaign: str):
    store.record_explorer_result(campaign, "structure", {"mode": "structure", "status": "ok", "directories": {}})
    store.record_explorer_result(campaign, "delta", {"mode": "delta", "status": "error", "error": "boom"})
    results = store.explorer_results(campaign)
    assert [(r["mode"], r["status"]) for r in results] == [("structure", "ok"), ("delta", "error")]
    assert results[1]["result"]["error"] == "boom"
    with pytest.raises(FtlError) as excinfo:
        store.record_explorer_result(campaign, "vibes", {})
    assert error_of(excinfo).error_type == "schema_invalid"
    assert store.exploration() is None
    store.save_exploration(campaign, {"_meta": {"version": "1.0"}, "structure": {"n": 1}})
    store.save_exploration(campaign, {"_meta": {"version": "1.0"}, "structure": {"n": 2}})
    assert store.exploration(campaign)["structure"] == {"n": 2}
    assert store.exploration()["structure"] == {"n": 2}
    assert store.exploration("c-other") is None


def test_memory_dedups_by_name_and_type(store: Store):
    first = MemoryStore(store).record({"name": "import-cycle", "type": "failure", "trigger": "ImportError",
                              "fix": "move the import", "source": ["001-a"], "campaign_id": "c-1", "cost": 500})
    assert first["occurrences"] == 1 and first["fix"] == "move the import" and first["cost"] == 500
    again = MemoryStore(store).record({"name": "import-cycle", "type": "failure", "trigger": "other",
                              "fix": "other", "source": ["002-b", "001-a"]})
    assert again["occurrences"] == 2 and again["source"] == ["001-a", "002-b"]
    assert again["fix"] == "move the import" and again["trigger"] == "ImportError"
    MemoryStore(store).record({"name": "import-cycle", "type": "pattern", "trigger": "t", "insight": "lazy imports"})
    MemoryStore(store).record({"name": "rare", "type": "failure", "trigger": "t", "fix": "f"})
    assert [m["name"] for m in MemoryStore(store).entries("failure")] == ["import-cycle", "rare"]
    assert [m["type"] for m in MemoryStore(store).entries("pattern")] == ["pattern"]
    assert len(MemoryStore(store).entries(limit=50)) == 3 and len(MemoryStore(store).entries(limit=1)) == 1


@pytest.mark.parametrize("entry", [
    {"type": "failure", "trigger": "t", "fix": "f"},
    {"name": "n", "type": "success", "trigger": "t", "fix": "f"},
    {"name": "n", "type": "failure", "trigger": 5, "fix": "f"},
    {"name": "n", "type": "failure", "trigger": "t", "fix": ["not", "text"]},
    {"name": "n", "type": "pattern", "trigger": "t", "insight": "i", "source": 5},
])
def test_memory_rejects_malformed_entries(store: Store, entry):
    with pytest.raises(FtlError) as excinfo:
        MemoryStore(store).record(entry)
    assert error_of(excinfo).error_type == "schema_invalid"
    assert MemoryStore(store).entries(limit=50) == []


def test_task_graph_and_selected_tasks_match_the_full_rows(store: Store):
    cid = store.create_campaign("graph")["campaign_id"]
    store.add_tasks(cid, plan(task("001"), task("002", depends=["001"]), task("010", depends=["001", "002"])))
    store.transition_task(cid, "001", "running")
    rows = store.tasks(cid)
    depends, status = store.task_graph(cid)
    assert depends == {r["seq"]: r["depends"] for r in rows}
    assert status == {r["seq"]: r["status"] for r in rows}
    assert list(depends) == ["001", "002", "010"]
    assert store.tasks(cid, seqs=["010", "001", "999"]) == [rows[0], rows[2]]
    assert store.tasks(cid, seqs=[]) == []


@pytest.mark.parametrize("text", ['[]', '["001","002"]', '{"a":{"b":[1,2.5,null,true]},"s":"é"}',
                                  '{"big":123456789012345678901234567890}', '[NaN]'])
def test_json_columns_read_back_as_the_json_module_reads_them(text: str):
    from ftl.store import _loads
    value, expected = _loads(text), json.loads(text)
    assert json.dumps(value) == json.dumps(expected)


def test_commits_survive_a_killed_process_and_durable_fsyncs_each(tmp_path):
    # WAL + NORMAL by default (kill -9 safe, like the event log); durable=True is FULL (power loss)
    from ftl.store import Store

    with Store.for_repo(tmp_path) as store:
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Store.for_repo(tmp_path, durable=True) as store:
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_ready_tasks_in_sql_is_the_dag_ready_set(data) -> None:
    """`Store.ready_tasks` (SQLite) agrees with `ftl.dag.ready_set` on random DAGs and statuses."""
    count = data.draw(st.integers(1, 25))
    depends = {i: sorted(data.draw(st.sets(st.integers(1, i - 1), max_size=3)) if i > 1 else [])
               for i in range(1, count + 1)}
    statuses = data.draw(st.lists(st.sampled_from(["pending", "running", "complete", "blocked"]),
                                  min_size=count, max_size=count))
    with tempfile.TemporaryDirectory() as tmp, Store.for_repo(Path(tmp)) as store:
        cid = store.create_campaign("ready in SQL")["campaign_id"]
        store.add_tasks(cid, plan(*(task(f"{i:03d}", [f"{d:03d}" for d in deps])
                                    for i, deps in depends.items())))
        with store._conn:  # statuses set directly: the transitions are not under test here
            store._conn.executemany("UPDATE task SET status = ? WHERE campaign_id = ? AND seq = ?",
                                    [(s, cid, f"{i:03d}") for i, s in zip(depends, statuses)])
        expected = dag.ready_set(*store.task_graph(cid))
        assert [t["seq"] for t in store.ready_tasks(cid)] == expected
        assert store.ready_tasks(cid) == store.tasks(cid, seqs=expected)


def test_an_unknown_campaign_is_not_found_by_every_task_read_also_after_a_known_one(tmp_path: Path) -> None:
    """The store remembers campaigns it found (ftl never deletes one); an unknown id is still
    asked about, and answered not_found, by every read of a task's hot path."""
    with Store(tmp_path / "ftl.db") as store:
        known = store.create_campaign("objective")["campaign_id"]
        assert store.blocked_seqs(known) == [] and store.workspaces(known) == []
        for read in (store.blocked_seqs, store.tasks, store.workspaces, store.counts,
                     lambda cid: store.tasks(cid, seqs=["001"]), lambda cid: store.task(cid, "001")):
            with pytest.raises(FtlError) as raised:
                read("c-20260101-000000-dead")
            assert raised.value.error_type == "not_found"
            assert "campaign c-20260101-000000-dead" in str(raised.value.details)
