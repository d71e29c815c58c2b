"""Wire layer: parsing, the error envelope, code mapping, and fuzzed messages against the server."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl.errors import MANGLECP_CODES, REGISTRY
from ftl.manglecp.facts import format_time, parse_time
from ftl.manglecp.messages import (
    MESSAGE_TYPES, PROTOCOL_VERSION, Fact, ProtocolError, dumps, envelope, make_error, parse_message,
    parse_payload, to_ftl_error)

from .helpers import final, intent, make_server, tools_by_name


def _code(exc_info) -> str:
    return exc_info.value.code


def test_unparsable_is_malformed_with_null_id():
    with pytest.raises(ProtocolError) as exc:
        parse_message(b"{not json")
    assert _code(exc) == "malformed_message"
    assert exc.value.envelope()["id"] is None


@pytest.mark.parametrize("raw", [b"NaN", b'{"a": Infinity}', b"[1,2]", b'"text"', b"\xff\xfe{}"])
def test_non_object_or_non_json_is_malformed(raw):
    with pytest.raises(ProtocolError) as exc:
        parse_message(raw)
    assert _code(exc) == "malformed_message"


def test_envelope_needs_id_key_payload_object_and_version():
    base = {"type": "intent_request", "id": "x", "manglecp": PROTOCOL_VERSION, "payload": {}}
    for key in ("type", "id", "manglecp", "payload"):
        broken = {k: v for k, v in base.items() if k != key}
        with pytest.raises(ProtocolError) as exc:
            parse_message(broken)
        assert _code(exc) == "malformed_message", key
    with pytest.raises(ProtocolError) as exc:
        parse_message({**base, "payload": []})
    assert _code(exc) == "malformed_message"
    assert exc.value.id == "x"  # the id was usable, so the error echoes it


def test_empty_request_id_is_malformed_and_uncorrelated():
    with pytest.raises(ProtocolError) as exc:
        parse_message({"type": "intent_request", "id": "", "manglecp": PROTOCOL_VERSION, "payload": {}})
    assert _code(exc) == "malformed_message"
    assert exc.value.envelope()["id"] is None


def test_wrong_version_names_supported_versions():
    with pytest.raises(ProtocolError) as exc:
        parse_message({"type": "intent_request", "id": "t-1", "manglecp": "1999-01-draft", "payload": {}})
    error = exc.value.envelope()
    assert error["id"] == "t-1"
    assert error["payload"]["code"] == "unsupported_version"
    assert error["payload"]["recoverable"] is True
    assert error["payload"]["details"] == {"requested_version": "1999-01-draft",
                                           "supported_versions": [PROTOCOL_VERSION]}


def test_unknown_type_is_invalid_type_not_recoverable():
    with pytest.raises(ProtocolError) as exc:
        parse_message({"type": "frobnicate", "id": "t-1", "manglecp": PROTOCOL_VERSION, "payload": {}})
    error = exc.value.envelope()["payload"]
    assert (error["code"], error["recoverable"]) == ("invalid_type", False)


def test_size_cap_counts_bytes_before_parsing():
    with pytest.raises(ProtocolError) as exc:
        parse_message("é" * 600, max_bytes=1000)  # 1200 bytes, 600 characters
    assert _code(exc) == "message_too_large"
    assert exc.value.details == {"limit_bytes": 1000, "size_bytes": 1200}


def test_payload_models_report_violations_with_paths():
    env = parse_message(envelope("invoke_request", "i-1", {"macro_id": "", "args": []}))
    with pytest.raises(ProtocolError) as exc:
        parse_payload(env)
    paths = {v["path"] for v in exc.value.details["violations"]}
    assert {"/payload/macro_id", "/payload/args"} <= paths


@pytest.mark.parametrize("code", sorted(MANGLECP_CODES))
def test_make_error_takes_status_flags_from_the_registry(code):
    error = make_error(code, "text", {"k": 1}, retry_after_ms=5, id="q")
    assert error == {"type": "error", "id": "q", "manglecp": PROTOCOL_VERSION,
                     "payload": {"code": code, "message": "text", "recoverable": MANGLECP_CODES[code][1],
                                 "details": {"k": 1}, "retry_after_ms": 5}}


def test_dumps_is_one_line_utf8_without_ascii_escapes():
    text = dumps(envelope("progress", "a", {"status": "running", "detail": "line1\nline2 🚀"}))
    assert "\n" not in text and "🚀" in text
    assert json.loads(text)["payload"]["detail"] == "line1\nline2 🚀"


@pytest.mark.parametrize("code,kind", [
    ("rate_limited", "rate_limited"), ("server_not_ready", "server_not_ready"),
    ("macro_not_found", "macro_not_found"), ("evaluation_timeout", "timeout"),
    ("schema_validation_failed", "invalid_params"), ("arity_mismatch", "invalid_facts"),
    ("reserved_predicate", "invalid_facts"), ("auth_invalid", "auth_invalid"),
    ("execution_failed", "execution_failed"), ("x-workspace_invalid", "workspace_invalid"),
    ("x-unheard-of", "internal_error"), ("cancelled", "cancelled"),
])
def test_to_ftl_error_maps_codes_to_registry_kinds(code, kind):
    error = to_ftl_error({"code": code, "message": "m", "recoverable": True, "retry_after_ms": 250})
    assert error.error_type == kind
    assert error.details["manglecp_code"] == code
    assert error.retry_after_ms == 250
    assert error.message == "m"


def test_to_ftl_error_prefers_details_error_type():
    error = to_ftl_error({"code": "execution_failed", "message": "verify failed", "recoverable": False,
                          "details": {"error_type": "verify_failed", "seq": "001"}})
    assert error.error_type == "verify_failed"
    assert error.details["seq"] == "001"
    assert error.kind is REGISTRY["verify_failed"]


def test_time_values():
    assert parse_time("2026-02-19T14:30:00Z") == 1771511400000
    assert parse_time(1771511400000) == 1771511400000
    assert parse_time("now") == "now" and parse_time("_") == "_"
    assert format_time(1771511400000) == "2026-02-19T14:30:00.000Z"
    for bad in ("2026-02-19", "2026-02-19T14:30:00", True, 1.5, "yesterday"):
        with pytest.raises(ValueError):
            parse_time(bad)
    with pytest.raises(ValueError):
        parse_time(5, formats=("rfc3339",))


def test_fact_model_needs_exactly_one_argument_form():
    assert Fact(pred="task", args=["001", 2]).dump() == {"pred": "task", "args": ["001", 2]}
    with pytest.raises(ValueError):
        Fact(pred="task")
    with pytest.raises(ValueError):
        Fact(pred="task", args=[], named_args={})
    with pytest.raises(ValueError):
        Fact(pred="Task", args=[])


# --- fuzzing: whatever arrives, the reply is one well-formed error and the server keeps serving.

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)

_valid = [
    intent("diag", [{"pred": "enable", "args": ["x"]}]),
    envelope("invoke_request", "i-1", {"macro_id": "m-0000", "args": {"text": "hi"}}),
    envelope("cancel", None, {"request_id": "r-1"}),
    envelope("authenticate", "a-1", {"scheme": "bearer", "token": "t"}),
]


@st.composite
def _mutated(draw) -> object:
    message = json.loads(json.dumps(draw(st.sampled_from(_valid))))
    for _ in range(draw(st.integers(1, 3))):
        target = message
        path = draw(st.lists(st.sampled_from(["payload", "intent", "facts", "args", 0, "name", "macro_id"]),
                             max_size=3))
        for step in path:
            if isinstance(target, dict) and isinstance(step, str) and isinstance(target.get(step), (dict, list)):
                target = target[step]
            elif isinstance(target, list) and isinstance(step, int) and target:
                target = target[0] if isinstance(target[0], (dict, list)) else target
        if isinstance(target, dict) and target:
            key = draw(st.sampled_from(sorted(target)))
            if draw(st.booleans()):
                target[key] = draw(_json_values)
            else:
                del target[key]
        elif isinstance(target, list):
            target.append(draw(_json_values))
    return message


_server = make_server()
_probe = intent("diag", id="probe")


def _check_reply(replies: list[dict], sent: object) -> None:
    assert len(replies) <= 3
    for reply in replies:
        assert set(reply) == {"type", "id", "manglecp", "payload"}
        assert reply["manglecp"] == PROTOCOL_VERSION
        assert reply["type"] in MESSAGE_TYPES
        json.dumps(reply, allow_nan=False)
    if replies and replies[-1]["type"] == "error":
        payload = replies[-1]["payload"]
        assert isinstance(payload["message"], str) and payload["message"]
        assert payload["recoverable"] is MANGLECP_CODES.get(payload["code"], (0, payload["recoverable"]))[1]
        reply_id = replies[-1]["id"]
        sent_id = sent.get("id") if isinstance(sent, dict) else None
        assert reply_id is None or reply_id == sent_id
    assert "mandatory_tool" in tools_by_name(final(_server.handle(_probe)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64)))
def test_random_bytes_get_an_error_and_the_server_keeps_serving(raw):
    replies = _server.handle(raw)
    assert len(replies) == 1 and replies[0]["type"] == "error"
    assert replies[0]["id"] is None
    _check_reply(replies, None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_messages_get_well_formed_replies(message):
    replies = _server.handle(json.dumps(message))
    _check_reply(replies, message)
    if message.get("type") != "cancel" or replies:
        assert replies[-1]["type"] in ("error", "intent_response", "invoke_response", "authenticate_response")
