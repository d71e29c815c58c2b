"""Planner tools: plan loading/validation, the planner-output parser, and a stand-in planner agent."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.errors import FtlError
from ftl.server.tools.planner import (DECISIONS, AgentPlannerArgs, LoadPlanArgs, agent_planner,
                                      load_plan, parse_planner_output)

from .conftest import agent

PLAN = {"objective": "Add login", "tasks": [
    {"seq": 1, "slug": "spec-login", "type": "SPEC", "delta": ["tests/test_login.py"],
     "verify": "pytest tests/test_login.py"},
    {"seq": "002", "slug": "impl-login", "delta": ["login.py"], "verify": "pytest",
     "depends": "001"}]}


# --------------------------------------------------------------------------- load_plan

def test_load_plan_normalises_and_proceeds(tmp_path, ctx_for):
    result = load_plan(LoadPlanArgs(plan=PLAN), ctx_for(tmp_path))
    assert result["decision"] == "PROCEED"
    assert [t["seq"] for t in result["plan"]["tasks"]] == ["001", "002"]
    assert result["plan"]["tasks"][1]["depends"] == ["001"]
    assert result["plan"]["_schema_version"] == "1.0"


def test_load_plan_rejects_an_invalid_plan(tmp_path, ctx_for):
    bad = {"objective": "x", "tasks": [{"seq": "001", "slug": "Bad Slug", "delta": ["a*.py"]}]}
    with pytest.raises(FtlError) as caught:
        load_plan(LoadPlanArgs(plan=bad), ctx_for(tmp_path))
    assert caught.value.error_type == "schema_invalid"
    assert caught.value.details["count"] >= 3


def test_load_plan_reports_a_cycle(tmp_path, ctx_for):
    cyclic = {"objective": "x", "tasks": [
        {"seq": "001", "slug": "a", "delta": ["a.py"], "verify": "true", "depends": "002"},
        {"seq": "002", "slug": "b", "delta": ["b.py"], "verify": "true", "depends": "001"}]}
    with pytest.raises(FtlError) as caught:
        load_plan(LoadPlanArgs(plan=cyclic), ctx_for(tmp_path))
    assert caught.value.error_type == "cycle_detected"


# --------------------------------------------------------------------------- parser

def test_markdown_proceed_with_fenced_plan():
    text = f"### Confidence: PROCEED\n\nReasoning.\n\n```json\n{json.dumps(PLAN)}\n```\n"
    result = parse_planner_output(text)
    assert result["decision"] == "PROCEED" and result["plan"] == PLAN and not result["inferred"]


def test_later_fenced_block_is_tried_when_the_first_is_not_a_plan():
    text = ("**Decision:** proceed\n```\nnot json\n```\n```json\n{\"note\": 1}\n```\n"
            f"```json\n{json.dumps(PLAN)}\n```")
    result = parse_planner_output(text)
    assert result["decision"] == "PROCEED" and result["plan"] == PLAN


def test_plan_embedded_in_prose_without_header_is_an_inferred_proceed():
    result = parse_planner_output(f"Here you go: {json.dumps(PLAN)} -- enjoy")
    assert (result["decision"], result["inferred"], result["plan"]) == ("PROCEED", True, PLAN)
    assert "raw-plan" in result["markers"]


def test_clarify_questions_numbered_and_bulleted_outside_fences():
    text = ("## Confidence: CLARIFY\n\n## Blocking Questions\n1. Which database should we use?\n"
            "2) **Is the API public?**\n- Keep v1 endpoints?\n* Keep v1 endpoints?\n"
            "- This is a statement.\n```\n3. A question inside code?\n```\n")
    result = parse_planner_output(text)
    assert result["decision"] == "CLARIFY"
    assert result["questions"] == ["Which database should we use?", "Is the API public?",
                                   "Keep v1 endpoints?"]


def test_clarify_outranks_proceed_when_both_headers_appear():
    text = f"Confidence: PROCEED\n```json\n{json.dumps(PLAN)}\n```\nDecision: CLARIFY\n1. Why?"
    result = parse_planner_output(text)
    assert result["decision"] == "CLARIFY" and result["plan"] == PLAN


def test_confirm_header_and_lowercase_headings_that_are_not_decisions():
    assert parse_planner_output("# Confirm the approach\nsome text")["decision"] == "UNKNOWN"
    assert parse_planner_output("### CONFIRM\n1. Option A?\n2. Option B?")["decision"] == "CONFIRM"


def test_questions_section_without_header_is_an_inferred_clarify():
    result = parse_planner_output("I need more detail.\n\n## Questions\n- Which users?\n")
    assert (result["decision"], result["inferred"], result["questions"]) == ("CLARIFY", True, ["Which users?"])


def test_json_envelope_answer():
    envelope = {"decision": "confirm", "questions": ["Drop the table?"], "plan": PLAN}
    result = parse_planner_output(json.dumps(envelope))
    assert (result["decision"], result["questions"], result["plan"]) == ("CONFIRM", ["Drop the table?"], PLAN)


def test_nothing_recognisable_is_unknown():
    result = parse_planner_output("I am not sure what to do.")
    assert result == {"decision": "UNKNOWN", "questions": [], "inferred": False, "markers": []}


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400) | st.lists(st.sampled_from([
    "### Confidence: PROCEED", "Decision: CLARIFY", "```json", "```", "{", "}", '"tasks": [',
    "]", "1. why?", "- what?", "## Questions", '{"objective": "o", "tasks": []}', "\n", "~~~",
    "{\"decision\": \"CONFIRM\", \"questions\": [1, null]}", "[[[[", "CONFIRM"]), max_size=30).map("\n".join))
def test_parser_never_raises_on_arbitrary_text(text):
    result = parse_planner_output(text)
    assert result["decision"] in DECISIONS
    assert all(isinstance(q, str) for q in result["questions"])
    assert "plan" not in result or isinstance(result["plan"]["tasks"], list)


# --------------------------------------------------------------------------- agent_planner

def test_agent_planner_markdown_plan(tmp_path, ctx_for):
    args = AgentPlannerArgs(objective="Add login", command=agent("plan-markdown"))
    result = agent_planner(args, ctx_for(tmp_path))
    assert result["decision"] == "PROCEED" and result["exit_code"] == 0
    assert result["plan"]["objective"] == "Add login" and result["plan"]["tasks"][0]["slug"] == "first"
    assert "Confidence: PROCEED" in result["output_tail"]


def test_agent_planner_clarify_with_nonzero_exit(tmp_path, ctx_for):
    result = agent_planner(AgentPlannerArgs(objective="x", command=agent("clarify")), ctx_for(tmp_path))
    assert (result["decision"], result["exit_code"]) == ("CLARIFY", 2)
    assert result["questions"] == ["Which database?", "Keep the old API?"]


def test_agent_planner_receives_replan_input(tmp_path, ctx_for):
    args = AgentPlannerArgs(objective="x", exploration={"delta": {"candidates": []}},
                            replan={"blocked_tasks": [{"seq": "001"}]}, command=agent("echo-input"))
    result = agent_planner(args, ctx_for(tmp_path))
    sent = json.loads(result["questions"][0][: -len(" ok?")])
    assert sent["mode"] == "replan" and sent["replan"] == {"blocked_tasks": [{"seq": "001"}]}
    assert sent["exploration"] == {"delta": {"candidates": []}}


def test_agent_planner_timeout_is_data(tmp_path, ctx_for):
    args = AgentPlannerArgs(objective="x", command=["sleep", "30"], timeout_s=0.3)
    result = agent_planner(args, ctx_for(tmp_path))
    assert result["timed_out"] and result["decision"] == "UNKNOWN" and result["exit_code"] is None
