"""Hostile or broken input on the wire: every line gets its MangleCP answer and nothing stops the
loops that read them (the stdio read loop, the HTTP endpoints, the client's reader thread)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import queue
import sys
import threading
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.manglecp.access import Session
from ftl.manglecp.facts import format_time
from ftl.manglecp.messages import encode, envelope
from ftl.sanitize import sanitize_text
from ftl.server.serve import serve_stdio

from .helpers import FakeClock, final, intent, invoke, make_server, tools_by_name

DEEP = b"[" * 5000 + b"]" * 5000  # ~10 KB; json.loads raises RecursionError on it


def _stdio_replies(server, data: bytes, finals: set) -> list[dict]:
    """Run the real stdio read loop on a pipe, write ``data``, and keep stdin open until a final
    message for every id in ``finals`` came (EOF would cancel what is still queued); every
    message written after the manifest."""
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    # Closed in this order on the way out (client, server side, then ours): the reading
    # threads see EOF before their stream is closed under them.
    with os.fdopen(read_out, "rb") as out, os.fdopen(read_in, "rb") as stdin, \
            os.fdopen(write_out, "wb", buffering=0) as stdout, os.fdopen(write_in, "wb", buffering=0) as client:
        loop = threading.Thread(target=serve_stdio, args=(server, stdin, stdout), daemon=True)
        loop.start()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in out], daemon=True).start()
        assert json.loads(lines.get(timeout=10))["type"] == "manifest"
        client.write(data)
        seen: list[dict] = []
        while not finals <= {m["id"] for m in seen if m["type"] != "progress"}:
            try:
                seen.append(json.loads(lines.get(timeout=10)))
            except queue.Empty:
                raise AssertionError(f"no final message for all of {finals} in 10 s; seen {seen}") from None
        client.close()
        loop.join(10)
        assert not loop.is_alive()
    return seen


def test_a_deeply_nested_line_is_answered_and_the_stdio_loop_keeps_reading():
    after = json.dumps(intent("diag", id="after")).encode()
    replies = _stdio_replies(make_server(), DEEP + b"\n" + after + b"\n", {None, "after"})
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
    intent_name = {"mandatory_tool": "diag", "slow_tool": "tools"}.get(name, "levels")
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
    replies = _stdio_replies(server, b"".join(json.dumps(r).encode() + b"\n" for r in requests),
                             {"nan-result", "nan-decision"})
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


# -- a cancel that arrives before its request is tracked ----------------------------------------


class _ApprovalGate:
    """A gate whose check waits for an approver (the test) before it allows the call."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self.approve = threading.Event()
        self.checks = 0

    def visible(self, name):
        return True

    def check(self, call):
        self.checks += 1
        self.waiting.set()
        assert self.approve.wait(10), "the test never approved"


def _recording(server, name: str) -> list:
    ran: list = []
    server.catalog[name] = dataclasses.replace(server.catalog[name],
                                               invoke=lambda args, ctx: ran.append(args) or {"ok": True})
    return ran


def test_a_cancel_sent_while_the_gate_waits_for_approval_cancels_the_invocation():
    gate = _ApprovalGate()
    server = make_server(gate=gate)
    ran = _recording(server, "mandatory_tool")
    session = Session(key="s")
    macro = _macro(server, "mandatory_tool", "s")
    replies: list = []
    worker = threading.Thread(target=lambda: replies.extend(
        server.handle(invoke(macro, {}, id="gated-1"), session=session)))
    worker.start()
    assert gate.waiting.wait(10)
    assert server.handle(envelope("cancel", "c-1", {"request_id": "gated-1"}), session=session) == []
    gate.approve.set()
    worker.join(10)
    assert (final(replies)["id"], final(replies)["payload"]["code"]) == ("gated-1", "cancelled")
    assert ran == []  # the tool never started

    # a cancel that came before the request: the gate is not even asked
    server.handle(envelope("cancel", "c-2", {"request_id": "gated-2"}), session=session)
    reply = final(server.handle(invoke(macro, {}, id="gated-2"), session=session))
    assert reply["payload"]["code"] == "cancelled" and gate.checks == 1 and ran == []
    # ... and other requests of the session are not affected
    assert final(server.handle(invoke(macro, {}, id="gated-3"), session=session))["type"] == "invoke_response"


def test_stdin_eof_cancels_requests_still_queued_in_the_stdio_pool():
    server = make_server()
    ran = _recording(server, "mandatory_tool")
    slow = _macro(server, "slow_tool", "stdio")
    queued = _macro(server, "mandatory_tool", "stdio")
    lines = [invoke(slow, {"seconds": 10}, id="running"), invoke(queued, {}, id="queued")]
    out = io.BytesIO()
    # one worker: "queued" waits behind "running" until EOF has cancelled the session
    serve_stdio(server, io.BytesIO(b"".join(json.dumps(m).encode() + b"\n" for m in lines)), out,
                max_workers=1)
    finals = {m["id"]: m for m in map(json.loads, out.getvalue().splitlines()[1:]) if m["type"] != "progress"}
    assert finals["queued"]["payload"]["code"] == "cancelled" and ran == []
    assert finals["running"]["type"] in ("invoke_response", "error")


