"""Tests for ftl.validation: every violation at once, graph checks, file loading, no tracebacks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl.errors import FtlError
from ftl.models import Plan
from ftl.validation import json_path, load_plan_file, parse_plan

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def task(seq, slug: str, depends="none", **extra) -> dict:
    return {"seq": seq, "slug": slug, "delta": [f"src/{slug}.py"], "verify": "pytest -q",
            "depends": depends, **extra}


def plan(*tasks: dict, **extra) -> dict:
    return {"_schema_version": "1.0", "objective": "add login", "campaign": "auth",
            "tasks": list(tasks), **extra}


VALID = plan(task("001", "spec-login", type="SPEC"), task("002", "impl-login", "001"),
             task("003", "verify-login", ["001", "002"], type="VERIFY"))


def violations_of(raw: object) -> tuple[str, list[dict]]:
    with pytest.raises(FtlError) as info:
        parse_plan(raw)
    return info.value.error_type, info.value.details["violations"]


def test_valid_plan_parses_and_normalises() -> None:
    parsed = parse_plan(VALID)
    assert isinstance(parsed, Plan)
    assert [t.seq for t in parsed.tasks] == ["001", "002", "003"]
    assert parsed.task("3").depends == ["001", "002"]


def test_one_and_001_are_the_same_task() -> None:
    raw = plan(task(1, "a"), task("2", "b", "1"), task("003", "c", [1, "002"]))
    parsed = parse_plan(raw)
    assert [t.seq for t in parsed.tasks] == ["001", "002", "003"]
    assert parsed.task(3).depends == ["001", "002"]


def test_a_task_is_found_by_its_seq_in_any_form_and_after_the_tasks_are_replaced() -> None:
    parsed = parse_plan(plan(*(task(i, f"t-{i}", [i - 1] if i > 1 else "none") for i in range(1, 2001))))
    assert [parsed.task(seq).slug for seq in (1, "2", "0003", 2000)] == ["t-1", "t-2", "t-3", "t-2000"]
    with pytest.raises(KeyError, match="2001"):
        parsed.task(2001)
    parsed.tasks = parsed.tasks[:1]  # the index follows the list it was built from
    with pytest.raises(KeyError, match="002"):
        parsed.task(2)
    assert parsed.task(1).slug == "t-1"


def test_every_violation_is_reported_at_once_with_json_paths() -> None:
    raw = plan(task("001", "Bad Slug"), task("abc", "b"), task("003", "c", ["009"]),
               task("4", "d", budget=0), bogus=True)  # unknown fields pass through (FTL compat)
    del raw["objective"]
    error_type, violations = violations_of(raw)
    assert error_type == "schema_invalid"
    paths = {v["path"] for v in violations}
    assert paths == {"$.objective", "$.tasks[0].slug", "$.tasks[1].seq",
                     "$.tasks[2].depends[0]", "$.tasks[3].budget"}
    for violation in violations:
        assert set(violation) == {"path", "message", "fix"}
        assert violation["message"] and violation["fix"]
    by_path = {v["path"]: v for v in violations}
    assert "objective" in by_path["$.objective"]["fix"]
    assert ">= 1" in by_path["$.tasks[3].budget"]["fix"]
    with pytest.raises(FtlError) as info:
        parse_plan(raw)
    assert info.value.details["count"] == len(violations) == 5
    assert "5 violation(s)" in info.value.message
    json.dumps(info.value.details)  # envelopes serialise details as JSON


def test_dangling_dependency_names_the_missing_seq_and_the_valid_ones() -> None:
    _, violations = violations_of(plan(task("001", "a"), task("002", "b", "7")))
    assert len(violations) == 1
    assert violations[0]["path"] == "$.tasks[1].depends"
    assert "depends on 007" in violations[0]["message"]
    assert "valid seqs: 001, 002" in violations[0]["message"]
    assert "007" in violations[0]["fix"]


def test_duplicate_seqs_name_both_paths() -> None:
    _, violations = violations_of(plan(task("1", "a"), task("002", "b"), task("001", "c")))
    assert len(violations) == 1
    assert violations[0]["path"] == "$.tasks[2].seq"
    assert "$.tasks[0].seq" in violations[0]["message"] and "$.tasks[2].seq" in violations[0]["message"]


def test_only_a_cycle_raises_cycle_detected_with_its_path() -> None:
    raw = plan(task("001", "a", "003"), task("002", "b"), task("003", "c", ["002", "1"]))
    with pytest.raises(FtlError) as info:
        parse_plan(raw)
    assert info.value.error_type == "cycle_detected"
    assert info.value.details["cycle"] == "001 -> 003 -> 001"
    assert info.value.safe_details()["cycle"] == "001 -> 003 -> 001"
    [violation] = info.value.details["violations"]
    assert violation["message"] == "dependency cycle: 001 -> 003 -> 001"
    assert violation["path"] == "$.tasks[0].depends"


def test_cycle_among_other_errors_is_one_of_the_schema_violations() -> None:
    raw = plan(task("001", "a", "002"), task("002", "B", "001"))
    error_type, violations = violations_of(raw)
    assert error_type == "schema_invalid"
    messages = [v["message"] for v in violations]
    assert "dependency cycle: 001 -> 002 -> 001" in messages
    assert any(v["path"] == "$.tasks[1].slug" for v in violations)


def test_self_dependency_is_reported_once_even_beside_other_errors() -> None:
    _, violations = violations_of(plan(task("001", "a", ["1"])))
    assert violations == [{"path": "$.tasks[0].depends[0]", "message": "task 001 depends on itself",
                           "fix": "remove the task's own seq from its depends"}]
    _, violations = violations_of(plan(task("001", "A", "001")))
    assert sorted(v["path"] for v in violations) == ["$.tasks[0].depends", "$.tasks[0].slug"]


def test_graph_checks_run_on_tasks_with_other_errors() -> None:
    # Task 0 has a bad slug, yet its dangling dependency is reported in the same pass.
    _, violations = violations_of(plan(task("001", "Bad", "005")))
    assert {v["path"] for v in violations} == {"$.tasks[0].slug", "$.tasks[0].depends"}


@pytest.mark.parametrize(("raw", "fragment"), [
    ([], "an array"), ("plan", "a string"), (3, "a number"), (None, "null"), (True, "a boolean"),
])
def test_non_object_input(raw: object, fragment: str) -> None:
    error_type, violations = violations_of(raw)
    assert error_type == "schema_invalid"
    assert violations[0]["path"] == "$" and fragment in violations[0]["message"]


def test_json_path_rendering() -> None:
    assert json_path(("tasks", 2, "seq")) == "$.tasks[2].seq"
    assert json_path(("tasks", 0, "target_lines", "src/a.py")) == '$.tasks[0].target_lines["src/a.py"]'
    assert json_path(()) == "$"


# --------------------------------------------------------------------------- files

def test_load_plan_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(VALID), encoding="utf-8")
    assert load_plan_file(path).objective == "add login"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(VALID).encode())  # a BOM is tolerated
    assert len(load_plan_file(path).tasks) == 3


def test_missing_file_names_only_the_file(tmp_path: Path) -> None:
    with pytest.raises(FtlError) as info:
        load_plan_file(tmp_path / "nope.json")
    assert info.value.error_type == "not_found"
    assert info.value.details == {"what": "plan file nope.json"}
    assert str(tmp_path) not in info.value.message
    with pytest.raises(FtlError) as info:
        load_plan_file(tmp_path)  # a directory cannot be read either
    assert info.value.error_type == "not_found"


def test_bad_json_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{\n  "objective": "x",\n  "tasks": [,]\n}\n', encoding="utf-8")
    with pytest.raises(FtlError) as info:
        load_plan_file(path)
    assert info.value.error_type == "schema_invalid"
    [violation] = info.value.details["violations"]
    assert (violation["line"], violation["column"]) == (3, 13)
    assert "line 3, column 13" in violation["message"]
    assert str(tmp_path) not in json.dumps(info.value.details)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(b'{"objective": "\xff"}')
    with pytest.raises(FtlError) as info:
        load_plan_file(path)
    assert info.value.error_type == "schema_invalid"
    assert info.value.details["violations"][0]["column"] == 16


def test_file_errors_carry_plan_violations(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan(task("001", "a", "002"))), encoding="utf-8")
    with pytest.raises(FtlError) as info:
        load_plan_file(path)
    assert "plan file p.json" in info.value.message


# --------------------------------------------------------------------------- never a traceback

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 2_000_000) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(["none", "001", "1", "", "a-b", "*.py", "../x"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["seq", "slug", "depends", "verify", "tasks", "objective",
                                       "delta", "budget", "x"]) | st.text(max_size=4),
                      children, max_size=5),
    max_leaves=20)


def _assert_plan_or_known_error(raw: object) -> None:
    try:
        parsed = parse_plan(raw)
    except FtlError as exc:
        assert exc.error_type in {"schema_invalid", "cycle_detected"}
        violations = exc.details["violations"]
        assert violations, "an error always names at least one violation"
        for violation in violations:
            assert violation["path"].startswith("$") and violation["message"] and violation["fix"]
        json.dumps(exc.details)
    else:
        assert isinstance(parsed, Plan)


@SETTINGS
@given(json_values)
def test_arbitrary_json_never_raises_anything_else(raw: object) -> None:
    _assert_plan_or_known_error(raw)


def _locations(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _locations(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _locations(child, prefix + (index,))


@SETTINGS
@given(st.data())
def test_mutated_valid_plans_never_raise_anything_else(data) -> None:
    raw = copy.deepcopy(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        locations = [loc for loc in _locations(raw) if loc]
        if not locations:
            break
        loc = data.draw(st.sampled_from(locations))
        parent = raw
        for key in loc[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[loc[-1]]
        else:
            parent[loc[-1]] = data.draw(json_values)
    _assert_plan_or_known_error(raw)
