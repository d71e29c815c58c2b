"""ftl.plan_rows: the lean registration path agrees with pydantic (ftl.validation + ftl.models).

The lean path may decline any plan (pydantic then judges it), but a plan it accepts must give
exactly the rows pydantic gives, byte for byte, and it must never accept a plan pydantic refuses.
Hypothesis draws plans near the valid ones: every field valid, coercible (``"5"``, ``5.0``),
or invalid, plus extras, idiom objects and graph defects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError

from ftl import dag, plan_rules
from ftl.errors import FtlError
from ftl.models import Idioms, Plan, Task
from ftl.plan_rows import PLAN_FIELDS, TASK_FIELDS, PlanRows, lean_plan_rows, plan_rows
from ftl.store import Store
from ftl.surfaces.envelope import failure
from ftl.validation import parse_plan
from module_probe import run_script

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- strategies

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False), st.text(max_size=6),
                         st.sampled_from(["\ud800", "é\n\x1f\u2028", "1e400"]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=6)

#: Valid values of the optional task fields (pydantic and the lean path both accept them).
VALID = {
    "type": ["BUILD", "SPEC", "VERIFY"], "delta": [[], ["src/a.py"], ["src/a.py", "b.txt"]],
    "creates": [[], ["new.py"]], "budget": [1, 5, 100], "run": [None, "make"],
    "timeout_s": [None, 1, 2.5, 1e308], "preflight": [[], ["ls"]], "verify_source": [None, "tests"],
    "target_lines": [{}, {"a.py": "1-9"}], "builder": [None, "shell", "agent"],
    "isolation": [None, "worktree", "shared"], "resources": [None, {}, {"num_cpus": 2}, {"num_cpus": 0.5}],
}
#: Values pydantic refuses, or accepts only after a coercion (the lean path must decline both).
ODD = {
    "seq": [" 7", "0007", 7.0, True, "x", None, "٣"], "slug": ["Bad", "a--b", "", 5, "x\n"],
    "type": ["build", None, 1], "delta": [["*.py"], ["/abs"], ["../x"], [""], [3], "a.py"],
    "creates": [["a[1].py"]], "verify": [" ", "", 1, None], "budget": [0, 101, "5", 5.0, True, None, 2**70],
    "depends": ["", None, "1,2", 2.0, {"a": 1}, ["none"], [999], "999", ["001", "001"]],
    "timeout_s": [0, -1, "3", True, float("inf"), 10**400], "preflight": [[1], "ls"], "verify_source": [2],
    "target_lines": [{"a.py": 3}, []], "builder": ["robot"], "isolation": ["cloud"],
    "resources": [{"num_cpus": 2000}, {"num_cpus": True}, {"gpus": 1}, {"num_cpus": "2"},
                  {"num_cpus": 10**400}],
}
ODD_HEADER = {
    "objective": ["", 1], "campaign": ["Bad Slug"], "framework": [1],
    "framework_confidence": [1.5, True, "0.5", 10**400], "_schema_version": [1], "schema_version": ["1.0"],
    "idioms": [{"required": [{"text": "no print", "regex": "print"}]}, {"other": []}, "x", {"required": [1]}],
    "tasks": [[], "tasks"],
}


@st.composite
def valid_task(draw, number: int, earlier: list[int]) -> dict:
    seq = draw(st.sampled_from([f"{number:03d}", f"{number:03d}", number, str(number)]))
    chosen = sorted(draw(st.sets(st.sampled_from(earlier), max_size=3))) if earlier else []
    depends = draw(st.sampled_from([
        [f"{n:03d}" for n in chosen] or "none",  # as planners write them: the lean fast path
        [f"{n:03d}" for n in reversed(chosen)], chosen,  # valid, normalised on the way in
        f"{chosen[0]:03d}" if chosen else "none", [] if not chosen else [f"{chosen[0]}"]]))
    task = {"seq": seq, "slug": draw(st.sampled_from(["add-login", "a", f"task-{number}"])),
            "verify": draw(st.sampled_from(["true", "pytest -q"])), "depends": depends}
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=4, unique=True)):
        task[name] = draw(st.sampled_from(VALID[name]))
    for key in draw(st.lists(st.sampled_from(["rationale", "_note", "model_dump"]), max_size=2, unique=True)):
        task[key] = draw(json_values)
    return task


@st.composite
def plans(draw) -> object:
    """A valid plan, then up to two mutations: an odd field value, a missing required field, a
    dependency that closes a cycle, points at itself or at no task, or a duplicate seq."""
    numbers = sorted(draw(st.sets(st.integers(1, 1200), min_size=1, max_size=6)))
    tasks = [draw(valid_task(n, numbers[:i])) for i, n in enumerate(numbers)]
    plan: dict = {"objective": "Ship it"}
    for name, values in (("campaign", [None, "auth-rework"]), ("framework", [None, "fastapi"]),
                         ("framework_confidence", [None, 0, 0.5, 1]), ("_schema_version", ["1.0", "2"]),
                         ("idioms", [{"required": ["use x"]}, {"forbidden": []},
                                     {"required": [], "forbidden": ["print"]}])):
        if draw(st.booleans()):
            plan[name] = draw(st.sampled_from(values))
    plan["tasks"] = tasks
    for key in draw(st.lists(st.sampled_from(["notes", "_extra", "revision"]), max_size=2, unique=True)):
        plan[key] = draw(json_values)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        task = draw(st.sampled_from(tasks))
        mutation = draw(st.sampled_from(["field", "field", "missing", "header", "cycle", "self",
                                         "dangling", "duplicate"]))
        if mutation == "field":
            name = draw(st.sampled_from(sorted(ODD)))
            task[name] = draw(st.sampled_from(ODD[name]))
        elif mutation == "missing":
            task.pop(draw(st.sampled_from(["seq", "slug", "verify"])), None)
        elif mutation == "header":
            name = draw(st.sampled_from(sorted(ODD_HEADER)))
            plan[name] = draw(st.sampled_from(ODD_HEADER[name]))
        elif mutation == "cycle":
            tasks[0]["depends"] = [f"{numbers[-1]:03d}"]
        elif mutation == "self":
            task["depends"] = [task.get("seq")]
        elif mutation == "dangling":
            task["depends"] = ["1300"]
        else:
            tasks.append(dict(task))
    return plan if draw(st.integers(0, 30)) else draw(json_values)


def pydantic_rows(raw: object) -> PlanRows | FtlError | None:
    """What the pydantic path gives: the rows, its error, or None when the plan is valid but
    its text cannot be written (pydantic refuses to serialise a lone surrogate)."""
    try:
        plan = parse_plan(raw)
    except FtlError as error:
        return error
    try:
        return PlanRows.from_plan(plan)
    except PydanticSerializationError:
        return None


# --------------------------------------------------------------------------- agreement

@SETTINGS
@given(plans())
@example({"objective": "x", "tasks": [{"seq": "001", "slug": "a", "verify": "true", "depends": "none"},
                                      {"seq": 2, "slug": "b", "verify": "true", "depends": "1"}]})
@example({"objective": "x", "tasks": [{"seq": "001", "slug": "a", "verify": "true", "budget": "5"}]})
@example({"objective": "x", "tasks": [{"seq": "001", "slug": "a", "verify": "true", "depends": ["002"]},
                                      {"seq": "002", "slug": "b", "verify": "true", "depends": ["001"]}]})
def test_lean_rows_equal_pydantic_rows_or_the_lean_path_declines(raw: object) -> None:
    lean = lean_plan_rows(raw)
    full = pydantic_rows(raw)
    if lean is not None:
        assert isinstance(full, PlanRows), f"lean accepted a plan pydantic refuses: {full}"
        assert lean == full
    if isinstance(full, FtlError):  # every refusal keeps pydantic's structured error
        with pytest.raises(FtlError) as caught:
            plan_rows(raw)
        assert (caught.value.error_type, caught.value.details) == (full.error_type, full.details)
    elif isinstance(full, PlanRows):
        assert plan_rows(raw) == full


def big_plan(tasks: int) -> dict:
    """The shape bench/run_all.py registers (seqs past 999 included)."""
    items = [{"seq": f"{i:03d}", "slug": f"task-{i}", "type": "BUILD", "delta": [], "verify": "true",
              "budget": 1, "depends": [f"{d:03d}" for d in (i - 2, i - 1) if d >= 1] or "none"}
             for i in range(1, tasks + 1)]
    return {"objective": "big plan", "tasks": items}


def test_a_planner_written_plan_takes_the_lean_path() -> None:
    # The 40 MiB figure of issue 11 depends on it: a plan in the usual shape must not fall back.
    raw = big_plan(1200)
    rows = lean_plan_rows(raw)
    assert rows is not None and rows == PlanRows.from_plan(parse_plan(raw))
    assert [row.seq for row in rows.tasks][998:1001] == ["999", "1000", "1001"]
    # its graph was checked on the way; rows made from a model are checked by the store
    assert rows.graph_checked and not PlanRows.from_plan(parse_plan(raw)).graph_checked


def test_field_tables_match_the_models() -> None:
    # Names and order (the order of model_dump_json) and defaults of every field.
    assert list(TASK_FIELDS) == list(Task.model_fields)
    for name, info in Task.model_fields.items():
        default = TASK_FIELDS[name][0]
        if info.is_required():
            assert default is TASK_FIELDS["seq"][0], name
        else:
            assert default == info.get_default(call_default_factory=True), name
    plan_fields = {info.alias or name: info for name, info in Plan.model_fields.items() if name != "tasks"}
    assert list(PLAN_FIELDS) == list(plan_fields)
    for name, info in plan_fields.items():
        if not info.is_required():
            default = info.get_default(call_default_factory=True)
            assert PLAN_FIELDS[name][0] == (default.model_dump() if isinstance(default, Idioms) else default)
    assert list(Plan.model_fields)[-1] == "tasks"  # the lean plan text puts tasks after the header


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789 x", max_size=8), st.integers(-5, 2_000_000)))
def test_canonical_seqs_are_the_fixed_points_of_normalize_seq(value: object) -> None:
    try:
        normal = plan_rules.normalize_seq(value)
    except ValueError:
        normal = None
    if isinstance(value, str):
        assert bool(plan_rules.CANONICAL_SEQ_RE.fullmatch(value)) == (normal == value)
    if normal is not None:
        assert plan_rules.CANONICAL_SEQ_RE.fullmatch(normal)


# --------------------------------------------------------------------------- the store

def test_the_store_writes_the_same_rows_from_lean_rows_and_from_a_plan(tmp_path: Path) -> None:
    raw = big_plan(30)
    raw["tasks"][3]["rationale"] = {"why": "ordering", "weight": 0.5}
    written = []
    for name, plan in (("lean", lean_plan_rows(raw)), ("model", parse_plan(raw))):
        assert plan is not None
        with Store.for_repo(tmp_path / name) as store:
            cid = store.create_campaign("rows")["campaign_id"]
            assert store.add_tasks(cid, plan) == [f"{i:03d}" for i in range(1, 31)]
            conn = store._conn
            written.append((
                conn.execute("SELECT plan FROM plan").fetchall()[0][0],
                [tuple(r) for r in conn.execute("SELECT seq, slug, type, depends, status, attempts, "
                                                "blocked_by, spec FROM task ORDER BY seq")]))
            assert store.get_plan(cid) == parse_plan(raw)
    assert written[0] == written[1]


def test_the_same_plan_with_extras_in_another_order_is_not_saved_twice(tmp_path: Path) -> None:
    raw = {"objective": "x", "notes": {"a": 1, "b": 2}, "revision": 3,
           "tasks": [{"seq": "001", "slug": "a", "verify": "true"}]}
    reordered = {"objective": "x", "revision": 3, "notes": {"b": 2, "a": 1},
                 "tasks": [{"seq": 1, "slug": "a", "verify": "true"}]}
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x", plan=parse_plan(raw))["campaign_id"]
        store.add_tasks(cid, plan_rows(reordered))
        assert store.plan_versions(cid) == [1]
        assert store.latest_plan_fields(cid, ("objective", "campaign")) == {"objective": "x", "campaign": None}


def test_a_bad_plan_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["campaign_id"]
        rows = PlanRows.from_plan(Plan.model_validate(
            {"objective": "x", "tasks": [{"seq": "001", "slug": "a", "verify": "true", "depends": ["002"]},
                                         {"seq": "002", "slug": "b", "verify": "true", "depends": ["001"]}]}))
        with pytest.raises(FtlError) as caught:
            store.add_tasks(cid, rows)
        assert caught.value.error_type == "cycle_detected"
        assert store.tasks(cid) == [] and store.plan_versions(cid) == []
        assert store._conn.execute("PRAGMA ignore_check_constraints").fetchone()[0] == 0


# --------------------------------------------------------------------------- the command

SCRIPT = Path(__file__).resolve().parent.parent / "lib" / "campaign.py"


def _add_tasks(repo: Path, plan: object) -> tuple[dict, list[str]]:
    subprocess.run([sys.executable, str(SCRIPT), "create", "lean"], cwd=repo, check=True, capture_output=True)
    done, report = run_script(SCRIPT, "add-tasks", cwd=repo, stdin=json.dumps(plan))
    return json.loads(done.stdout), report["modules"]


def test_add_tasks_registers_a_usual_plan_without_loading_pydantic(tmp_path: Path) -> None:
    envelope, modules = _add_tasks(tmp_path, big_plan(5))
    assert envelope["success"] and envelope["data"]["seqs"] == ["001", "002", "003", "004", "005"]
    assert not [m for m in modules if m.split(".")[0] in ("pydantic", "pydantic_core", "logging")
                or m == "ftl.models"]  # a light command: logging too is set up only on failure


def test_add_tasks_reports_pydantics_violations_for_a_plan_the_lean_path_declines(tmp_path: Path) -> None:
    plan = big_plan(3)
    plan["tasks"][1]["budget"] = "lots"
    envelope, modules = _add_tasks(tmp_path, plan)
    assert not envelope["success"] and "pydantic" in modules
    details = envelope["data"]["details"]
    assert [v["path"] for v in details["violations"]] == ["$.tasks[1].budget"]
    with pytest.raises(FtlError) as caught:
        parse_plan(plan, source="plan on standard input")
    expected = json.loads(json.dumps(failure(caught.value)))  # the pydantic path's error, whole
    assert {k: v for k, v in envelope.items() if k != "meta"} == {k: v for k, v in expected.items() if k != "meta"}


def _nested(levels: int) -> object:
    value: object = "leaf"
    for level in range(levels):
        value = {"a": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize("where", ["task", "plan"])
def test_extras_nest_up_to_the_limit_and_no_further_on_both_paths(where: str) -> None:
    """Both paths take an extra field nested `MAX_EXTRA_DEPTH` levels and refuse one level
    more with the same schema_invalid; before, 300 levels passed validation and then failed as
    an internal error when the specs were written."""
    limit = plan_rules.MAX_EXTRA_DEPTH
    for levels, accepted in ((limit, True), (limit + 1, False), (1000, False)):
        plan = big_plan(2)
        (plan["tasks"][1] if where == "task" else plan)["notes"] = _nested(levels)
        lean, full = lean_plan_rows(plan), pydantic_rows(plan)
        if accepted:
            assert isinstance(full, PlanRows) and lean == full
            continue
        assert lean is None and isinstance(full, FtlError) and full.error_type == "schema_invalid"
        [violation] = full.details["violations"]
        assert violation["path"] == ("$.tasks[1]" if where == "task" else "$")
        assert f"'notes' nests objects and arrays deeper than {limit} levels" in violation["message"]
        if levels < 200:  # a plan saved before the limit existed still loads from the store
            assert Plan.model_validate_json(json.dumps(plan)).tasks[1].seq == "002"


def test_add_tasks_answers_a_plan_nested_1000_deep_with_its_violation(tmp_path: Path) -> None:
    """orjson reads stdin up to 1024 levels (json stopped near 970): the depth rule answers."""
    plan = big_plan(2)
    plan["tasks"][0]["notes"] = "DEEP"
    text = json.dumps(plan).replace('"DEEP"', "[" * 1000 + '"leaf"' + "]" * 1000)  # past json.dumps' recursion
    subprocess.run([sys.executable, str(SCRIPT), "create", "lean"], cwd=tmp_path, check=True, capture_output=True)
    done, _ = run_script(SCRIPT, "add-tasks", cwd=tmp_path, stdin=text)
    envelope = json.loads(done.stdout)
    assert envelope["data"]["ftl_error_type"] == "schema_invalid", envelope
    assert "deeper than" in envelope["data"]["details"]["violations"][0]["message"]


# --------------------------------------------------------------------------- dag fast paths

def test_ready_set_still_refuses_an_unknown_status_of_a_dependency_it_reaches() -> None:
    with pytest.raises(ValueError, match="'done' is not a valid task status"):
        dag.ready_set({"002": ["001"]}, {"001": "done"})
    assert dag.ready_set({"002": ["003", "001"], "003": []}, {"001": "done"}) == ["003"]  # never reached


_SEQ_LIKE = st.one_of(st.from_regex(r"[0-9]{1,7}", fullmatch=True), st.text(alphabet="0123456789,\n x", max_size=8))
_SLUG_LIKE = st.one_of(st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*\n?", fullmatch=True),
                       st.text(alphabet="ab09-,\nA_ ", max_size=8))


@settings(max_examples=400, deadline=None)
@given(st.lists(_SEQ_LIKE, max_size=6), st.lists(_SLUG_LIKE, max_size=6))
def test_column_regex_checks_agree_with_the_rules_one_value_at_a_time(seqs: list[str], slugs: list[str]) -> None:
    # The joined-column checks must accept exactly the columns whose every value passes the rule
    # of plan_rules (commas inside a value, a trailing newline, empty columns included).
    from ftl import plan_rows as module

    assert module._all_canonical_seqs(seqs) == all(map(plan_rules.CANONICAL_SEQ_RE.fullmatch, seqs))
    assert module._all_slugs(slugs) == all(map(plan_rules.SLUG_RE.match, slugs))
