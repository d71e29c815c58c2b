"""Hostile or broken input on the wire: every line gets its MangleCP answer and nothing stops the
loops that read them (the stdio read loop, the HTTP endpoints, the client's reader thread)."""

from __future__ import annotations

import io
import json

from ftl.server.serve import serve_stdio

from .helpers import intent, make_server

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
