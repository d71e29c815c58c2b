"""The four gates (ftl.gate): ThoughtGate's test matrix (reference errors-and-gates.md §1.9) for
visibility, governance, Cedar policy and approval, with real cedarpy policies and real approval
commands; clocks and sleeps are injected where the gate waits."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ftl.gate as gate_module
from ftl.errors import FtlError, REGISTRY
from ftl.gate import TIMEOUT_APPROVER, Gatekeeper, GateDecision
from ftl.gate.call import Call

PERMIT_BUILDS = ('@id("shell-builds")\n'
                 'permit(principal, action == Action::"invoke", resource == Tool::"shell_builder");\n')
FORBID_DEPLOY = ('@id("no-production-deploys")\nforbid(principal, action, resource)\n'
                 '  when { context.dirs.contains("deploy") };\n')
RELEASE_APPROVAL = ('@id("release-needs-approval")\n@approval("required")\n'
                    'permit(principal, action == Action::"invoke", resource == Tool::"shell_builder")\n'
                    '  when { context.dirs.contains("release") };\n')


class FakeClock:
    """Monotonic clock advanced only by the injected sleep; records the sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep: Any = None

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))


class FakePrompt:
    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.questions: list[tuple[str, float]] = []

    def ask(self, question: str, timeout_s: float) -> str | None:
        self.questions.append((question, timeout_s))
        return self.answers.pop(0)


def write(root: Path, name: str, text: str) -> str:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return name


def approver_script(root: Path, exit_code: int, *, sleep_s: float = 0.0) -> list[str]:
    """A command that saves its stdin to approver-input.json, sleeps, then exits."""
    name = write(root, f"approver_{exit_code}.py", f"""
        import sys, time, pathlib
        pathlib.Path("approver-input.json").write_text(sys.stdin.read())
        time.sleep({sleep_s})
        sys.exit({exit_code})
    """)
    return [sys.executable, name]


def call(tool: str = "shell_builder", *, seq: str = "001", delta: tuple[str, ...] = ("docs/a.md",),
         creates: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    workspace = {"seq": seq, "slug": "t", "type": "BUILD", "delta": list(delta),
                 "creates": list(creates), "verify": "true"}
    return {"tool": tool, "args": {"workspace": workspace}, "side_effects": ["filesystem", "process"],
            "principal": "runner", "context": {}, **extra}


def keeper(repo: Path, gates: dict[str, Any], **kw: Any) -> Gatekeeper:
    return Gatekeeper.from_config(gates, repo=repo, **kw)


def policy_gates(repo: Path, policy: str, **approval: Any) -> dict[str, Any]:
    write(repo, "policies/p.cedar", policy)
    gates: dict[str, Any] = {"governance": {"default": "forward",
                                            "rules": [{"match": {"tool": "shell_builder"}, "action": "policy"}]},
                             "policy": {"files": ["policies/p.cedar"]}}
    if approval:
        gates["approval"] = approval
    return gates


def refusal(gk: Gatekeeper, c: dict[str, Any]) -> FtlError:
    with pytest.raises(FtlError) as info:
        gk.check(c)
    return info.value


# --- gate 1: visibility ----------------------------------------------------------------------

def test_everything_is_visible_and_forwarded_by_default(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {})
    assert gk.visible("anything") and gk.visible("explore_memory")
    decision = gk.check(call())
    assert decision == GateDecision("shell_builder", "forward",
                                    (("visibility", "pass"), ("governance", "forward")))


def test_exclude_beats_include_and_include_is_an_allowlist(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"expose": {"include": ["explore_*", "shell_builder"], "exclude": "explore_memory"}})
    assert gk.visible("explore_structure") and gk.visible("shell_builder")
    assert not gk.visible("explore_memory")     # excluded
    assert not gk.visible("agent_builder")      # not included


def test_hidden_tool_is_refused_with_tool_not_exposed(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"expose": {"exclude": ["shell_*"]}})
    error = refusal(gk, call())
    assert error.error_type == "tool_not_exposed" and error.kind.jsonrpc_code == -32015
    assert error.details == {"tool": "shell_builder", "gate": "visibility"}


