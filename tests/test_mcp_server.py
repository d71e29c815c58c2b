"""ftl's MCP server through the MCP SDK's own client.

Transports: most tests connect `mcp.Client` to the real server object in process (the SDK's
in-memory transport, ``mode="legacy"``: the initialize handshake Claude Code uses; a few also run
``mode="auto"``, the 2026 per-request path). The "upstream" the matrix needs is either ftl's own
runner with its embedded MangleCP server in process, or a fake runner factory that raises the
fault under test. The four gates are the real `ftl.gate.Gatekeeper` built from ``[gates]`` in the
repository's ftl.toml (real Cedar policies, a real approval command). Protocol faults the SDK
client cannot produce (bad JSON, non-JSON-RPC, batches, oversize) go through ``ftl mcp`` as a
subprocess over raw pipes; one more subprocess session uses the SDK's stdio client.

ThoughtGate matrix rows covered (reference §1.9): gate errors -32015/-32014/-32003/-32007, the
blocking approval timeout as an isError result (§1.5), EC-ERR-001..006, bad JSON -32700, not
JSON-RPC -32600, body over the limit -32600, unknown method -32601, notification -> no reply,
batch -> one -32600 (MCP 2025-06-18 dropped batching).
"""

from __future__ import annotations

import functools
import json
import shutil
import logging
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from mcp import Client, MCPError, StdioServerParameters

from ftl.errors import FtlError
from ftl.events import read_events
from ftl.surfaces.jsonrpc import CorrelationIds
from ftl.surfaces.mcp_server import TOOLS, FtlMcpServer, mcp
from ftl.telemetry.metrics import Metrics
from ftl.engine.runner import Runner, connect_in_process

SECRETS = ("hunter2", "abc123def456ghi")
PLANTED = "password=hunter2 Authorization: Bearer abc123def456ghi"


# --------------------------------------------------------------------------- harness

def make_server(repo: Path, *, runner_factory: Any = None, metrics: Metrics | None = None,
                run_id: str = "run1", **kwargs: Any) -> FtlMcpServer:
    factory = runner_factory or functools.partial(Runner, client_factory=connect_in_process)
    return FtlMcpServer(repo, metrics=metrics or Metrics(), runner_factory=factory,
                        correlation=CorrelationIds(run_id), **kwargs)


def session(server: FtlMcpServer, calls: list[tuple[str, dict[str, Any]]], *, mode: str = "legacy",
            meta: dict[str, Any] | None = None, progress: list[tuple] | None = None) -> list[Any]:
    """Connect the SDK client, make each call; each answer is a CallToolResult or an MCPError.
    Progress notifications are appended to ``progress`` when it is given."""
    answers: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def main() -> None:
        async with Client(server.server, mode=mode) as client:
            for name, args in calls:
                try:
                    answers.append(await client.call_tool(
                        name, args, meta=meta, progress_callback=on_progress if progress is not None else None))
                except MCPError as error:
                    answers.append(error)

    anyio.run(main)
    return answers


def one(server: FtlMcpServer, name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    return session(server, [(name, args or {})], **kwargs)[0]


def rpc_error(answer: Any, code: int, error_type: str) -> dict[str, Any]:
    assert isinstance(answer, MCPError), answer
    assert answer.code == code, (answer.code, answer.message, answer.data)
    data = answer.data
    assert data["error_type"] == error_type and data["correlation_id"]
    text = json.dumps({"message": answer.message, "data": data})
    assert "Traceback" not in text and not any(s in text for s in SECRETS)
    return data


def envelope_of(answer: Any, *, is_error: bool) -> dict[str, Any]:
    assert not isinstance(answer, MCPError), (answer.code, answer.message, answer.data)
    assert answer.is_error is is_error
    env = answer.structured_content
    assert json.loads(answer.content[0].text) == env
    assert env["meta"]["version"] == "response-v2" and env["success"] is (not is_error)
    return env


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".gitignore").write_text(".ftl/\n")
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=path, check=True)
    return path


def plan(*tasks: dict[str, Any], objective: str = "ship it") -> str:
    return json.dumps({"objective": objective, "framework": "none", "tasks": list(tasks)})


def task(seq: str, depends: Any = "none", verify: str = "true") -> dict[str, Any]:
    return {"seq": seq, "slug": f"task-{seq}", "run": "true", "verify": verify, "depends": depends}


