"""State deltas: ftl's per-tool outcomes (what each result implies) and the client's application
of a delta (spec 07 §4; conformance items 38, 41, 47 and C-9)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings, strategies as st

from ftl.config import Config
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.definitions import BoundContext
from ftl.manglecp.facts import NormalFact, apply_state_delta, matches_pattern, validate_facts
from ftl.manglecp.messages import fact
from ftl.manglecp.transport import InProcessTransport
from ftl.server.app import build_server
from ftl.server.catalog import (
    DELTA_PREDICATES, FILE_FACTS_CAP, builder_outcome, cascade_outcome, plan_outcome, verify_outcome)

TASK = BoundContext("build_task", {}, (NormalFact("task", ("007", "BUILD")),))


def _preds(outcome):
    return [f["pred"] for f in outcome.asserts]


def test_builder_outcome_lists_files_and_suggests_verify():
    result = {"status": "complete", "files_changed": ["a.py", "b.py"], "out_of_scope": ["b.py"]}
    outcome = builder_outcome({"workspace": {"seq": "007"}}, result, TASK)
    assert outcome.asserts == (fact("build_outcome", "007", "complete"), fact("file_changed", "007", "a.py", True),
                               fact("file_changed", "007", "b.py", False))
    assert {"pred": "file_changed", "args": ["007", None, None]} in outcome.retracts
    assert [s["name"] for s in outcome.suggested_intents] == ["verify_task"]
    assert outcome.continuation_facts == (fact("task", "007", "BUILD"),)


def test_a_mass_change_is_one_rolled_up_fact():
    files = [f"f{i}.py" for i in range(FILE_FACTS_CAP + 1)]
    outcome = builder_outcome({"workspace": {"seq": "007"}},
                              {"status": "failed", "files_changed": files, "out_of_scope": files[:3]}, TASK)
    assert _preds(outcome) == ["build_outcome", "bulk_modification_completed"]
    assert outcome.asserts[1]["args"] == ["007", FILE_FACTS_CAP + 1, 3]
    assert outcome.suggested_intents == ()  # a failed build suggests nothing


def test_a_blocked_build_sets_the_task_status_and_suggests_cascade():
    outcome = builder_outcome({"workspace": {"seq": "007"}}, {"status": "blocked"}, TASK)
    assert fact("task_status", "007", "blocked") in outcome.asserts
    assert outcome.suggested_intents[0]["name"] == "analyze_cascade"
    assert outcome.continuation_facts == (fact("blocked", "007"),)


def test_verify_outcome_needs_the_task_and_completes_it_when_passed():
    passed = verify_outcome({}, {"passed": True, "exit_code": 0}, TASK)
    assert passed.asserts == (fact("verify_result", "007", True), fact("task_status", "007", "complete"))
    failed = verify_outcome({}, {"passed": False, "exit_code": 2}, TASK)
    assert failed.asserts == (fact("verify_result", "007", False),)
    assert failed.suggested_intents[0]["name"] == "build_task" and "exit 2" in failed.summary
    unbound = verify_outcome({}, {"passed": True}, BoundContext("verify_task"))
    assert unbound.asserts == () and unbound.summary


def test_plan_and_cascade_outcomes():
    plan = plan_outcome({}, {"decision": "PROCEED", "plan": {"tasks": [{}, {}]}}, BoundContext("plan_campaign"))
    assert plan.asserts == (fact("plan_decision", "PROCEED"), fact("plan_task_count", 2))
    assert plan.suggested_intents[0]["name"] == "build_task"
    clarify = plan_outcome({}, {"decision": "CLARIFY"}, BoundContext("replan_campaign"))
    assert clarify.suggested_intents[0]["name"] == "replan_campaign"
    cascade = cascade_outcome({}, {"recommendation": "replan", "unreachable_count": 3,
                                   "roots": [{"seq": "002"}, {"seq": "005"}]}, BoundContext("analyze_cascade"))
    assert cascade.suggested_intents[0]["name"] == "replan_campaign"
    assert cascade.continuation_facts == (fact("blocked", "002"), fact("blocked", "005"))


def test_every_delta_predicate_is_a_valid_client_fact():
    """A client may send delta facts back (C-9): they are declared and pass validation."""
    from ftl.server.app import PREDICATES
    from ftl.manglecp.messages import FactsProfile
    declared = {p.predicate for p in PREDICATES}
    assert {p.predicate for p in DELTA_PREDICATES} <= declared
    outcome = builder_outcome({"workspace": {"seq": "007"}}, {"status": "blocked", "files_changed": ["x"]}, TASK)
    facts = [dict(f, t={"at": "2026-02-19T14:30:00Z"}) if f["pred"] in {"build_outcome", "file_changed"} else f
             for f in outcome.asserts] + list(outcome.continuation_facts)
    _, violations = validate_facts(facts, FactsProfile(predicates=list(PREDICATES)))
    assert violations == []


def test_the_real_builder_and_verifier_answer_with_a_state_delta(tmp_path: Path):
    """Conformance 38/41/47 on ftl's own tools: every assert has a category and a source."""
    client = ManglecpClient(InProcessTransport(build_server(tmp_path, Config(), isolation="thread"),
                                               close_server=True))
    workspace = {"workspace_id": "c-1-007-1", "campaign_id": "c-1", "seq": "007", "slug": "write",
                 "type": "BUILD", "objective": "write a file", "delta": ["out.txt"], "verify": "true",
                 "run": "echo hi > out.txt; echo x > stray.txt", "budget": 1, "timeout_s": 30}
    facts = [fact("task", "007", "BUILD"), fact("task_has_run", "007")]
    try:
        built = client.invoke_tool("build_task", facts, "shell_builder", {"workspace": workspace})
        delta = built.state_delta.model_dump(by_alias=True)
        assert [(f["pred"], f["args"]) for f in delta["assert"]] == [
            ("build_outcome", ["007", "complete"]), ("file_changed", ["007", "out.txt", True]),
            ("file_changed", ["007", "stray.txt", False])]
        for item in delta["assert"]:
            assert item["category"] in ("server", "session", "derived")
            assert item["source"]["source_type"] and "t" in item
        assert built.next["suggested_intents"][0]["name"] == "verify_task"
        verified = client.invoke_tool("verify_task", built.next["continuation_facts"], "run_verify",
                                      {"command": "test -f out.txt"})
        assert [(f["pred"], f["args"]) for f in verified.state_delta.assert_] == [
            ("verify_result", ["007", True]), ("task_status", ["007", "complete"])]
        working = apply_state_delta(facts, delta)
        working = apply_state_delta(working, verified.state_delta.model_dump(by_alias=True))
        again = client.evaluate("verify_task", working)  # the delta facts are valid session facts
        assert [t.name for t in again.macro_tools] == ["run_verify"]
    finally:
        client.close()


