"""Tests for ftl.postmortem.spool: `Records` against the list it replaces (any settle order, tiny batches),
`TaskTable` against a dict under random adds, mutations and evictions with a tiny cache, and
`ftl.postmortem.replay` with a tiny spool against the defaults (the generated benchmark log and every log in
tests/logs/), the streamed lazy JSON against the eager one, and `Replay` closing its database."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ftl.postmortem.spool as spool
from ftl.postmortem.check import Checker
from ftl.postmortem.replay import Replay, render_text, replay, text_lines, write_json
from ftl.postmortem.timeline import _codec
from ftl.postmortem.spool import Records, Spool, TaskTable, task_sort_key

ROOT = Path(__file__).resolve().parent.parent
LOGS = Path(__file__).parent / "logs"
DRILL = LOGS / "drill.jsonl"
LOG_FILES = sorted(LOGS.glob("*.jsonl"))

sys.path.insert(0, str(ROOT / "bench"))
from bench_replay import generate  # noqa: E402  (bench/ is not a package)

SETTINGS = settings(max_examples=50, deadline=None)
TINY = {"TASK_CACHE": 4, "EVICT": 1, "BATCH": 3}
# Every eviction empties the cache: a TaskInfo held across an `evict` would lose its changes.
EMPTYING = {"TASK_CACHE": 2, "EVICT": 2, "BATCH": 1}


# ------------------------------------------------------------------------------ Records

@dataclass(slots=True)
class Item:
    """A record like replay's: a slotted dataclass stored as a tuple of its fields."""

    n: int
    name: str | None
    tags: list[int] = field(default_factory=list)
    ok: bool = False


_ITEM_ENCODE, _ITEM_DECODE = _codec(Item)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                     st.floats(allow_nan=False), st.text(max_size=6))


def _record(kind: str, n: int, payload: Any) -> Any:
    # `n` (the record's key) makes every record distinct, so an order mistake cannot hide.
    if kind == "tuple":
        return (n, payload, [payload])
    if kind == "dict":
        return {"n": n, "v": payload, "nested": {"v": [payload]}}
    return Item(n, None if payload is None else str(payload), [n, n + 1], bool(n % 2))


def _records(db: Spool, kind: str) -> Records[Any]:
    if kind == "item":
        return Records(db, "r", _ITEM_ENCODE, _ITEM_DECODE)
    return Records(db, "r")


def _check_sequence(records: Records[Any], expected: list[Any]) -> None:
    """Everything a caller reads from `Records` agrees with ``expected`` (a list)."""
    assert len(records) == len(expected)
    assert list(records) == expected
    assert list(records) == expected  # re-iterable: the second walk reads the same
    assert records == expected and records == tuple(expected)
    assert not records == expected + [expected[-1] if expected else 0]
    assert records != 5
    for i in range(len(expected)):
        assert records[i] == expected[i]
        assert records[-1 - i] == expected[-1 - i]
    for bad in (len(expected), -len(expected) - 1):
        with pytest.raises(IndexError):
            records[bad]
    if expected:
        changed = list(expected)
        changed[-1] = "not a record"
        assert records != changed


@st.composite
def _payloads(draw: Any) -> tuple[str, list[Any]]:
    kind = draw(st.sampled_from(["tuple", "dict", "item"]))
    payloads = draw(st.lists(_scalars, max_size=40))
    return kind, [_record(kind, n, p) for n, p in enumerate(payloads)]


@SETTINGS
@given(data=_payloads(), batch=st.integers(1, 7), delays=st.lists(st.one_of(st.none(), st.integers(0, 6)),
                                                                  min_size=40, max_size=40),
       checkpoints=st.sets(st.integers(0, 50), max_size=4))
def test_records_bounded_disorder(data: tuple[str, list[Any]], batch: int, delays: list[int | None],
                                  checkpoints: set[int]) -> None:
    """Record ``n`` begins at time ``n`` (`reserve`) and settles ``delays[n]`` later (`add`), or
    is appended at once when its delay is None (key from the same counter): iteration follows
    the keys, also when read (a flush of a partial batch) while records are still open."""
    kind, expected = data
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spool, "BATCH", batch)
        db = Spool()
        try:
            records = _records(db, kind)
            keys: dict[int, int] = {}
            settled: list[int] = []
            due: dict[int, list[int]] = {}
            for t in range(len(expected) + 8):
                if t < len(expected):
                    if delays[t] is None:
                        records.append(expected[t])
                        settled.append(t)
                    else:
                        keys[t] = records.reserve()
                        assert keys[t] == t
                        due.setdefault(t + delays[t], []).append(t)
                for n in due.pop(t, []):
                    records.add(expected[n], keys[n])
                    settled.append(n)
                if t in checkpoints:
                    assert list(records) == [expected[n] for n in sorted(settled)]
            assert not due
            _check_sequence(records, expected)
        finally:
            db.close()


