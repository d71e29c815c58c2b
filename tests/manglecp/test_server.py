"""The server framework: manifest, checks, auth, limits, rendering, invocation (conformance
items 2, 4-8, 13, 20-22, 26-27, 32-35, 39-40, 45-46, 55)."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

from ftl.errors import MANGLECP_CODES
from ftl.manglecp.messages import MIN_MESSAGE_BYTES, PROTOCOL_VERSION, Manifest, envelope
from ftl.manglecp.access import Session
from ftl.manglecp.definitions import ServerLimits
from ftl.manglecp.render import estimate_tokens

from .helpers import final, intent, invoke, make_server, tools_by_name


def _error(replies):
    reply = final(replies)
    assert reply["type"] == "error", reply
    payload = reply["payload"]
    assert payload["recoverable"] is MANGLECP_CODES[payload["code"]][1]  # conformance 26
    return reply


def _macro(server, name, session=None, intent_name="tools"):
    return tools_by_name(final(server.handle(intent(intent_name), session=session)))[name]["macro_id"]


# --- manifest and envelope ------------------------------------------------------------------

def test_manifest_has_every_required_field(server):
    manifest = server.manifest()
    assert (manifest["type"], manifest["id"], manifest["manglecp"]) == ("manifest", None, PROTOCOL_VERSION)
    payload = Manifest.model_validate(manifest["payload"])
    assert payload.protocol.conformance_level in (1, 2, 3)
    assert payload.limits.max_message_bytes >= MIN_MESSAGE_BYTES
    assert payload.auth.required is False
    assert payload.endpoints.intent_eval and payload.endpoints.macro_invoke
    assert "tools" not in manifest["payload"]  # anti-enumeration: intents only
    assert any(p.predicate == "disclosure_upgrade" for p in payload.facts_profile.predicates)


def test_ids_are_echoed(server):
    assert final(server.handle(intent("diag", id="t-1")))["id"] == "t-1"
    macro_id = _macro(server, "echo_tool")
    assert final(server.handle(invoke(macro_id, {"text": "hi"}, id="t-2")))["id"] == "t-2"


def test_server_types_from_a_client_are_invalid_type(server):
    reply = _error(server.handle(envelope("manifest", "m-1", {})))
    assert reply["payload"]["code"] == "invalid_type" and reply["id"] == "m-1"


def test_size_floor_and_cap():
    server = make_server()
    big = intent("diag")
    big["payload"]["intent"]["params"] = {"pad": "x" * (MIN_MESSAGE_BYTES - 100_000)}
    raw = json.dumps(big).encode()
    assert len(raw) < MIN_MESSAGE_BYTES
    assert final(server.handle(raw))["type"] == "intent_response"
    too_big = b" " * (MIN_MESSAGE_BYTES + 1)
    reply = _error(server.handle(too_big))
    assert reply["payload"]["code"] == "message_too_large" and reply["id"] is None


# --- status, rate limit, auth ---------------------------------------------------------------

def test_booting_and_draining_refuse_requests(clock):
    server = make_server(status="booting", clock=clock)
    pushed = []
    server.add_manifest_listener(pushed.append)
    reply = _error(server.handle(intent("diag")))
    assert reply["payload"]["code"] == "server_not_ready" and reply["payload"]["retry_after_ms"] > 0
    server.set_status("ready")
    assert pushed[-1]["payload"]["status"] == "ready"
    assert final(server.handle(intent("diag")))["type"] == "intent_response"
    server.set_status("draining")
    assert _error(server.handle(intent("diag")))["payload"]["code"] == "server_not_ready"


def test_rate_limit_uses_the_injected_clock(clock):
    server = make_server(limits=ServerLimits(rate_per_s=2.0, rate_burst=2), clock=clock)
    session = Session(key="client-a")
    assert final(server.handle(intent("diag"), session=session))["type"] == "intent_response"
    assert final(server.handle(intent("diag"), session=session))["type"] == "intent_response"
    limited = _error(server.handle(intent("diag"), session=session))
    assert limited["payload"]["code"] == "rate_limited"
    assert limited["payload"]["retry_after_ms"] == 500
    assert final(server.handle(intent("diag"), session=Session(key="client-b")))["type"] == "intent_response"
    clock.advance(0.5)
    assert final(server.handle(intent("diag"), session=session))["type"] == "intent_response"


def test_bearer_auth_codes(auth):
    server = make_server(auth=auth)
    assert server.manifest()["payload"]["auth"] == {"required": True, "schemes": ["bearer"]}
    assert _error(server.handle(intent("diag")))["payload"]["code"] == "auth_required"
    bad = _error(server.handle(intent("diag"), session=Session(credentials="nope")))
    assert bad["payload"]["code"] == "auth_invalid" and "nope" not in json.dumps(bad)
    narrow = _error(server.handle(intent("diag"), session=Session(credentials="narrow-token")))
    assert narrow["payload"]["code"] == "auth_insufficient"
    ok = final(server.handle(intent("levels"), session=Session(credentials="narrow-token")))
    assert ok["type"] == "intent_response"


def test_session_authenticate_message(auth):
    server = make_server(auth=auth)
    session = Session()
    assert _error(server.handle(intent("diag"), session=session))["payload"]["code"] == "auth_required"
    denied = server.handle(envelope("authenticate", "a-0", {"scheme": "bearer", "token": "wrong"}), session=session)
    assert final(denied)["payload"]["code"] == "auth_invalid"
    reply = final(server.handle(envelope("authenticate", "a-1", {"scheme": "bearer", "token": "good-token"}),
                                session=session))
    assert reply["type"] == "authenticate_response" and reply["payload"]["identity"] == "alice"
    assert final(server.handle(intent("diag"), session=session))["type"] == "intent_response"


# --- rendering ------------------------------------------------------------------------------

def test_full_tools_have_the_required_shape(server):
    tools = final(server.handle(intent("diag")))["payload"]["macro_tools"]
    assert len({t["macro_id"] for t in tools}) == len(tools)
    for tool in tools:
        assert tool["disclosure_level"] == "full" and tool["description"]
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])
        assert isinstance(tool["safety"]["requires_user_confirmation"], bool)
        assert tool["safety"]["side_effects"]  # never [] (our decision)


# spec 06 §4: (required, allowed) fields per level
WHITELIST = {
    "full": ({"macro_id", "name", "disclosure_level", "description", "input_schema", "safety"},
             {"macro_id", "name", "disclosure_level", "description", "input_schema", "safety", "output_schema",
              "context_injection", "validity", "metadata"}),
    "condensed": ({"macro_id", "name", "disclosure_level", "description"},
                  {"macro_id", "name", "disclosure_level", "description", "metadata"}),
    "minimal": ({"macro_id", "name", "disclosure_level"}, {"macro_id", "name", "disclosure_level"}),
}


@pytest.mark.parametrize("level", ["full", "condensed", "minimal"])
def test_disclosure_levels_follow_the_whitelist(server, level):
    required, allowed = WHITELIST[level]
    reply = final(server.handle(intent("diag", [{"pred": "enable", "args": ["skill"]}],
                                       options={"disclosure_preference": level})))
    for tool in reply["payload"]["macro_tools"]:
        assert tool["disclosure_level"] == level and required <= set(tool) <= allowed


def test_adaptive_levels_and_configurable_thresholds(clock):
    server = make_server(clock=clock)
    adaptive = tools_by_name(final(server.handle(intent("levels", options={}))))
    assert {n: t["disclosure_level"] for n, t in adaptive.items()} == {
        "score80": "full", "score50": "condensed", "score30": "minimal"}
    lowered = make_server(limits=ServerLimits(full_threshold=45, minimal_threshold=5), clock=clock)
    levels = {n: t["disclosure_level"] for n, t in tools_by_name(final(lowered.handle(intent("levels", options={})))).items()}
    assert levels == {"score80": "full", "score50": "full", "score30": "minimal", "score10": "minimal"}


def test_max_tools_returned_keeps_the_best(server):
    tools = final(server.handle(intent("levels", constraints={"max_tools_returned": 2})))["payload"]["macro_tools"]
    assert [t["name"] for t in tools] == ["score80", "score50"]


def test_token_budget_demotes_lowest_scores_first(server):
    full = final(server.handle(intent("levels")))["payload"]["macro_tools"]
    total = sum(estimate_tokens(t) for t in full)
    budget = total - 10
    tools = final(server.handle(intent("levels", constraints={"max_tokens_budget": budget})))["payload"]["macro_tools"]
    assert sum(estimate_tokens(t) for t in tools) <= budget
    levels = [t["disclosure_level"] for t in tools]
    assert levels[0] == "full" and levels[-1] != "full"  # the lowest score is demoted first
    tiny = final(server.handle(intent("levels", constraints={"max_tokens_budget": 20})))["payload"]["macro_tools"]
    assert sum(estimate_tokens(t) for t in tiny) <= 20
    assert [t["name"] for t in tiny] == [t["name"] for t in full][:len(tiny)]


def test_disclosure_upgrade_returns_that_tool_at_full(server):
    condensed = tools_by_name(final(server.handle(intent("levels", options={}))))["score50"]
    assert condensed["disclosure_level"] == "condensed"
    upgrade = {"pred": "disclosure_upgrade", "args": [condensed["macro_id"]]}
    again = tools_by_name(final(server.handle(intent("levels", [upgrade], options={}))))
    assert again["score50"]["disclosure_level"] == "full"


def test_proof_hints_only_on_request(server):
    assert "proof_hints" not in final(server.handle(intent("diag")))["payload"]
    hints = final(server.handle(intent("diag", options={"include_proof_hints": True,
                                                         "disclosure_preference": "full"})))["payload"]["proof_hints"]
    assert hints["derivations"] and all(all(r.isidentifier() for r in d["rule_chain"]) for d in hints["derivations"])
    assert {"candidate": "prohibited_tool", "excluded_by": "exclusion", "reason": "policy"} in hints["excluded"]
    assert ":-" not in json.dumps(hints) and "/" not in json.dumps(hints)


# --- invocation -----------------------------------------------------------------------------

def test_invoke_cycle_with_progress_before_the_response(server):
    replies = server.handle(invoke(_macro(server, "echo_tool"), {"text": "hi"}))
    assert [r["type"] for r in replies] == ["progress", "progress", "progress", "invoke_response"]
    assert replies[1]["payload"] == {"status": "running", "detail": "echoing", "percent": 50.0}
    payload = replies[-1]["payload"]
    assert payload["result"] == {"echo": {"text": "hi"}, "identity": "anonymous"}
    assert payload["observability"]["summary"]


def test_unknown_macro_and_schema_errors(server):
    missing = _error(server.handle(invoke("m-does-not-exist", {})))
    assert missing["payload"]["code"] == "macro_not_found"
    bad = _error(server.handle(invoke(_macro(server, "echo_tool"), {"text": 5, "count": -1, "extra": 1})))
    assert bad["payload"]["code"] == "schema_validation_failed"
    errors = bad["payload"]["details"]["schema_errors"]
    assert [(e["path"], e["keyword"]) for e in errors] == [
        ("/", "additionalProperties"), ("/count", "minimum"), ("/text", "type")]


def test_macro_cache_is_scoped_per_session_and_validity_windows_expire(clock):
    server = make_server(limits=ServerLimits(macro_validity_s=60, macro_ttl_s=600), clock=clock)
    mine = Session(key="one")
    tool = tools_by_name(final(server.handle(intent("tools"), session=mine)))["echo_tool"]
    assert tool["validity"] == {"not_before": "2026-02-19T14:10:00.000Z", "expires_at": "2026-02-19T14:11:00.000Z"}
    macro_id = tool["macro_id"]
    assert _error(server.handle(invoke(macro_id, {"text": "x"}), session=Session(key="two")))[
        "payload"]["code"] == "macro_not_found"
    assert final(server.handle(invoke(macro_id, {"text": "x"}), session=mine))["type"] == "invoke_response"
    clock.advance(60)  # the window is [not_before, expires_at)
    expired = _error(server.handle(invoke(macro_id, {"text": "x"}), session=mine))["payload"]
    assert (expired["code"], expired["details"]["expired_at"]) == ("macro_expired", "2026-02-19T14:11:00.000Z")
    clock.advance(601)  # evicted after the window plus macro_ttl_s
    assert _error(server.handle(invoke(macro_id, {"text": "x"}), session=mine))["payload"]["code"] == "macro_not_found"


def test_without_a_validity_window_entries_are_evicted_after_the_ttl(clock):
    server = make_server(limits=ServerLimits(macro_validity_s=None, macro_ttl_s=60), clock=clock)
    tool = tools_by_name(final(server.handle(intent("tools"))))["echo_tool"]
    assert "validity" not in tool
    clock.advance(61)
    assert _error(server.handle(invoke(tool["macro_id"], {"text": "x"})))["payload"]["code"] == "macro_not_found"


def test_tool_ftl_error_keeps_its_kind_and_only_safe_details(server):
    reply = _error(server.handle(invoke(_macro(server, "failing_tool"), {})))
    payload = reply["payload"]
    assert payload["code"] == "execution_failed"
    assert payload["details"] == {"seq": "001", "exit_code": 3, "error_type": "verify_failed"}
    assert "secret" not in json.dumps(reply)


def test_unexpected_exceptions_leak_nothing(server):
    for name in ("crash_tool", "bad_result_tool"):
        reply = _error(server.handle(invoke(_macro(server, name), {})))
        assert reply["payload"]["code"] == "internal_error"
        assert set(reply["payload"]["details"]) == {"correlation_id"}
        assert "secret" not in json.dumps(reply) and "Traceback" not in json.dumps(reply)


def test_confirmation_workflow(server, auth):
    macro_id = _macro(server, "danger_tool")
    required = _error(server.handle(invoke(macro_id, {"amount": 5})))
    details = required["payload"]["details"]
    assert required["payload"]["code"] == "confirmation_required" and details["side_effects"] == ["payments"]
    token = details["confirmation_token"]
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    assert _error(server.handle(invoke(macro_id, {"amount": 5}, confirmation_token=forged)))[
        "payload"]["code"] == "confirmation_invalid"
    other_args = _error(server.handle(invoke(macro_id, {"amount": 6}, confirmation_token=token)))
    assert other_args["payload"]["code"] == "confirmation_invalid"
    ok = final(server.handle(invoke(macro_id, {"amount": 5}, confirmation_token=token)))
    assert ok["type"] == "invoke_response"
    reused = _error(server.handle(invoke(macro_id, {"amount": 5}, confirmation_token=token)))
    assert reused["payload"]["code"] == "confirmation_invalid"


def test_confirmation_tokens_expire(clock):
    server = make_server(clock=clock)
    macro_id = _macro(server, "danger_tool")
    token = _error(server.handle(invoke(macro_id, {})))["payload"]["details"]["confirmation_token"]
    clock.advance(301)
    assert _error(server.handle(invoke(macro_id, {}, confirmation_token=token)))["payload"]["code"] == \
        "confirmation_invalid"


def test_automated_principal_bypasses_confirmation_only_when_configured(auth):
    server = make_server(auth=auth)
    robot = Session(credentials="robot-token")
    macro_id = _macro(server, "danger_tool", session=robot)
    assert final(server.handle(invoke(macro_id, {}), session=robot))["type"] == "invoke_response"
    alice = Session(credentials="good-token")
    macro_id = _macro(server, "danger_tool", session=alice)
    assert _error(server.handle(invoke(macro_id, {}), session=alice))["payload"]["code"] == "confirmation_required"


def test_cancel_gives_exactly_one_cancelled_reply(server):
    session = Session(key="s")
    macro_id = _macro(server, "slow_tool", session=session)
    started = threading.Event()
    replies: list = []
    # the first progress message ("started") says the tool is running
    worker = threading.Thread(target=lambda: replies.extend(server.handle(
        invoke(macro_id, {"seconds": 30}, id="slow-1"), session=session,
        emit=lambda m: started.set() if m["type"] == "progress" else None)))
    worker.start()
    assert started.wait(10)
    assert server.handle(envelope("cancel", None, {"request_id": "slow-1"}), session=session) == []
    worker.join(10)
    assert [r["type"] for r in replies] == ["error"]
    assert (replies[0]["id"], replies[0]["payload"]["code"]) == ("slow-1", "cancelled")
