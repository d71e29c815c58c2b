"""Level-2 features of the server framework: state delta, next steps, skills and context
injection, periodic progress, proof hints, rule coverage, the advertised level (MangleCP spec 05
§5, spec 06, spec 07 §3-7, spec 09 §5-6; conformance items 38, 41-43, 47, 50, 51)."""

from __future__ import annotations

import json
import re
import threading

from ftl.manglecp.messages import PRED_RE, envelope
from ftl.manglecp.access import Session
from ftl.manglecp.definitions import ServerLimits
from ftl.manglecp.render import estimate_tokens

from .helpers import final, intent, invoke, make_server, tools_by_name

SKILL_FACT = {"pred": "enable", "args": ["skill"]}


def _macro(server, name, facts=None, session=None):
    return tools_by_name(final(server.handle(intent("tools", facts), session=session)))[name]["macro_id"]


def test_state_delta_carries_category_and_provenance_and_drops_undeclared_facts(server):
    reply = final(server.handle(invoke(_macro(server, "echo_tool", [{"pred": "enable", "args": ["x"]}]),
                                       {"text": "hi"})))
    payload = reply["payload"]
    asserted = payload["state_delta"]["assert"]
    assert [f["pred"] for f in asserted] == ["echoed", "echo_count"]  # undeclared_pred dropped
    echoed, count = asserted
    assert echoed["category"] == "session" and echoed["t"] == {"at": "2026-02-19T14:10:00.000Z"}
    assert echoed["source"] == {"source_type": "server", "source_id": "fixture:echo_tool",
                                "asserted_at": "2026-02-19T14:10:00.000Z"}
    assert count["args"] == [1]  # the outcome sees the bound evaluation: one fact
    assert count["source"]["source_type"] == "scan" and "t" not in count  # not a temporal predicate
    assert payload["state_delta"]["retract"] == [{"pred": "echoed", "args": [None]}]
    assert payload["next"] == {"suggested_intents": [{"name": "diag", "description": "Diagnose next."}],
                               "continuation_facts": [{"pred": "enable", "args": ["x"]}]}
    observability = payload["observability"]
    assert observability["summary"] == "Echoed 2 character(s)."
    assert [e["action"] for e in observability["events"]] == ["echo_tool", "echo"]


def test_observability_events_are_capped():
    server = make_server(limits=ServerLimits(max_observability_events=1))
    payload = final(server.handle(invoke(_macro(server, "echo_tool"), {"text": "x"})))["payload"]
    assert len(payload["observability"]["events"]) == 1


def test_macro_ids_are_bound_to_the_evaluation_facts(server):
    """Two evaluations with different facts never share a macro id, so concurrent tasks on one
    session cannot invoke each other's binding (reference §11 item 23)."""
    session = Session(key="runner")
    plain = _macro(server, "echo_tool", session=session)
    bound = _macro(server, "echo_tool", [{"pred": "enable", "args": ["x"]}], session=session)
    assert plain != bound
    assert _macro(server, "echo_tool", [{"pred": "enable", "args": ["x"]}], session=session) == bound
    counts = [final(server.handle(invoke(mid, {"text": "x"}), session=session))["payload"]["state_delta"]
              ["assert"][1]["args"] for mid in (plain, bound)]
    assert counts == [[0], [1]]


def test_skills_and_resources_only_when_the_rules_prove_them(server):
    without = tools_by_name(final(server.handle(intent("diag"))))["mandatory_tool"]
    assert without["context_injection"] == {"instructions": "Run the diagnosis first."}
    tool = tools_by_name(final(server.handle(intent("diag", [SKILL_FACT]))))["mandatory_tool"]
    injection = tool["context_injection"]
    inline, referenced = injection["skills"]
    assert inline["skill_id"] == "diag_guide" and inline["inline"] is True and inline["content"]
    assert referenced == {"skill_id": "diag_manual", "inline": False,
                          "description": "The full diagnosis manual."}
    assert injection["context_resources"] == [{"uri": "docs/diag.md", "priority": 70},
                                              {"uri": "https://example.org/diag", "priority": 20}]
    condensed = tools_by_name(final(server.handle(intent("diag", [SKILL_FACT],
                                                         options={"disclosure_preference": "condensed"}))))
    assert all("context_injection" not in t for t in condensed.values())


def test_a_tight_budget_references_skills_then_drops_resources_before_demoting(server):
    tools = final(server.handle(intent("diag", [SKILL_FACT])))["payload"]["macro_tools"]
    total = sum(estimate_tokens(t) for t in tools)
    squeezed = final(server.handle(intent("diag", [SKILL_FACT], constraints={"max_tokens_budget": total - 1})))
    tool = tools_by_name(squeezed)["mandatory_tool"]
    assert [t["disclosure_level"] for t in squeezed["payload"]["macro_tools"]] == ["full"] * len(tools)
    assert [s["inline"] for s in tool["context_injection"]["skills"]] == [False, False]
    assert len(tool["context_injection"]["context_resources"]) == 2  # the skill switch was enough
    inline_cost = estimate_tokens(tools_by_name(final(server.handle(intent("diag", [SKILL_FACT]))))["mandatory_tool"])
    budget = total - (inline_cost - estimate_tokens(tool)) - 5  # a little more than the switch saves
    tighter = tools_by_name(final(server.handle(intent("diag", [SKILL_FACT],
                                                       constraints={"max_tokens_budget": budget}))))
    assert tighter["mandatory_tool"]["context_injection"]["context_resources"] == [
        {"uri": "docs/diag.md", "priority": 70}]  # the lowest priority went first