def test_a_delta_facts_verdict_is_remembered_for_its_shape_only(tmp_path: Path):
    """The server remembers that a delta fact of a shape (predicate, argument types, a ``t`` it
    stamped) is valid; another shape of the same predicate, or a ``t`` the tool gave, is
    checked again."""
    server = build_server(tmp_path, Config(), isolation="thread")
    try:
        for seq, passed in (("007", True), ("008", False), ("009", True)):
            made = server._delta_fact({"pred": "verify_result", "args": [seq, passed]}, "run_verify")
            assert made is not None and made["args"] == [seq, passed] and "at" in made["t"]
        assert server._delta_fact({"pred": "verify_result", "args": ["007", "yes"]}, "run_verify") is None
        assert server._delta_fact({"pred": "verify_result", "args": [7, True]}, "run_verify") is None
        assert server._delta_fact({"pred": "verify_result", "args": ["007"]}, "run_verify") is None
        assert server._delta_fact({"pred": "verify_result", "args": ["007", True],
                                   "t": {"at": "not a time"}}, "run_verify") is None
        assert server._delta_fact({"pred": "verify_results", "args": ["007", True]}, "run_verify") is None
    finally:
        server.close()


# --- client side: applying a delta ------------------------------------------------------------

def test_retracts_go_first_and_null_is_a_wildcard():
    facts = [fact("status", "a", "old"), fact("status", "b", "old"), fact("other", "a")]
    delta = {"retract": [{"pred": "status", "args": ["a", None]}],
             "assert": [{"pred": "status", "args": ["a", "old"], "category": "derived",
                         "source": {"source_type": "server"}}]}
    out = apply_state_delta(facts, delta)
    # the same fact is retracted and re-asserted: retracts first, so it survives, as a session fact
    assert out == [fact("status", "b", "old"), fact("other", "a"),
                   {"pred": "status", "args": ["a", "old"], "category": "session"}]
    assert facts[0] == fact("status", "a", "old")  # the input is not changed
    assert not matches_pattern({"pred": "status", "args": [None]}, fact("status", "a", "b"))  # arity


VALUES = st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(0, 2))
FACTS = st.lists(st.builds(lambda p, args: {"pred": p, "args": args}, st.sampled_from(["p", "q"]),
                           st.lists(VALUES, min_size=1, max_size=2)), max_size=8)
PATTERNS = st.lists(st.builds(lambda p, args: {"pred": p, "args": args}, st.sampled_from(["p", "q"]),
                              st.lists(st.one_of(st.none(), VALUES), min_size=1, max_size=2)), max_size=3)


@settings(max_examples=60, deadline=None)
@given(FACTS, PATTERNS, FACTS)
def test_delta_application_laws(facts, retracts, asserts):
    out = apply_state_delta(facts, {"retract": retracts, "assert": asserts})
    keys = [(f["pred"], f["args"]) for f in out]
    kept = [f for f in facts if not any(matches_pattern(r, f) for r in retracts)]
    added = keys[len(kept):]
    assert keys[:len(kept)] == [(f["pred"], f["args"]) for f in kept]  # order kept
    assert len(added) == len({(p, repr(a)) for p, a in added})  # an assert never duplicates
    assert not set(map(repr, added)) & set(repr((f["pred"], f["args"])) for f in kept)
    for item in asserts:  # every assert survives: retracts never apply after asserts
        assert (item["pred"], item["args"]) in keys
    for f in facts:  # a kept old fact matches no retract; a dropped one matches one (or is re-asserted)
        matched = any(matches_pattern(r, f) for r in retracts)
        assert ((f["pred"], f["args"]) in keys) == (not matched or (f["pred"], f["args"]) in
                                                   [(a["pred"], a["args"]) for a in asserts])