def test_globs_are_case_sensitive_and_star_crosses_slashes(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"expose": {"exclude": ["admin*"]}})
    assert not gk.visible("admin/tool") and gk.visible("Admin")


# --- gate 2: governance ----------------------------------------------------------------------

def test_governance_default_applies_when_no_rule_matches(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"default": "deny",
                                          "rules": [{"match": {"tool": "run_verify"}, "action": "forward"}]}})
    assert gk.check(call("run_verify")).outcome == "forward"
    error = refusal(gk, call("shell_builder"))
    assert error.error_type == "governance_denied" and error.kind.jsonrpc_code == -32014
    assert gk.route("shell_builder") == (None, "deny")


def test_governance_first_matching_rule_wins(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"rules": [
        {"match": {"tool": "shell_*"}, "action": "forward"},
        {"match": {"tool": "shell_builder"}, "action": "deny"},
        {"match": {"tool": "shell_builder"}, "action": "deny"}]}})
    decision = gk.check(call())
    assert decision.outcome == "forward" and decision.rule == 0


def test_governance_rule_with_another_source_is_skipped(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"rules": [
        {"match": {"tool": "*", "source": "mcp"}, "action": "deny"}]}})
    assert gk.check(call()).outcome == "forward"                 # source defaults to manglecp
    assert refusal(gk, call(source="mcp")).error_type == "governance_denied"
    assert gk.route("x", "mcp") == (0, "deny")


def test_forward_skips_policy_and_approval(tmp_path: Path) -> None:
    gates = policy_gates(tmp_path, "forbid(principal, action, resource);", mode="file", file="d.json")
    gates["governance"]["rules"].insert(0, {"match": {"tool": "shell_builder"}, "action": "forward"})
    decision = keeper(tmp_path, gates).check(call())
    assert decision.outcome == "forward" and [g for g, _ in decision.gates] == ["visibility", "governance"]


def test_approve_rule_skips_policy(tmp_path: Path) -> None:
    gates = policy_gates(tmp_path, "forbid(principal, action, resource);",
                         mode="command", command=approver_script(tmp_path, 0))
    gates["governance"]["rules"] = [{"match": {"tool": "shell_builder"}, "action": "approve"}]
    decision = keeper(tmp_path, gates).check(call())
    assert decision.outcome == "approved" and decision.approver == "command"
    assert [g for g, _ in decision.gates] == ["visibility", "governance", "approval"]


# --- gate 3: Cedar policy (EC-POL) -----------------------------------------------------------

def test_permit_allows_without_approval(tmp_path: Path) -> None:
    gk = keeper(tmp_path, policy_gates(tmp_path, PERMIT_BUILDS + FORBID_DEPLOY))
    decision = gk.check(call(delta=("docs/notes.md",)))
    assert decision.outcome == "allow" and decision.policy_ids == ("shell-builds",)
    assert decision.gates == (("visibility", "pass"), ("governance", "policy"), ("policy", "allow"))


def test_any_forbid_beats_permits(tmp_path: Path) -> None:
    gk = keeper(tmp_path, policy_gates(tmp_path, PERMIT_BUILDS + FORBID_DEPLOY))
    error = refusal(gk, call(delta=("deploy/production.toml",)))
    assert error.error_type == "policy_denied" and error.kind.jsonrpc_code == -32003
    assert error.details == {"tool": "shell_builder", "gate": "policy"}


def test_policies_no_rule_routes_to_are_named_at_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ThoughtGate's V-004 as a warning: [gates.policy] with no route to it is never consulted."""
    gates = policy_gates(tmp_path, FORBID_DEPLOY)
    with caplog.at_level(logging.WARNING, logger="ftl.gate"):
        keeper(tmp_path, gates)
    assert not [r for r in caplog.records if "[gates.policy]" in r.getMessage()]
    gates["governance"]["rules"] = [{"match": {"tool": "shell_builder"}, "action": "forward"}]
    with caplog.at_level(logging.WARNING, logger="ftl.gate"):
        gk = keeper(tmp_path, gates)
    assert [r for r in caplog.records if "never consulted" in r.getMessage()]
    assert gk.check(call()).outcome == "forward"  # a warning, not a refusal: the route decides


