"""Review 13's defects in the FTL drop-in scripts (lib/) and in plan parsing, each pinned by a test
that failed before its fix: FTL's TASK flow getting no workspace, workspaces after a re-plan
merge, REGISTER saving a duplicate plan version, malformed planner plans, slugs ending in a
newline, concurrent `workspace create`, merge error texts, plan ids past SQLite's INTEGER,
non-finite numbers and non-ASCII digits, and the arguments FTL accepted.

The scripts run in process (click's CliRunner, ``standalone_mode=False``: a command returns its
`Reply` or raises), on a store set up directly; the rules they share are tested as functions.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from ftl.errors import FtlError
from ftl.plan_rows import lean_plan_rows, plan_rows
from ftl.plan_rules import normalize_seq
from ftl.server.tools.planner import parse_planner_output
from ftl.store import Store
from ftl.validation import parse_plan

LIB = Path(__file__).resolve().parent.parent / "lib"
sys.path.insert(0, str(LIB))

import _campaign  # noqa: E402 - lib/ is on sys.path only from here
import _common  # noqa: E402


def _script(name: str) -> Any:
    """The commands module of ``lib/NAME.py`` (``lib/_NAME.py``: the script only launches it)."""
    return importlib.import_module(f"_{name}")


WORKSPACE, PLAN, ORCHESTRATION, EXPLORATION, DECISION = (
    _script(n) for n in ("workspace", "plan", "orchestration", "exploration", "decision_parser"))


def invoke(group: click.Group, repo: Path, *args: str, stdin: str | None = None) -> Any:
    """Run one command of a lib script in process; its `Reply`, or the exception it raised."""
    result = CliRunner().invoke(group, ["--repo", str(repo), *args], input=stdin, standalone_mode=False)
    _common._detach_repo_logs()
    return result.exception if result.exception is not None else result.return_value


def task(seq: str, depends: Any = "none", **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "slug": f"task-{seq}", "verify": "true", "depends": depends, **extra}


PLAN3 = {"objective": "ship the parser", "framework": "none", "rationale": "three independent parts",
         "tasks": [task("001"), task("002"), task("003")]}


def new_campaign(repo: Path, plan: dict | None = None, *, register: bool = False) -> str:
    """An active campaign with ``plan`` saved as version 1 (``plan.py write``), its tasks
    registered only with ``register``."""
    with Store.for_repo(repo) as store:
        cid = store.create_campaign("ship the parser")["campaign_id"]
        if plan is not None:
            store.save_plan(cid, parse_plan(plan))
            if register:
                store.add_tasks(cid, parse_plan(plan))
    return cid


def store_of(repo: Path) -> Store:
    return Store.for_repo(repo)


# --------------------------------------------------------------------------- 1. TASK flow

def test_create_without_task_registers_the_plan_then_starts_every_ready_task(tmp_path: Path) -> None:
    cid = new_campaign(tmp_path, PLAN3)  # FTL's TASK flow: plan.py write, then workspace create
    reply = invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1")
    assert [w["seq"] for w in reply.data["created"]] == ["001", "002", "003"]
    assert reply.data["skipped"] == [] and not reply.warnings
    with store_of(tmp_path) as store:
        assert {t["status"] for t in store.tasks(cid)} == {"running"}
        assert store.plan_versions(cid) == [1]  # registering the same plan saves no new version


# --------------------------------------------------------------------------- 2. after a merge

def test_create_after_a_merge_builds_from_the_tasks_current_specs(tmp_path: Path) -> None:
    cid = new_campaign(tmp_path, PLAN3, register=True)
    invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "001")
    invoke(WORKSPACE.cli, tmp_path, "block", "001", "--reason", "wrong test")
    revision = tmp_path / "revised.json"
    revision.write_text(json.dumps({"tasks": [task("001", verify="pytest tests/test_new.py"),
                                              task("004", "002")]}), encoding="utf-8")
    merged = invoke(_campaign.cli, tmp_path, "merge-revised-plan", str(revision))
    assert (merged.data["merged"], merged.data["added"]) == (1, 1)

    # FTL's EXECUTE keeps passing the plan id it started with.
    revised = invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "001")
    (workspace,) = revised.data["created"]
    assert (workspace["verify"], workspace["verify_source"], workspace["attempt"]) == (
        "pytest tests/test_new.py", "tests/test_new.py", 2)
    assert [w.code for w in revised.warnings] == ["STALE_CACHE"]
    invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "002")
    invoke(WORKSPACE.cli, tmp_path, "complete", "002", "--delivered", "done")
    added = invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "004")
    assert [w["workspace_id"] for w in added.data["created"]] == ["004-task-004"]
    assert added.data["created"][0]["lineage"]["parent"] == "002-task-002"
    with store_of(tmp_path) as store:
        assert store.task(cid, "004")["status"] == "running"


def test_create_of_a_seq_the_campaign_lacks_is_not_found(tmp_path: Path) -> None:
    new_campaign(tmp_path, PLAN3, register=True)
    error = invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "009")
    assert isinstance(error, FtlError) and error.error_type == "not_found"
    assert "009" in error.message


# --------------------------------------------------------------------------- 3. REGISTER

def test_register_of_ftls_plan_record_saves_no_duplicate_and_keeps_extras(tmp_path: Path) -> None:
    cid = new_campaign(tmp_path, {**PLAN3, "campaign": "parser", "framework_confidence": 0.7})
    record = invoke(PLAN.cli, tmp_path, "read", "--id", "1").ftl  # what FTL mode prints
    assert "rationale" not in record and record["id"] == 1
    reply = invoke(_campaign.cli, tmp_path, "add-tasks", stdin=json.dumps(record, indent=2))
    assert reply.data["plan_version"] == 1
    with store_of(tmp_path) as store:
        assert store.plan_versions(cid) == [1]
        assert store.get_plan(cid, 1).model_extra == {"rationale": "three independent parts"}
    listed = invoke(PLAN.cli, tmp_path, "list").ftl
    assert [(p["id"], p["status"]) for p in listed] == [(1, "active")]


def test_register_of_another_plan_inherits_no_extra_field(tmp_path: Path) -> None:
    cid = new_campaign(tmp_path, PLAN3)
    other = {"objective": "ship the parser", "tasks": [task("001"), task("002")]}
    reply = invoke(_campaign.cli, tmp_path, "add-tasks", stdin=json.dumps(other))
    assert reply.data["plan_version"] == 2
    with store_of(tmp_path) as store:
        assert store.get_plan(cid, 2).model_extra == {}


# --------------------------------------------------------------------------- 4. planner answers

@pytest.mark.parametrize("text, errors", [
    ('Here is the plan.\n\n```json\n{"objective": "x", "tasks": "no"}\n```\n', ["$.tasks: "]),
    ('### Confidence: PROCEED\n\n```json\n{"objective": "x"}\n```\n', ["$.tasks: Field required"]),
    ('{"objective": "x", "tasks": "no"}', ["$.tasks: "]),
    ('{"decision": "PROCEED", "plan": {"objective": "x"}}', ["$.tasks: Field required"]),
])
def test_a_malformed_plan_is_returned_with_its_violations(text: str, errors: list[str]) -> None:
    result = DECISION.decide(text)
    assert result["decision"] == "PROCEED" and result["plan_json"]["objective"] == "x"
    assert result["validation"]["valid"] is False
    assert [e[:len(p)] for e, p in zip(result["validation"]["errors"], errors)] == errors


def test_a_malformed_plan_is_kept_apart_from_the_plan_and_leaves_the_decision() -> None:
    answer = parse_planner_output('```json\n{"objective": "x", "tasks": "no"}\n```')
    assert "plan" not in answer and answer["plan_attempt"] == {"objective": "x", "tasks": "no"}
    assert answer["decision"] == "UNKNOWN" and "plan-attempt" in answer["markers"]
    code = parse_planner_output('```python\n{"objective": "x"}\n```')  # code, not a plan
    assert "plan_attempt" not in code and DECISION.decide('```python\n{"a": 1}\n```')["decision"] == "UNKNOWN"
    asked = DECISION.decide('## Confidence: CLARIFY\n1. Which db?\n```json\n{"objective": "x"}\n```')
    assert (asked["decision"], asked["questions"], "plan_json" in asked) == ("CLARIFY", ["Which db?"], False)


# --------------------------------------------------------------------------- 5. slugs

def test_a_slug_ending_in_a_newline_is_refused_on_both_paths(tmp_path: Path) -> None:
    raw = {"objective": "o", "tasks": [task("001") | {"slug": "add-login\n"}]}
    assert lean_plan_rows(raw) is None
    for check in (parse_plan, lambda r: plan_rows(r, source="plan")):
        with pytest.raises(FtlError) as caught:
            check(raw)
        assert caught.value.details["violations"][0]["path"] == "$.tasks[0].slug"
    cid = new_campaign(tmp_path)
    error = invoke(_campaign.cli, tmp_path, "add-tasks", stdin=json.dumps(raw))
    assert isinstance(error, FtlError) and error.error_type == "schema_invalid"
    with store_of(tmp_path) as store:
        assert store.tasks(cid) == []


# --------------------------------------------------------------------------- 6. concurrent create

def _create_racing_another(repo: Path, monkeypatch, step: str) -> tuple[Any, Any]:
    """``workspace create --task 001``, with another such call run to its end just before this
    one's ``Store.<step>`` (the race two create processes run). Returns (mine, theirs)."""
    original = getattr(Store, step)
    others: list[Any] = []

    def after_another_call(self, *args, **kwargs):
        if not others:
            others.append(None)
            others[0] = invoke(WORKSPACE.cli, repo, "create", "--plan-id", "1", "--task", "001")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Store, step, after_another_call)
    mine = invoke(WORKSPACE.cli, repo, "create", "--plan-id", "1", "--task", "001")
    assert not isinstance(mine, Exception), mine
    return mine, others[0]


