"""Tests for ftl.schemas: the committed schemas/ files match the models and accept ftl's inputs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ftl import schemas
from ftl.models import Plan

REPO_SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
REGENERATE = "regenerate with `.venv/bin/python -m ftl.schemas` and commit schemas/"


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((REPO_SCHEMAS / schemas.filename(name)).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("filename", sorted(schemas.generate()))
def test_committed_schema_matches_the_models(filename: str) -> None:
    path = REPO_SCHEMAS / filename
    assert path.is_file(), f"schemas/{filename} is missing; {REGENERATE}"
    committed = json.loads(path.read_text(encoding="utf-8"))
    assert committed == schemas.generate()[filename], f"schemas/{filename} is stale; {REGENERATE}"


def test_registry_and_schema_headers() -> None:
    assert set(schemas.SCHEMAS) == {"plan", "task", "workspace", "build_result", "explorer_result",
                                    "event", "response-v2"}
    for filename, schema in schemas.generate().items():
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"].endswith(filename)
        jsonschema.Draft202012Validator.check_schema(schema)


def test_write_and_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = schemas.write(tmp_path / "out")
    assert sorted(p.name for p in written) == sorted(schemas.generate())
    for path in written:
        assert path.read_text(encoding="utf-8") == schemas.render(schemas.generate()[path.name])
    assert schemas.main([str(tmp_path / "cli")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(schemas.SCHEMAS)
    assert (tmp_path / "cli" / "plan.schema.json").is_file()


PLAN = {
    "_schema_version": "1.0", "objective": "add login", "campaign": "auth",
    "idioms": {"required": ["use pytest"], "forbidden": []},
    "tasks": [
        {"seq": "001", "slug": "spec", "type": "SPEC", "delta": ["tests/test_a.py"],
         "verify": "pytest -q", "depends": "none"},
        {"seq": 2, "slug": "impl", "delta": ["src/a.py"], "verify": "pytest -q", "depends": "001"},
        {"seq": "3", "slug": "check", "type": "VERIFY", "delta": [], "verify": "pytest -q",
         "depends": ["001", 2], "budget": 7, "target_lines": {"src/a.py": "10-40"}},
    ],
}


def test_valid_plan_in_its_input_forms_validates_against_the_schema() -> None:
    Plan.model_validate(PLAN)
    validator("plan").validate(PLAN)
    validator("task").validate(PLAN["tasks"][2])


@pytest.mark.parametrize("mutation", [
    lambda p: p.pop("objective"),
    lambda p: p["tasks"][0].update(budget=0),
    lambda p: p["tasks"][0].update(seq="abc"),
    lambda p: p["tasks"][1].update(depends="001,002"),
    lambda p: p["tasks"][1].update(seq=True),
    lambda p: p.update(tasks=[]),
    lambda p: p["tasks"][2].update(type="DEPLOY"),
])
def test_schema_rejects_what_the_model_rejects(mutation) -> None:
    raw = json.loads(json.dumps(PLAN))
    mutation(raw)
    with pytest.raises(ValidationError):
        Plan.model_validate(raw)
    assert list(validator("plan").iter_errors(raw)), "schema accepted an invalid plan"


def test_unknown_plan_and_task_fields_pass_through_model_and_schema() -> None:
    raw = json.loads(json.dumps(PLAN))
    raw["rationale"] = "FTL planner note"
    raw["tasks"][0]["notes"] = {"why": "kept"}
    plan = Plan.model_validate(raw)
    dumped = plan.model_dump(mode="json", by_alias=True)
    assert dumped["rationale"] == "FTL planner note" and dumped["tasks"][0]["notes"] == {"why": "kept"}
    assert not list(validator("plan").iter_errors(raw))


seq_inputs = st.integers(1, 60).flatmap(
    lambda n: st.sampled_from([n, str(n), f"{n:03d}", f" {n:02d} "]))
depends_inputs = st.one_of(
    st.sampled_from(["none", "", None]), seq_inputs,
    st.lists(st.one_of(seq_inputs, st.sampled_from(["none", None])), max_size=3))
task_inputs = st.fixed_dictionaries(
    {"seq": seq_inputs, "slug": st.from_regex(r"\A[a-z0-9]{1,6}(-[a-z0-9]{1,4}){0,2}\Z"),
     "verify": st.sampled_from(["pytest -q", "make check"])},
    optional={"depends": depends_inputs, "type": st.sampled_from(["SPEC", "BUILD", "VERIFY"]),
              "delta": st.lists(st.sampled_from(["src/a.py", "tests/t.py"]), max_size=2),
              "budget": st.integers(1, 100), "timeout_s": st.floats(0.1, 1e4),
              "builder": st.sampled_from(["shell", "agent", None]), "run": st.none() | st.just("make")})
plan_inputs = st.fixed_dictionaries(
    {"objective": st.text(min_size=1, max_size=10), "tasks": st.lists(task_inputs, min_size=1, max_size=4)},
    optional={"_schema_version": st.just("1.0"), "framework": st.none() | st.just("django"),
              "framework_confidence": st.none() | st.floats(0, 1)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_inputs)
def test_every_plan_the_model_accepts_the_schema_accepts(raw: dict) -> None:
    try:
        Plan.model_validate(raw)
    except ValidationError:
        assume(False)
    errors = [e.message for e in validator("plan").iter_errors(raw)]
    assert not errors, f"schema rejects a plan the model accepts: {errors}"


def test_real_envelopes_and_events_validate_against_their_schemas(tmp_path) -> None:
    from ftl.surfaces import envelope
    from ftl.errors import FtlError
    from ftl.events import EventLog, read_events

    response = validator("response-v2")
    response.validate(envelope.success({"x": 1}, warnings=[envelope.Warning("PARTIAL_FAILURE", "1 of 2")]))
    response.validate(envelope.failure(FtlError("schema_invalid", {"count": 1})))
    bad = envelope.success({})
    bad["meta"]["version"] = "response-v1"
    assert list(response.iter_errors(bad))
    log = EventLog(tmp_path / "e.jsonl", "c-1")
    log.emit("STATE_ENTRY", state="INIT")
    log.emit("TASK_START", task_seq="001", worker="w1")
    log.close()
    event = validator("event")
    for record in read_events(tmp_path / "e.jsonl"):
        event.validate(record)