def test_early_cancels_are_remembered_for_a_bounded_time_and_number():
    now = [0.0]
    session = Session(clock=lambda: now[0])
    assert session.cancel("later") is False  # not running: remembered
    assert session.cancel_pending("later") and session.claim_cancel_flag("later").is_set()
    assert not session.claim_cancel_flag("later").is_set()  # consumed once

    session.cancel("stale")
    now[0] += Session.EARLY_CANCEL_TTL_S + 1
    assert not session.cancel_pending("stale") and not session.claim_cancel_flag("stale").is_set()

    for n in range(Session.EARLY_CANCEL_LIMIT + 5):
        session.cancel(f"r{n}")
    event = threading.Event()
    session.track_running("r0", event)  # the oldest ids were dropped past the limit
    assert not event.is_set()
    session.track_running(f"r{Session.EARLY_CANCEL_LIMIT + 4}", event)
    assert event.is_set()

    mine, waiting, theirs = threading.Event(), threading.Event(), threading.Event()
    session.give_cancel("running", mine)  # a caller's event, its request already running
    session.track_running("running", session.claim_cancel_flag("running"))
    session.track_running("other", theirs)  # the session's own flag of another request
    session.give_cancel("given", waiting)  # a caller's event, its request not started
    session.cancel_all()
    flag = session.claim_cancel_flag("given")
    assert flag.is_set() and not waiting.is_set()  # a caller's own event is never set by the session,
    assert not mine.is_set()  # running or not
    assert theirs.is_set()  # the session's own flags are
    session.untrack_running("running")


# -- error replies are sanitised like the JSON-RPC and response-v2 surfaces ---------------------

TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
LEAKY = FtlError("idiom_violation",
                 {"seq": "001", "idiom": "no-print", "where": "/home/alice/secret-repo/src/a.py:3",
                  "violations": [{"file": "/home/alice/secret-repo/src/a.py", "token": TOKEN}]},
                 message='Traceback (most recent call last):\n  File "/home/alice/secret-repo/x.py", line 1')


class _RefusingGate:
    def visible(self, name):
        return True

    def check(self, call):
        raise FtlError("policy_denied", {"gate": "policy", "tool": call["tool"],
                                         "reason": f"denied for /home/alice/secret-repo with {TOKEN}"},
                       message=f"Refused: policy /etc/ftl/policy.cedar said no ({TOKEN})")


def _raise(exc):
    def invoke(args, ctx):
        raise exc
    return invoke


def test_tool_and_gate_errors_are_sanitised_on_the_manglecp_surface():
    server = make_server()
    server.catalog["mandatory_tool"] = dataclasses.replace(server.catalog["mandatory_tool"], invoke=_raise(LEAKY))
    tool_error = final(server.handle(invoke(_macro(server, "mandatory_tool"), {}, id="leak-1")))
    gated = make_server(gate=_RefusingGate())
    gate_error = final(gated.handle(invoke(_macro(gated, "mandatory_tool"), {}, id="leak-2")))
    for reply in (tool_error, gate_error):
        text = json.dumps(reply)
        assert reply["type"] == "error" and "Traceback" not in text
        assert TOKEN not in text and "/home/alice" not in text and "/etc/ftl" not in text, text
    assert tool_error["payload"]["message"] == sanitize_text(LEAKY.template_message())
    assert tool_error["payload"]["details"]["error_type"] == "idiom_violation"
    assert tool_error["payload"]["details"]["idiom"] == "no-print"  # safe details stay
    assert gate_error["payload"]["details"]["gate"] == "policy"


# -- the client side: a misbehaving server never crashes or hangs the client ---------------------

MISBEHAVING = str(Path(__file__).with_name("misbehaving_server.py"))


@pytest.fixture(scope="module")
def manifest_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("manifest") / "manifest.json"
    path.write_bytes(encode(make_server().manifest()))
    return str(path)


def _client(mode: str, manifest_file: str, close_timeout_s: float = 5.0, **kwargs):
    from ftl.manglecp.client import ManglecpClient
    from ftl.manglecp.transport import StdioTransport

    transport = StdioTransport([sys.executable, MISBEHAVING, mode, manifest_file],
                               close_timeout_s=close_timeout_s)
    return ManglecpClient(transport, **kwargs)


