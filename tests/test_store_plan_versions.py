"""Plan versions whose tasks are shared with the task rows (schema 3, issue 11 item 4): every
version reads back byte for byte as a store that writes whole versions (schema 2's way) gives
it, after any sequence of add-tasks, re-plan merges, saved plans and task moves; a schema-2
file opens, migrates and keeps its plans."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.errors import FtlError
from ftl.models import Plan
from ftl.plan_rows import PlanRows, lean_plan_rows
from ftl.store import SCHEMA_VERSION, Store
from store_files import store_file_at
from test_store import FakeClock


def raw_plan(seqs: list[int], *, objective: str = "ship it", verify: str = "true",
             extra: dict | None = None) -> dict:
    """A plan of ``seqs`` (in this order), each task depending on the previous seq in the list
    when that one is lower (so the graph is a DAG whatever the order)."""
    tasks = []
    for index, number in enumerate(seqs):
        before = [f"{seqs[index - 1]:03d}"] if index and seqs[index - 1] < number else "none"
        tasks.append({"seq": f"{number:03d}", "slug": f"task-{number}", "verify": verify, "depends": before,
                      "budget": 1 + number % 5})
    return {"objective": objective, "framework": "pytest", **(extra or {}), "tasks": tasks}


def shared_rows(store: Store, campaign_id: str) -> list[tuple[int, bool]]:
    """(version, whether its tasks are shared with the task rows) of every saved version."""
    return [(r[0], r[1] is not None) for r in store._conn.execute(
        "SELECT version, tasks_at FROM plan WHERE campaign_id = ? ORDER BY version", (campaign_id,))]


def pair(tmp_path: Path) -> tuple[Store, Store]:
    """A store with shared versions and one that writes every version whole, same clock."""
    shared = Store.for_repo(tmp_path / "shared", clock=FakeClock())
    whole = Store.for_repo(tmp_path / "whole", clock=FakeClock())
    whole.share_registered_tasks = False
    return shared, whole


def assert_same_versions(shared: Store, whole: Store, cid: tuple[str, str]) -> None:
    versions = shared.plan_versions(cid[0])
    assert versions == whole.plan_versions(cid[1])
    for version in versions:
        text = whole.plan_text(cid[1], version)
        assert shared.plan_text(cid[0], version) == text, f"plan version {version} differs"
        assert shared.get_plan(cid[0], version) == whole.get_plan(cid[1], version)
    assert shared.integrity_check() == "ok"


def test_add_tasks_writes_the_specs_once_and_reads_the_version_back(tmp_path: Path) -> None:
    raw = raw_plan([3, 1, 2, 1000, 10], extra={"notes": {"why": "order"}})
    rows = lean_plan_rows(raw)
    assert rows is not None
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        store.add_tasks(cid, rows)
        assert shared_rows(store, cid) == [(1, True)]
        stored = store._conn.execute("SELECT plan FROM plan").fetchone()[0]
        assert '"tasks":[]' in stored and len(stored) < len(rows.plan_json) // 2
        # the plan order (not the seq order) and the extras after the task list come back
        assert store.plan_text(cid) == rows.plan_json
        assert store.get_plan(cid) == Plan.model_validate(raw)
        assert store.latest_plan_fields(cid, ("objective", "framework", "notes")) == {
            "objective": "ship it", "framework": "pytest", "notes": '{"why":"order"}'}


def test_a_merge_writes_the_shared_version_out_whole_first(tmp_path: Path) -> None:
    shared, whole = pair(tmp_path)
    with shared, whole:
        cids = []
        for store in (shared, whole):
            cid = store.create_campaign("x")["campaign_id"]
            store.add_tasks(cid, Plan.model_validate(raw_plan([1, 2, 3])))
            store.transition_task(cid, "001", "running")
            store.transition_task(cid, "001", "blocked", reason="broken")
            store.merge_revised_plan(cid, Plan.model_validate(raw_plan([1, 4], verify="make test")),
                                     max_new_tasks=5)
            cids.append(cid)
        assert shared_rows(shared, cids[0]) == [(1, False), (2, False)]
        assert_same_versions(shared, whole, (cids[0], cids[1]))
        # version 1 still has the registered spec of 001, which the merge replaced
        assert shared.get_plan(cids[0], 1).tasks[0].verify == "true"
        assert shared.task(cids[0], "001")["spec"]["verify"] == "make test"


def test_a_failed_merge_leaves_the_version_shared(tmp_path: Path) -> None:
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        store.add_tasks(cid, Plan.model_validate(raw_plan([1, 2])))
        with pytest.raises(FtlError):
            store.merge_revised_plan(cid, Plan.model_validate(raw_plan([1, 5, 6])), max_new_tasks=1)
        assert shared_rows(store, cid) == [(1, True)]  # the transaction rolled back


def test_a_missing_shared_task_row_is_a_conflict_not_a_wrong_plan(tmp_path: Path) -> None:
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        store.add_tasks(cid, Plan.model_validate(raw_plan([1, 2])))
        store._conn.execute("DELETE FROM task WHERE seq = '002'")  # a store changed by hand
        with pytest.raises(FtlError) as excinfo:
            store.get_plan(cid)
        assert excinfo.value.error_type == "conflict" and "002" in excinfo.value.message


# One step of a campaign's life after add-tasks: (kind, argument).
_STEPS = st.lists(st.one_of(
    st.tuples(st.just("merge"), st.lists(st.integers(1, 12), min_size=1, max_size=6, unique=True),
              st.sampled_from(["true", "make test", "pytest -q"])),
    st.tuples(st.just("save"), st.lists(st.integers(1, 12), min_size=1, max_size=6, unique=True),
              st.sampled_from(["true", "ruff ."])),
    st.tuples(st.just("finish"), st.integers(1, 12), st.sampled_from(["complete", "blocked"])),
    st.tuples(st.just("executed"), st.integers(1, 4), st.just("")),
), max_size=5)


@settings(max_examples=40, deadline=None)
@given(seqs=st.lists(st.integers(1, 1200), min_size=1, max_size=7, unique=True),
       lean=st.booleans(), first=st.sampled_from(["none", "same", "other"]),
       extra=st.sampled_from([{}, {"notes": ["a", {"b": 1}]}, {"campaign": "ship-it", "framework_confidence": 0.5}]),
       steps=_STEPS)
def test_every_version_reads_back_as_a_store_of_whole_versions_gives_it(
        tmp_path_factory, seqs, lean, first, extra, steps) -> None:
    tmp_path = tmp_path_factory.mktemp("versions")
    raw = raw_plan(seqs, extra=extra)
    shared, whole = pair(tmp_path)
    with shared, whole:
        cids = []
        for store in (shared, whole):
            initial = {"none": None, "same": Plan.model_validate(raw),
                       "other": Plan.model_validate(raw_plan([7], objective="earlier"))}[first]
            cid = store.create_campaign("x", plan=initial)["campaign_id"]
            rows = lean_plan_rows(raw) if lean else PlanRows.from_plan(Plan.model_validate(raw))
            store.add_tasks(cid, rows)
            cids.append(cid)
        if first != "same":  # add-tasks saved a version: the shared store shares it
            assert shared_rows(shared, cids[0])[-1] == (len(shared.plan_versions(cids[0])), True)
        assert_same_versions(shared, whole, (cids[0], cids[1]))
        for kind, arg, text in steps:
            outcomes = []
            for store, cid in zip((shared, whole), cids):
                try:
                    if kind == "merge":
                        store.merge_revised_plan(cid, Plan.model_validate(raw_plan(arg, verify=text)), max_new_tasks=20)
                    elif kind == "save":
                        store.save_plan(cid, Plan.model_validate(raw_plan(arg, verify=text)))
                    elif kind == "finish":
                        seq = f"{arg:03d}"
                        store.transition_task(cid, seq, "running")
                        store.transition_task(cid, seq, text, reason="r" if text == "blocked" else None)
                    else:
                        store.mark_plan_executed(cid, arg)
                    outcomes.append("ok")
                except FtlError as error:
                    outcomes.append(error.error_type)
            assert outcomes[0] == outcomes[1]
            assert_same_versions(shared, whole, (cids[0], cids[1]))


def schema_2_store(path: Path, plan: Plan) -> str:
    """A store file as ftl wrote it at schema version 2: one campaign, its plan (version 1,
    whole, marked executed) and its tasks."""
    conn = store_file_at(path, 2)
    now = "2026-11-21T04:15:03.000Z"
    cid = "c-20261121-041503-abcd"
    conn.execute("INSERT INTO campaign (campaign_id, objective, flow, status, tracked, created_at, updated_at) "
                 "VALUES (?, 'old', 'campaign', 'active', '{}', ?, ?)", (cid, now, now))
    conn.execute("INSERT INTO plan (campaign_id, version, plan, created_at, executed_at) VALUES (?, 1, ?, ?, ?)",
                 (cid, plan.model_dump_json(by_alias=True), now, now))
    for task in plan.tasks:
        conn.execute("INSERT INTO task (campaign_id, seq, slug, type, depends, status, spec, updated_at) "
                     "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
                     (cid, task.seq, task.slug, task.type.value, json.dumps(task.depends, separators=(",", ":")),
                      task.model_dump_json(), now))
    conn.close()
    return cid


def test_a_schema_2_store_migrates_and_keeps_its_plans(tmp_path: Path) -> None:
    plan = Plan.model_validate(raw_plan([2, 1, 3], extra={"notes": "kept"}))
    db = tmp_path / ".ftl" / "ftl.db"
    db.parent.mkdir()
    cid = schema_2_store(db, plan)
    with Store(db) as store:
        assert store.schema_version() == SCHEMA_VERSION and store.integrity_check() == "ok"
        assert store.plan_text(cid, 1) == plan.model_dump_json(by_alias=True)
        assert store.get_plan(cid) == plan and store.executed_plan_versions(cid) == {1}
        assert shared_rows(store, cid) == [(1, False)]
        assert [t["seq"] for t in store.ready_tasks(cid)] == ["001", "002"]
        # the migrated store goes on as a new one: a merge writes version 2 whole
        store.merge_revised_plan(cid, Plan.model_validate(raw_plan([1, 4])), max_new_tasks=1)
        assert store.get_plan(cid, 1) == plan and shared_rows(store, cid) == [(1, False), (2, False)]
    with Store(db) as store:  # reopening does not migrate again
        assert store.schema_version() == SCHEMA_VERSION and store.get_plan(cid, 1) == plan


def test_add_tasks_writes_every_row_across_insert_batches(tmp_path: Path) -> None:
    # 2 full batches of _INSERT_BATCH rows and a partial one; each row as one INSERT would write it.
    from ftl.store import _INSERT_BATCH

    count = 2 * _INSERT_BATCH + 5
    raw = raw_plan(list(range(count, 0, -1)))  # plan order: descending seqs
    for task in raw["tasks"][::3]:
        task["depends"] = [f"{n:03d}" for n in range(max(1, int(task["seq"]) - 3), int(task["seq"]))]
    rows = lean_plan_rows(raw)
    assert rows is not None
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        assert store.add_tasks(cid, rows) == [f"{n:03d}" for n in range(1, count + 1)]
        written = {r[0]: tuple(r) for r in store._conn.execute(
            "SELECT seq, slug, type, depends, status, attempts, blocked_by, spec FROM task")}
        expected = {t.seq: (t.seq, t.slug, t.type, json.dumps(list(t.depends), separators=(",", ":")),
                            "pending", 0, "[]", t.spec) for t in rows.tasks}
        assert written == expected
        assert store.plan_text(cid) == rows.plan_json


def test_add_tasks_checks_foreign_keys_again_afterwards(tmp_path: Path) -> None:
    # add-tasks writes with the foreign-key check off (its campaign is read in the same
    # transaction); every other write, including one after a refused add-tasks, has it on.
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        store.add_tasks(cid, Plan.model_validate(raw_plan([1, 2])))
        assert store._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        with pytest.raises(FtlError):
            store.add_tasks(cid, Plan.model_validate(raw_plan([3])))  # already has tasks
        assert store._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        with pytest.raises(FtlError):
            store.add_tasks("c-unknown", Plan.model_validate(raw_plan([3])))
        assert store._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store.integrity_check() == "ok"
    with pytest.raises(FtlError) as excinfo:
        store.add_tasks(cid, Plan.model_validate(raw_plan([3])))
    assert excinfo.value.error_type == "invalid_state"  # closed, as every other call


def test_a_new_store_has_8_kib_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    from ftl.store import PAGE_SIZE

    with Store.for_repo(tmp_path / "new") as store:
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 8192
    db = tmp_path / "old" / ".ftl" / "ftl.db"
    db.parent.mkdir(parents=True)
    cid = schema_2_store(db, Plan.model_validate(raw_plan([1, 2])))  # SQLite's default 4 KiB
    with Store(db) as store:
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        store.merge_revised_plan(cid, Plan.model_validate(raw_plan([1, 3])), max_new_tasks=1)
        assert store.get_plan(cid).tasks[-1].seq == "003" and store.integrity_check() == "ok"


def test_a_shared_version_is_read_in_one_snapshot(tmp_path: Path, monkeypatch) -> None:
    # Another process merging between the read of the version row and the read of the specs
    # must not mix the two: plan_text reads both in one read transaction (WAL snapshot).
    with Store.for_repo(tmp_path, clock=FakeClock()) as reader, \
            Store.for_repo(tmp_path, clock=FakeClock()) as writer:
        cid = writer.create_campaign("x")["campaign_id"]
        writer.add_tasks(cid, Plan.model_validate(raw_plan([1, 2])))
        saved = reader.plan_text(cid, 1)
        original = Store._plan_text

        def merge_in_between(conn, campaign_id, row):
            if conn is reader._conn and row[1] is not None:  # the reader has the shared row
                writer.merge_revised_plan(cid, Plan.model_validate(raw_plan([1, 2], verify="changed")),
                                          max_new_tasks=0)
            return original(conn, campaign_id, row)

        monkeypatch.setattr(Store, "_plan_text", staticmethod(merge_in_between))
        assert reader.plan_text(cid, 1) == saved  # the reader's snapshot: row and specs as registered
        monkeypatch.setattr(Store, "_plan_text", staticmethod(original))
        assert not reader._conn.in_transaction
        assert reader.plan_text(cid, 1) == saved and '"verify":"changed"' in reader.plan_text(cid, 2)


def test_a_big_add_tasks_holds_its_pages_in_cache_and_gives_the_cache_back(tmp_path: Path) -> None:
    # 3 MB of specs: past SQLite's default 2 MB cache, which spilled pages to the WAL mid-insert.
    # The statements show the cache raised for the insert and set back after it, and the rows'
    # INSERT needs no statement journal (OR ROLLBACK).
    rows = lean_plan_rows(raw_plan(list(range(1, 1201)), verify="make check " + "x" * 2500))
    assert rows is not None and sum(len(t.spec) for t in rows.tasks) > 3_000_000
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        default = store._conn.execute("PRAGMA cache_size").fetchone()[0]
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        store.add_tasks(cid, rows)
        store._conn.set_trace_callback(None)
        sizes = [int(s.rsplit("=", 1)[1]) for s in statements if s.startswith("PRAGMA cache_size =")]
        assert sizes[0] <= -5800 and sizes[-1] == default  # KiB: twice the specs' size, then back
        assert store._conn.execute("PRAGMA cache_size").fetchone()[0] == default
        inserts = [s for s in statements if s.startswith("INSERT") and "INTO task " in s]
        assert inserts and all(s.startswith("INSERT OR ROLLBACK INTO task ") for s in inserts)
        assert len(store.ready_tasks(cid)) == 1 and store.integrity_check() == "ok"


def test_an_add_tasks_insert_that_fails_saves_nothing_and_the_store_goes_on(tmp_path: Path) -> None:
    # The insert rolls the whole transaction back itself (OR ROLLBACK); the session must not
    # trip over the transaction being gone, and nothing of the plan may stay behind. A duplicate
    # seq that claims to be checked is the only way to make a row conflict here.
    good = lean_plan_rows(raw_plan([1, 2, 3]))
    assert good is not None
    broken = PlanRows(plan_json=good.plan_json, framework=good.framework,
                      tasks=[*good.tasks, good.tasks[0]], graph_checked=True)
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        default = store._conn.execute("PRAGMA cache_size").fetchone()[0]
        with pytest.raises(FtlError):
            store.add_tasks(cid, broken)
        assert store._conn.execute("SELECT COUNT(*) FROM task").fetchone()[0] == 0
        assert store.plan_versions(cid) == []
        assert store._conn.execute("PRAGMA cache_size").fetchone()[0] == default
        assert store._conn.execute("PRAGMA ignore_check_constraints").fetchone()[0] == 0
        assert store._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store.add_tasks(cid, good) == ["001", "002", "003"]
        assert store.integrity_check() == "ok"


class _FailingPragma:
    """The store's connection, except that asking for ``statement`` raises (a fault between
    add-tasks' settings and its insert: a MemoryError, an interrupt)."""

    def __init__(self, conn, statement: str) -> None:
        self._conn, self._statement = conn, statement

    def execute(self, sql, *args):
        if sql == self._statement:
            raise KeyboardInterrupt
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_add_tasks_puts_its_settings_back_whatever_stops_it(tmp_path: Path) -> None:
    # ignore_check_constraints is on for the insert only: a fault right after it is switched on
    # must not leave later writes unchecked (a task status outside the CHECK list).
    rows = lean_plan_rows(raw_plan([1, 2]))
    assert rows is not None
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        real = store._conn
        store._conn = _FailingPragma(real, "PRAGMA cache_size")
        with pytest.raises(KeyboardInterrupt):
            store.add_tasks(cid, rows)
        store._conn = real
        assert real.execute("PRAGMA ignore_check_constraints").fetchone()[0] == 0
        assert real.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert real.execute("SELECT COUNT(*) FROM task").fetchone()[0] == 0
        with pytest.raises(sqlite3.IntegrityError):
            real.execute("UPDATE campaign SET status = 'bogus' WHERE campaign_id = ?", (cid,))
        assert store.add_tasks(cid, rows) == ["001", "002"]
