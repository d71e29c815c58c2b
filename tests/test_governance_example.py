"""The governance example (examples/governance): its configuration, policies and approver decide
each task's builder call as expected.json says, and the whole campaign, run through run.sh with
the real CLI, ends with the refused tasks blocked by the gate that refused them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftl.config import load_config
from ftl.errors import FtlError
from ftl.events import read_events
from ftl.gate import Gatekeeper
from ftl.models import Plan
from ftl.postmortem.replay import replay
from ftl.server.catalog import TOOL_SPECS
from ftl.engine.workspaces import build_workspace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "governance"
EXPECTED = json.loads((EXAMPLE / "expected.json").read_text(encoding="utf-8"))
SIDE_EFFECTS = {spec.name: list(spec.side_effects) for spec in TOOL_SPECS}
GATE_OF = {"tool_not_exposed": "visibility", "governance_denied": "governance",
           "policy_denied": "policy", "approval_rejected": "approval", "approval_timeout": "approval"}


def scratch_repo(tmp_path: Path) -> Path:
    """The repository run.sh builds, without git (the gates do not need it)."""
    repo = tmp_path / "governance"
    shutil.copytree(EXAMPLE / "project", repo)
    shutil.copytree(EXAMPLE / "policies", repo / "governance" / "policies")
    shutil.copy(EXAMPLE / "approve.py", repo / "governance" / "approve.py")
    return repo


def builder_call(plan: Plan, seq: str) -> dict:
    task = plan.task(seq)
    workspace = build_workspace(campaign_id="c1", plan=plan, task=task, attempt=1, timeout_s=60.0,
                                tasks=[])
    tool = "shell_builder" if task.builder_kind == "shell" else "agent_builder"
    return {"tool": tool, "args": {"workspace": workspace.model_dump(mode="json"), "exclude_paths": []},
            "side_effects": SIDE_EFFECTS[tool], "principal": "anonymous", "context": {}}


def test_each_task_meets_the_gate_expected_json_names(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    config = load_config(EXAMPLE / "ftl.toml", repo)
    gate = Gatekeeper.from_config(config.gates, repo=repo)
    plan = Plan.model_validate_json((EXAMPLE / "plan.json").read_text(encoding="utf-8"))
    outcomes = {}
    for task in plan.tasks:
        try:
            outcomes[task.seq] = gate.check(builder_call(plan, task.seq)).outcome
        except FtlError as error:
            assert error.details == {"tool": builder_call(plan, task.seq)["tool"],
                                     "gate": GATE_OF[error.error_type]}
            outcomes[task.seq] = error.error_type
    assert outcomes == {"001": "allow", **EXPECTED["blocked_by_gate"], "004": "approved"}
    # The other tools a campaign calls pass; the hidden explorer is neither listed nor callable.
    assert gate.check({"tool": "run_verify", "args": {"command": "true"}}).outcome == "forward"
    for hidden in EXPECTED["hidden_tools"]:
        assert not gate.visible(hidden)
        with pytest.raises(FtlError) as info:
            gate.check({"tool": hidden})
        assert info.value.error_type == "tool_not_exposed"
    assert all(gate.visible(spec.name) for spec in TOOL_SPECS if spec.name not in EXPECTED["hidden_tools"])


def test_expected_json_covers_every_task_and_the_agent_is_selectable(tmp_path: Path) -> None:
    plan = Plan.model_validate_json((EXAMPLE / "plan.json").read_text(encoding="utf-8"))
    assert sorted(EXPECTED["tasks"]) == [t.seq for t in plan.tasks]
    assert all(not t.depends for t in plan.tasks)  # every refusal is the gate's, not a cascade
    blocked = {seq for seq, status in EXPECTED["tasks"].items() if status == "blocked"}
    assert blocked == set(EXPECTED["blocked_by_gate"])
    config = load_config(EXAMPLE / "ftl.toml", scratch_repo(tmp_path))
    assert config.agent_command  # agent_builder needs a configured command to be selected at all
    assert plan.task("002").builder_kind == "agent"


def test_run_script_is_strict_bash_and_executable() -> None:
    script = EXAMPLE / "run.sh"
    assert os.access(script, os.X_OK)
    assert "set -euo pipefail" in script.read_text(encoding="utf-8")
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_campaign_blocks_each_refused_task_with_its_gate(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "FTL_WORK_DIR": str(tmp_path),
           "FTL_BIN": str(Path(sys.executable).parent / "ftl")}
    metrics_file = tmp_path / "metrics.prom"
    proc = subprocess.run(["bash", str(EXAMPLE / "run.sh"), "--json", "--metrics-file",
                           str(metrics_file)], capture_output=True, text=True,
                          env=env, timeout=240, cwd=ROOT)
    assert proc.returncode == EXPECTED["exit_code"], proc.stderr[-3000:]
    envelope = json.loads(proc.stdout)
    tasks = {t["seq"]: t for t in envelope["data"]["summary"]["tasks"]}
    assert {seq: t["status"] for seq, t in tasks.items()} == EXPECTED["tasks"]
    for seq, error_type in EXPECTED["blocked_by_gate"].items():
        reason = tasks[seq]["block_reason"] or ""
        assert error_type in reason and f"{GATE_OF[error_type]} gate" in reason, reason
        assert "no-production-deploys" not in reason and "release process" not in reason

    repo = tmp_path / "governance"
    branch = envelope["data"]["summary"]["integration_branch"]

    def integrated(path: str) -> str:
        return subprocess.run(["git", "show", f"{branch}:{path}"], cwd=repo, capture_output=True,
                              text=True, check=True).stdout

    # What ran and what never did (on the campaign's branch; the checkout is untouched).
    assert "four governance gates" in integrated("docs/CHANGES.md")
    assert "four governance gates" not in (repo / "docs" / "CHANGES.md").read_text()
    assert "Governance gates" in integrated("release/NOTES.md")
    assert integrated("release/VERSION") == "1.0.0\n"
    assert "replicas = 3" in integrated("deploy/production.toml")
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    assert replay(logs).violations == []
    events = list(read_events(logs[0]))
    called = {e.get("tool") for e in events if e["event"] == "TOOL_CALL"}
    assert not called & set(EXPECTED["hidden_tools"])
    partial = [e for e in events if e["event"] == "PARTIAL_FAILURE" and e.get("missing")]
    assert partial and "memory" in partial[0]["missing"]

    # The campaign's own metrics carry its gate decisions (issue 15 item 4), once each: the
    # tool server ran in a subprocess, the counts come from the GATE_DECISION events.
    decisions = [e for e in events if e["event"] == "GATE_DECISION"]
    builder_decisions = {e["task_seq"]: e for e in decisions if e["tool"].endswith("_builder")}
    assert builder_decisions["001"]["outcome"] == "allow"
    assert builder_decisions["004"]["outcome"] == "approved"
    for seq, error_type in EXPECTED["blocked_by_gate"].items():
        assert builder_decisions[seq]["reason"] == error_type
        assert builder_decisions[seq]["denied_by"] == GATE_OF[error_type]
    metrics = parse_metrics(metrics_file.read_text())
    assert metrics[("ftl_gate_decisions_total", (("gate", "policy"), ("outcome", "allow")))] >= 1
    assert metrics[("ftl_gate_decisions_total", (("gate", "approval"), ("outcome", "approved")))] == 1
    denials = {labels: value for (name, labels), value in metrics.items()
               if name == "ftl_gate_denials_total"}
    expected_denials: dict = {}
    for error_type in EXPECTED["blocked_by_gate"].values():
        key = (("gate", GATE_OF[error_type]), ("reason", error_type))
        expected_denials[key] = expected_denials.get(key, 0) + 1
    assert denials == expected_denials
    steps = sum(len(e["gates"]) for e in decisions)
    assert sum(v for (name, _), v in metrics.items() if name == "ftl_gate_decisions_total") == steps


def parse_metrics(text: str) -> dict:
    """``{(name, ((label, value), ...)): sample}`` of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out