@SETTINGS
@given(data=_payloads(), batch=st.integers(1, 7), st_data=st.data())
def test_records_any_settle_order(data: tuple[str, list[Any]], batch: int, st_data: Any) -> None:
    """All records begin first, then settle in a random permutation: iteration is by key."""
    kind, expected = data
    order = st_data.draw(st.permutations(range(len(expected))))
    checkpoint = st_data.draw(st.integers(0, len(expected)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spool, "BATCH", batch)
        db = Spool()
        try:
            records = _records(db, kind)
            keys = [records.reserve() for _ in expected]
            assert keys == list(range(len(expected)))
            for i, n in enumerate(order):
                if i == checkpoint:
                    assert list(records) == [expected[m] for m in sorted(order[:i])]
                records.add(expected[n], keys[n])
            _check_sequence(records, expected)
        finally:
            db.close()


def test_records_batch_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """`BATCH` is read when a record is added: a smaller value written mid-way flushes sooner."""
    db = Spool()
    records: Records[int] = Records(db, "r")
    for n in range(5):
        records.append(n)
    assert db.db.execute("SELECT count(*) FROM r").fetchone()[0] == 0  # 5 < default BATCH
    monkeypatch.setattr(spool, "BATCH", 2)
    records.append(5)
    assert db.db.execute("SELECT count(*) FROM r").fetchone()[0] == 1  # 6 >= 2: one blob
    assert records == list(range(6)) and records[-1] == 5
    with pytest.raises(TypeError):
        records["0"]  # type: ignore[index]
    db.close()


# ------------------------------------------------------------------------------ TaskTable

@dataclass(slots=True)
class Task:
    seq: str
    value: int
    roots: list[str] | None  # None: not blocked; []: a blocked root; else the roots blocking it
    tags: list[int]


_TASK_ENCODE, _TASK_DECODE = _codec(Task)


def _blocked_by(task: Task) -> list[str] | None:
    return task.roots


def _table(db: Spool, name: str = "tasks", capacity: int | None = None) -> TaskTable[Task]:
    return TaskTable(db, name, _TASK_ENCODE, _TASK_DECODE, _blocked_by, capacity=capacity)


# Numeric seqs with different zero padding (one sort key, ties by text), non-numeric seqs, the
# empty seq (replay's fallback for a missing task_seq) and a number too long for the key.
_SEQS = st.one_of(st.sampled_from(["7", "007", "07", "1", "10", "010", "2", "002", "abc", "b", "",
                                   "10a", "x-1", "é", "12345678901234567890"]),
                  st.text(alphabet="0123456789ab", max_size=3))
_ROOTS = st.one_of(st.none(), st.lists(_SEQS, max_size=3))
_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), _SEQS, st.integers(-5, 5), _ROOTS),
    st.tuples(st.just("mutate"), _SEQS, st.integers(-5, 5), _ROOTS),
    st.tuples(st.just("evict")),
    st.tuples(st.just("check")),
), max_size=60)


def _order(seq: str) -> tuple[int, str]:
    return task_sort_key(seq), seq


def _model_cascade(model: dict[str, Task]) -> list[tuple[str, list[str]]]:
    """The cascade tree from the dict: roots are blocked tasks naming no root plus every named
    root; each lists the blocked tasks naming it (once per mention), all in task order."""
    pairs = [(root, t.seq) for t in model.values() if t.roots is not None for root in t.roots]
    roots = {t.seq for t in model.values() if t.roots == []} | {root for root, _ in pairs}
    return [(root, sorted((s for r, s in pairs if r == root), key=_order))
            for root in sorted(roots, key=_order)]


def _check_table(table: TaskTable[Task], model: dict[str, Task]) -> None:
    expected = [model[s] for s in sorted(model, key=_order)]
    assert list(table.values()) == expected
    assert list(table.blocked()) == [t for t in expected if t.roots is not None]
    assert list(table.cascade()) == _model_cascade(model)
    assert list(table) == [t.seq for t in expected]
    assert len(table) == len(model)


