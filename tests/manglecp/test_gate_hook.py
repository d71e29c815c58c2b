"""The gate hook of the server framework (ThoughtGate's visibility gate at evaluation, gates 2-4 on
every invocation) and its wiring from ``[gates]`` in ftl's embedded server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ftl.config import Config
from ftl.errors import REGISTRY, FtlError
from ftl.manglecp.access import Session
from ftl.manglecp.messages import fact

from .helpers import final, intent, invoke, make_server, tools_by_name


class FakeGate:
    """Hides the tools in ``hidden``; refuses calls with the kinds in ``refuse`` (tool -> kind)."""

    def __init__(self, hidden=(), refuse=None, broken=False) -> None:
        self.hidden = set(hidden)
        self.refuse = dict(refuse or {})
        self.broken = broken
        self.calls: list[dict] = []

    def visible(self, tool_name: str) -> bool:
        if self.broken:
            raise RuntimeError("gate backend down")
        return tool_name not in self.hidden

    def check(self, call: dict) -> None:
        self.calls.append(call)
        if self.broken:
            raise RuntimeError("gate backend down")
        kind = self.refuse.get(call["tool"])
        if kind:
            raise FtlError(kind, {"tool": call["tool"], "gate": REGISTRY[kind].gate,
                                  "rule": "secret-rule-7"})


def test_hidden_tools_are_absent_and_their_dependents_dropped():
    gate = FakeGate(hidden={"helper_tool", "prohibited_tool"})
    server = make_server(gate=gate)
    reply = final(server.handle(intent("diag", options={"include_proof_hints": True,
                                                         "disclosure_preference": "full"})))
    names = set(tools_by_name(reply))
    assert "helper_tool" not in names and "dependent_tool" not in names  # C4 still holds
    assert "mandatory_tool" in names
    text = json.dumps(reply)
    assert "helper_tool" not in text and "prohibited_tool" not in text  # not even in proof hints


def test_a_tool_hidden_after_evaluation_is_macro_not_found():
    gate = FakeGate()
    server = make_server(gate=gate)
    macro_id = tools_by_name(final(server.handle(intent("tools"))))["echo_tool"]["macro_id"]
    gate.hidden.add("echo_tool")
    reply = final(server.handle(invoke(macro_id, {"text": "x"})))
    assert reply["payload"]["code"] == "macro_not_found" and gate.calls == []


def test_check_gets_the_call_after_schema_validation_and_before_confirmation():
    gate = FakeGate()
    server = make_server(gate=gate)
    tools = tools_by_name(final(server.handle(intent("tools", [fact("enable", "x")]))))
    bad = final(server.handle(invoke(tools["echo_tool"]["macro_id"], {"text": 5})))
    assert bad["payload"]["code"] == "schema_validation_failed" and gate.calls == []
    ok = final(server.handle(invoke(tools["echo_tool"]["macro_id"], {"text": "hi"}, id="r-9")))
    assert ok["type"] == "invoke_response"
    call = gate.calls[-1]
    assert {k: call[k] for k in ("tool", "args", "side_effects", "principal")} == {
        "tool": "echo_tool", "args": {"text": "hi"}, "side_effects": ["none"], "principal": "anonymous"}
    context = call["context"]
    assert (context["intent"], context["request_id"], context["fact_count"]) == ("tools", "r-9", 1)
    assert context["facts"] == [{"pred": "enable", "args": ["x"]}]
    gate.refuse["danger_tool"] = "governance_denied"
    denied = final(server.handle(invoke(tools["danger_tool"]["macro_id"], {})))
    assert denied["payload"]["code"] == "auth_insufficient"  # refused before any token is issued
    assert "confirmation_token" not in json.dumps(denied)


def test_principal_is_the_identity_when_auth_is_on(auth):
    gate = FakeGate()
    server = make_server(gate=gate, auth=auth)
    session = Session(credentials="good-token")
    macro_id = tools_by_name(final(server.handle(intent("tools"), session=session)))["echo_tool"]["macro_id"]
    final(server.handle(invoke(macro_id, {"text": "x"}), session=session))
    assert gate.calls[-1]["principal"] == "alice"


@pytest.mark.parametrize("kind", ["tool_not_exposed", "governance_denied", "policy_denied",
                                  "approval_rejected", "approval_timeout", "approval_not_found"])
def test_gate_refusals_render_their_registry_row(kind):
    counted = []
    server = make_server(gate=FakeGate(refuse={"echo_tool": kind}),
                         on_error=lambda error_type, gate: counted.append((error_type, gate)))
    macro_id = tools_by_name(final(server.handle(intent("tools"))))["echo_tool"]["macro_id"]
    reply = final(server.handle(invoke(macro_id, {"text": "x"}, id="g-1")))
    row = REGISTRY[kind]
    payload = reply["payload"]
    assert (reply["type"], reply["id"], payload["code"], payload["recoverable"]) == (
        "error", "g-1", row.manglecp_code, row.recoverable)
    assert payload["details"] == {"tool": "echo_tool", "error_type": kind, "gate": row.gate}
    assert "secret-rule" not in json.dumps(reply)
    assert counted == [(kind, row.gate)]


def test_a_broken_gate_fails_closed():
    server = make_server(gate=FakeGate(broken=True))
    assert final(server.handle(intent("tools")))["payload"]["macro_tools"] == []


def test_configured_gates_reach_the_embedded_server(tmp_path: Path):
    from ftl.server.app import build_server
    server = build_server(tmp_path, Config(gates={"expose": {"exclude": ["shell_*"]}}), isolation="thread")
    try:
        reply = final(server.handle(intent("build_task", [fact("task", "001", "BUILD"),
                                                          fact("task_has_run", "001")])))
        assert tools_by_name(reply) == {}
        verify = final(server.handle(intent("verify_task")))
        assert set(tools_by_name(verify)) == {"run_verify"}
    finally:
        server.close()


def test_configured_gates_are_never_skipped(tmp_path: Path, monkeypatch):
    from ftl.server.app import build_server, connect
    monkeypatch.setitem(sys.modules, "ftl.gate", None)  # the gate module cannot be imported
    config = Config(gates={"expose": {"exclude": ["shell_*"]}})
    for attempt in (lambda: build_server(tmp_path, config, isolation="thread"),
                    lambda: connect(tmp_path, config)):
        with pytest.raises(FtlError) as exc:
            attempt()
        assert exc.value.error_type == "configuration_error"
    plain = build_server(tmp_path, Config(), isolation="thread")  # no gates: no import needed
    plain.close()


def test_serve_refuses_configured_gates_it_cannot_load(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from ftl.server.serve import serve
    monkeypatch.setitem(sys.modules, "ftl.gate", None)
    config = Config(gates={"expose": {"exclude": ["shell_*"]}}).model_dump_json()
    result = CliRunner().invoke(serve, ["--stdio", "--repo", str(tmp_path), "--config-json", config])
    assert result.exit_code == 2 and "gate module is unavailable" in result.output
