"""Review 15: memory input that later calls cannot read is refused where it comes in
(relationship maps of the wrong shape, NaN and infinite costs), and the metrics neither make a
series of a label value with a trailing newline nor count an infinite cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.memory import MemoryStore
from ftl.store import Store
from ftl.telemetry.metrics import OTHER, EventMetrics, Metrics

LIB = Path(__file__).resolve().parent.parent / "lib"


@pytest.fixture
def mem(tmp_path: Path):
    with Store(tmp_path / "ftl.db") as store:
        yield MemoryStore(store)


TRIGGERS = {"f1": "ImportError: no module named yaml", "f2": "disk quota exceeded under /tmp/build"}


def failure(name: str, **extra) -> dict:
    return {"name": name, "type": "failure", "trigger": TRIGGERS[name], "fix": "x", "cost": 500, **extra}


PATTERN = {"name": "p1", "type": "pattern", "trigger": "pattern trigger text long",
           "insight": "insight text long enough", "saved": 100}


def violation(raised: pytest.ExceptionInfo) -> dict:
    assert raised.value.error_type == "schema_invalid"
    [found] = raised.value.details["violations"]
    assert found["fix"]
    return found


@pytest.mark.parametrize("key, value, path", [
    ("related_typed", "oops", "related_typed"),
    ("related_typed", ["f2"], "related_typed"),
    ("related_typed", {"co_occurs": "f2"}, "related_typed.co_occurs"),
    ("cross_relationships", ["p1"], "cross_relationships"),
    ("cross_relationships", {"solves": "abc"}, "cross_relationships.solves"),
    ("cross_relationships", {"solves": [1]}, "cross_relationships.solves"),
])
@pytest.mark.parametrize("write", ["add", "record"])
def test_a_relationship_map_of_the_wrong_shape_is_refused_naming_its_path(mem, write, key, value, path) -> None:
    with pytest.raises(FtlError) as raised:
        getattr(mem, write)(failure("f1", **{key: value}))
    assert violation(raised)["path"] == path
    assert mem.get("f1") is None


def test_well_formed_relationship_maps_are_kept_and_extended(mem) -> None:
    assert mem.add(failure("f1", related_typed={"co_occurs": ["f0"]},
                           cross_relationships={"solves": ["p0"]})) == "added"
    assert mem.add(failure("f2", related_typed=None)) == "added"
    assert mem.add(PATTERN) == "added"
    assert mem.add_relationship("f1", "f2") == "added"
    assert mem.add_cross_relationship("f1", "p1") == "added"
    assert [p["name"] for p in mem.solutions("f1")] == ["p1"]
    stored = mem.get("f1")
    assert stored["related_typed"] == {"co_occurs": ["f0", "f2"]}
    assert stored["cross_relationships"] == {"solves": ["p0", "p1"]}
    assert mem.get("f2")["related_typed"] == {"co_occurs": ["f1"]}


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_cost_or_saving_is_refused(mem, raw) -> None:
    value = json.loads(raw)  # json.loads accepts all three
    for entry, path in ((failure("f1", cost=value), "cost"), ({**PATTERN, "saved": value}, "saved")):
        for write in (mem.add, mem.record):
            with pytest.raises(FtlError) as raised:
                write(entry)
            found = violation(raised)
            assert found["path"] == path and "finite" in found["message"]
    assert mem.entries() == []


def test_the_memory_command_answers_a_malformed_map_with_a_validation_error(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "FTL_OUTPUT"}
    entry = json.dumps(failure("f1", related_typed="oops"))
    done = subprocess.run([sys.executable, str(LIB / "memory.py"), "add-failure", "--json", entry],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60)
    data = json.loads(done.stdout)["data"]
    assert done.returncode == 2 and data["error_code"] == "VALIDATION_ERROR", done.stdout
    assert "related_typed" in done.stdout and "Traceback" not in done.stderr


def test_a_label_value_with_a_trailing_newline_is_not_a_series_of_its_own() -> None:
    m = Metrics()
    events = EventMetrics(m)
    events({"event": "TASK_END", "status": "complete"})
    events({"event": "TASK_END", "status": "complete\n"})
    assert m.registry.get_sample_value("ftl_tasks_total", {"status": "complete"}) == 1.0
    assert m.registry.get_sample_value("ftl_tasks_total", {"status": OTHER}) == 1.0
    assert "complete\\n" not in m.render()[0].decode()


@pytest.mark.parametrize("cost", [float("inf"), float("-inf"), float("nan"), -1.0, 0, True, "0.5"])
def test_only_a_finite_positive_cost_is_counted(cost) -> None:
    m = Metrics()
    m.count_agent(cost, None)
    m.count_agent(0.5, None)
    assert m.registry.get_sample_value("ftl_agent_cost_usd_total") == 0.5


def test_the_module_docstring_counts_the_counters_it_defines() -> None:
    from ftl.telemetry import metrics
    m = Metrics()
    count = len({family.name for family in m.registry.collect()})
    words = {4: "Four", 5: "Five", 6: "Six", 7: "Seven", 8: "Eight"}
    assert metrics.__doc__.split("\n\n")[1].startswith(f"{words[count]} counters"), count


@pytest.mark.parametrize("column, raw, expected", [
    ("related_typed", '"oops"', {}),
    ("related_typed", '["f9"]', {}),
    ("related_typed", '{"co_occurs": "f9"}', {"co_occurs": ["f9"]}),
    ("related_typed", '{"co_occurs": [1, "f9", null]}', {"co_occurs": ["f9"]}),
    ("related_typed", "not json", {}),
    ("cross_relationships", '{"solves": "p9"}', {"solves": ["p9"]}),
    ("cross_relationships", "null", {}),
])
def test_rows_stored_malformed_before_the_checks_are_read_and_linked(tmp_path: Path, column, raw,
                                                                     expected) -> None:
    """Entries written before ftl refused malformed maps and infinite costs: reading them, and
    linking them to others, works; names in the old map are kept, what is not a name is not."""
    with Store(tmp_path / "ftl.db") as store:
        mem = MemoryStore(store)
        assert mem.add(failure("f1")) == "added" and mem.add(failure("f2")) == "added"
        assert mem.add(PATTERN) == "added"
        with store._session(write=True) as conn:  # as an older ftl left it
            conn.execute(f"UPDATE memory_entry SET {column} = ?, cost = ? WHERE name = 'f1'",
                         (raw, float("inf")))
        entry = mem.get("f1")
        assert entry[column] == expected and entry["cost"] == 0
        assert mem.add_relationship("f1", "f2") == "added"
        assert mem.add_cross_relationship("f1", "p1") == "added"
        linked = mem.get("f1")
        assert linked["related_typed"].get("co_occurs", [])[-1:] == ["f2"]
        assert linked["cross_relationships"].get("solves", [])[-1:] == ["p1"]
        assert all(isinstance(e["importance"], float) for e in mem.entries())
        assert mem.feedback("f1", helped=True) == "updated"
        assert mem.get("f1")["importance"] == 0.0  # an infinite cost ranks as no value