def test_concurrent_creates_of_one_task_both_get_the_one_attempt(tmp_path: Path, monkeypatch) -> None:
    """The other call records its workspace between this call's read and its write (the race
    two `workspace create` processes run); both return attempt 1, recorded once."""
    cid = new_campaign(tmp_path, PLAN3, register=True)
    mine, theirs = _create_racing_another(tmp_path, monkeypatch, "record_workspace")
    assert [(w["workspace_id"], w["attempt"]) for w in mine.data["created"]] == \
           [(w["workspace_id"], w["attempt"]) for w in theirs.data["created"]] == [("001-task-001", 1)]
    with store_of(tmp_path) as store:
        assert len(store.workspaces(cid, seq="001")) == 1 and store.task(cid, "001")["attempts"] == 1


def test_a_create_that_loses_the_start_to_another_returns_its_attempt(tmp_path: Path, monkeypatch) -> None:
    cid = new_campaign(tmp_path, PLAN3, register=True)
    original = Store.transition_task
    others: list[Any] = []

    def start_after_another_call(self, campaign_id, seq, to, **kwargs):
        if to == "running" and not others:
            others.append(None)
            others[0] = invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "001")
        return original(self, campaign_id, seq, to, **kwargs)

    monkeypatch.setattr(Store, "transition_task", start_after_another_call)
    mine = invoke(WORKSPACE.cli, tmp_path, "create", "--plan-id", "1", "--task", "001")
    assert not isinstance(mine, Exception), mine
    assert mine.data["created"][0]["workspace_id"] == others[0].data["created"][0]["workspace_id"]
    with store_of(tmp_path) as store:
        assert len(store.workspaces(cid, seq="001")) == 1 and store.task(cid, "001")["attempts"] == 1


