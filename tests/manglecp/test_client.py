"""The client: retry semantics (spec 09 §7), re-evaluation, fact checks, boot wait, threads
(conformance C-1..C-7)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ftl.errors import FtlError
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.definitions import ServerLimits
from ftl.manglecp.messages import envelope, fact, make_error
from ftl.manglecp.transport import InProcessTransport, Transport

from .helpers import FakeClock, make_server


class ScriptedTransport(Transport):
    """Answers requests from a script of error codes / callables; records what it was sent."""

    def __init__(self, server, script: list[Any]) -> None:
        self.inner = InProcessTransport(server)
        self.script = list(script)
        self.sent: list[dict] = []
        self.manifests: list[dict] = []

    def manifest(self, *, refresh: bool = False, timeout_s: float = 60.0) -> dict:
        if not self.manifests:
            return self.inner.manifest()
        if refresh and len(self.manifests) > 1:
            self.manifests.pop(0)
        return self.manifests[0]

    def request(self, message, *, on_message=None, cancel=None, timeout_s=None) -> dict:
        self.sent.append(message)
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, dict):
                return {**step, "id": message["id"]}
        return self.inner.request(message, on_message=on_message, cancel=cancel)


def _err(code: str, retry_after_ms: int | None = None, recoverable: bool | None = None) -> dict:
    return make_error(code, f"{code} happened", retry_after_ms=retry_after_ms, recoverable=recoverable)


@pytest.fixture
def sleeps() -> list[float]:
    return []


def _client(script, sleeps, **kw) -> tuple[ManglecpClient, ScriptedTransport]:
    transport = ScriptedTransport(make_server(clock=FakeClock()), script)
    return ManglecpClient(transport, sleep=sleeps.append, **kw), transport


def test_rate_limited_waits_at_least_retry_after_and_backs_off(sleeps):
    client, transport = _client([_err("rate_limited", 1000), _err("rate_limited", 10),
                                 _err("server_not_ready", 0)], sleeps, backoff_base_ms=100)
    response = client.evaluate("diag", [])
    assert response.tool("mandatory_tool") is not None
    assert sleeps == [1.0, 0.2, 0.4]  # max(retry_after, 100 * 2**attempt)
    ids = [m["id"] for m in transport.sent]
    assert len(set(ids)) == len(ids) == 4 and all(ids)  # every retry is a new request


def test_at_most_five_retries(sleeps):
    client, transport = _client([_err("rate_limited", 5)] * 10, sleeps, max_retries=50)
    with pytest.raises(FtlError) as exc:
        client.evaluate("diag", [])
    assert exc.value.error_type == "rate_limited" and exc.value.retry_after_ms == 5
    assert len(transport.sent) == 6 and len(sleeps) == 5


@pytest.mark.parametrize("code,kind", [("internal_error", "internal_error"),
                                       ("evaluation_failed", "evaluation_failed"),
                                       ("invalid_facts", "invalid_facts"),
                                       ("evaluation_timeout", "timeout")])
def test_errors_that_resending_cannot_fix_are_raised_at_once(sleeps, code, kind):
    client, transport = _client([_err(code)], sleeps)
    with pytest.raises(FtlError) as exc:
        client.evaluate("diag", [])
    assert exc.value.error_type == kind and len(transport.sent) == 1 and sleeps == []


def test_never_retries_a_non_recoverable_error_even_with_a_retryable_code(sleeps):
    client, transport = _client([_err("server_not_ready", 10, recoverable=False)], sleeps)
    with pytest.raises(FtlError):
        client.evaluate("diag", [])
    assert len(transport.sent) == 1


def test_invoke_tool_reevaluates_on_macro_not_found(sleeps):
    # evaluate, invoke -> macro_not_found, evaluate again, invoke for real
    client, transport = _client([None, _err("macro_not_found")], sleeps)
    response = client.invoke_tool("tools", [], "echo_tool", {"text": "hi"})
    assert response.result["echo"] == {"text": "hi"}
    assert [m["type"] for m in transport.sent] == ["intent_request", "invoke_request"] * 2


def test_invoke_tool_gives_up_after_the_reevaluation_budget(sleeps):
    client, transport = _client([None, _err("macro_expired"), None, _err("macro_expired")], sleeps)
    with pytest.raises(FtlError) as exc:
        client.invoke_tool("tools", [], "echo_tool", {"text": "hi"}, max_reevaluations=1)
    assert exc.value.error_type == "macro_expired"


def test_tool_not_offered_is_tool_not_exposed(sleeps):
    client, _ = _client([], sleeps)
    with pytest.raises(FtlError) as exc:
        client.invoke_tool("diag", [], "echo_tool", {})
    assert exc.value.error_type == "tool_not_exposed" and "mandatory_tool" in exc.value.details["offered"]


def test_tool_errors_arrive_with_their_own_kind(sleeps):
    client, _ = _client([], sleeps)
    with pytest.raises(FtlError) as exc:
        client.invoke_tool("tools", [], "failing_tool", {})
    assert exc.value.error_type == "verify_failed" and exc.value.details["exit_code"] == 3


def test_client_checks_facts_before_sending(sleeps):
    client, transport = _client([], sleeps)
    with pytest.raises(FtlError) as exc:
        client.evaluate("diag", [fact("_manglecp_x"), fact("final", "t", 1), fact("enable")])
    assert exc.value.error_type == "invalid_facts"
    assert [v["issue"] for v in exc.value.details["violations"]] == [
        "reserved_predicate", "invalid_facts", "arity_mismatch"]
    assert transport.sent == []


def test_client_clamps_constraints_to_server_limits(sleeps):
    transport = ScriptedTransport(make_server(limits=ServerLimits(max_derived_facts=500)), [])
    client = ManglecpClient(transport, sleep=sleeps.append)
    client.evaluate("diag", [], constraints={"max_facts_created": 10_000, "max_tools_returned": 3})
    assert transport.sent[0]["payload"]["constraints"] == {"max_facts_created": 500, "max_tools_returned": 3}


def test_waits_for_a_booting_server_without_sending(sleeps):
    server = make_server()
    booting = server.manifest()
    booting["payload"]["status"] = "booting"
    transport = ScriptedTransport(server, [])
    transport.manifests = [booting, booting, server.manifest()]
    client = ManglecpClient(transport, sleep=sleeps.append, backoff_base_ms=100)
    assert client.evaluate("diag", []).tool("mandatory_tool") is not None
    assert sleeps == [0.1, 0.2] and len(transport.sent) == 1


def test_boot_timeout_raises_server_not_ready(sleeps):
    server = make_server(status="booting")
    client = ManglecpClient(InProcessTransport(server), sleep=sleeps.append, boot_timeout_s=1.0)
    with pytest.raises(FtlError) as exc:
        client.evaluate("diag", [])
    assert exc.value.error_type == "server_not_ready"
    assert sum(sleeps) == pytest.approx(1.0)


def test_progress_and_cancel_in_process():
    server = make_server()
    client = ManglecpClient(InProcessTransport(server, close_server=True))
    updates = []
    client.invoke_tool("tools", [], "echo_tool", {"text": "x"}, on_progress=updates.append)
    assert [u.status for u in updates] == ["started", "running", "finalizing"]
    cancel = threading.Event()
    timer = threading.Timer(0.1, cancel.set)
    timer.start()
    with pytest.raises(FtlError) as exc:
        client.invoke_tool("tools", [], "slow_tool", {"seconds": 30}, cancel=cancel)
    assert exc.value.error_type == "cancelled"
    client.close()


def test_concurrent_invocations_from_many_threads():
    client = ManglecpClient(InProcessTransport(make_server(), close_server=True))
    results: dict[int, Any] = {}

    def work(i: int) -> None:
        results[i] = client.invoke_tool("tools", [], "echo_tool", {"text": f"n{i}"}).result["echo"]["text"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {i: f"n{i}" for i in range(8)}
    client.close()


def test_unexpected_reply_type_is_an_error(sleeps):
    client, _ = _client([envelope("invoke_response", "x", {"result": {}})], sleeps)
    with pytest.raises(FtlError) as exc:
        client.evaluate("diag", [])
    assert exc.value.error_type == "invalid_request"