class FailingRunner:
    """A runner factory whose runs raise ``exc`` (the fault under test)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __call__(self, repo: Path, config: Any, on_event: Any = None,
                 interrupt: Any = None) -> "FailingRunner":
        return self

    def start(self, objective: str, **kwargs: Any) -> Any:
        raise self.exc

    resume = start

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- listing, success

@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_lists_every_tool_with_its_schema_in_both_protocol_eras(tmp_path: Path, mode: str) -> None:
    server = make_server(tmp_path)

    async def main() -> list[Any]:
        async with Client(server.server, mode=mode) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in anyio.run(main)}
    assert set(tools) == {spec.name for spec in TOOLS} == {
        "campaign_run", "campaign_resume", "campaign_status", "ready_tasks", "cascade_analysis",
        "replay_log", "intents"}
    assert {"type": "string", "minLength": 1, "maxLength": 4096} in \
        tools["campaign_run"].input_schema["properties"]["plan"]["anyOf"]
    assert tools["replay_log"].input_schema["required"] == ["path"]
    assert tools["campaign_status"].annotations.read_only_hint is True
    assert tools["campaign_run"].annotations.read_only_hint is False
    env = envelope_of(one(server, "campaign_status", mode=mode), is_error=False)
    assert env["data"] == {"status": "none"}
    assert not (tmp_path / ".ftl").exists()  # a read never creates a store


def test_intents_come_from_the_embedded_servers_manifest(tmp_path: Path) -> None:
    from ftl.server.app import INTENTS
    from ftl.server.catalog import TOOL_SPECS

    env = envelope_of(one(make_server(tmp_path), "intents"), is_error=False)
    assert [i["name"] for i in env["data"]["intents"]] == [i["name"] for i in INTENTS]
    assert {t["name"] for t in env["data"]["tools"]} == {s.name for s in TOOL_SPECS}
    assert env["data"]["status"] == "ready" and env["data"]["server"]["name"] == "ftl"


def test_campaign_lifecycle_through_mcp(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    write(repo, "plan.json", plan(task("001"), task("002", ["001"], verify="false"), task("003", ["002"])))
    metrics = Metrics()
    server = make_server(repo, metrics=metrics)
    progress: list[tuple] = []
    run = envelope_of(one(server, "campaign_run", {"plan": "plan.json", "jobs": 2}, progress=progress),
                      is_error=False)
    assert [value for value, _, _ in progress] == list(range(1, len(progress) + 1))  # increasing
    messages = [message for _, _, message in progress]
    assert "state EXECUTE" in messages and "task 001 complete" in messages
    cid = run["data"]["campaign_id"]
    assert run["data"]["outcome"] == "complete_with_blocked" and run["data"]["exit_code"] == 3
    assert [w["code"] for w in run["meta"]["warning_details"]] == ["PARTIAL_FAILURE"]
    assert str(tmp_path) not in json.dumps(run)
    # The run's store was closed when the call ended (checkpointed, no log left behind): the
    # server lives on, so a connection left to the collector would stay open for a while.
    assert not (repo / ".ftl" / "ftl.db-wal").exists()

    status, ready, cascade, replayed, by_id = session(server, [
        ("campaign_status", {}), ("ready_tasks", {"campaign_id": cid}), ("cascade_analysis", {}),
        ("replay_log", {"path": cid, "check": True}),
        ("replay_log", {"path": f".ftl/events/{cid}.jsonl"})])
    status = envelope_of(status, is_error=False)["data"]
    assert {t["seq"]: t["status"] for t in status["tasks"]} == {
        "001": "complete", "002": "blocked", "003": "blocked"}
    assert envelope_of(ready, is_error=False)["data"] == {"campaign_id": cid, "items": []}
    roots = envelope_of(cascade, is_error=False)["data"]["roots"]
    assert [r["seq"] for r in roots] == ["002"] and roots[0]["already_blocked"] == ["003"]
    replayed = envelope_of(replayed, is_error=False)["data"]
    assert replayed["check"] == {"passed": True, "violations": 0} and replayed["campaign_id"] == cid
    assert envelope_of(by_id, is_error=False)["data"]["campaign_id"] == cid

    # The campaign's events fed the counters (EventMetrics on the runner's event log).
    assert metrics.registry.get_sample_value("ftl_tasks_total", {"status": "complete"}) == 1
    assert metrics.registry.get_sample_value("ftl_tasks_total", {"status": "blocked"}) == 1
    body = metrics.render()[0].decode()
    assert 'ftl_errors_total{category="validation",code="flaky_test",gate="none"} 3.0' in body
    assert 'ftl_retries_total{kind="flaky_test",outcome="retried"} 2.0' in body


def test_campaign_returned_from_error_is_an_is_error_result_with_its_summary(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    answer = one(make_server(repo), "campaign_run", {"objective": "needs a planner"})
    env = envelope_of(answer, is_error=True)
    assert env["data"]["ftl_error_type"] == "dependency_missing"
    assert env["data"]["exit_code"] == 4 and env["data"]["summary"]["route"] == "return_errors"
    assert env["data"]["remediation"] and env["error"]


def test_a_run_stopped_by_a_lost_cluster_is_an_is_error_result_that_says_how_to_resume() -> None:
    """The runner's ``stopped`` outcome (tests/test_ray_outage.py drives the real one) is not a
    success: the agent gets the error and the resume hint, and the exit code says resumable."""
    from ftl.surfaces.mcp_server import _run_outcome
    from ftl.engine.runner import EXIT_UNAVAILABLE, RunResult

    error = FtlError("cluster_lost", {"address": "10.0.0.5:6379",
                                      "cause": "the head at 10.0.0.5:6379 refused connections for 15 s"})
    summary = {"error": {"error_type": error.error_type, "message": error.message,
                         "details": error.safe_details()},
               "message": error.message + " Stopped; run `ftl campaign resume` once the cluster is back."}
    outcome = _run_outcome(RunResult("c-1", "stopped", EXIT_UNAVAILABLE, summary, Path("c-1.jsonl")), "c9")
    assert outcome.is_error
    assert outcome.envelope["success"] is False
    assert outcome.envelope["data"]["ftl_error_type"] == "cluster_lost"
    assert outcome.envelope["data"]["exit_code"] == EXIT_UNAVAILABLE == 75
    assert "ftl campaign resume" in outcome.envelope["data"]["remediation"]
    assert "ftl campaign resume" in outcome.envelope["data"]["summary"]["message"]


# --------------------------------------------------------------------------- agent errors (isError)

def test_a_plan_with_a_cycle_is_an_is_error_result_the_agent_can_fix(tmp_path: Path) -> None:
    write(tmp_path, "plan.json", plan(task("001", ["002"]), task("002", ["001"])))
    env = envelope_of(one(make_server(tmp_path), "campaign_run", {"plan": "plan.json"}), is_error=True)
    assert env["data"]["ftl_error_type"] == "cycle_detected"
    assert env["data"]["error_code"] == "CIRCULAR_DEPENDENCY"
    assert "001" in env["data"]["details"]["cycle"] and env["data"]["remediation"]
    assert not (tmp_path / ".ftl").exists()  # refused before any campaign was created


def test_a_plan_breaking_the_schema_lists_every_violation(tmp_path: Path) -> None:
    write(tmp_path, "plan.json", json.dumps({"objective": "x", "tasks": [{"seq": "001", "slug": "Bad Slug"}]}))
    env = envelope_of(one(make_server(tmp_path), "campaign_run", {"plan": "plan.json"}), is_error=True)
    assert env["data"]["ftl_error_type"] == "schema_invalid"
    assert env["data"]["details"]["violations"] and env["data"]["details"]["count"] >= 1


# --------------------------------------------------------------------------- protocol and runner faults

def test_unknown_tool_and_bad_arguments_are_invalid_params(tmp_path: Path) -> None:
    unknown, extra, wrong, missing = session(make_server(tmp_path), [
        ("no_such_tool", {}), ("campaign_status", {"bogus": PLANTED}),
        ("campaign_run", {"jobs": "many " + PLANTED}), ("replay_log", {})])
    rpc_error(unknown, -32602, "invalid_params")
    assert rpc_error(extra, -32602, "invalid_params")["details"]["schema_errors"] == [
        {"path": "/bogus", "message": "Extra inputs are not permitted", "keyword": "extra_forbidden"}]
    data = rpc_error(wrong, -32602, "invalid_params")
    assert data["tool"] == "campaign_run" and data["details"]["schema_errors"][0]["path"] == "/jobs"
    assert rpc_error(missing, -32602, "invalid_params")["details"]["schema_errors"][0]["path"] == "/path"


def test_objective_or_plan_is_required(tmp_path: Path) -> None:
    data = rpc_error(one(make_server(tmp_path), "campaign_run", {}), -32602, "invalid_params")
    assert data["details"]["schema_errors"][0]["path"] == "/objective"


def test_runner_faults_are_jsonrpc_errors_from_the_registry(tmp_path: Path) -> None:
    active = make_server(tmp_path, runner_factory=FailingRunner(FtlError(
        "conflict", {"what": "Campaign c-1 is still active; finish or resume it first."})))
    data = rpc_error(one(active, "campaign_run", {"objective": "x"}), -32089, "conflict")
    assert data["tool"] == "campaign_run" and "still active" in data["details"]["what"]
    missing = make_server(tmp_path, runner_factory=FailingRunner(FtlError(
        "not_found", {"what": "an active campaign to resume"})))
    rpc_error(one(missing, "campaign_resume", {}), -32088, "not_found")
    rpc_error(one(make_server(tmp_path), "cascade_analysis", {}), -32088, "not_found")
    rpc_error(one(make_server(tmp_path), "replay_log", {"path": "nope.jsonl"}), -32088, "not_found")
    rpc_error(one(make_server(tmp_path), "campaign_status", {"repo": "no/such/dir"}), -32088, "not_found")


def test_unclassified_exception_is_internal_error_with_trace_only_in_the_log(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ftl")
    boom = RuntimeError(f"db at {tmp_path}/x.db rejected {PLANTED}\nSELECT * FROM task")
    server = make_server(tmp_path, runner_factory=FailingRunner(boom), run_id="runZ")
    answer = one(server, "campaign_run", {"objective": "x"})
    data = rpc_error(answer, -32603, "internal_error")
    cid = data["correlation_id"]
    assert cid.startswith("runZ-") and data == {"correlation_id": cid, "error_type": "internal_error"}
    assert answer.message == f"An internal error occurred (correlation id {cid})."  # no tool: system-level
    assert str(tmp_path) not in answer.message
    record = next(r for r in caplog.records if getattr(r, "correlation_id", None) == cid and r.exc_info)
    assert record.exc_info[1] is boom


def test_correlation_id_from_the_client_is_kept_and_a_missing_one_is_generated(tmp_path: Path) -> None:
    server = make_server(tmp_path, run_id="runC")
    given = one(server, "campaign_status", {}, meta={"correlation_id": "agent-42"})
    assert envelope_of(given, is_error=False)["meta"]["request_id"] == "agent-42"
    error = one(server, "replay_log", {"path": "x"}, meta={"correlation_id": "agent-43"})
    assert rpc_error(error, -32088, "not_found")["correlation_id"] == "agent-43"
    injected = one(server, "replay_log", {"path": "x"}, meta={"correlation_id": "bad\nid " + PLANTED})
    generated = rpc_error(injected, -32088, "not_found")["correlation_id"]
    assert generated.startswith("runC-")  # EC-ERR-004: unusable ids are replaced, not echoed


class _Unrenderable(FtlError):
    def safe_details(self):
        raise RuntimeError("rendering failed")


def test_ec_err_001_error_while_building_the_error_is_a_bare_32603(tmp_path: Path) -> None:
    fault = _Unrenderable("conflict", {"what": "x"}, message="Campaign busy.")
    answer = one(make_server(tmp_path, runner_factory=FailingRunner(fault)), "campaign_run", {"objective": "x"})
    assert answer.code == -32603 and answer.message == "Internal error"
    assert set(answer.data) == {"correlation_id", "error_type"} and answer.data["error_type"] == "internal_error"


def test_ec_err_002_003_006_long_non_utf8_and_sensitive_upstream_text(tmp_path: Path) -> None:
    upstream = (b"upstream \xff\xfe said " + PLANTED.encode() + b" at " + str(tmp_path).encode()
                + b"/srv.sock ").decode("utf-8", "surrogateescape") * 40
    fault = FtlError("network_error", {"problem": upstream, "url": "https://u:pw@host/x"},
                     message="Tool server call failed: " + upstream)
    answer = one(make_server(tmp_path, runner_factory=FailingRunner(fault)), "campaign_run", {"objective": "x"})
    data = rpc_error(answer, -32013, "network_error")
    assert len(answer.message.encode("utf-8")) <= 1024 and answer.message.endswith("…")
    assert "\ufffd" in answer.message and "\udcff" not in answer.message
    assert str(tmp_path) not in json.dumps(data) and "…/srv.sock" in data["details"]["problem"]
    assert "url" not in data["details"] and "pw@" not in json.dumps(data)
    assert "tool" not in data  # network trouble is system-level (ThoughtGate §1.7)


# --------------------------------------------------------------------------- the four gates

POLICY = 'forbid(principal, action, resource == Tool::"ready_tasks");\n'


def gated_repo(root: Path, approval: str) -> Path:
    """A repository whose ftl.toml routes each tool through a different gate."""
    write(root, "policies/p.cedar", POLICY)
    write(root, "approver.py", "import sys; sys.stdin.read(); sys.exit(1)\n")
    write(root, "ftl.toml", f"""
        [gates.expose]
        exclude = ["replay_log", "campaign_resume"]

        [gates.governance]
        default = "forward"

        [[gates.governance.rules]]
        match = {{ tool = ["campaign_status", "campaign_resume"] }}
        action = "deny"

        [[gates.governance.rules]]
        match = {{ tool = ["ready_tasks"] }}
        action = "policy"

        [[gates.governance.rules]]
        match = {{ tool = ["cascade_analysis"] }}
        action = "approve"

        [gates.policy]
        files = ["policies/p.cedar"]

        [gates.approval]
        {approval}
    """)
    return root


def test_thoughtgate_gate_matrix_through_the_real_gates(tmp_path: Path) -> None:
    repo = gated_repo(tmp_path, f'mode = "command"\ncommand = [{json.dumps(sys.executable)}, "approver.py"]')
    metrics = Metrics()
    server = make_server(repo, metrics=metrics)

    async def listed() -> set[str]:
        async with Client(server.server, mode="legacy") as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert anyio.run(listed) == {spec.name for spec in TOOLS} - {"replay_log", "campaign_resume"}
    hidden, denied, forbidden, rejected, forwarded, both = session(server, [
        ("replay_log", {"path": "x"}), ("campaign_status", {}), ("ready_tasks", {}),
        ("cascade_analysis", {}), ("intents", {}), ("campaign_resume", {})])
    for answer, code, kind, gate in ((hidden, -32015, "tool_not_exposed", "visibility"),
                                     (denied, -32014, "governance_denied", "governance"),
                                     (forbidden, -32003, "policy_denied", "policy"),
                                     (rejected, -32007, "approval_rejected", "approval"),
                                     (both, -32015, "tool_not_exposed", "visibility")):  # EC-ERR-005
        data = rpc_error(answer, code, kind)
        assert data["gate"] == gate and data["tool"] in answer.message
        text = json.dumps(data) + answer.message
        for internal in ("forbid(", "p.cedar", "policy0", "approver.py", "[gates", "apr-"):
            assert internal not in text  # rules, policies and workflows stay in the log
    envelope_of(forwarded, is_error=False)
    assert metrics.registry.get_sample_value(
        "ftl_errors_total", {"code": "policy_denied", "gate": "policy", "category": "authorization"}) == 1


def test_blocking_approval_timeout_is_an_is_error_result(tmp_path: Path) -> None:
    repo = gated_repo(tmp_path, 'mode = "file"\nfile = "decisions.json"\ntimeout_s = 0\non_timeout = "deny"')
    env = envelope_of(one(make_server(repo), "cascade_analysis", {}), is_error=True)
    assert env["data"]["ftl_error_type"] == "approval_timeout"
    assert env["data"]["error_type"] == "unavailable" and env["data"]["details"] == {"tool": "cascade_analysis"}


def test_hidden_and_unknown_tools_look_the_same_when_gates_are_on(tmp_path: Path) -> None:
    server = make_server(gated_repo(tmp_path, 'mode = "file"\nfile = "d.json"'))
    hidden, unknown = session(server, [("replay_log", {"path": "x"}), ("no_such_tool", {})])
    assert rpc_error(hidden, -32015, "tool_not_exposed")["gate"] == "visibility"
    assert rpc_error(unknown, -32015, "tool_not_exposed")["gate"] == "visibility"


def test_gates_configured_but_unimportable_is_a_configuration_error(tmp_path: Path, monkeypatch) -> None:
    server = make_server(gated_repo(tmp_path, 'mode = "file"\nfile = "d.json"'))
    monkeypatch.setitem(sys.modules, "ftl.gate", None)  # `import ftl.gate` raises ImportError

    async def main() -> list[Any]:
        out: list[Any] = []
        async with Client(server.server, mode="legacy") as client:
            for call in (client.list_tools(), client.call_tool("intents", {})):
                try:
                    out.append(await call)
                except MCPError as error:
                    out.append(error)
        return out

    for answer in anyio.run(main):
        assert "ftl.gate" in rpc_error(answer, -32016, "configuration_error")["details"]["problem"]


def test_invalid_gates_table_refuses_every_call(tmp_path: Path) -> None:
    write(tmp_path, "ftl.toml", '[gates.governance]\ndefault = "maybe"\n')
    data = rpc_error(one(make_server(tmp_path), "intents"), -32016, "configuration_error")
    assert data["details"]["violations"][0]["path"].startswith("gates.governance")


# --------------------------------------------------------------------------- ftl mcp over stdio

class RawSession:
    """``ftl mcp`` as a subprocess spoken to line by line (stdin stays open until close)."""

    def __init__(self, repo: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "ftl", "mcp", "--repo", str(repo)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, raw: bytes) -> None:
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def reply(self) -> dict[str, Any]:
        return json.loads(self.lines.get(timeout=30))

    def close(self) -> tuple[int, str]:
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        return code, self.proc.stderr.read().decode("utf-8", "replace")


def test_stdio_protocol_faults_get_standard_codes(tmp_path: Path) -> None:
    raw = RawSession(tmp_path)
    try:
        raw.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}).encode())
        assert raw.reply()["result"]["serverInfo"]["name"] == "ftl"
        raw.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')  # no reply
        cases = [
            (b'{"jsonrpc": "2.0", "id": 2, "method": ', None, -32700, "parse_error"),
            (b'\xff\xfe{"jsonrpc": "2.0" ' + PLANTED.encode(), None, -32700, "parse_error"),
            (json.dumps({"id": 3, "hello": PLANTED}).encode(), 3, -32600, "invalid_request"),
            (json.dumps([{"jsonrpc": "2.0", "id": 4, "method": "ping"}]).encode(), None, -32600,
             "invalid_request"),
            (json.dumps({"jsonrpc": "2.0", "id": 5, "method": "no/such"}).encode(), 5, -32601,
             "method_not_found"),
            (json.dumps({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {
                "name": "campaign_status", "arguments": {"pad": "x" * (1024 * 1024 + 10)}}}).encode(),
             6, -32600, "message_too_large"),
            # MCP ids are strings or integers: the SDK would take these for notifications and
            # never answer (JSON-RPC 2.0 §5: -32600 with id null when the id is unusable)
            (b'{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', None, -32600, "invalid_request"),
            (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', None, -32600, "invalid_request"),
            (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', None, -32600, "invalid_request"),
            (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}', None, -32600, "invalid_request"),
            (b"[" * 5000 + b"]" * 5000, None, -32700, "parse_error"),  # nested past the parser
        ]
        for line, request_id, code, kind in cases:
            raw.send(line)
            reply = raw.reply()
            assert reply["id"] == request_id and reply["error"]["code"] == code, reply
            assert reply["error"]["data"]["error_type"] == kind and reply["error"]["data"]["correlation_id"]
            assert not any(s in json.dumps(reply) for s in SECRETS)
        raw.send(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "campaign_status", "arguments": {}}}).encode())
        result = raw.reply()
        assert result["id"] == 7 and result["result"]["structuredContent"]["data"] == {"status": "none"}
    finally:
        code, stderr = raw.close()
    assert code == 0
    log_lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert {"parse_error", "invalid_request", "method_not_found", "message_too_large"} <= \
        {line.get("error_type") for line in log_lines}
    assert all(line["correlation_id"] for line in log_lines if line.get("error_type"))
    assert not any(s in stderr for s in SECRETS)


def test_sdk_stdio_client_against_ftl_mcp(tmp_path: Path) -> None:
    write(tmp_path, "plan.json", plan(task("001", ["001"])))
    params = StdioServerParameters(command=sys.executable, args=["-m", "ftl", "mcp", "--repo", str(tmp_path)],
                                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})

    async def main() -> list[Any]:
        out: list[Any] = []
        async with Client(params, mode="legacy") as client:
            out.append({t.name for t in (await client.list_tools()).tools})
            out.append(await client.call_tool("campaign_run", {"plan": "plan.json"}))
            try:
                await client.call_tool("ready_tasks", {"campaign_id": 7})
            except MCPError as error:
                out.append(error)
        return out

    names, cycle, bad = anyio.run(main)
    assert names == {spec.name for spec in TOOLS}
    refused = envelope_of(cycle, is_error=True)["data"]  # a task depending on itself
    assert refused["ftl_error_type"] == "schema_invalid"
    assert refused["details"]["violations"][0]["path"] == "$.tasks[0].depends[0]"
    assert rpc_error(bad, -32602, "invalid_params")["tool"] == "ready_tasks"


def test_ftl_mcp_is_a_cli_command_and_refuses_a_bad_repo(tmp_path: Path) -> None:
    from ftl.surfaces.cli import main

    assert main.commands["mcp"] is mcp
    result = CliRunner().invoke(main, ["mcp", "--repo", str(tmp_path / "missing")])
    assert result.exit_code == 2
    envelope_line = [line for line in result.stderr.splitlines() if line.startswith('{"data"')][-1]
    env = json.loads(envelope_line)
    assert env["success"] is False and env["data"]["ftl_error_type"] == "not_found"
    assert str(tmp_path) not in result.stderr and result.stdout == ""


def test_a_cancelled_campaign_run_stops_the_run_resumably(tmp_path: Path) -> None:
    # The client gives up on campaign_run (notifications/cancelled): the run must stop
    # (cancelled, resumable) rather than go on changing the repository unseen.
    repo = git_repo(tmp_path / "repo")
    slow = {"seq": "001", "slug": "slow", "run": "sleep 20", "verify": "true", "depends": "none"}
    write(repo, "plan.json", plan(slow))
    server = make_server(repo)
    began = time.monotonic()

    async def main() -> None:
        async with Client(server.server) as client:
            with anyio.move_on_after(1.5):
                await client.call_tool("campaign_run", {"plan": "plan.json"})

    anyio.run(main)
    logs = list((repo / ".ftl" / "events").glob("*.jsonl"))

    def ended() -> bool:
        return bool(logs) and any(e["event"] == "RUN_END" for e in read_events(logs[0]))

    deadline = time.monotonic() + 15
    while not ended() and time.monotonic() < deadline:
        time.sleep(0.05)
        logs = logs or list((repo / ".ftl" / "events").glob("*.jsonl"))
    end = [e for e in read_events(logs[0]) if e["event"] == "RUN_END"][-1]
    assert end["outcome"] == "cancelled" and end["resumable"] is True
    assert time.monotonic() - began < 15  # the 20 s build was stopped, not waited out


def test_replay_log_cuts_long_lists_and_every_answer_is_standard_json(tmp_path: Path, monkeypatch) -> None:
    import ftl.surfaces.mcp_server as surface

    drill = Path(__file__).parent / "logs" / "drill.jsonl"
    write(tmp_path, "drill.jsonl", drill.read_text())
    monkeypatch.setattr(surface, "REPLAY_LIST_LIMIT", 2)
    data = envelope_of(one(make_server(tmp_path), "replay_log", {"path": "drill.jsonl"}),
                       is_error=False)
    assert data["data"]["cut"]["tasks"] > 2 and len(data["data"]["tasks"]) == 2
    assert "REPLAY_LISTS_CUT" in [w["code"] for w in data["meta"]["warning_details"]]
    result = surface.Outcome({"summary": {"cost": float("nan"), "spans": [float("inf")]}}).result()
    assert json.loads(result.content[0].text, parse_constant=lambda name: pytest.fail(name)) == {
        "summary": {"cost": "nan", "spans": ["inf"]}}


# --------------------------------------------------------------------------- roots

def test_paths_outside_the_servers_roots_are_refused_without_being_opened(tmp_path: Path) -> None:
    served, outside = tmp_path / "served", tmp_path / "outside"
    git_repo(served)
    git_repo(outside)
    (outside / "plan.json").write_text("{not json")  # opened, it would be a parse error
    (served / "escape").symlink_to(outside, target_is_directory=True)
    server = make_server(served)
    calls = [("campaign_status", {"repo": str(outside)}),
             ("campaign_status", {"repo": "../outside"}),
             ("campaign_status", {"repo": "escape"}),  # a symlink out counts where it points
             ("campaign_run", {"objective": "x", "plan": str(outside / "plan.json")}),
             ("replay_log", {"path": "../outside/events.jsonl"}),
             ("replay_log", {"path": "/etc/passwd"})]
    for (name, args), answer in zip(calls, session(server, calls)):
        data = rpc_error(answer, -32602, "invalid_params")
        problem = data["details"]["schema_errors"][0]
        assert problem["keyword"] == "x-root" and problem["path"] in ("/repo", "/plan", "/path"), (name, data)
        assert str(tmp_path) not in json.dumps(data) and "passwd" not in json.dumps(data)
    assert not (outside / ".ftl").exists()  # nothing was created in the refused repository


def test_a_named_repository_whose_ftl_folder_links_out_is_refused(tmp_path: Path) -> None:
    served, outside = tmp_path / "served", tmp_path / "outside"
    git_repo(served)
    git_repo(served / "inner")
    outside.mkdir()
    (served / "inner" / ".ftl").symlink_to(outside, target_is_directory=True)
    calls = [("campaign_status", {"repo": "inner"}),
             ("campaign_run", {"objective": "x", "repo": "inner"})]
    for answer in session(make_server(served), calls):
        data = rpc_error(answer, -32602, "invalid_params")
        assert data["details"]["schema_errors"][0] == {**data["details"]["schema_errors"][0],
                                                       "keyword": "x-root", "path": "/repo"}
    assert list(outside.iterdir()) == []  # nothing was written through the link
    (served / "inner" / ".ftl").unlink()
    (served / "inner" / ".ftl").mkdir()  # a real folder whose store links out: refused too
    (served / "inner" / ".ftl" / "ftl.db").symlink_to(outside / "ftl.db")
    [answer] = session(make_server(served), [("campaign_status", {"repo": "inner"})])
    assert rpc_error(answer, -32602, "invalid_params")["details"]["schema_errors"][0]["keyword"] == "x-root"
    assert list(outside.iterdir()) == []
    shutil.rmtree(served / "inner" / ".ftl")
    (served / "inner" / ".ftl").symlink_to(served / "state", target_is_directory=True)
    (served / "state").mkdir()  # a link that stays inside the roots is fine
    [answer] = session(make_server(served), [("campaign_status", {"repo": "inner"})])
    assert envelope_of(answer, is_error=False)["data"]["status"] == "none"

def test_allow_root_opens_another_directory_and_inside_paths_stay_usable(tmp_path: Path) -> None:
    served, other = tmp_path / "served", tmp_path / "other"
    git_repo(served)
    git_repo(other / "repo")
    (served / "sub").mkdir()
    allowed = make_server(served, allowed_roots=[other])
    inside, nested = session(allowed, [("campaign_status", {"repo": str(other / "repo")}),
                                       ("campaign_status", {"repo": "sub/.."})])
    for answer in (inside, nested):  # allowed: answered (no campaign yet), not refused
        assert envelope_of(answer, is_error=False)["data"]["status"] == "none"
    with pytest.raises(FtlError) as missing:
        make_server(served, allowed_roots=[tmp_path / "nope"])
    assert missing.value.error_type == "not_found"


def test_a_campaign_ids_log_and_unresolvable_paths_are_confined_too(tmp_path: Path) -> None:
    served, outside = tmp_path / "served", tmp_path / "outside"
    git_repo(served)
    outside.mkdir()
    (outside / "secret.jsonl").write_text('{"event": "RUN_START", "seq": 1}\n')
    (served / ".ftl" / "events").mkdir(parents=True, exist_ok=True)
    (served / ".ftl" / "events" / "leak.jsonl").symlink_to(outside / "secret.jsonl")
    (served / "loop").symlink_to(served / "loop")
    calls = [("replay_log", {"path": "leak"}),  # a campaign id whose log points out
             ("replay_log", {"path": "loop"}),  # a symlink loop: used to be an internal error
             ("replay_log", {"path": "~nosuchuser_zz/x.jsonl"})]
    for answer in session(make_server(served), calls):
        data = rpc_error(answer, -32602, "invalid_params")
        assert data["details"]["schema_errors"][0]["keyword"] == "x-root"
