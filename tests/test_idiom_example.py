"""The idiom-check example (examples/idiom-check): a plan forbids ``print($$$)`` in Python; task
001 adds a module that prints, task 002 one that does not (issue 15 item 1, "Done when")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftl.events import read_events
from ftl.idioms import check_idioms, violation_error
from ftl.postmortem.replay import replay
from ftl.validation import load_plan_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "idiom-check"
EXPECTED = json.loads((EXAMPLE / "expected.json").read_text(encoding="utf-8"))


def test_each_task_meets_the_outcome_expected_json_names(tmp_path: Path) -> None:
    """Runs each task's own command on a copy of the project, then the checker on its files."""
    plan = load_plan_file(EXAMPLE / "plan.json")
    outcomes = {}
    for task in plan.tasks:
        repo = tmp_path / task.slug
        shutil.copytree(EXAMPLE / "project", repo)
        subprocess.run(task.run, shell=True, cwd=repo, check=True, timeout=60,
                       env={**os.environ, "PYTHON": sys.executable})
        subprocess.run(task.verify, shell=True, cwd=repo, check=True, timeout=60,
                       env={**os.environ, "PYTHON": sys.executable})
        violations = check_idioms(repo, [*task.delta, *task.creates], plan.idioms)
        outcomes[task.seq] = "blocked" if violations else "complete"
        if violations:
            error = violation_error(task.seq, violations)
            expected = EXPECTED["violations"][task.seq]
            assert error.error_type == expected["error_type"]
            assert error.safe_details()["where"] == expected["where"]
            assert expected["where"] in error.message
    assert outcomes == EXPECTED["tasks"]


def test_run_script_is_strict_bash_and_executable() -> None:
    script = EXAMPLE / "run.sh"
    assert os.access(script, os.X_OK)
    assert "set -euo pipefail" in script.read_text(encoding="utf-8")
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_campaign_blocks_the_print_task_as_idiom_violation(tmp_path: Path) -> None:
    """End to end through run.sh and the real CLI. Enabled by deleting the skip line above once
    BUILD runs the idiom check (issue 15 item 1)."""
    env = {**os.environ, "PYTHON": sys.executable, "FTL_WORK_DIR": str(tmp_path),
           "FTL_BIN": str(Path(sys.executable).parent / "ftl")}
    proc = subprocess.run(["bash", str(EXAMPLE / "run.sh"), "--json"], capture_output=True,
                          text=True, env=env, timeout=240, cwd=ROOT)
    assert proc.returncode == EXPECTED["exit_code"], proc.stderr[-3000:]
    tasks = {t["seq"]: t for t in json.loads(proc.stdout)["data"]["summary"]["tasks"]}
    assert {seq: t["status"] for seq, t in tasks.items()} == EXPECTED["tasks"]
    for seq, expected in EXPECTED["violations"].items():
        reason = tasks[seq]["block_reason"] or ""
        assert reason.startswith(expected["error_type"]) and expected["where"] in reason, reason
    logs = sorted((tmp_path / "idiom-check" / ".ftl" / "events").glob("*.jsonl"))
    assert replay(logs).violations == []
    failures = [e for e in read_events(logs[0]) if e["event"] == "TOOL_FAILURE"]
    assert [(e["task_seq"], e["error_type"]) for e in failures] == [("001", "idiom_violation")]
