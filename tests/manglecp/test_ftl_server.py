"""ftl's embedded server: which macro-tools each intent returns, from facts and configuration,
and the server-bound agent commands."""

from __future__ import annotations

import sys
from pathlib import Path

import jsonschema
import pytest

from ftl.config import Config
from ftl.errors import FtlError
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import fact
from ftl.manglecp.transport import InProcessTransport, StdioTransport
from ftl.server.app import build_server
from ftl.server.catalog import TOOL_SPECS


def _client(repo: Path, **config) -> ManglecpClient:
    server = build_server(repo, Config(**config), isolation="thread")
    return ManglecpClient(InProcessTransport(server, close_server=True))


@pytest.fixture
def plain(tmp_path):
    client = _client(tmp_path)
    yield client
    client.close()


@pytest.fixture
def agents(tmp_path):
    client = _client(tmp_path, agent_command=["agent"], planner_command=["planner"])
    yield client
    client.close()


def _names(client, intent, facts=()):
    return sorted(t.name for t in client.evaluate(intent, list(facts)).macro_tools)


def test_every_catalog_tool_is_available_with_a_valid_schema(plain):
    server = plain.transport.server
    assert sorted(server.catalog) == sorted(spec.name for spec in TOOL_SPECS)
    for tool in server.catalog.values():
        jsonschema.Draft202012Validator.check_schema(dict(tool.input_schema))


def test_explorers_follow_the_requested_modes(plain):
    assert _names(plain, "explore_codebase") == []
    assert _names(plain, "explore_codebase", [fact("explorer_mode", "structure"), fact("explorer_mode", "delta")]) \
        == ["explore_delta", "explore_structure"]
    every = [fact("explorer_mode", m) for m in ("structure", "pattern", "memory", "delta")]
    assert _names(plain, "explore_codebase", every) == [
        "explore_delta", "explore_memory", "explore_pattern", "explore_structure"]


@pytest.mark.parametrize("intent", ["plan_campaign", "replan_campaign"])
def test_planning(plain, agents, intent):
    assert _names(plain, intent, [fact("plan_given")]) == ["load_plan"]
    assert _names(plain, intent) == []  # no plan and no planner configured
    assert _names(agents, intent) == ["agent_planner"]
    assert _names(agents, intent, [fact("plan_given")]) == ["load_plan"]


def test_builder_selection(plain, agents):
    task = fact("task", "001", "BUILD")
    run = fact("task_has_run", "001")
    assert _names(plain, "build_task", [task, run]) == ["shell_builder"]
    assert _names(plain, "build_task", [task]) == []  # no run command, no agent configured
    assert _names(agents, "build_task", [task]) == ["agent_builder"]
    assert _names(agents, "build_task", [task, run]) == ["shell_builder"]
    assert _names(agents, "build_task", [task, run, fact("builder_requested", "001", "agent")]) == ["agent_builder"]
    both = [task, run, fact("builder_requested", "001", "agent"), fact("builder_requested", "001", "shell")]
    assert _names(agents, "build_task", both) == ["shell_builder"]  # tie -> shell, the task has a run
    assert _names(plain, "build_task", [task, run, fact("builder_requested", "001", "agent")]) == ["shell_builder"]
    assert _names(agents, "build_task", [task, run, fact("exclude_tool", "shell_builder")]) == []


@pytest.mark.parametrize("intent,tool", [("verify_task", "run_verify"), ("observe_outcomes", "observer"),
                                         ("analyze_cascade", "cascade_analysis")])
def test_single_tool_intents(plain, intent, tool):
    assert _names(plain, intent) == [tool]


def test_intents_return_only_their_own_tools(agents):
    served = {spec.name: set(spec.intents) for spec in TOOL_SPECS}
    facts = [fact("explorer_mode", m) for m in ("structure", "pattern", "memory", "delta")] + [
        fact("task", "001", "BUILD"), fact("task_has_run", "001"), fact("plan_given")]
    for intent in {i for intents in served.values() for i in intents}:
        for name in _names(agents, intent, facts):
            assert intent in served[name], (intent, name)


def test_the_client_cannot_choose_the_agent_command(agents, tmp_path):
    schema = agents.evaluate("build_task", [fact("task", "001", "BUILD")]).tool("agent_builder").input_schema
    assert "command" not in schema["properties"]
    with pytest.raises(FtlError) as exc:
        agents.invoke_tool("build_task", [fact("task", "001", "BUILD")], "agent_builder",
                           {"workspace": {}, "command": ["rm", "-rf", "/"]})
    assert exc.value.error_type == "invalid_params"
    assert exc.value.details["schema_errors"][0]["keyword"] == "additionalProperties"


def test_configured_planner_command_is_the_one_that_runs(tmp_path):
    script = tmp_path / "planner.py"
    script.write_text("import sys, json; json.load(sys.stdin); print('Confidence: CLARIFY\\n- Which database?')\n")
    client = _client(tmp_path, planner_command=[sys.executable, str(script)])
    try:
        result = client.invoke_tool("plan_campaign", [], "agent_planner", {"objective": "add a cache"}).result
        assert result["decision"] == "CLARIFY"
    finally:
        client.close()


@pytest.mark.parametrize("server, transport", [(None, InProcessTransport), ("embedded", InProcessTransport),
                                               ("embedded:stdio", StdioTransport)])
def test_connect_builds_the_embedded_server_where_asked_with_the_whole_config(tmp_path, server, transport):
    from ftl.server.app import connect
    client = connect(tmp_path, Config(agent_command=["my-agent"], server=server))
    try:
        assert type(client.transport) is transport
        # agent_command reached the server: the agent builder is offered for a task without run
        assert _names(client, "build_task", [fact("task", "001", "BUILD")]) == ["agent_builder"]
    finally:
        client.close()


def test_connect_refuses_an_unknown_server_and_in_process_overrides_stdio(tmp_path):
    from ftl.server.app import connect
    with pytest.raises(FtlError) as exc:
        connect(tmp_path, Config(), server="ftp://nowhere")
    assert exc.value.error_type == "configuration_error"
    assert "embedded:stdio" in exc.value.details["problem"]
    in_process = connect(tmp_path, Config(server="embedded:stdio"), in_process=True)
    assert isinstance(in_process.transport, InProcessTransport)
    in_process.close()