def test_no_matching_policy_denies(tmp_path: Path) -> None:
    gates = policy_gates(tmp_path, PERMIT_BUILDS)
    gates["governance"]["rules"] = [{"match": {"tool": "*"}, "action": "policy"}]
    assert refusal(keeper(tmp_path, gates), call("agent_builder")).error_type == "policy_denied"


def test_empty_policy_file_loads_and_denies_everything(tmp_path: Path) -> None:
    gk = keeper(tmp_path, policy_gates(tmp_path, ""))
    assert refusal(gk, call()).error_type == "policy_denied"


def test_allow_reached_while_a_policy_errored_is_a_denial(tmp_path: Path) -> None:
    # The forbid reads an attribute the context lacks: Cedar skips it and still says Allow.
    broken = 'forbid(principal, action, resource) when { context.missing_attribute == "x" };\n'
    gk = keeper(tmp_path, policy_gates(tmp_path, PERMIT_BUILDS + broken))
    verdict = gk.policies.evaluate("runner", "shell_builder", {"files": []})
    assert verdict.decision == "Allow" and verdict.errors and not verdict.allowed
    assert refusal(gk, call()).error_type == "policy_denied"


def test_cedar_no_decision_denies(tmp_path: Path) -> None:
    # With a schema the request itself is checked; a context the schema does not describe
    # cannot even be built, and Cedar answers NoDecision.
    write(tmp_path, "policies/schema.cedarschema", """
        entity Agent; entity Tool;
        action invoke appliesTo { principal: [Agent], resource: [Tool], context: { seq: Long } };
    """)
    gates = policy_gates(tmp_path, 'permit(principal, action == Action::"invoke", resource);')
    gates["policy"]["schema"] = "policies/schema.cedarschema"
    gk = keeper(tmp_path, gates)
    verdict = gk.policies.evaluate("runner", "shell_builder", Call.parse(call()).cedar_context())
    assert verdict.decision == "NoDecision" and not verdict.allowed
    assert refusal(gk, call()).error_type == "policy_denied"


def test_schema_that_matches_the_context_allows(tmp_path: Path) -> None:
    write(tmp_path, "policies/schema.cedarschema", """
        entity Agent; entity Tool;
        action invoke appliesTo { principal: [Agent], resource: [Tool], context: {
          seq: String, task_type: String, files: Set<String>, dirs: Set<String>,
          side_effects: Set<String>, source: String } };
    """)
    gates = policy_gates(tmp_path, PERMIT_BUILDS + FORBID_DEPLOY)
    gates["policy"]["schema"] = "policies/schema.cedarschema"
    gk = keeper(tmp_path, gates)
    assert gk.check(call()).outcome == "allow"
    assert refusal(gk, call(delta=("deploy/x",))).error_type == "policy_denied"


def test_cedar_context_carries_task_files_dirs_and_side_effects(tmp_path: Path) -> None:
    c = Call.parse(call(seq="004", delta=("release/notes/NOTES.md",), creates=("a.txt",),
                                     context={"attempt": 2, "ratio": 0.5, "drop": None}))
    ctx = c.cedar_context()
    assert ctx == {"seq": "004", "task_type": "BUILD", "files": ["a.txt", "release/notes/NOTES.md"],
                   "dirs": ["release", "release/notes"], "side_effects": ["filesystem", "process"],
                   "source": "manglecp", "attempt": 2, "ratio": "0.5"}
    forged = Call.parse(call(context={"__entity": {"type": "Agent", "id": "root"},
                                                   "facts": [{"pred": "p", "__extn": {"fn": "ip"}}]}))
    assert forged.cedar_context()["facts"] == [{"pred": "p"}] and "__entity" not in forged.cedar_context()
    bare = Call.parse({"tool": "run_verify", "args": {"command": "true"}}).cedar_context()
    assert bare["seq"] == "" and bare["files"] == [] and bare["dirs"] == []