@SETTINGS
@given(capacity=st.integers(2, 5), evict=st.integers(1, 3), ops=_OPS)
def test_task_table_matches_dict(capacity: int, evict: int, ops: list[tuple[Any, ...]]) -> None:
    """Adds, look-up-then-mutate and evictions with a tiny cache give the same story as a dict.

    Records are mutated in place the way replay does: looked up by seq for each operation and
    never held across an `evict`. ``model`` holds independent copies, so a mutation lost on a
    write-out (or an evicted record changed behind the table's back) shows as a difference."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spool, "EVICT", evict)
        db = Spool()
        try:
            table = _table(db, capacity=capacity)
            model: dict[str, Task] = {}
            missing = Task("missing", 0, None, [])
            for op in ops:
                if op[0] == "evict":
                    before = list(table.cache)
                    table.evict()
                    assert len(table.cache) <= capacity
                    if len(before) > capacity:  # the oldest go, down to `capacity - EVICT`
                        kept = max(0, capacity - evict)
                        assert list(table.cache) == (before[len(before) - kept:] if kept else [])
                    else:
                        assert list(table.cache) == before
                    continue
                if op[0] == "check":
                    _check_table(table, model)
                    continue
                _, seq, delta, roots = op
                record = table.get(seq)
                if seq not in model:
                    assert record is None
                    assert table.get(seq, missing) is missing
                    assert seq not in table
                    with pytest.raises(KeyError):
                        table[seq]
                    if op[0] == "add":
                        added = table.add(seq, Task(seq, delta, roots, [delta]))
                        assert added == Task(seq, delta, roots, [delta])
                        model[seq] = Task(seq, delta, None if roots is None else list(roots), [delta])
                    continue
                assert record == model[seq]
                assert seq in table and table[seq] is record
                record.value += delta  # the mutations replay makes: in place, on the cached record
                record.roots = roots
                record.tags.append(delta)
                m = model[seq]
                m.value += delta
                m.roots = None if roots is None else list(roots)
                m.tags = [*m.tags, delta]
            table.evict()
            assert len(table.cache) <= capacity
            _check_table(table, model)
            for seq, expected in model.items():
                assert table.get(seq) == expected
        finally:
            db.close()


def test_task_table_capacity_read_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    db = Spool()
    monkeypatch.setattr(spool, "TASK_CACHE", 3)
    table = _table(db, "a")
    monkeypatch.setattr(spool, "TASK_CACHE", 100)
    assert table.capacity == 3
    assert _table(db, "b", capacity=0).capacity == 2
    for n in range(10):
        table.add(str(n), Task(str(n), n, None, []))
    monkeypatch.setattr(spool, "EVICT", 1)
    table.evict()
    assert list(table.cache) == ["8", "9"]  # 10 cached, capacity 3: the oldest 8 go
    assert [t.value for t in table.values()] == list(range(10))
    db.close()


def test_task_sort_key() -> None:
    assert sorted(["010", "b", "002", "7", "a1"], key=lambda s: (task_sort_key(s), s)) == \
        ["002", "7", "010", "a1", "b"]
    assert task_sort_key("007") == task_sort_key("7") == 7
    assert task_sort_key("1" * 20) == task_sort_key("x") > task_sort_key("9" * 17)


def test_task_sort_key_non_decimal_digit() -> None:
    assert task_sort_key("²") == task_sort_key("x")


# ------------------------------------------------------------------------------ replay

@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spool") / "bench.jsonl"
    counts = generate(path, 6000, 1)
    assert counts["blocked"] > 0 and counts["tasks"] > 1000  # blocks, a cascade, many tasks
    return path


def _both(path: Path) -> tuple[dict[str, Any], str]:
    with replay([path]) as result:
        return result.to_json(), render_text(result)


@pytest.mark.parametrize("tiny", [TINY, EMPTYING], ids=["tiny", "emptying"])
@pytest.mark.parametrize("name", [p.name for p in LOG_FILES] + ["generated"])
def test_replay_same_with_tiny_spool(name: str, tiny: dict[str, int], generated: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-task cache evicting one at a time (or a 2-task one emptied by every eviction) and
    tiny batches change nothing in the output."""
    path = generated if name == "generated" else LOGS / name
    default_json, default_text = _both(path)
    for key, value in tiny.items():
        monkeypatch.setattr(spool, key, value)
    tiny_json, tiny_text = _both(path)
    assert tiny_json == default_json
    assert tiny_text == default_text


