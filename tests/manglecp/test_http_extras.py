"""HTTP binding extras: a disconnect or a ``cancel`` stops the invocation, referenced skills,
``/metrics`` (spec 02 §4.2 "to cancel, close the connection"; reference §11 item 25)."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import urllib.parse

import httpx
import pytest

from ftl.errors import FtlError
from ftl.manglecp.access import BearerAuth, Principal
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import encode, envelope
from ftl.manglecp.transport import WELL_KNOWN_PATH, HttpTransport
from ftl.server.serve import create_app

from .helpers import intent, invoke, make_server, tools_by_name
from .test_http import _Running


class Watched:
    """A slow tool that says when it started and when it saw its cancel flag."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    def __call__(self, args, ctx):
        self.started.set()
        if ctx.cancel.wait(30):
            self.cancelled.set()
        return {"finished": not ctx.cancel.is_set()}


@pytest.fixture
def watched_server():
    watched = Watched()
    server = make_server(auth=BearerAuth({"good-token": Principal("alice")}))
    server.catalog["slow_tool"] = dataclasses.replace(server.catalog["slow_tool"], invoke=watched)
    with _Running(create_app(server, disconnect_poll_s=0.02)) as running:
        running.watched = watched
        yield running


AUTH = {"Authorization": "Bearer good-token", "Accept": "application/json"}


def _slow_macro(url: str) -> str:
    reply = httpx.post(url + "/manglecp/evaluate", json=intent("tools"), headers=AUTH).json()
    return tools_by_name(reply)["slow_tool"]["macro_id"]


def test_closing_the_connection_cancels_the_invocation(watched_server):
    url = watched_server.url
    body = encode(invoke(_slow_macro(url), {}, id="drop-1"))
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /manglecp/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer good-token\r\nAccept: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert watched_server.watched.started.wait(10)
    # without the disconnect the tool would wait 30 s for its cancel flag
    assert watched_server.watched.cancelled.wait(10)


def test_a_cancel_message_stops_a_request_of_the_same_caller(watched_server):
    url = watched_server.url
    manifest = httpx.get(url + WELL_KNOWN_PATH).json()["payload"]
    assert manifest["extensions"]["x-http_cancel"] == "/manglecp/cancel"
    macro_id = _slow_macro(url)
    box = {}
    worker = threading.Thread(target=lambda: box.update(response=httpx.post(
        url + "/manglecp/invoke", json=invoke(macro_id, {}, id="slow-9"), headers=AUTH, timeout=30)))
    worker.start()
    assert watched_server.watched.started.wait(10)
    cancel = envelope("cancel", "c-1", {"request_id": "slow-9"})
    stranger = httpx.post(url + "/manglecp/cancel", json=cancel, headers={"Accept": "application/json"})
    assert (stranger.status_code, stranger.json()["payload"]["code"]) == (401, "auth_required")
    assert httpx.post(url + "/manglecp/cancel", json=cancel, headers=AUTH).status_code == 204
    worker.join(10)
    response = box["response"]
    assert (response.status_code, response.json()["payload"]["code"], response.json()["id"]) == (
        499, "cancelled", "slow-9")
    assert watched_server.watched.cancelled.is_set()


def test_the_http_client_cancel_reaches_the_tool(watched_server):
    client = ManglecpClient(HttpTransport(watched_server.url, token="good-token"))
    cancel = threading.Event()
    threading.Thread(target=lambda: watched_server.watched.started.wait(10) and cancel.set()).start()
    try:
        with pytest.raises(FtlError) as exc:
            client.invoke_tool("tools", [], "slow_tool", {}, cancel=cancel)
        assert exc.value.error_type == "cancelled"
        assert watched_server.watched.cancelled.wait(10)
    finally:
        client.close()


def test_referenced_skills_can_be_fetched_with_the_token(watched_server):
    url = watched_server.url + "/manglecp/skills/diag_manual"
    assert httpx.get(url).status_code == 401
    skill = httpx.get(url, headers=AUTH).json()
    assert skill["skill_id"] == "diag_manual" and skill["content"].startswith("The manual.")
    assert httpx.get(watched_server.url + "/manglecp/skills/nope", headers=AUTH).status_code == 404


def test_metrics_need_the_token_when_auth_is_on(watched_server):
    denied = httpx.get(watched_server.url + "/metrics")
    assert (denied.status_code, denied.json()["payload"]["code"]) == (401, "auth_required")
    response = httpx.get(watched_server.url + "/metrics", headers={"Authorization": "Bearer good-token"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert b"# TYPE ftl_errors_total counter" in response.content


def test_metrics_are_open_without_auth():
    with _Running(create_app(make_server())) as running:
        response = httpx.get(running.url + "/metrics")
        assert response.status_code == 200 and b"ftl_gate_decisions_total" in response.content
        assert json.loads(httpx.get(running.url + WELL_KNOWN_PATH).content)["type"] == "manifest"