def test_policy_can_use_principal_and_entities(tmp_path: Path) -> None:
    write(tmp_path, "policies/entities.json", json.dumps([
        {"uid": {"type": "Agent", "id": "runner"}, "attrs": {}, "parents": [{"type": "Team", "id": "ops"}]}]))
    gates = policy_gates(tmp_path, 'permit(principal in Team::"ops", action, resource);')
    gates["policy"]["entities"] = "policies/entities.json"
    gk = keeper(tmp_path, gates)
    assert gk.check(call()).outcome == "allow"
    assert refusal(gk, call(principal="stranger")).error_type == "policy_denied"


def test_policies_from_several_files_are_one_set(tmp_path: Path) -> None:
    write(tmp_path, "policies/a.cedar", PERMIT_BUILDS)
    write(tmp_path, "policies/b.cedar", FORBID_DEPLOY)
    gates = policy_gates(tmp_path, "")
    gates["policy"]["files"] = ["policies/a.cedar", str(tmp_path / "policies/b.cedar")]
    gk = keeper(tmp_path, gates)
    assert gk.check(call()).outcome == "allow"
    assert refusal(gk, call(delta=("deploy/p.toml",))).error_type == "policy_denied"


# --- gate 4: approval (EC-TASK / EC-PIP) -----------------------------------------------------

def test_approval_annotation_sends_a_permit_to_the_approver_with_the_call_json(tmp_path: Path) -> None:
    gk = keeper(tmp_path, policy_gates(tmp_path, PERMIT_BUILDS + RELEASE_APPROVAL,
                                       mode="command", command=approver_script(tmp_path, 0)))
    decision = gk.check(call(seq="004", delta=("release/NOTES.md",)))
    assert decision.outcome == "approved" and decision.approver == "command"
    assert set(decision.policy_ids) == {"shell-builds", "release-needs-approval"}
    sent = json.loads((tmp_path / "approver-input.json").read_text())
    assert sent["request_id"] == decision.request_id and sent["tool"] == "shell_builder"
    assert sent["context"]["seq"] == "004" and sent["context"]["files"] == ["release/NOTES.md"]
    assert sent["args"]["workspace"]["seq"] == "004"
    # The unannotated permit alone does not ask anyone.
    (tmp_path / "approver-input.json").unlink()
    assert gk.check(call(delta=("docs/x.md",))).outcome == "allow"
    assert not (tmp_path / "approver-input.json").exists()


def test_rejected_by_command(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"default": "approve"},
                           "approval": {"mode": "command", "command": approver_script(tmp_path, 1)}})
    error = refusal(gk, call())
    assert error.error_type == "approval_rejected" and error.kind.jsonrpc_code == -32007
    assert error.details == {"tool": "shell_builder", "gate": "approval"}


def test_a_crashing_approval_command_rejects(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"default": "approve"},
                           "approval": {"mode": "command", "command": approver_script(tmp_path, 2)}})
    assert refusal(gk, call()).error_type == "approval_rejected"


def test_command_timeout_is_killed_and_denied(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {
        "mode": "command", "command": approver_script(tmp_path, 0, sleep_s=30), "timeout_s": 0.3}})
    error = refusal(gk, call())
    assert error.error_type == "approval_timeout" and error.kind.jsonrpc_code == -32008


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
def test_file_approval_timeout_both_ways(tmp_path: Path, on_timeout: str) -> None:
    clock = FakeClock()
    gk = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {
        "mode": "file", "file": ".ftl/approvals.json", "timeout_s": 10, "poll_s": 3,
        "on_timeout": on_timeout}}, clock=clock, sleep=clock.sleep)
    if on_timeout == "deny":
        assert refusal(gk, call()).error_type == "approval_timeout"
    else:
        decision = gk.check(call())
        assert decision.outcome == "approved_on_timeout" and decision.approver == TIMEOUT_APPROVER
        assert decision.gates[-1] == ("approval", "approved_on_timeout")
    assert clock.sleeps == [3, 3, 3, 1]          # polls every poll_s, never past the timeout
    assert not list((tmp_path / ".ftl").glob("approvals.json.pending/*"))


