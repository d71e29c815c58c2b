"""Conformance Level 2 (reference §9 items 28-47), over stdio and HTTP against real server
processes, plus the Level-3 features the server has (49 validity, 50 proof hints, 51 rule
coverage, 52 external predicates, 55 disclosure upgrade)."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from datetime import datetime, timezone

import pytest

from ftl.manglecp.facts import validate_facts
from ftl.manglecp.messages import PRED_RE, FactsProfile, envelope, fact
from ftl.manglecp.render import estimate_tokens

from .conftest import Reply, expect_error, tools
from .test_level1 import intent, invoke, macro

SIDE_EFFECTS = {"none", "filesystem", "network", "database", "browser", "process", "payments",
                "authentication", "destructive"}
EVAL_TIME = "2026-02-19T14:30:00Z"
DETERMINISM_FACTS = [fact("enable", "x"), fact("enable", "skill"), fact("task", "001", 3), fact("flag", False),
                     fact("blob", {"b": [1, 2], "a": "🚀"}), fact("seen", "deploy") | {"t": {"at": EVAL_TIME}}]


def signature(reply: Reply) -> list[tuple]:
    """What C6 compares: the macro ids, their disclosure levels and scores."""
    assert reply.type == "intent_response", reply.message
    return sorted((t["macro_id"], t["disclosure_level"], t.get("metadata", {}).get("score"))
                  for t in reply.payload["macro_tools"])


def determinism_request(facts, id: str) -> dict:
    return intent("diag", facts, id=id, eval_time=EVAL_TIME, constraints={"max_tools_returned": 10},
                  options={"disclosure_preference": "adaptive"})


# 28, 29 --------------------------------------------------------------------------------------
def test_28_determinism_100_identical_requests_shuffled_and_across_processes(conn, servers):
    expected = signature(conn.send(determinism_request(DETERMINISM_FACTS, "d-0")))
    assert len(expected) >= 5
    same = conn.send_many([determinism_request(DETERMINISM_FACTS, f"d-{i}") for i in range(1, 101)])
    assert all(signature(r) == expected for r in same)
    rng = random.Random(28)
    shuffled = []
    for i in range(100):
        facts = DETERMINISM_FACTS[:]
        rng.shuffle(facts)
        shuffled.append(determinism_request(facts, f"s-{i}"))
    assert all(signature(r) == expected for r in conn.send_many(shuffled))
    # another server process (the locked one: same fixture, its own workers and hash seed)
    other = servers["locked", conn.transport]
    if other.transport == "http":
        other.headers["Authorization"] = "Bearer good-token"
    else:
        other.send(envelope("authenticate", "d-auth", {"scheme": "bearer", "token": "good-token"}))
    full = determinism_request(DETERMINISM_FACTS, "d-x")
    full["payload"]["options"] = {"disclosure_preference": "full"}  # its thresholds differ (item 33)
    assert signature(other.send(full)) == signature(conn.send(full))


def test_29_equal_score_conflict_keeps_the_same_one(conn):
    replies = conn.send_many([intent("diag", id=f"c3-{i}") for i in range(10)])
    kept = {tuple(sorted({"pair_a", "pair_b"} & set(tools(r)))) for r in replies}
    assert kept == {("pair_a",)}


# 30, 31 --------------------------------------------------------------------------------------
def test_30_dependencies_come_along_or_the_dependent_goes(conn):
    names = set(tools(conn.send(intent("diag"))))
    assert {"dependent_tool", "helper_tool"} <= names
    blocked = set(tools(conn.send(intent("diag", [fact("block_helper")]))))
    assert "dependent_tool" not in blocked and "helper_tool" not in blocked


def test_31_a_tripped_limit_is_never_a_partial_result(conn):
    for constraints, code in (({"max_facts_created": 5}, "derivation_limit_exceeded"),
                              ({"max_compute_ms": 50}, "evaluation_timeout")):
        name = "heavy" if code == "derivation_limit_exceeded" else "slow"
        reply = conn.send(intent(name, constraints=constraints))
        expect_error(reply, code)
        assert "macro_tools" not in json.dumps(reply.message)


# 32-35 ---------------------------------------------------------------------------------------
WHITELIST = {
    "full": ({"macro_id", "name", "disclosure_level", "description", "input_schema", "safety"},
             {"output_schema", "context_injection", "validity", "metadata"}),
    "condensed": ({"macro_id", "name", "disclosure_level", "description"}, {"metadata"}),
    "minimal": ({"macro_id", "name", "disclosure_level"}, set()),
}


@pytest.mark.parametrize("level", ["full", "condensed", "minimal"])
def test_32_disclosure_levels_follow_the_whitelist(conn, level):
    required, optional = WHITELIST[level]
    reply = conn.send(intent("diag", [fact("enable", "skill")], options={"disclosure_preference": level}))
    for tool in reply.payload["macro_tools"]:
        assert tool["disclosure_level"] == level
        assert required <= set(tool) <= required | optional


def test_33_adaptive_levels_follow_the_configured_thresholds(conn, servers):
    levels = {n: t["disclosure_level"] for n, t in tools(conn.send(intent("levels", options={}))).items()}
    assert levels == {"score80": "full", "score50": "condensed", "score30": "minimal"}  # score10 omitted
    other = servers["locked", conn.transport]  # configured with full_threshold 45
    if other.transport == "http":
        other.headers["Authorization"] = "Bearer good-token"
    else:
        other.send(envelope("authenticate", "t33", {"scheme": "bearer", "token": "good-token"}))
    changed = {n: t["disclosure_level"] for n, t in tools(other.send(intent("levels", options={}))).items()}
    assert changed == {"score80": "full", "score50": "full", "score30": "minimal"}


def test_34_token_budget_demotes_the_lowest_scores_first(conn):
    full = conn.send(intent("levels")).payload["macro_tools"]
    budget = sum(estimate_tokens(t) for t in full) - 10
    fitted = conn.send(intent("levels", constraints={"max_tokens_budget": budget})).payload["macro_tools"]
    assert sum(estimate_tokens(t) for t in fitted) <= budget
    assert [t["name"] for t in fitted] == [t["name"] for t in full]
    assert fitted[0]["disclosure_level"] == "full" and fitted[-1]["disclosure_level"] != "full"


def test_35_max_tools_returned_keeps_the_best(conn):
    kept = conn.send(intent("levels", constraints={"max_tools_returned": 2})).payload["macro_tools"]
    assert [t["name"] for t in kept] == ["score80", "score50"]


# 36, 37 --------------------------------------------------------------------------------------
def test_36_temporal_facts_in_every_advertised_format(conn):
    formats = conn.manifest()["payload"]["facts_profile"]["time_formats"]
    assert set(formats) == {"rfc3339", "epoch_ms"}
    ms = 1_771_511_400_000
    facts = [fact("seen", "a") | {"t": {"at": EVAL_TIME}},
             fact("seen", "b") | {"t": {"start": "2026-02-19T14:00:00+00:00", "end": "_"}},
             fact("seen", "c") | {"t": {"at": ms}},
             fact("seen", "d") | {"t": {"start": "_", "end": ms}},
             fact("seen", "e") | {"t": {"start": ms - 1000, "end": "now"}}]
    assert conn.send(intent("temporal", facts)).type == "intent_response"
    bad = expect_error(conn.send(intent("temporal", [fact("seen", "a") | {"t": {"at": "yesterday"}}])),
                       "invalid_facts")
    assert bad["details"]["violations"][0]["fact_index"] == 0


def test_37_eval_time_is_now_for_the_rules(conn):
    deploy = fact("seen", "deploy") | {"t": {"at": "2026-02-19T14:30:00Z"}}
    four = conn.send(intent("temporal", [deploy], eval_time="2026-02-19T14:34:00Z"))
    assert four.payload["eval_time_used"] == "2026-02-19T14:34:00Z" and "recent_tool" in tools(four)
    six = conn.send(intent("temporal", [deploy], eval_time="2026-02-19T14:36:00Z"))
    assert "recent_tool" not in tools(six)
    used = conn.send(intent("temporal")).payload["eval_time_used"]
    server_now = datetime.fromisoformat(used.replace("Z", "+00:00"))
    assert abs((server_now - datetime.now(timezone.utc)).total_seconds()) < 5


# 38, 41, 47 ----------------------------------------------------------------------------------
def test_38_47_state_delta_with_categories_and_provenance(conn):
    reply = conn.send(invoke(macro(conn, "echo_tool"), {"text": "delta"}))
    delta = reply.payload["state_delta"]
    assert delta["assert"]
    for item in delta["assert"]:
        assert item["category"] in ("server", "session", "derived")
        assert item["source"]["source_type"]
        assert PRED_RE.match(item["pred"]) and isinstance(item["args"], list)
    assert delta["retract"] == [{"pred": "echoed", "args": [None]}]  # a null wildcard


def test_41_suggested_intents_and_continuation_facts(conn):
    reply = conn.send(invoke(macro(conn, "echo_tool"), {"text": "next"}))
    nxt = reply.payload["next"]
    manifest = conn.manifest()["payload"]
    for suggestion in nxt["suggested_intents"]:
        assert suggestion["name"] in {i["name"] for i in manifest["intents"]} and suggestion["description"]
    profile = FactsProfile.model_validate(manifest["facts_profile"])
    assert validate_facts(nxt["continuation_facts"], profile)[1] == []


# 39, 40 --------------------------------------------------------------------------------------
def test_39_side_effects_are_declared_and_never_empty(conn):
    for name in ("diag", "tools"):
        for tool in conn.send(intent(name)).payload["macro_tools"]:
            effects = tool["safety"]["side_effects"]
            assert effects and all(e in SIDE_EFFECTS or e.startswith("x-") for e in effects)


def test_40_confirmation(conn, locked):
    danger = macro(conn, "danger_tool")
    required = expect_error(conn.send(invoke(danger, {"amount": 5})), "confirmation_required")
    token = required["details"]["confirmation_token"]
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    expect_error(conn.send(invoke(danger, {"amount": 5}, confirmation_token=forged)), "confirmation_invalid")
    assert conn.send(invoke(danger, {"amount": 5}, confirmation_token=token)).type == "invoke_response"
    expect_error(conn.send(invoke(danger, {"amount": 5}, confirmation_token=token)), "confirmation_invalid")
    # bypass only for a principal configured as automated for these effects
    if locked.transport == "http":
        locked.headers["Authorization"] = "Bearer robot-token"
    else:
        locked.send(envelope("authenticate", "t40", {"scheme": "bearer", "token": "robot-token"}))
    assert locked.send(invoke(macro(locked, "danger_tool"), {"amount": 1})).type == "invoke_response"
    if locked.transport == "http":
        locked.headers["Authorization"] = "Bearer good-token"
    else:
        locked.send(envelope("authenticate", "t40b", {"scheme": "bearer", "token": "good-token"}))
    expect_error(locked.send(invoke(macro(locked, "danger_tool"), {"amount": 1})), "confirmation_required")


# 42, 43 --------------------------------------------------------------------------------------
def test_42_skills_inline_referenced_triggered_and_squeezed(conn):
    assert "skills" not in tools(conn.send(intent("diag")))["mandatory_tool"].get("context_injection", {})
    reply = conn.send(intent("diag", [fact("enable", "skill")]))
    inline, referenced = tools(reply)["mandatory_tool"]["context_injection"]["skills"]
    assert inline["inline"] is True and inline["content"]
    assert referenced["inline"] is False and referenced["skill_id"] and referenced["description"]
    total = sum(estimate_tokens(t) for t in reply.payload["macro_tools"])
    squeezed = conn.send(intent("diag", [fact("enable", "skill")], constraints={"max_tokens_budget": total - 1}))
    assert [s["inline"] for s in tools(squeezed)["mandatory_tool"]["context_injection"]["skills"]] == [False, False]


def test_43_context_injection_as_the_rules_derive_it(conn):
    injection = tools(conn.send(intent("diag", [fact("enable", "skill")])))["mandatory_tool"]["context_injection"]
    assert injection["instructions"] == "Run the diagnosis first."
    assert [s["skill_id"] for s in injection["skills"]] == ["diag_guide", "diag_manual"]
    assert injection["context_resources"] == [{"uri": "docs/diag.md", "priority": 70},
                                              {"uri": "https://example.org/diag", "priority": 20}]


# 44 ------------------------------------------------------------------------------------------
def test_44_fact_violation_details(conn):
    payload = expect_error(conn.send(intent("diag", [fact("task", "001")])), "arity_mismatch")
    violation = payload["details"]["violations"][0]
    assert {k: violation[k] for k in ("fact_index", "predicate", "issue", "expected_arity", "actual_arity")} == {
        "fact_index": 0, "predicate": "task", "issue": "arity_mismatch", "expected_arity": 2, "actual_arity": 1}
    assert violation["message"]


# 45 ------------------------------------------------------------------------------------------
def test_45_readiness_booting_ready_draining(booting):
    first = booting.manifest()
    assert first["payload"]["status"] == "booting"
    refused = expect_error(booting.send(intent("diag", id="b-1")), "server_not_ready")
    assert refused["recoverable"] is True and refused["retry_after_ms"] > 0
    (booting.gate_dir / "ready").touch()
    if booting.transport == "stdio":
        booting.wait_manifest("ready")  # pushed on the session transport
    else:
        deadline = time.monotonic() + 30
        while booting.manifest()["payload"]["status"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.05)
    assert booting.send(intent("diag", id="b-2")).type == "intent_response"
    (booting.gate_dir / "drain").touch()
    if booting.transport == "stdio":
        booting.wait_manifest("draining")
    else:
        while booting.manifest()["payload"]["status"] != "draining" and time.monotonic() < deadline:
            time.sleep(0.05)
    expect_error(booting.send(intent("diag", id="b-3")), "server_not_ready")
    if booting.transport == "stdio":
        assert booting.close() == 0  # item 12: exits after stdin EOF


# 46 ------------------------------------------------------------------------------------------
def test_46_cancel_gives_exactly_one_final_message(conn):
    slow = macro(conn, "slow_tool")
    if conn.transport == "stdio":
        box = conn.open_box("slow-46")
        conn.write(json.dumps(invoke(slow, {"seconds": 30}, id="slow-46")).encode())
        first = box.get(timeout=30)
        assert (first["type"], first["payload"]["status"]) == ("progress", "started")
        conn.write(json.dumps(envelope("cancel", None, {"request_id": "slow-46"})).encode())
        final = conn.collect("slow-46", box)
        assert (final.type, final.payload["code"]) == ("error", "cancelled")
        time.sleep(0.1)
        assert box.empty()  # nothing else for that id
        return
    # HTTP: closing the connection or POSTing a cancel (extension x-http_cancel) cancels
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(reply=conn.send(invoke(slow, {"seconds": 30}, id="slow-46"))))
    worker.start()
    cancel_url = conn.url + conn.manifest()["payload"]["extensions"]["x-http_cancel"]
    while worker.is_alive():  # repeated until it lands: the invocation may not have started yet
        response = conn.client.post(cancel_url, json=envelope("cancel", "c-46", {"request_id": "slow-46"}))
        assert response.status_code == 204
        worker.join(0.1)
    reply = box["reply"]
    assert (reply.status, reply.type, reply.payload["code"]) == (499, "error", "cancelled")


# Level-3 features the server has ---------------------------------------------------------------
def test_49_validity_windows_expire(conn):
    tool = tools(conn.send(intent("tools", id="v-49")))["ephemeral_tool"]
    validity = tool["validity"]
    assert validity["not_before"] < validity["expires_at"]
    time.sleep(0.6)  # past the fixture tool's 0.5 s window
    payload = expect_error(conn.send(invoke(tool["macro_id"], {})), "macro_expired")
    assert payload["details"]["expired_at"] == validity["expires_at"]


def test_50_proof_hints(conn):
    plain = conn.send(intent("diag"))
    assert plain.payload.get("proof_hints") is None
    reply = conn.send(intent("diag", [fact("enable", "x")], options={"include_proof_hints": True,
                                                                     "disclosure_preference": "full"}))
    hints = reply.payload["proof_hints"]
    assert len(hints["derivations"]) == len(reply.payload["macro_tools"])
    text = json.dumps(hints)
    assert ":-" not in text and "/" not in text and "prohibited(" not in text
    for derivation in hints["derivations"]:
        assert all(PRED_RE.match(r) for r in derivation["rule_chain"])
        assert "prohibited" not in derivation["rule_chain"]


def test_51_rule_coverage(conn):
    reply = conn.send(intent("diag", options={"disclosure_preference": "full", "x-rule_coverage": True}))
    coverage = reply.payload["diagnostics"]["rule_coverage"]
    assert coverage["rules_fired"] + coverage["rules_dormant"] + coverage["rules_inapplicable"] == \
        coverage["total_rules"]
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*#\d+", d["rule"]) for d in coverage["dormant_details"])


def test_51_the_client_asks_for_rule_coverage(servers):
    from ftl.manglecp.client import ManglecpClient
    from ftl.manglecp.transport import HttpTransport
    client = ManglecpClient(HttpTransport(servers["open", "http"].url))
    try:
        diagnostics = client.evaluate("diag", [], rule_coverage=True).diagnostics
        assert diagnostics["rule_coverage"]["total_rules"] > 0
        assert "rule_coverage" not in client.evaluate("diag", []).diagnostics
    finally:
        client.close()


def test_52_no_undeclared_external_predicates(conn):
    assert conn.manifest()["payload"]["capabilities"]["external_predicates"] == []


def test_55_disclosure_upgrade(conn):
    condensed = tools(conn.send(intent("levels", options={})))["score50"]
    assert condensed["disclosure_level"] == "condensed"
    upgraded = conn.send(intent("levels", [fact("disclosure_upgrade", condensed["macro_id"])], options={}))
    assert tools(upgraded)["score50"]["disclosure_level"] == "full"