# --------------------------------------------------------------------------- 7, 8. merge errors

def test_a_revisions_dangling_dependency_names_the_campaigns_seqs_as_valid() -> None:
    with pytest.raises(FtlError) as caught:
        parse_plan({"objective": "o", "tasks": [task("004", "009")]}, known_seqs={"001", "002"})
    message = caught.value.details["violations"][0]["message"]
    assert message.endswith("valid seqs: 001, 002, 004") and "plan or the campaign" in message


def test_ftl_mode_merge_errors_name_the_first_violation(tmp_path: Path) -> None:
    new_campaign(tmp_path, PLAN3, register=True)
    revision = tmp_path / "revised.json"
    revision.write_text(json.dumps({"tasks": [task("004") | {"slug": "Bad Slug"}, task("005", "009")]}),
                        encoding="utf-8")
    error = invoke(_campaign.cli, tmp_path, "merge-revised-plan", str(revision))
    text = error.ftl_payload["error"]
    assert text.startswith("The plan file revised.json does not match its schema (2 violation(s)). First: ")
    assert "$.tasks[0].slug: slug must be kebab-case" in text and text.endswith("(and 1 more)")
    assert error.ftl_payload["merged"] == 0 and error.ftl_exit == 0


def test_a_cycle_through_existing_tasks_names_the_dependency_that_closes_it(tmp_path: Path) -> None:
    cid = new_campaign(tmp_path, {"objective": "o", "tasks": [task("001"), task("002", "001")]}, register=True)
    with store_of(tmp_path) as store, pytest.raises(FtlError) as caught:
        store.merge_revised_plan(cid, parse_plan({"objective": "o", "tasks": [task("001", "002")]},
                                                 known_seqs={"002"}), max_new_tasks=5)
    assert caught.value.error_type == "cycle_detected"
    assert caught.value.details["violations"][0]["path"] == "tasks[seq=001].depends"