def test_zero_timeout_expires_at_once_without_asking(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {
        "mode": "command", "command": approver_script(tmp_path, 0), "timeout_s": 0}})
    assert refusal(gk, call()).error_type == "approval_timeout"
    assert not (tmp_path / "approver-input.json").exists()


def test_file_approval_reads_the_decision_for_its_request_id(tmp_path: Path) -> None:
    clock = FakeClock()
    decisions = tmp_path / ".ftl" / "approvals.json"
    gk = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {
        "mode": "file", "file": ".ftl/approvals.json", "timeout_s": 60, "poll_s": 5}},
        clock=clock, sleep=clock.sleep)
    pending_seen: list[dict] = []

    def approver(polls: int) -> None:  # a person answers after the second poll
        pending = list((tmp_path / ".ftl" / "approvals.json.pending").glob("*.json"))
        pending_seen.extend(json.loads(p.read_text()) for p in pending)
        if polls == 2:
            request_id = pending_seen[0]["request_id"]
            decisions.write_text(json.dumps({"apr-other": "reject",
                                             request_id: {"decision": "approve", "by": "alice"}}))

    clock.on_sleep = approver
    decision = gk.check(call(seq="007"))
    assert decision.outcome == "approved" and decision.approver == "file:alice"
    assert pending_seen[0]["context"]["seq"] == "007"
    assert not (tmp_path / ".ftl" / "approvals.json.pending" / f"{decision.request_id}.json").exists()
    # One approval per request (ThoughtGate): the same call again is a new request, which the
    # recorded decision does not answer; it waits for its own, and times out without one.
    clock.on_sleep = lambda polls: None
    assert refusal(gk, call(seq="007")).error_type == "approval_timeout"

    def answering(word: str):
        def approver(polls: int) -> None:
            for pending in (tmp_path / ".ftl" / "approvals.json.pending").glob("*.json"):
                decisions.write_text(json.dumps({pending.stem: word}))
        return approver

    clock.on_sleep = answering("reject")
    assert refusal(gk, call(seq="007")).error_type == "approval_rejected"
    clock.on_sleep = answering("maybe")  # unknown -> fail closed
    assert refusal(gk, call(seq="007")).error_type == "approval_rejected"


def test_an_approval_request_id_is_new_for_every_request_and_names_what_is_shown() -> None:
    first, second = (Call.parse(call(seq="007")).request_id() for _ in range(2))
    assert first != second and first.split("-")[1] == second.split("-")[1]
    other = Call.parse({**call(seq="007"), "side_effects": ["exec", "delete"]})
    assert other.request_id().split("-")[1] != first.split("-")[1]  # side effects are in it


def test_half_written_decision_file_is_polled_again(tmp_path: Path) -> None:
    clock = FakeClock()
    (tmp_path / "d.json").write_text('{"apr-')
    gk = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {
        "mode": "file", "file": "d.json", "timeout_s": 2, "poll_s": 1}}, clock=clock, sleep=clock.sleep)
    assert refusal(gk, call()).error_type == "approval_timeout"


@pytest.mark.parametrize("answers,outcome", [
    (["y"], "approved"), (["yes"], "approved"), (["n"], "approval_rejected"),
    (["what?", "no"], "approval_rejected"), (["?", "?", "?"], "approval_rejected"),
    ([None], "approval_timeout")])
def test_prompt_approval(tmp_path: Path, answers: list, outcome: str) -> None:
    clock = FakeClock()
    io = FakePrompt(*answers)
    gk = keeper(tmp_path, {"governance": {"default": "approve"},
                           "approval": {"mode": "prompt", "timeout_s": 30}},
                prompt_io=io, clock=clock, sleep=clock.sleep)
    if outcome == "approved":
        decision = gk.check(call(seq="003", delta=("release/VERSION",)))
        assert decision.approver == "prompt"
    else:
        assert refusal(gk, call(seq="003", delta=("release/VERSION",))).error_type == outcome
    question, timeout_s = io.questions[0]
    assert "shell_builder" in question and "task 003" in question and "release/VERSION" in question
    assert timeout_s == 30
    assert len(io.questions) == len(answers)


