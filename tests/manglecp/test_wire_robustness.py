"""Hostile or broken input on the wire: every line gets its MangleCP answer and nothing stops the
loops that read them (the stdio read loop, the HTTP endpoints, the client's reader thread)."""

from __future__ import annotations

import dataclasses
import io
import json

from ftl.manglecp.access import Session
from ftl.manglecp.messages import encode
from ftl.server.serve import serve_stdio

from .helpers import final, intent, invoke, make_server, tools_by_name

DEEP = b"[" * 5000 + b"]" * 5000  # ~10 KB; json.loads raises RecursionError on it


def _stdio_replies(server, data: bytes) -> list[dict]:
    """Run the real stdio read loop over ``data``; every line it wrote after the manifest."""
    out = io.BytesIO()
    serve_stdio(server, io.BytesIO(data), out)
    return [json.loads(line) for line in out.getvalue().splitlines()[1:]]


def test_a_deeply_nested_line_is_answered_and_the_stdio_loop_keeps_reading():
    after = json.dumps(intent("diag", id="after")).encode()
    replies = _stdio_replies(make_server(), DEEP + b"\n" + after + b"\n")
    by_id = {m["id"]: m for m in replies if m["type"] != "progress"}
    assert by_id[None]["type"] == "error"
    assert by_id[None]["payload"]["code"] == "malformed_message"
    assert by_id["after"]["type"] == "intent_response"


# -- replies that cannot be encoded (NaN / infinity) --------------------------------------------


class _NanDecisionGate:
    """A gate that allows every call and shows a decision JSON cannot carry."""

    class Decision:
        def public(self):
            return {"score": float("nan")}

    def visible(self, name):
        return True

    def check(self, call):
        return self.Decision()


def _nan_server(**kwargs):
    server = make_server(**kwargs)
    server.catalog["score80"] = dataclasses.replace(server.catalog["score80"],
                                                    invoke=lambda args, ctx: {"x": float("nan")})
    return server


def _macro(server, name: str, session_key: str | None = None) -> str:
    """Evaluate the intent offering ``name`` (in the macro cache of ``session_key``: the stdio
    loop's session is "stdio") and return its macro id."""
    intent_name = "diag" if name == "mandatory_tool" else "levels"
    reply = server.handle(intent(intent_name), session=Session(key=session_key))[-1]
    return tools_by_name(reply)[name]["macro_id"]


def test_a_non_finite_tool_result_is_an_internal_error_with_a_correlation_id(caplog):
    server = _nan_server()
    reply = final(server.handle(invoke(_macro(server, "score80"), {}, id="nan-1")))
    assert (reply["type"], reply["id"], reply["payload"]["code"]) == ("error", "nan-1", "internal_error")
    correlation_id = reply["payload"]["details"]["correlation_id"]
    assert correlation_id in reply["payload"]["message"]
    assert any(correlation_id in record.getMessage() for record in caplog.records)
    encode(reply)  # sendable as it is


def test_an_unencodable_reply_reaches_the_stdio_client_as_internal_error():
    server = _nan_server(gate=_NanDecisionGate())
    requests = [invoke(_macro(server, "score80", "stdio"), {}, id="nan-result"),
                invoke(_macro(server, "mandatory_tool", "stdio"), {}, id="nan-decision")]
    replies = _stdio_replies(server, b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    finals = {m["id"]: m for m in replies if m["type"] != "progress"}
    assert set(finals) == {"nan-result", "nan-decision"}
    for message in finals.values():
        assert (message["type"], message["payload"]["code"]) == ("error", "internal_error")
        assert message["payload"]["details"]["correlation_id"] in message["payload"]["message"]


def test_an_unencodable_reply_over_http_is_a_500_error_envelope():
    from starlette.testclient import TestClient

    from ftl.server.serve import create_app

    server = _nan_server(gate=_NanDecisionGate())
    client = TestClient(create_app(server), raise_server_exceptions=False)
    headers = {"content-type": "application/json"}
    tools = {}
    for intent_name in ("levels", "diag"):
        tools.update(tools_by_name(client.post("/manglecp/evaluate", content=encode(intent(intent_name)),
                                               headers=headers).json()))
    for name in ("score80", "mandatory_tool"):
        response = client.post("/manglecp/invoke", content=encode(invoke(tools[name]["macro_id"], {}, id=name)),
                               headers=headers)
        assert response.status_code == 500 and response.headers["content-type"] == "application/json"
        body = response.json()
        assert (body["type"], body["id"], body["payload"]["code"]) == ("error", name, "internal_error")


def test_a_number_beyond_the_double_range_is_malformed_not_infinity():
    raw = ('{"type":"intent_request","id":"big-number","manglecp":"2026-02-draft","payload":{"intent":'
           '{"name":"diag"},"facts":[{"pred":"task","args":["001",1e400]}],'
           '"options":{"include_proof_hints":true}}}')
    reply = make_server().handle(raw)[-1]
    assert (reply["type"], reply["payload"]["code"]) == ("error", "malformed_message")
    assert "1e400" in reply["payload"]["details"]["violations"][0]["message"]
