"""ftl's own embedded server (``ftl serve``) against the checklist items that depend on its
domain: the manifest it advertises (13, level 2), determinism across processes (28), the state
delta and next steps of its real builder and verifier (38, 41, 47) and predicate schemas that
cover every input predicate its rules read (53). Over stdio and HTTP, as real processes."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import Manifest, fact
from ftl.manglecp.transport import WELL_KNOWN_PATH, HttpTransport, StdioTransport

SERVE = [sys.executable, "-m", "ftl.server.serve"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("repo")


@pytest.fixture(scope="module")
def clients(repo):
    """Two stdio server processes and one HTTP server process on the same repository."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    http = subprocess.Popen(SERVE + ["--http", f"127.0.0.1:{port}", "--repo", str(repo)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opened = {"stdio": ManglecpClient(StdioTransport(SERVE + ["--stdio", "--repo", str(repo)])),
              "stdio-2": ManglecpClient(StdioTransport(SERVE + ["--stdio", "--repo", str(repo)]))}
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(url + WELL_KNOWN_PATH, timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    opened["http"] = ManglecpClient(HttpTransport(url))
    yield opened
    for client in opened.values():
        client.close()
    http.terminate()
    http.wait(20)


@pytest.fixture(params=["stdio", "http"])
def client(request, clients) -> ManglecpClient:
    return clients[request.param]


def test_13_manifest_of_ftls_server(client):
    manifest = client.wait_ready()
    assert isinstance(manifest, Manifest)
    assert manifest.protocol.conformance_level == 2
    assert manifest.capabilities.temporal is True
    declared = {p.predicate: p for p in manifest.facts_profile.predicates}
    assert declared["verify_result"].direction == "both" and declared["verify_result"].temporal
    assert declared["task"].direction == "input"
    assert {i.name for i in manifest.intents} >= {"build_task", "verify_task", "analyze_cascade"}


def test_28_determinism_across_processes_and_transports(clients):
    facts = [fact("task", "001", "BUILD"), fact("task_has_run", "001"), fact("framework", "pytest"),
             fact("campaign_state", "build"), fact("explorer_mode", "delta"), fact("plan_given")]
    rng = random.Random(53)

    def signature(client, intent_name, facts):
        response = client.evaluate(intent_name, facts, eval_time="2026-02-19T14:30:00Z")
        return sorted((t.macro_id, t.disclosure_level, t.metadata.score if t.metadata else None)
                      for t in response.macro_tools)

    for intent_name in ("build_task", "verify_task", "explore_codebase", "plan_campaign"):
        expected = signature(clients["stdio"], intent_name, facts)
        assert expected
        for name in ("stdio", "stdio-2", "http") * 3:
            shuffled = facts[:]
            rng.shuffle(shuffled)
            assert signature(clients[name], intent_name, shuffled) == expected


def test_38_41_47_real_builder_and_verifier_deltas(client, repo):
    seq = "00" + str(len(list(repo.iterdir())))  # a fresh seq per transport
    workspace = {"workspace_id": f"c-1-{seq}-1", "campaign_id": "c-1", "seq": seq, "slug": "w", "type": "BUILD",
                 "objective": "write", "delta": [f"out{seq}.txt"], "verify": "true",
                 "run": f"echo hi > out{seq}.txt", "budget": 1, "timeout_s": 30}
    facts = [fact("task", seq, "BUILD"), fact("task_has_run", seq)]
    built = client.invoke_tool("build_task", facts, "shell_builder", {"workspace": workspace})
    asserted = built.state_delta.assert_
    assert [(f["pred"], f["args"]) for f in asserted] == [("build_outcome", [seq, "complete"]),
                                                          ("file_changed", [seq, f"out{seq}.txt", True])]
    assert all(f["category"] == "session" and f["source"]["source_type"] == "server" for f in asserted)
    assert built.next["suggested_intents"] == [
        {"name": "verify_task", "description": f"Run task {seq}'s verify command."}]
    verified = client.invoke_tool("verify_task", built.next["continuation_facts"], "run_verify",
                                  {"command": f"test -f out{seq}.txt"})
    assert [(f["pred"], f["args"]) for f in verified.state_delta.assert_] == [
        ("verify_result", [seq, True]), ("task_status", [seq, "complete"])]
    assert verified.observability["summary"] == f"Task {seq}'s verify command passed."


def test_53_predicate_schemas_cover_every_input_predicate_the_rules_read(tmp_path):
    """Every predicate a rule body reads that no rule derives, no server fact provides and that
    is not a server-tier pipeline predicate is declared in the facts profile as input (or both);
    and no server-tier predicate is open to clients (reference §7.1)."""
    import clingo.ast

    from ftl.config import Config
    from ftl.server.app import DOMAIN_RULES, build_server
    from ftl.server.evaluation.program import PHASE_RULES, instrument
    from ftl.server.evaluation.symbols import PIPELINE_PREDICATES, RESERVED

    server = build_server(tmp_path, Config(agent_command=["a"], planner_command=["p"]), isolation="thread")
    try:
        statements: list = []
        for path in (*PHASE_RULES, *DOMAIN_RULES):
            clingo.ast.parse_string(path.read_text(), statements.append)
        _, rules = instrument(statements)
        heads = {r.head for r in rules} | {s.head.atom.symbol.name for s in statements
                                          if s.ast_type == clingo.ast.ASTType.Rule and not s.body}
        server_facts = {pred for pred, _ in server.evaluator.server_facts} | {"intent", "intent_param"}
        read = {p for r in rules for p in (*r.positive, *r.negative)}
        inputs = {p for p in read - heads - server_facts - PIPELINE_PREDICATES if not p.startswith(RESERVED)}
        declared = {p.predicate for p in server.facts_profile.predicates if p.direction in ("input", "both")}
        assert inputs and inputs <= declared, inputs - declared
        assert not declared & (PIPELINE_PREDICATES | server_facts)
    finally:
        server.close()