def test_prompt_without_a_tty_falls_back_to_the_command(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(gate_module.TtyPrompt, "open", classmethod(lambda cls: None))
    gk = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {
        "mode": "prompt", "command": approver_script(tmp_path, 0)}})
    assert gk.check(call()).approver == "command"
    bare = keeper(tmp_path, {"governance": {"default": "approve"}, "approval": {"mode": "prompt"}})
    assert refusal(bare, call()).error_type == "approval_not_found"


def test_approval_needed_but_no_workflow_is_approval_not_found(tmp_path: Path) -> None:
    gk = keeper(tmp_path, {"governance": {"rules": [{"match": {"tool": "shell_builder"}, "action": "approve"}]}})
    error = refusal(gk, call())
    assert error.error_type == "approval_not_found" and error.kind.jsonrpc_code == -32017
    assert error.details == {"tool": "shell_builder", "gate": "approval"}
    assert gk.check(call("run_verify")).outcome == "forward"


# --- order and disclosure (EC-ERR-005, EC-ERR-006) -------------------------------------------

def test_several_failing_gates_the_first_wins(tmp_path: Path) -> None:
    gates = policy_gates(tmp_path, "forbid(principal, action, resource);",
                         mode="command", command=approver_script(tmp_path, 1))
    # policy forbids and the approver would reject: policy wins, the approver never runs.
    assert refusal(keeper(tmp_path, gates), call()).error_type == "policy_denied"
    assert not (tmp_path / "approver-input.json").exists()
    # governance denies as well: governance wins.
    gates["governance"]["rules"].insert(0, {"match": {"tool": "shell_*"}, "action": "deny"})
    assert refusal(keeper(tmp_path, gates), call()).error_type == "governance_denied"
    # and hidden too: visibility wins.
    gates["expose"] = {"exclude": ["shell_builder"]}
    assert refusal(keeper(tmp_path, gates), call()).error_type == "tool_not_exposed"


@pytest.mark.parametrize("error_type,gate,code", [
    ("tool_not_exposed", "visibility", -32015), ("governance_denied", "governance", -32014),
    ("policy_denied", "policy", -32003), ("approval_rejected", "approval", -32007),
    ("approval_timeout", "approval", -32008), ("approval_not_found", "approval", -32017)])
def test_each_gate_error_has_its_registry_row(error_type: str, gate: str, code: int) -> None:
    row = REGISTRY[error_type]
    assert row.gate == gate and row.jsonrpc_code == code


def test_refusals_reveal_no_rule_patterns_policy_ids_or_reasons(tmp_path: Path) -> None:
    secret_policy = ('@id("secret-policy-7f3a")\nforbid(principal, action, resource)\n'
                     '  when { context.files.contains("deploy/hidden-reason.toml") };\n')
    gates = policy_gates(tmp_path, PERMIT_BUILDS + secret_policy)
    gates["governance"]["rules"].append({"match": {"tool": "agent_b[u]ild*"}, "action": "deny",
                                         "description": "secret-rule-description"})
    gk = keeper(tmp_path, gates)
    for c in (call(delta=("deploy/hidden-reason.toml",)), call("agent_builder")):
        error = refusal(gk, c)
        shown = json.dumps({"message": error.message, "details": error.details,
                            "safe": error.safe_details()})
        for secret in ("secret-policy-7f3a", "hidden-reason", "agent_b[u]ild", "secret-rule", "policy0"):
            assert secret not in shown
        assert set(error.details) == {"tool", "gate"}
        assert f"({error.details['gate']} gate)" in error.message


def test_call_without_a_tool_name_is_invalid_params(tmp_path: Path) -> None:
    assert refusal(keeper(tmp_path, {}), {"args": {}}).error_type == "invalid_params"


# --- configuration errors --------------------------------------------------------------------