# --------------------------------------------------------------------------- 9. plan ids

@pytest.mark.parametrize("group, args", [
    (PLAN.cli, ("read", "--id")), (PLAN.cli, ("mark-executed", "--id")),
    (WORKSPACE.cli, ("create", "--plan-id"))])
def test_a_plan_id_past_sqlites_integer_is_a_usage_error(tmp_path: Path, group, args) -> None:
    new_campaign(tmp_path, PLAN3)
    error = invoke(group, tmp_path, *args, "99999999999999999999999")
    assert isinstance(error, click.BadParameter) and "9223372036854775807" in error.format_message()
    largest = invoke(group, tmp_path, *args, str(2**63 - 1))
    assert isinstance(largest, FtlError) and largest.error_type == "not_found"


# --------------------------------------------------------------------------- 10. numbers and digits

@pytest.mark.parametrize("text, path", [
    ('{"objective": "o", "tasks": [{"seq": "001", "slug": "a", "verify": "true", "timeout_s": 1e400}]}',
     "$.tasks[0].timeout_s"),
    ('{"objective": "o", "tasks": [{"seq": "001", "slug": "a", "verify": "true", "note": [1, -1e999]}]}',
     "$.tasks[0].note[1]"),
    ('{"objective": "o", "weight": NaN, "tasks": [{"seq": "001", "slug": "a", "verify": "true"}]}',
     "$.weight"),
])
def test_a_number_that_is_not_finite_is_refused_where_it_is(text: str, path: str) -> None:
    raw = json.loads(text)
    assert lean_plan_rows(raw) is None
    for check in (parse_plan, lambda r: plan_rows(r, source="plan")):
        with pytest.raises(FtlError) as caught:
            check(raw)
        assert [v["path"] for v in caught.value.details["violations"]] == [path]


@pytest.mark.parametrize("value", ["١", "٠٠٣", "²", "1²"])
def test_a_seq_takes_ascii_digits_only(value: str) -> None:
    with pytest.raises(ValueError, match="ASCII digits"):
        normalize_seq(value)
    assert normalize_seq(" 7 ") == "007"


# --------------------------------------------------------------------------- 11. FTL's arguments

def test_find_similar_takes_any_threshold_but_nan(tmp_path: Path) -> None:
    new_campaign(tmp_path)
    assert invoke(_campaign.cli, tmp_path, "find-similar", "--threshold", "1.5").data == {"items": []}
    refused = invoke(_campaign.cli, tmp_path, "find-similar", "--threshold", "nan")
    assert isinstance(refused, click.BadParameter) and "nan" in refused.format_message()


def test_update_task_reads_a_negative_seq_as_the_seq(tmp_path: Path) -> None:
    new_campaign(tmp_path, PLAN3, register=True)
    error = invoke(_campaign.cli, tmp_path, "update-task", "-1", "complete")
    assert isinstance(error, FtlError) and error.error_type == "schema_invalid"
    assert error.message == "Invalid SEQ: seq must be ASCII digits (0-9) like \"001\", got '-1'."


def test_refusals_kept_say_why_and_what_to_do(tmp_path: Path) -> None:
    written = invoke(EXPLORATION.cli, tmp_path, "write-result", "--session", "abc12345", "--mode",
                     "structure", stdin='{"status": "ok"}')
    assert isinstance(written, FtlError) and written.error_type == "not_found"
    assert "campaign.py create OBJECTIVE" in written.message and "abc12345" in written.message
    new_campaign(tmp_path)
    state = invoke(ORCHESTRATION.cli, tmp_path, "emit-state", "CUSTOM_STATE")
    assert isinstance(state, FtlError) and "INIT, EXPLORE" in state.message and "ftl replay" in state.message
    status = invoke(PLAN.cli, tmp_path, "list", "--status", "anything")
    assert isinstance(status, click.BadParameter) and "'active', 'executed', 'superseded'" in status.format_message()


def test_concurrent_creates_that_both_register_the_plan_both_succeed(tmp_path: Path, monkeypatch) -> None:
    """Two `workspace create` calls on a campaign whose plan is not registered yet: the other
    registers it between this call's check and its own registration."""
    cid = new_campaign(tmp_path, PLAN3)
    mine, theirs = _create_racing_another(tmp_path, monkeypatch, "add_tasks")
    assert [w["attempt"] for w in mine.data["created"]] == [w["attempt"] for w in theirs.data["created"]] == [1]
    with store_of(tmp_path) as store:
        assert len(store.tasks(cid)) == 3 and len(store.workspaces(cid, seq="001")) == 1
