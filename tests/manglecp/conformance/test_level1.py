"""Conformance Level 1 (reference §9 items 1-27), over stdio and HTTP against real server processes.

Item 11 (WebSocket) does not apply: the server offers no WebSocket binding.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from ftl.manglecp.messages import (
    MIN_MESSAGE_BYTES, PROTOCOL_VERSION, Manifest, envelope, fact)

from .conftest import ERRORS_SEEN, Reply, expect_error, tools
from .fixture_server import MAX_FACTS_PER_REQUEST, SERVER_MAX_DERIVED


def intent(name: str, facts=None, *, id: str = "r-1", **payload) -> dict:
    body = {"intent": {"name": name}, "facts": facts or [], **payload}
    body.setdefault("options", {"disclosure_preference": "full"})
    return envelope("intent_request", id, body)


def invoke(macro_id: str, args: dict, *, id: str = "r-2", **payload) -> dict:
    return envelope("invoke_request", id, {"macro_id": macro_id, "args": args, **payload})


def macro(conn, name: str, intent_name: str = "tools", facts=None) -> str:
    return tools(conn.send(intent(intent_name, facts, id=f"e-{name}")))[name]["macro_id"]


# 2 -------------------------------------------------------------------------------------------
def test_02_ids_are_echoed(conn):
    assert conn.send(intent("diag", id="t-1")).message["id"] == "t-1"
    reply = conn.send(invoke(macro(conn, "echo_tool"), {"text": "hi"}, id="t-2"))
    assert (reply.type, reply.message["id"]) == ("invoke_response", "t-2")


# 3 -------------------------------------------------------------------------------------------
def test_03_unparsable_input_is_an_uncorrelated_malformed_message(conn):
    payload = expect_error(conn.send(b"{not json", reply_id=None), "malformed_message")
    assert payload and conn.send(intent("diag")).type == "intent_response"  # still serving


def test_03_uncorrelated_error_has_a_null_id(conn):
    reply = conn.send(b"{not json", reply_id=None)
    assert reply.message["id"] is None


# 4 -------------------------------------------------------------------------------------------
def test_04_an_empty_request_id_is_malformed(conn):
    message = intent("diag", id="")
    reply = conn.send(message, reply_id=None)
    expect_error(reply, "malformed_message")
    assert reply.message["id"] is None


# 5 -------------------------------------------------------------------------------------------
def test_05_unsupported_version(conn):
    message = intent("diag", id="v-1") | {"manglecp": "1999-01-draft"}
    payload = expect_error(conn.send(message), "unsupported_version")
    assert payload["recoverable"] is True
    assert PROTOCOL_VERSION in payload["details"]["supported_versions"]
    assert payload["details"]["requested_version"] == "1999-01-draft"


# 6 -------------------------------------------------------------------------------------------
def test_06_unknown_type(conn):
    payload = expect_error(conn.send(envelope("frobnicate", "f-1", {})), "invalid_type")
    assert payload["recoverable"] is False


# 7, 8 ----------------------------------------------------------------------------------------
def test_07_a_message_just_under_16_mib_is_accepted(conn):
    assert Manifest.model_validate(conn.manifest()["payload"]).limits.max_message_bytes >= 16 * 1024 * 1024
    message = intent("diag", id="big-1")
    message["payload"]["intent"]["params"] = {"pad": ""}
    pad = MIN_MESSAGE_BYTES - 100 * 1024 - len(json.dumps(message))  # ~15.9 MiB in all
    message["payload"]["intent"]["params"]["pad"] = "x" * pad
    assert conn.send(message).type == "intent_response"


def test_08_one_byte_over_the_cap_is_message_too_large(conn):
    limit = conn.manifest()["payload"]["limits"]["max_message_bytes"]
    prefix = b'{"type":"intent_request","id":"huge-1","manglecp":"2026-02-draft","payload":{"pad":"'
    raw = prefix + b"x" * (limit + 1 - len(prefix) - 3) + b'"}}'
    assert len(raw) == limit + 1
    reply = conn.send(raw, reply_id=None)
    expect_error(reply, "message_too_large")
    assert conn.send(intent("diag")).type == "intent_response"


# 9 -------------------------------------------------------------------------------------------
def test_09_non_bmp_strings_round_trip_and_output_is_utf8_without_bom(conn):
    text = "🚀 ünïcode 𝄞"
    reply = conn.send(invoke(macro(conn, "echo_tool", facts=[fact("enable", text)]), {"text": text[:19]}))
    assert reply.payload["result"]["echo"]["text"] == text[:19]
    assert reply.payload["state_delta"]["assert"][0]["args"] == [text[:19]]
    raw = conn.lines if conn.transport == "stdio" else conn.bodies
    assert raw
    for data in raw:
        assert not data.startswith(b"\xef\xbb\xbf")
        data.decode("utf-8")
    assert text[:19].encode("utf-8") in b"".join(raw)  # sent as UTF-8, not as \u escapes


# 10 ------------------------------------------------------------------------------------------
def test_10_http_binding(servers):
    conn = servers["open", "http"]
    response = conn.client.get(conn.url + "/.well-known/manglecp/manifest.json")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert (body["type"], body["id"]) == ("manifest", None)
    evaluated = conn.send(intent("tools", id="h-1"))
    assert (evaluated.status, evaluated.type) == (200, "intent_response")
    invoked = conn.send(invoke(tools(evaluated)["echo_tool"]["macro_id"], {"text": "x"}, id="h-2"))
    assert (invoked.status, invoked.type) == (200, "invoke_response")
    wrong = conn.send(intent("diag", id="h-3"), path="/manglecp/invoke")
    expect_error(wrong, "invalid_type")


# 12 ------------------------------------------------------------------------------------------
def test_12_stdio_binding(servers):
    conn = servers["open", "stdio"]
    assert conn.first_line_before_write is True  # the manifest came before the test wrote anything
    assert json.loads(conn.lines[0])["type"] == "manifest"
    for line in conn.lines:
        assert line.endswith(b"\n") and isinstance(json.loads(line), dict)
    # the process exits after EOF: checked by test_45 on its own server (exit code 0)


# 13 ------------------------------------------------------------------------------------------
def test_13_manifest_required_fields(conn):
    message = conn.manifest()
    assert (message["type"], message["id"], message["manglecp"]) == ("manifest", None, PROTOCOL_VERSION)
    manifest = Manifest.model_validate(message["payload"])
    assert manifest.protocol.conformance_level == 2
    assert manifest.status in ("ready", "booting", "degraded", "draining")
    assert manifest.facts_profile.time_formats and isinstance(manifest.capabilities.temporal, bool)
    assert manifest.auth.required is False
    if conn.transport == "http":
        assert manifest.endpoints.intent_eval and manifest.endpoints.macro_invoke
    text = json.dumps(message)
    assert "echo_tool" not in text and "mandatory_tool" not in text  # no tool list


def test_13_auth_schemes_when_auth_is_required(locked):
    manifest = locked.manifest()["payload"]
    assert manifest["auth"] == {"required": True, "schemes": ["bearer"]}


# 14, 15, 16 ----------------------------------------------------------------------------------
def test_14_fact_syntax(conn):
    payload = expect_error(conn.send(intent("diag", [{"pred": "Bad-Name", "args": []},
                                                     {"pred": "a" * 200, "args": []}])), "invalid_facts")
    assert [v["fact_index"] for v in payload["details"]["violations"]] == [0, 1]


def test_15_reserved_prefix(conn):
    reply = conn.send(intent("diag", [{"pred": "_manglecp_x", "args": ["a"]}]))
    payload = expect_error(reply, "reserved_predicate")
    assert payload["details"]["violations"][0]["issue"] == "reserved_predicate"


def test_16_too_many_facts(conn):
    assert conn.manifest()["payload"]["limits"]["max_facts_per_request"] == MAX_FACTS_PER_REQUEST
    facts = [fact("enable", f"v{i}") for i in range(MAX_FACTS_PER_REQUEST + 1)]
    expect_error(conn.send(intent("diag", facts)), "too_many_facts")


# 17-20 ---------------------------------------------------------------------------------------
def test_17_intent_cycle_and_uncovered_intent(conn):
    reply = conn.send(intent("diag"))
    assert reply.type == "intent_response" and "eval_time_used" in reply.payload
    assert isinstance(reply.payload["macro_tools"], list) and reply.payload["macro_tools"]
    empty = conn.send(intent("nobody_serves_this"))
    assert (empty.type, empty.payload["macro_tools"]) == ("intent_response", [])


def test_18_relevance_and_exclusion(conn):
    names = set(tools(conn.send(intent("diag"))))
    assert "mandatory_tool" in names
    assert "prohibited_tool" not in names  # prohibited although a rule scores it 95
    assert "other_tool" not in names       # belongs to the intent `other`
    assert set(tools(conn.send(intent("other")))) == {"other_tool"}


def test_19_fresh_store_per_request(conn):
    assert "enabled_tool" in tools(conn.send(intent("diag", [fact("enable", "x")])))
    assert "enabled_tool" not in tools(conn.send(intent("diag")))


def test_20_full_macro_tool_shape(conn):
    macro_tools = conn.send(intent("diag", [fact("enable", "skill")])).payload["macro_tools"]
    assert len({t["macro_id"] for t in macro_tools}) == len(macro_tools)
    for tool in macro_tools:
        assert tool["macro_id"] and tool["name"] and tool["description"]
        assert tool["disclosure_level"] == "full"
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])
        assert isinstance(tool["safety"]["requires_user_confirmation"], bool)
        assert isinstance(tool["safety"]["side_effects"], list)


# 21, 22 --------------------------------------------------------------------------------------
def test_21_invoke_cycle(conn):
    reply = conn.send(invoke(macro(conn, "echo_tool"), {"text": "hello"}))
    assert reply.type == "invoke_response" and isinstance(reply.payload["result"], dict)
    assert reply.payload["result"]["echo"] == {"text": "hello"}


def test_22_invoke_errors(conn):
    payload = expect_error(conn.send(invoke("m-unknown", {})), "macro_not_found")
    assert payload["details"]["macro_id"] == "m-unknown"
    bad = expect_error(conn.send(invoke(macro(conn, "echo_tool"), {"text": 5})), "schema_validation_failed")
    assert bad["details"]["schema_errors"] == [{"path": "/text", "message": "5 is not of type 'string'",
                                                 "keyword": "type"}]


# 23-25 ---------------------------------------------------------------------------------------
def _no_partial_result(reply: Reply) -> None:
    assert reply.type == "error" and "macro_tools" not in json.dumps(reply.message)


def test_23_gas_limit(conn):
    reply = conn.send(intent("heavy", constraints={"max_facts_created": 10}))
    payload = expect_error(reply, "derivation_limit_exceeded")
    budget = payload["details"]["budget"]
    assert payload["recoverable"] is True and budget["limit"] == 10 and budget["consumed"] >= 10
    assert budget["unit"] == "derived_facts" and payload["details"]["partial_results_available"] is False
    _no_partial_result(reply)


def test_24_constraints_merge_down_to_the_server_limit(conn):
    reply = conn.send(intent("heavy", constraints={"max_facts_created": 10 * SERVER_MAX_DERIVED}))
    payload = expect_error(reply, "derivation_limit_exceeded")
    assert payload["details"]["budget"]["limit"] == SERVER_MAX_DERIVED
    _no_partial_result(reply)


def test_25_timeout(conn):
    reply = conn.send(intent("slow", constraints={"max_compute_ms": 50}))
    payload = expect_error(reply, "evaluation_timeout")
    assert payload["details"]["budget"] == {**payload["details"]["budget"], "limit": 50, "unit": "ms"}
    _no_partial_result(reply)
    assert conn.send(intent("diag")).type == "intent_response"  # the killed worker was replaced


# 27 ------------------------------------------------------------------------------------------
def test_27_auth_statuses(locked):
    if locked.transport == "http":
        locked.headers.pop("Authorization", None)
    expect_error(locked.send(intent("diag", id="a-1")), "auth_required")
    if locked.transport == "http":
        expect_error(locked.send(intent("diag", id="a-2"), headers={"Authorization": "Bearer wrong"}), "auth_invalid")
        narrow = locked.send(intent("diag", id="a-3"), headers={"Authorization": "Bearer narrow-token"})
        expect_error(narrow, "auth_insufficient")
        ok = locked.send(intent("levels", id="a-4"), headers={"Authorization": "Bearer narrow-token"})
        assert ok.type == "intent_response"
        preflight = locked.client.options(locked.url + "/manglecp/evaluate",
                                          headers={"Origin": "https://evil.example",
                                                   "Access-Control-Request-Method": "POST"})
        assert preflight.headers.get("access-control-allow-origin") != "*"
        return
    # a session authenticates once with an `authenticate` message (spec 08 §3.3)
    expect_error(locked.send(envelope("authenticate", "a-2", {"scheme": "bearer", "token": "wrong"})),
                 "auth_invalid")
    answer = locked.send(envelope("authenticate", "a-3", {"scheme": "bearer", "token": "narrow-token"}))
    assert (answer.type, answer.payload["identity"]) == ("authenticate_response", "bob")
    expect_error(locked.send(intent("diag", id="a-4")), "auth_insufficient")
    assert locked.send(intent("levels", id="a-5")).type == "intent_response"
    assert locked.send(envelope("authenticate", "a-6", {"scheme": "bearer", "token": "good-token"})
                       ).payload["identity"] == "alice"


# 1, 26 (over everything the session saw so far) -----------------------------------------------
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_01_every_server_message_is_an_envelope(servers, transport):
    conn = servers["open", transport]
    raw = conn.lines if transport == "stdio" else conn.bodies
    assert len(raw) > 20
    known = {"manifest", "intent_response", "invoke_response", "progress", "error", "authenticate_response"}
    for data in raw:
        message = json.loads(data)
        assert set(message) == {"type", "id", "manglecp", "payload"}
        assert message["type"] in known and message["manglecp"] == PROTOCOL_VERSION
        assert isinstance(message["payload"], dict)
        assert message["id"] is None or isinstance(message["id"], str)


def test_26_every_error_seen_has_the_registry_shape():
    from ftl.manglecp.messages import code_row
    assert len(ERRORS_SEEN) > 20
    for transport, payload, status in ERRORS_SEEN:
        assert {"code", "message", "recoverable"} <= set(payload)
        assert payload["recoverable"] is code_row(payload["code"])[1], payload
        if status is not None:
            assert status == code_row(payload["code"])[0], payload
