"""stdio binding against a real ``python -m ftl.server.serve --stdio`` (conformance items 3, 7-9,
12, 45, 46 and client items C-1, C-6)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import MIN_MESSAGE_BYTES, PROTOCOL_VERSION, envelope, fact
from ftl.manglecp.transport import StdioTransport

SERVE = [sys.executable, "-m", "ftl.server.serve", "--stdio"]


def _read_until(stdout, predicate, limit: int = 50) -> list[dict]:
    seen = []
    for _ in range(limit):
        line = stdout.readline()
        assert line, "server closed stdout early"
        message = json.loads(line)
        seen.append(message)
        if predicate(message):
            return seen
    raise AssertionError(f"no matching message in {seen}")


def test_raw_protocol(tmp_path: Path):
    process = subprocess.Popen(SERVE + ["--repo", str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = process.stdout.readline()  # before writing anything
        assert not first.startswith(b"\xef\xbb\xbf")
        manifest = json.loads(first)
        assert (manifest["type"], manifest["id"], manifest["manglecp"]) == ("manifest", None, PROTOCOL_VERSION)
        if manifest["payload"]["status"] == "booting":
            _read_until(process.stdout, lambda m: m["type"] == "manifest" and m["payload"]["status"] == "ready")

        process.stdin.write(b"{not json\n")
        process.stdin.flush()
        error = _read_until(process.stdout, lambda m: m["type"] == "error")[-1]
        assert (error["id"], error["payload"]["code"]) == (None, "malformed_message")

        # a line just under 16 MiB is accepted (not message_too_large) ...
        request = envelope("intent_request", "big-1", {"intent": {"name": "verify_task", "params": {"pad": ""}},
                                                       "facts": [fact("framework", "🚀")]})
        pad = MIN_MESSAGE_BYTES - len(json.dumps(request).encode()) - 1024
        request["payload"]["intent"]["params"]["pad"] = "x" * pad
        process.stdin.write(json.dumps(request, ensure_ascii=False).encode() + b"\n")
        # ... a line over the cap is refused, and the server keeps going
        process.stdin.write(b'{"pad":"' + b"y" * MIN_MESSAGE_BYTES + b'"}\n')
        process.stdin.write(json.dumps(envelope("intent_request", "t-1", {"intent": {"name": "verify_task"}}))
                            .encode() + b"\n")
        process.stdin.flush()
        finals: dict = {}
        # the three replies may come in any order (requests are processed concurrently)
        _read_until(process.stdout, lambda m: m["type"] != "progress" and not finals.update({m["id"]: m})
                    and {"big-1", "t-1", None} <= set(finals))
        by_id = finals
        assert by_id["big-1"]["type"] == "intent_response"
        assert by_id[None]["payload"]["code"] == "message_too_large"
        assert [t["name"] for t in by_id["t-1"]["payload"]["macro_tools"]] == ["run_verify"]
        process.stdin.close()  # EOF -> clean exit
        assert process.wait(timeout=20) == 0
        rest = process.stdout.read()
        for line in rest.splitlines():
            json.loads(line)  # whatever was still pending is valid JSON, nothing else
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()
        process.stdin.close() if not process.stdin.closed else None


def test_client_over_stdio_invokes_cancels_and_pipelines(tmp_path: Path):
    client = ManglecpClient(StdioTransport(SERVE + ["--repo", str(tmp_path)]))
    try:
        result = client.invoke_tool("verify_task", [fact("task", "001", "BUILD")], "run_verify",
                                    {"command": "echo ok"}).result
        assert result["passed"] is True and result["output"].strip() == "ok"

        cancel = threading.Event()
        timer = threading.Timer(0.3, cancel.set)
        timer.start()
        with pytest.raises(FtlError) as exc:
            client.invoke_tool("verify_task", [], "run_verify", {"command": "sleep 20"}, cancel=cancel)
        assert exc.value.error_type == "cancelled"  # without the cancel, `sleep 20` would pass

        outputs: list[str] = []
        workers = [threading.Thread(target=lambda i=i: outputs.append(client.invoke_tool(
            "verify_task", [], "run_verify", {"command": f"sleep 0.2; echo {i}"}).result["output"].strip()))
            for i in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        assert sorted(outputs) == ["0", "1", "2", "3"]

        with pytest.raises(FtlError) as exc:
            client.invoke_tool("verify_task", [], "run_verify", {"command": 5})
        assert exc.value.error_type == "invalid_params"
        assert exc.value.details["schema_errors"][0]["path"] == "/command"
    finally:
        client.close()
    assert client.transport.process.returncode == 0


def test_eof_cancels_running_invocations(tmp_path: Path):
    transport = StdioTransport(SERVE + ["--repo", str(tmp_path)])
    client = ManglecpClient(transport)
    response = client.evaluate("verify_task", [])
    macro_id = response.tool("run_verify").macro_id
    transport.send(envelope("invoke_request", "long-1", {"macro_id": macro_id, "args": {"command": "sleep 30"}}))
    time.sleep(0.3)  # let the invocation start; the assertions below do not depend on timing
    transport.close()
    # exit 0 means the server returned on EOF; had it waited for `sleep 30`, close() would have
    # killed it after 10 s (returncode -9)
    assert transport.process.returncode == 0


def test_serve_usage_errors(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from ftl.server.serve import serve
    runner = CliRunner()
    both = runner.invoke(serve, ["--stdio", "--http", "127.0.0.1:1", "--repo", str(tmp_path)])
    assert both.exit_code == 2 and "one of --stdio and --http" in both.output
    monkeypatch.delenv("FTL_TEST_TOKEN", raising=False)
    missing = runner.invoke(serve, ["--http", "127.0.0.1:1", "--token-env", "FTL_TEST_TOKEN"])
    assert missing.exit_code == 2 and "FTL_TEST_TOKEN" in missing.output
    bad_addr = runner.invoke(serve, ["--http", "nowhere", "--repo", str(tmp_path)])
    assert bad_addr.exit_code == 2


def test_a_server_that_dies_gives_network_error():
    manifest = json.dumps({"type": "manifest", "id": None, "manglecp": PROTOCOL_VERSION, "payload": {}})
    transport = StdioTransport([sys.executable, "-c", f"import sys; print({manifest!r}); sys.stdin.readline()"])
    try:
        with pytest.raises(FtlError) as exc:
            transport.request(envelope("intent_request", "x-1", {"intent": {"name": "diag"}}))
        assert exc.value.error_type == "network_error"
    finally:
        transport.close()


def test_a_server_without_manifest_gives_network_error():
    with pytest.raises(FtlError) as exc:
        StdioTransport([sys.executable, "-c", "print('not a manifest')"], manifest_timeout_s=10)
    assert exc.value.error_type == "network_error"


@pytest.mark.parametrize("isolation, statuses", [(None, ["ready"]), ("process", ["booting", "ready"])])
def test_boot_manifests_by_isolation(tmp_path: Path, isolation, statuses):
    # default (thread): the rules are parsed before the first line, so the server starts ready;
    # with worker processes it announces booting until the first worker is up (spec 02 §5.3)
    extra = ["--isolation", isolation] if isolation else []
    process = subprocess.Popen(SERVE + ["--repo", str(tmp_path)] + extra, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        seen = _read_until(process.stdout, lambda m: m["payload"]["status"] == "ready")
        assert [m["payload"]["status"] for m in seen] == statuses
        process.stdin.write(json.dumps(envelope("intent_request", "i-1", {
            "intent": {"name": "verify_task"}})).encode() + b"\n")
        process.stdin.flush()
        reply = _read_until(process.stdout, lambda m: m.get("id") == "i-1")[-1]
        assert [t["name"] for t in reply["payload"]["macro_tools"]] == ["run_verify"]
        process.stdin.close()
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
