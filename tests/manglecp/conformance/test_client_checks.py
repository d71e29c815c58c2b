"""Client-side conformance checks C-1..C-9 (reference §9) for `ManglecpClient` over the real stdio
and HTTP transports against the fixture server processes. C-5 (retry count, waits, backoff) and
C-6 (progress for unknown ids) need a server that misbehaves on purpose: they are covered by
``tests/manglecp/test_client.py`` with a scripted transport."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from ftl.errors import FtlError
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.facts import apply_state_delta
from ftl.manglecp.messages import fact
from ftl.manglecp.transport import HttpTransport, StdioTransport

from .conftest import SERVER


class Recording:
    """Wraps a transport and records every request it is asked to send."""

    def __init__(self, transport) -> None:
        self.inner = transport
        self.sent: list[dict] = []
        self.waiting = threading.Event()
        self.supports_push = transport.supports_push
        self.supports_cancel = transport.supports_cancel
        self.supports_progress = transport.supports_progress

    def manifest(self, **kwargs):
        return self.inner.manifest(**kwargs)

    def wait_manifest(self, seen, timeout_s):
        self.waiting.set()
        return self.inner.wait_manifest(seen, timeout_s)

    def request(self, message, **kwargs):
        self.sent.append(dict(message))
        return self.inner.request(message, **kwargs)

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def transports(servers):
    opened = {"stdio": StdioTransport([sys.executable, str(SERVER), "--stdio"]),
              "http": HttpTransport(servers["open", "http"].url)}
    yield opened
    for transport in opened.values():
        transport.close()


@pytest.fixture(params=["stdio", "http"])
def client(request, transports):
    """A client with a fresh request record, on the module's transport (one server process)."""
    recording = Recording(transports[request.param])
    return ManglecpClient(recording, sleep=lambda s: time.sleep(min(s, 0.05))), recording


def test_c1_c3_waits_for_the_manifest_and_for_ready_without_sending(tmp_path):
    """The stdio transport reads the manifest before anything else (C-1); while the server is
    ``booting`` the client sends nothing and waits for the pushed ``ready`` manifest (C-3)."""
    recording = Recording(StdioTransport([sys.executable, str(SERVER), "--stdio", "--gate-dir", str(tmp_path)]))
    client = ManglecpClient(recording)
    try:
        assert recording.manifest()["payload"]["status"] == "booting"
        box: dict = {}
        worker = threading.Thread(target=lambda: box.update(reply=client.evaluate("diag", [])))
        worker.start()
        assert recording.waiting.wait(30)  # the client is waiting for a new manifest ...
        assert recording.sent == []         # ... and has sent nothing
        (tmp_path / "ready").touch()
        worker.join(30)
        assert [t.name for t in box["reply"].macro_tools] and len(recording.sent) == 1
    finally:
        client.close()


def test_c2_ids_are_unique_and_non_empty(client):
    client, recording = client
    for _ in range(5):
        client.evaluate("diag", [])
    ids = [m["id"] for m in recording.sent]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)


def test_c4_output_and_reserved_facts_are_never_sent(client):
    client, recording = client
    for bad in (fact("final", "x", 1), {"pred": "_manglecp_x", "args": []}, fact("task", "only-one-arg")):
        with pytest.raises(FtlError) as exc:
            client.evaluate("diag", [bad])
        assert exc.value.error_type == "invalid_facts"
    assert recording.sent == []


def test_c7_an_expired_macro_is_reported_and_a_fresh_evaluation_works(client):
    client, _ = client
    tool = client.evaluate("tools", []).tool("ephemeral_tool")
    time.sleep(0.6)  # past its 0.5 s validity window
    with pytest.raises(FtlError) as exc:
        client.invoke(tool.macro_id, {})
    assert exc.value.error_type == "macro_expired" and exc.value.transient
    assert client.invoke_tool("tools", [], "ephemeral_tool", {}).result == {"ok": True}


def test_c8_a_confirmation_token_is_never_added_by_the_client(client):
    client, recording = client
    with pytest.raises(FtlError) as exc:
        client.invoke_tool("tools", [], "danger_tool", {"amount": 3})
    assert exc.value.error_type == "confirmation_required"
    invokes = [m for m in recording.sent if m["type"] == "invoke_request"]
    assert len(invokes) == 1 and "confirmation_token" not in invokes[0]["payload"]
    token = exc.value.details["confirmation_token"]  # what a UI hands back once the user agreed
    done = client.invoke_tool("tools", [], "danger_tool", {"amount": 3}, confirmation_token=token)
    assert done.result == {"ok": True}


def test_c9_deltas_apply_retracts_first_and_come_back_as_session_facts(client):
    client, _ = client
    working = [fact("enable", "x"), fact("echoed", "old") | {"t": {"at": "2026-02-19T14:30:00Z"}}]
    response = client.invoke_tool("tools", working, "echo_tool", {"text": "new"})
    working = apply_state_delta(working, response.state_delta.model_dump(by_alias=True))
    echoed = [f for f in working if f["pred"] == "echoed"]
    assert [f["args"] for f in echoed] == [["new"]] and echoed[0]["category"] == "session"
    assert "source" not in echoed[0]
    assert client.evaluate("diag", working).macro_tools  # the working set is valid input again