def test_replay_cache_bound_under_eviction(generated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task cache stays bounded through the fold, and the spool really evicted."""
    for key, value in TINY.items():
        monkeypatch.setattr(spool, key, value)
    events = [json.loads(line) for line in generated.read_text(encoding="utf-8").splitlines()]
    plan = next(e for e in events if e["event"] == "PLAN_REGISTERED")
    max_deps = max(len(d) for d in plan["depends"].values())
    jobs = next(e for e in events if e["event"] == "RUN_START")["config"]["jobs"]
    assert (max_deps, jobs) == (1, 8)  # the bench's plan; checked so the bound below stays true
    peak = [0]
    feed = Checker.feed

    def counting_feed(self: Any, event: dict[str, Any]) -> None:
        feed(self, event)
        peak[0] = max(peak[0], len(self.r.tasks.cache))

    monkeypatch.setattr(Checker, "feed", counting_feed)
    with replay([generated]) as result:
        capacity = result.tasks.capacity
        assert capacity == TINY["TASK_CACHE"]
        # Tasks only enter the cache through a look-up or an add; replay calls `evict` (leaving
        # at most `capacity`) before each TASK_START's look-up and before each task of a
        # PLAN_REGISTERED or CASCADE_PROPAGATE. This log's last task-touching event is a
        # non-empty CASCADE_PROPAGATE (then OBSERVE, COMPLETE, RUN_END touch no task), so right
        # after the fold the cache holds at most `capacity` plus the one task looked up after
        # the last `evict`.
        cascade = list(result.cascade)
        assert cascade[-1]["event"] == "CASCADE_PROPAGATE" and cascade[-1]["propagated"]
        assert len(result.tasks.cache) <= capacity + 1
        # Between two evictions (every TASK_START) the cache gains the started task, its
        # dependencies, and the other running tasks (at most jobs - 1) reloaded once each by
        # their TASK_END or by a RESUME's reset_tasks; nothing else looks a task up.
        assert peak[0] <= capacity + 1 + max_deps + (jobs - 1)
        assert len(result.tasks) > 1000  # most tasks live in the spool, not the cache
        assert sum(1 for _ in result.tasks.values()) == len(result.tasks)
        # Rendering reads tasks without caching them: the text report leaves the cache as is.
        cached = len(result.tasks.cache)
        blocks = list(result.iter_blocks())
        assert len(blocks) > capacity and sum(1 for _ in text_lines(result)) > 1000
        assert len(result.tasks.cache) == cached


@pytest.mark.parametrize("name", ["drill", "generated"])
def test_lazy_json_streams_the_same_document(name: str, generated: Path) -> None:
    path = generated if name == "generated" else DRILL
    with replay([path]) as result:
        out = io.StringIO()
        write_json(result.to_json(lazy=True), out)
        eager = json.loads(json.dumps(result.to_json(), sort_keys=True, default=str))
        assert eager["tasks"] and eager["task_status"] and eager["states"]  # not trivially empty
        assert json.loads(out.getvalue()) == eager


def test_lazy_json_can_be_written_twice() -> None:
    """`JsonArray` calls ``items()`` on every walk, so one lazy payload writes the same twice."""
    with replay([DRILL]) as result:
        payload = result.to_json(lazy=True)
        first, second = io.StringIO(), io.StringIO()
        write_json(payload, first)
        write_json(payload, second)
        assert json.loads(second.getvalue()) == json.loads(first.getvalue())


def test_replay_context_manager_closes_database() -> None:
    with replay([DRILL]) as result:
        attempts, tasks = result.attempts, result.tasks
        assert list(attempts) and list(tasks.values())
    with pytest.raises(sqlite3.ProgrammingError):
        list(attempts)
    with pytest.raises(sqlite3.ProgrammingError):
        list(tasks.values())


def test_replay_context_manager_closes_on_error() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Replay() as result:
            result.retries.append({"seq": 1})
            assert list(result.retries) == [{"seq": 1}]
            raise RuntimeError("boom")
    with pytest.raises(sqlite3.ProgrammingError):
        list(result.retries)


def test_replay_lone_surrogate_task_seq(tmp_path: Path) -> None:
    events = [json.loads(line) for line in DRILL.read_text(encoding="utf-8").splitlines()]
    first = next(e["task_seq"] for e in events if e.get("task_seq"))
    for e in events:
        if e.get("task_seq") == first:
            e["task_seq"] = "\ud800"
    # json.dumps writes the lone surrogate as the escape "\ud800", valid JSON that replay
    # reads through its json.loads fallback.
    log = tmp_path / "surrogate.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    with replay([log]) as result:
        assert "\ud800" in [t.seq for t in result.tasks.values()]