@pytest.mark.parametrize("gates,path", [
    ({"visibility": {}}, "gates.visibility"),
    ({"expose": {"exclude": ["a**"]}}, "gates.expose.exclude"),
    ({"expose": {"include": ["[abc"]}}, "gates.expose.include"),
    ({"governance": {"default": "allow"}}, "gates.governance.default"),
    ({"governance": {"rules": [{"match": {"tool": "x"}, "action": "block"}]}}, "gates.governance.rules.0.action"),
    ({"governance": {"rules": [{"match": {"name": "x"}, "action": "deny"}]}}, "gates.governance.rules.0.match.name"),
    ({"governance": {"rules": [{"match": {"tool": "x"}, "action": "policy"}]}}, "gates"),
    ({"policy": {"files": []}}, "gates.policy.files"),
    ({"approval": {"mode": "command"}}, "gates.approval"),
    ({"approval": {"mode": "file"}}, "gates.approval"),
    ({"approval": {"command": ["true"]}}, "gates.approval"),
    ({"approval": {"mode": "email"}}, "gates.approval.mode"),
    ({"approval": {"timeout_s": -1}}, "gates.approval.timeout_s"),
    ({"approval": {"on_timeout": "retry"}}, "gates.approval.on_timeout"),
    ({"approval": {"mode": "command", "command": ["no-such-approver-xyz"]}}, "gates.approval.command.0"),
    ({"approval": {"mode": "command", "command": ["./missing.sh"]}}, "gates.approval.command.0"),
])
def test_invalid_config_names_the_field(tmp_path: Path, gates: dict, path: str) -> None:
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, gates)
    error = info.value
    assert error.error_type == "configuration_error"
    assert path in [v["path"] for v in error.details["violations"]], error.details


def test_every_bad_field_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, {"expose": {"exclude": ["**"]}, "governance": {"default": "nope"}, "extra": 1})
    paths = {v["path"] for v in info.value.details["violations"]}
    assert paths == {"gates.expose.exclude", "gates.governance.default", "gates.extra"}


@pytest.mark.parametrize("policy,needle", [
    ("permit(principal, action, resource) when { ", "Cedar syntax error"),
    ('@approval("maybe")\npermit(principal, action, resource);', "@approval"),
])
def test_malformed_policy_file_fails_at_load(tmp_path: Path, policy: str, needle: str) -> None:
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, policy_gates(tmp_path, policy))
    error = info.value
    assert error.error_type == "configuration_error"
    assert any(needle in v["message"] for v in error.details["violations"]), error.details


def test_missing_policy_schema_and_entities_files_fail_at_load(tmp_path: Path) -> None:
    gates = policy_gates(tmp_path, PERMIT_BUILDS)
    gates["policy"] = {"files": ["policies/p.cedar", "policies/gone.cedar"], "schema": "nope.cedarschema",
                       "entities": "nope.json"}
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, gates)
    paths = {v["path"] for v in info.value.details["violations"]}
    assert paths == {"gates.policy.files.1", "gates.policy.schema", "gates.policy.entities"}


def test_unknown_entity_type_fails_at_load(tmp_path: Path) -> None:
    write(tmp_path, "policies/schema.cedarschema", "entity Agent; entity Tool;\n"
          "action invoke appliesTo { principal: [Agent], resource: [Tool] };\n")
    write(tmp_path, "policies/entities.json", json.dumps([{"uid": {"type": "Robot", "id": "r"},
                                                           "attrs": {}, "parents": []}]))
    gates = policy_gates(tmp_path, PERMIT_BUILDS)
    gates["policy"].update(schema="policies/schema.cedarschema", entities="policies/entities.json")
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, gates)
    assert [v["path"] for v in info.value.details["violations"]] == ["gates.policy.entities"]


@pytest.mark.parametrize("timeout_s", [float("inf"), float("nan"), -1, 1e10, 7 * 24 * 3600 + 1])
def test_an_approval_wait_that_never_ends_is_refused_at_load(tmp_path: Path, timeout_s: float) -> None:
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, {"governance": {"default": "approve"},
                          "approval": {"mode": "file", "file": "d.json", "timeout_s": timeout_s}})
    assert [v["path"] for v in info.value.details["violations"]] == ["gates.approval.timeout_s"]