def test_long_invocations_send_periodic_progress_until_they_end():
    server = make_server(limits=ServerLimits(progress_interval_s=0.01))
    session = Session(key="s")
    macro_id = _macro(server, "slow_tool", session=session)
    beats = threading.Event()
    seen: list[dict] = []

    def emit(message):
        seen.append(message)
        if message["payload"].get("detail", "").startswith("slow_tool running for"):
            beats.set()

    replies: list[dict] = []
    worker = threading.Thread(target=lambda: replies.extend(server.handle(
        invoke(macro_id, {"seconds": 30}, id="slow-1"), session=session, emit=emit)))
    worker.start()
    assert beats.wait(10)
    server.handle(envelope("cancel", None, {"request_id": "slow-1"}), session=session)
    worker.join(10)
    count = len(seen)
    assert [r["payload"]["code"] for r in replies] == ["cancelled"]
    assert seen[0]["payload"] == {"status": "started"}
    assert all(m["type"] == "progress" and m["id"] == "slow-1" for m in seen)
    threading.Event().wait(0.05)
    assert len(seen) == count  # nothing after the final message


def test_proof_hints_name_predicates_supporting_and_unmatched_facts(server):
    facts = [{"pred": "enable", "args": ["x"]}, {"pred": "flag", "args": [True]}]
    payload = final(server.handle(intent("diag", facts, options={"include_proof_hints": True,
                                                                 "disclosure_preference": "full"})))["payload"]
    hints = payload["proof_hints"]
    by_id = {d["macro_id"]: d for d in hints["derivations"]}
    tools = tools_by_name(final(server.handle(intent("diag", facts))))
    assert set(by_id) == {t["macro_id"] for t in tools.values()}  # one derivation per tool
    enabled = by_id[tools["enabled_tool"]["macro_id"]]
    assert enabled["supporting_facts"] == [{"pred": "enable", "args": ["x"]}]
    assert enabled["rule_chain"][-1] == "final" and "relevant_to_intent" in enabled["rule_chain"]
    helper = by_id[tools["helper_tool"]["macro_id"]]
    assert (helper["selected_by"], "tool_requires" in helper["rule_chain"]) == ("dependency", True)
    assert hints["unmatched_facts"] == [{"pred": "flag", "reason": "no rule used this fact for this intent"}]
    text = json.dumps(hints)
    assert all(PRED_RE.match(r) for d in hints["derivations"] for r in d["rule_chain"])
    assert ":-" not in text and "prohibited" not in text.replace("prohibited_tool", "")
    assert "_manglecp_" not in text
    assert payload["diagnostics"]["rules_fired"] > 0


def test_proof_hints_do_not_change_the_answer(server):
    plain = final(server.handle(intent("diag", eval_time=0)))["payload"]
    hinted = final(server.handle(intent("diag", eval_time=0, options={"include_proof_hints": True,
                                                                      "disclosure_preference": "full"})))["payload"]
    assert plain["macro_tools"] == hinted["macro_tools"]
    assert plain["diagnostics"]["facts_derived"] == hinted["diagnostics"]["facts_derived"]


def test_rule_coverage_in_dev_mode_only():
    asked = {"disclosure_preference": "full", "x-rule_coverage": True}
    off = make_server()
    assert "rule_coverage" not in final(off.handle(intent("diag", options=asked)))["payload"]["diagnostics"]
    server = make_server(limits=ServerLimits(rule_coverage=True))
    coverage = final(server.handle(intent("diag", options=asked)))["payload"]["diagnostics"]["rule_coverage"]
    assert coverage["rules_fired"] + coverage["rules_dormant"] + coverage["rules_inapplicable"] == \
        coverage["total_rules"]
    assert coverage["rules_fired"] > 0 and coverage["rules_inapplicable"] > 0  # e.g. the `heavy` chain
    statuses = {d["status"] for d in coverage["dormant_details"]}
    assert statuses <= {"dead", "partially_alive"}
    for detail in coverage["dormant_details"]:
        assert re.fullmatch(r"[a-z][a-z0-9_]*#\d+", detail["rule"])
        assert "prohibited" not in detail["missing_predicates"]
        assert not any(p.startswith("_manglecp_") for p in detail["missing_predicates"])
    dead = {d["rule"]: d for d in coverage["dormant_details"]}["needs_skill#1"]  # needs enable("skill")
    assert dead == {"rule": "needs_skill#1", "missing_predicates": ["enable"], "status": "dead"}


def test_the_advertised_level_drops_to_1_when_level_2_features_are_missing(server):
    assert server.level_gaps() == [] and server.manifest()["payload"]["protocol"]["conformance_level"] == 2
    bare = make_server(skills={})
    assert bare.manifest()["payload"]["protocol"]["conformance_level"] == 1
    assert bare.level_gaps() == ["skills (no Skill registered)"]
