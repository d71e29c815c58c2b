"""HTTP binding against a real uvicorn on 127.0.0.1 (conformance items 10, 26, 27; spec 02 §4.2)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from ftl.errors import FtlError
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import envelope
from ftl.manglecp.transport import WELL_KNOWN_PATH, HttpTransport
from ftl.server.serve import create_app

from .helpers import intent, invoke, make_server


class _Running:
    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "_Running":
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            time.sleep(0.01)
        raise RuntimeError("uvicorn did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def open_server():
    with _Running(create_app(make_server())) as running:
        yield running


@pytest.fixture(scope="module")
def locked_server():
    from ftl.manglecp.access import BearerAuth, Principal
    auth = BearerAuth({"good-token": Principal("alice"),
                       "narrow-token": Principal("bob", permissions=frozenset({"levels"}))})
    with _Running(create_app(make_server(auth=auth), cors_origins=("*", "https://ui.example"))) as running:
        yield running


def _post(url: str, message, **headers) -> httpx.Response:
    return httpx.post(url, json=message, headers={"Accept": "application/json", **headers}, timeout=30)


def test_manifest_and_endpoints(open_server):
    response = httpx.get(open_server.url + WELL_KNOWN_PATH)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    assert response.json()["type"] == "manifest" and response.json()["id"] is None
    assert httpx.get(open_server.url + WELL_KNOWN_PATH,
                     headers={"If-None-Match": response.headers["etag"]}).status_code == 304
    evaluated = _post(open_server.url + "/manglecp/evaluate", intent("tools", id="t-1"))
    assert evaluated.status_code == 200 and evaluated.json()["id"] == "t-1"
    macro_id = {t["name"]: t for t in evaluated.json()["payload"]["macro_tools"]}["echo_tool"]["macro_id"]
    invoked = _post(open_server.url + "/invoke", invoke(macro_id, {"text": "hi"}, id="t-2"))
    assert invoked.status_code == 200 and invoked.json()["type"] == "invoke_response"


@pytest.mark.parametrize("path,body,status,code", [
    ("/manglecp/evaluate", envelope("intent_request", "v", {"intent": {"name": "diag"}}) | {"manglecp": "1999-01-draft"},
     400, "unsupported_version"),
    ("/manglecp/evaluate", envelope("frobnicate", "f", {}), 400, "invalid_type"),
    ("/manglecp/invoke", envelope("intent_request", "w", {"intent": {"name": "diag"}}), 400, "invalid_type"),
    ("/manglecp/invoke", envelope("invoke_request", "n", {"macro_id": "m-nope", "args": {}}), 404, "macro_not_found"),
    ("/manglecp/evaluate", intent("heavy", constraints={"max_facts_created": 10}), 413, "derivation_limit_exceeded"),
    ("/manglecp/evaluate", intent("diag", [{"pred": "Bad-Name", "args": []}]), 400, "invalid_facts"),
])
def test_error_statuses_carry_an_error_body(open_server, path, body, status, code):
    response = _post(open_server.url + path, body)
    assert response.status_code == status
    assert response.json()["type"] == "error" and response.json()["payload"]["code"] == code


def test_not_json_and_wrong_content_type(open_server):
    response = httpx.post(open_server.url + "/manglecp/evaluate", content=b"{not json",
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["payload"]["code"] == "malformed_message"
    assert response.json()["id"] is None
    response = httpx.post(open_server.url + "/manglecp/evaluate", content=b"{}",
                          headers={"Content-Type": "text/plain"})
    assert response.status_code == 400 and response.json()["payload"]["code"] == "malformed_message"


def test_cors_is_open_without_auth(open_server):
    response = httpx.options(open_server.url + "/manglecp/evaluate",
                             headers={"Origin": "https://a.example", "Access-Control-Request-Method": "POST"})
    assert response.headers.get("access-control-allow-origin") == "*"


def test_bearer_auth_statuses_and_no_wildcard_cors(locked_server):
    url = locked_server.url + "/manglecp/evaluate"
    assert _post(url, intent("diag")).status_code == 401
    assert _post(url, intent("diag")).json()["payload"]["code"] == "auth_required"
    bad = _post(url, intent("diag"), Authorization="Bearer wrong")
    assert (bad.status_code, bad.json()["payload"]["code"]) == (401, "auth_invalid")
    narrow = _post(url, intent("diag"), Authorization="Bearer narrow-token")
    assert (narrow.status_code, narrow.json()["payload"]["code"]) == (403, "auth_insufficient")
    assert _post(url, intent("diag"), Authorization="Bearer good-token").status_code == 200
    for origin in ("https://evil.example", "https://ui.example"):
        preflight = httpx.options(url, headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert preflight.headers.get("access-control-allow-origin") != "*"
    allowed = httpx.options(url, headers={"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"})
    assert allowed.headers.get("access-control-allow-origin") == "https://ui.example"


def test_client_over_http(locked_server):
    client = ManglecpClient(HttpTransport(locked_server.url, token="good-token"))
    try:
        response = client.invoke_tool("tools", [], "echo_tool", {"text": "over http"})
        assert response.result == {"echo": {"text": "over http"}, "identity": "alice"}
        with pytest.raises(FtlError) as exc:
            client.invoke_tool("tools", [], "failing_tool", {})
        assert exc.value.error_type == "verify_failed"
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        with pytest.raises(FtlError) as exc:
            client.invoke_tool("tools", [], "slow_tool", {"seconds": 1}, cancel=cancel)
        assert exc.value.error_type == "cancelled"
    finally:
        client.close()
    with pytest.raises(FtlError) as exc:
        ManglecpClient(HttpTransport(locked_server.url, token="wrong")).evaluate("diag", [])
    assert exc.value.error_type == "auth_invalid"


def test_discovery_404_means_no_manglecp(open_server):
    transport = HttpTransport(open_server.url + "/not-here")
    with pytest.raises(FtlError) as exc:
        transport.manifest()
    assert exc.value.error_type == "network_error"


def test_serve_http_subprocess_with_token(tmp_path):
    import os
    import subprocess
    import sys

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = {**os.environ, "FTL_TEST_TOKEN": "sekrit"}
    process = subprocess.Popen([sys.executable, "-m", "ftl.server.serve", "--http", f"127.0.0.1:{port}",
                                "--repo", str(tmp_path), "--token-env", "FTL_TEST_TOKEN"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(url + WELL_KNOWN_PATH, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        manifest = httpx.get(url + WELL_KNOWN_PATH).json()["payload"]
        assert manifest["auth"] == {"required": True, "schemes": ["bearer"]}
        assert _post(url + "/manglecp/evaluate", intent("verify_task")).status_code == 401
        client = ManglecpClient(HttpTransport(url, token="sekrit"))
        assert client.invoke_tool("verify_task", [], "run_verify", {"command": "true"}).result["passed"] is True
        client.close()
        assert httpx.get(url + "/metrics").status_code == 401
        metrics = httpx.get(url + "/metrics", headers={"Authorization": "Bearer sekrit"}).text
        # the refused evaluation above was counted by the server (ftl.telemetry.metrics via on_error)
        assert 'ftl_errors_total{category="authentication",code="auth_required",gate="none"}' in metrics
    finally:
        process.terminate()
        # graceful stop; uvicorn re-raises the signal after shutting down, hence -SIGTERM
        assert process.wait(timeout=20) in (0, -15)
