"""The runnable examples under examples/ stay runnable: plans parse, DAG shapes hold, scripts work.

Nothing here touches the network or runs ftl's campaign runner: the failure drill's commands are
replayed by a small in-test loop (run, then verify up to 1 + `Config.flaky_verify_retries` times,
in dependency order; a failing run is classified with ftl's own `classify_command`), and the
run.sh scripts are executed against copies with a fake ftl executable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftl import dag
from ftl.config import Config
from ftl.models import Plan
from ftl.engine.recovery import classify_command
from ftl.validation import load_plan_file

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
REAL = EXAMPLES / "real-project"
DRILL = EXAMPLES / "failure-drill"
PLANS = {"real-project": REAL / "plan.json", "failure-drill": DRILL / "plan.json"}

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def graph(plan: Plan) -> dict[str, list[str]]:
    return {task.seq: task.depends for task in plan.tasks}


def expected_drill() -> dict:
    return json.loads((DRILL / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_parses_and_every_task_is_a_shell_task(name: str) -> None:
    plan = load_plan_file(PLANS[name])
    assert plan.campaign, "a campaign slug names the event log"
    assert dag.find_cycle(graph(plan)) is None
    for task in plan.tasks:
        assert task.builder_kind == "shell", f"{task.seq} needs a run command"
        assert task.timeout_s is not None and task.timeout_s <= 300, task.seq


def test_real_project_has_three_parallel_branches_joined_by_a_verify_task() -> None:
    plan = load_plan_file(PLANS["real-project"])
    deps = graph(plan)
    assert deps["001"] == []
    branches = ["002", "003", "004"]
    for seq in branches:
        assert deps[seq] == ["001"]
        assert not (dag.ancestors(deps, seq) & set(branches)), f"{seq} must not wait for a sibling"
    assert deps["005"] == branches
    assert plan.task("005").type.value == "VERIFY"
    assert dag.topological_order(deps)[-1] == "005"


def test_real_project_pins_one_version_everywhere() -> None:
    script = (REAL / "run.sh").read_text(encoding="utf-8")
    version = re.search(r'^version="([0-9.]+)"$', script, re.MULTILINE).group(1)
    assert re.search(r'^sha256="[0-9a-f]{64}"$', script, re.MULTILINE)
    plan_text = PLANS["real-project"].read_text(encoding="utf-8")
    mentioned = set(re.findall(r"(?:more_itertools-|more-itertools |== ?')(\d+\.\d+\.\d+)",
                               plan_text))
    assert mentioned == {version}
    plan = load_plan_file(PLANS["real-project"])
    assert plan.task("004").creates == [f"dist/more_itertools-{version}-py3-none-any.whl"]
    assert version in plan.objective


def test_drill_expected_names_every_task_with_a_final_status() -> None:
    plan = load_plan_file(PLANS["failure-drill"])
    expected = expected_drill()
    assert expected["exit_code"] == 3
    assert set(expected["tasks"]) == {task.seq for task in plan.tasks}
    assert set(expected["tasks"].values()) <= {"complete", "blocked"}


def test_drill_expectations_match_ftls_cascade_rules() -> None:
    plan = load_plan_file(PLANS["failure-drill"])
    deps, expected = graph(plan), expected_drill()
    blocked = {seq for seq, status in expected["tasks"].items() if status == "blocked"}
    roots = {seq for seq in blocked if not dag.ancestors(deps, seq) & blocked}
    assert len(roots) == 1
    (root,) = roots
    # The moment the root blocks, every other task has either completed or is still pending.
    status = {seq: ("blocked" if seq == root else "complete" if state == "complete" else "pending")
              for seq, state in expected["tasks"].items()}
    propagated = dict(dag.propagate_blocks(deps, status))
    assert propagated == expected["blocked_by"]
    assert set(propagated) == blocked - {root}
    assert len(propagated) >= Config().replan_threshold  # enough to trigger cascade analysis
    assert dag.descendants(deps, root) == set(propagated)
    assert any(len(deps[seq]) >= 2 for seq in propagated), "one dependent joins two branches"
    independent = {seq for seq, state in expected["tasks"].items()
                   if state == "complete" and seq not in dag.ancestors(deps, root)}
    assert independent, "an independent branch must complete"


def _sh(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_drill_commands_produce_the_expected_outcomes(tmp_path: Path) -> None:
    plan = load_plan_file(PLANS["failure-drill"])
    deps, expected = graph(plan), expected_drill()
    repo = tmp_path / "failure-drill"
    shutil.copytree(DRILL / "project", repo)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONDONTWRITEBYTECODE": "1"}
    attempts_allowed = 1 + Config().flaky_verify_retries
    outcome: dict[str, str] = {}
    verify_attempts: dict[str, int] = {}
    for seq in dag.topological_order(deps):
        if any(outcome.get(dep) != "complete" for dep in deps[seq]):
            outcome[seq] = "blocked"  # unreachable: never run
            continue
        task = plan.task(seq)
        ran = _sh(task.run, repo, env)
        if ran.returncode != 0:
            # ftl's own classifier must call it structural, or it would retry instead of block.
            result = {"exit_code": ran.returncode, "output": ran.stdout + ran.stderr,
                      "timed_out": False}
            error = classify_command(result, what="build", seq=seq)
            assert not error.transient, error.error_type
            assert error.error_type == "dependency_missing", error.error_type
            outcome[seq] = "blocked"
            continue
        for attempt in range(1, attempts_allowed + 1):
            if _sh(task.verify, repo, env).returncode == 0:
                outcome[seq] = "complete"
                break
        else:
            outcome[seq] = "blocked"
        verify_attempts[seq] = attempt
    assert outcome == expected["tasks"]
    assert verify_attempts["001"] == 2, "the flaky verify fails once, then passes"
    assert all(n == 1 for seq, n in verify_attempts.items() if seq != "001")


def test_flaky_check_fails_only_on_its_first_run(tmp_path: Path) -> None:
    counter = tmp_path / ".drill" / "attempts"
    script = DRILL / "project" / "scripts" / "flaky_check.py"
    codes = [subprocess.run([sys.executable, str(script), str(counter)],
                            capture_output=True).returncode for _ in range(3)]
    assert codes == [1, 0, 0]
    assert counter.read_text(encoding="utf-8") == "3"


@pytest.mark.parametrize("script", [REAL / "run.sh", DRILL / "run.sh"],
                         ids=["real-project", "failure-drill"])
def test_run_script_is_executable_strict_bash(script: Path) -> None:
    assert os.access(script, os.X_OK)
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)


@needs_git
@pytest.mark.parametrize("name", sorted(PLANS))
def test_gitignore_covers_every_generated_file(name: str, tmp_path: Path) -> None:
    ignore = REAL / "gitignore" if name == "real-project" else DRILL / "project" / ".gitignore"
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text(ignore.read_text(encoding="utf-8"), encoding="utf-8")
    generated = {".ftl/events/c.jsonl", ".ftl/ftl.db", "pkg/__pycache__/m.cpython-311.pyc"}
    counters = []
    for task in load_plan_file(PLANS[name]).tasks:
        generated.update(task.creates)
        counters += re.findall(r"flaky_check\.py\s+(\S+)", task.verify)
    assert bool(counters) == (name == "failure-drill")
    generated.update(counters)
    for path in sorted(generated):
        assert _git(repo, "check-ignore", "-q", "--no-index", path).returncode == 0, path


@needs_git
def test_drill_run_script_builds_a_clean_repo_and_calls_ftl(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(DRILL, examples / "failure-drill")
    shutil.copy(DRILL.parent / "common.sh", examples / "common.sh")
    record = tmp_path / "ftl-call.json"
    (tmp_path / "fake_ftl.py").write_text(
        "import json, subprocess, sys\n"
        "status = subprocess.run(['git', 'status', '--porcelain'], capture_output=True, text=True)\n"
        "with open(sys.argv[1], 'w') as out:\n"
        "    json.dump({'argv': sys.argv[2:], 'status': status.stdout}, out)\n",
        encoding="utf-8")
    fake_ftl = tmp_path / "fake-ftl"  # a shell wrapper: a long interpreter path may not fit a #! line
    fake_ftl.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "fake_ftl.py"}" '
                        f'"{record}" "$@"\n', encoding="utf-8")
    fake_ftl.chmod(0o755)
    env = {**os.environ, "FTL_BIN": str(fake_ftl), "PYTHON": sys.executable}
    script = examples / "failure-drill" / "run.sh"
    repo = examples / "work" / "failure-drill"
    for _ in range(2):  # idempotent: the second run starts again from a fresh copy
        result = subprocess.run([str(script), "--jobs", "2"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        call = json.loads(record.read_text(encoding="utf-8"))
        plan = load_plan_file(examples / "failure-drill" / "plan.json")
        assert call["argv"] == ["campaign", "run", plan.objective,
                                "--plan", str(examples / "failure-drill" / "plan.json"),
                                "--repo", str(repo), "--jobs", "2"]
        assert call["status"] == ""
        assert _git(repo, "rev-list", "--count", "HEAD").stdout.strip() == "1"
        assert not (repo / "stray.txt").exists()
        assert not (repo / ".drill").exists()
        (repo / "stray.txt").write_text("left over from a previous run", encoding="utf-8")
        (repo / ".drill").mkdir()


@needs_git
def test_real_project_run_script_rejects_an_sdist_with_the_wrong_hash(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(REAL, examples / "real-project")
    shutil.copy(REAL.parent / "common.sh", examples / "common.sh")
    script_text = (REAL / "run.sh").read_text(encoding="utf-8")
    version = re.search(r'^version="([0-9.]+)"$', script_text, re.MULTILINE).group(1)
    downloads = examples / "work" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / f"more_itertools-{version}.tar.gz").write_bytes(b"not the real sdist")
    env = {**os.environ, "FTL_BIN": "true", "PYTHON": sys.executable}
    result = subprocess.run([str(examples / "real-project" / "run.sh")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "sha256" in result.stderr
    assert not (examples / "work" / "more-itertools").exists()