def test_policy_failing_schema_validation_fails_at_load(tmp_path: Path) -> None:
    write(tmp_path, "policies/schema.cedarschema", "entity Agent; entity Tool;\n"
          "action invoke appliesTo { principal: [Agent], resource: [Tool], context: { seq: String } };\n")
    gates = policy_gates(tmp_path, "permit(principal, action, resource) when { context.nope == 1 };")
    gates["policy"]["schema"] = "policies/schema.cedarschema"
    with pytest.raises(FtlError) as info:
        keeper(tmp_path, gates)
    assert "schema validation" in info.value.details["violations"][0]["message"]


# --- properties ------------------------------------------------------------------------------

NAMES = st.text(alphabet="abcdefgh_*?[]!/", min_size=0, max_size=8)
GLOB_VALUES = st.one_of(NAMES, st.lists(NAMES, max_size=3), st.integers(), st.none())
GATES = st.fixed_dictionaries({}, optional={
    "expose": st.fixed_dictionaries({}, optional={"include": GLOB_VALUES, "exclude": GLOB_VALUES}),
    "governance": st.fixed_dictionaries({}, optional={
        "default": st.sampled_from(["forward", "deny", "approve", "policy", "other", 3]),
        "rules": st.lists(st.fixed_dictionaries(
            {"action": st.sampled_from(["forward", "deny", "approve", "x"])},
            optional={"match": st.fixed_dictionaries({}, optional={"tool": GLOB_VALUES, "source": GLOB_VALUES})}),
            max_size=3)}),
    "approval": st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["prompt", "command", "file", None, "x"]),
        "file": st.sampled_from(["d.json", "", None]),
        "timeout_s": st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.text(max_size=2)),
        "on_timeout": st.sampled_from(["deny", "approve", "later"])}),
    "junk": st.integers()})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gates=GATES, tool=st.text(alphabet="abcdefgh_/", min_size=1, max_size=8))
@example(gates={"governance": {"default": "approve"},  # found by a random run: passes on timeout
                "approval": {"mode": "prompt", "on_timeout": "approve", "file": "d.json"}}, tool="_")
def test_any_gates_table_loads_or_is_a_configuration_error(tmp_path: Path, gates: dict, tool: str) -> None:
    now = [0.0]

    def leap(seconds: float) -> None:  # an approval wait of any finite length ends at once
        now[0] += max(seconds, 1e306)

    try:
        gk = keeper(tmp_path, gates, clock=lambda: now[0], sleep=leap)
    except FtlError as error:
        assert error.error_type == "configuration_error" and error.details["violations"]
        return
    try:
        decision = gk.check({"tool": tool})
    except FtlError as error:
        assert error.kind.gate in ("visibility", "governance", "approval")
        assert error.details == {"tool": tool, "gate": error.kind.gate}
    else:
        # Nobody answers here (no TTY prompt, no decision file), so a call routed to approval
        # passes only when its wait runs out and on_timeout approves it.
        approval = gates.get("approval") or {}
        passes = {"forward"} | ({"approved_on_timeout"} if approval.get("on_timeout") == "approve" else set())
        assert decision.outcome in passes and gk.visible(tool)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(include=st.lists(st.sampled_from(["*", "a*", "*b", "a?", "[ab]*", "c"]), min_size=1, max_size=3),
       exclude=st.lists(st.sampled_from(["*", "a*", "*b", "[!a]*", "ab"]), max_size=2),
       tool=st.text(alphabet="abc", min_size=1, max_size=4))
def test_visible_is_include_minus_exclude(tmp_path: Path, include: list, exclude: list, tool: str) -> None:
    import fnmatch
    gk = keeper(tmp_path, {"expose": {"include": include, "exclude": exclude}})
    expected = (any(fnmatch.fnmatchcase(tool, p) for p in include)
                and not any(fnmatch.fnmatchcase(tool, p) for p in exclude))
    assert gk.visible(tool) is expected
    if not expected:
        assert refusal(gk, {"tool": tool}).error_type == "tool_not_exposed"