def test_bad_server_lines_do_not_kill_the_stdio_reader(manifest_file):
    sleeps: list[float] = []
    client = _client("junk", manifest_file, sleep=sleeps.append, request_timeout_s=10)
    try:
        for _ in range(2):  # the reader is still there for the next request
            with pytest.raises(FtlError) as exc:
                client.evaluate("diag", [])
            assert (exc.value.error_type, exc.value.message) == ("internal_error", "the real reply")
        assert client.transport._reader.is_alive()
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["retry-text", "retry-huge"])
def test_bad_retry_hints_fall_back_to_the_backoff_and_are_capped(manifest_file, mode):
    sleeps: list[float] = []
    client = _client(mode, manifest_file, sleep=sleeps.append, backoff_base_ms=100, backoff_max_ms=1000)
    try:
        with pytest.raises(FtlError) as exc:
            client.evaluate("diag", [])
    finally:
        client.close()
    assert (exc.value.error_type, exc.value.message) == ("internal_error", "gave up")
    # "soon" is no hint: the backoff alone (0.1 s, 0.2 s); 1e12 ms is capped at backoff_max_ms
    assert sleeps == ([0.1, 0.2] if mode == "retry-text" else [1.0, 1.0])


def test_an_infinite_retry_hint_is_dropped_not_an_overflow(manifest_file):
    client = _client("infinite-hint", manifest_file, sleep=lambda s: None)
    try:
        with pytest.raises(FtlError) as exc:
            client.evaluate("diag", [])
    finally:
        client.close()
    assert exc.value.error_type == "execution_failed" and exc.value.retry_after_ms is None


def test_retry_hints_are_validated_when_an_error_payload_is_read():
    from ftl.manglecp.messages import to_ftl_error

    for hint in ("soon", float("inf"), float("nan"), -5, True, [1]):
        assert to_ftl_error({"code": "rate_limited", "message": "x", "recoverable": True,
                             "retry_after_ms": hint}).retry_after_ms is None
    assert to_ftl_error({"code": "rate_limited", "message": "x", "recoverable": True,
                         "retry_after_ms": 1500.7}).retry_after_ms == 1500


def test_a_server_that_only_sends_progress_still_times_out(manifest_file):
    # close_timeout_s: the fake server does not stop talking on EOF; kill it rather than wait
    client = _client("chatty", manifest_file, close_timeout_s=0.2, sleep=lambda s: None,
                     request_timeout_s=0.3)
    try:
        with pytest.raises(FtlError) as exc:
            client.evaluate("diag", [])  # progress every 20 ms for 1.5 s, then an error
    finally:
        client.close()
    assert exc.value.error_type == "timeout" and exc.value.details["timeout_s"] == 0.3


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_a_message_of_exactly_the_limit_is_accepted_over_stdio_and_one_byte_more_is_not(newline: bytes):
    server = make_server()
    limit = server.limits.max_message_bytes  # 16 MiB: spec 02 §3.4 says this size MUST pass
    lines = []
    for request_id, size in (("at-limit", limit), ("over-limit", limit + 1)):
        message = intent("diag", id=request_id)
        message["payload"]["x-pad"] = ""
        message["payload"]["x-pad"] = "a" * (size - len(encode(message)))
        lines.append(encode(message))
        assert len(lines[-1]) == size
    # the line end is framing, not message: CRLF counts no more than LF
    replies = _stdio_replies(server, newline.join(lines) + newline, {"at-limit", None})
    finals = {m["id"]: m for m in replies if m["type"] != "progress"}
    assert finals["at-limit"]["type"] == "intent_response"
    assert finals[None]["payload"]["code"] == "message_too_large"


def test_eval_time_now_reports_the_time_used_not_the_word():
    clock = FakeClock()
    reply = make_server(clock=clock).handle(intent("diag", eval_time="now"))[-1]
    assert reply["payload"]["eval_time_used"] == format_time(int(clock.time() * 1000))
    given = "2026-02-19T14:08:00Z"  # a time the client gave is echoed as given (conformance 37)
    assert make_server().handle(intent("diag", eval_time=given))[-1]["payload"]["eval_time_used"] == given


def test_an_http_body_without_content_length_is_refused_once_it_passes_the_limit():
    import anyio

    from ftl.server.serve import create_app

    server = make_server()
    limit = server.limits.max_message_bytes
    chunk, total = 1 << 20, 4 * limit // (1 << 20)
    received, sent = [], []

    # The ASGI calls a server makes for a chunked POST (no Content-Length to refuse it up
    # front); the test client of starlette would read the whole body before the app sees it.
    async def receive():
        received.append(1)
        return {"type": "http.request", "body": b" " * chunk, "more_body": len(received) < total}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/manglecp/evaluate", "raw_path": b"/manglecp/evaluate",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8765)}
    anyio.run(create_app(server), scope, receive, send)
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["payload"]["code"] == "message_too_large"
    assert len(received) <= limit // chunk + 1  # reading stopped just past the limit, not at 64 MiB
