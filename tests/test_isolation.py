"""Worktree isolation end to end, through the real CLI and tool server: parallel tasks that
cannot see each other's half-done work, results as commits integrated one at a time, conflicts
re-run once on the new head or blocked naming the other task, and the user's checkout untouched
until `ftl campaign land`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ftl.events import read_events
from ftl.postmortem.replay import replay

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "parallel-edits"
FTL = [sys.executable, "-m", "ftl"]
ENV = {**os.environ, "PYTHON": sys.executable, "FTL_BIN": str(Path(sys.executable).parent / "ftl")}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def run_example(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    proc = subprocess.run(["bash", str(EXAMPLE / "run.sh"), "--json", *args], capture_output=True,
                          text=True, env={**ENV, "FTL_WORK_DIR": str(tmp_path)}, timeout=240)
    envelope = json.loads(proc.stdout)
    assert proc.returncode == envelope["data"]["exit_code"], proc.stderr[-2000:]
    return envelope["data"], tmp_path / "parallel-edits"


def events(repo: Path) -> list[dict]:
    (log,) = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    return list(read_events(log))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_parallel_edits_complete_and_leave_the_checkout_alone(tmp_path: Path, jobs: str) -> None:
    data, repo = run_example(tmp_path, "--jobs", jobs)
    expected = json.loads((EXAMPLE / "expected.json").read_text())
    assert data["exit_code"] == expected["exit_code"]
    assert {t["seq"]: t["status"] for t in data["summary"]["tasks"]} == expected["tasks"]
    branch = data["summary"]["integration_branch"]
    assert set(git(repo, "ls-tree", "-r", "--name-only", branch).splitlines()) >= {
        "app/a.py", "app/b.py", "app/__init__.py"}
    # The user's branch and work tree are untouched; worktrees are gone.
    assert git(repo, "log", "--format=%s", "main") == "parallel edits baseline"
    assert not (repo / "app" / "a.py").exists() and git(repo, "status", "--porcelain") == ""
    assert not any((repo / ".ftl" / "worktrees").iterdir())
    log = events(repo)
    commits = [e for e in log if e["event"] == "TASK_COMMIT"]
    integrated = [e for e in log if e["event"] == "TASK_INTEGRATED"]
    assert sorted(e["task_seq"] for e in commits) == ["001", "002", "003"]
    assert [e["commit"] for e in integrated] == [e["commit"] for e in commits]
    schema = json.loads((ROOT / "schemas" / "event.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    assert [error.message for e in log for error in validator.iter_errors(e)] == []
    assert replay(sorted((repo / ".ftl" / "events").glob("*.jsonl"))).violations == []
    status = subprocess.run([*FTL, "campaign", "status", "--repo", str(repo), "--json"],
                            capture_output=True, text=True, env=ENV, timeout=60)
    campaign = json.loads(status.stdout)["data"]["campaign"]
    assert (campaign["isolation"], campaign["integration_branch"]) == ("worktree", branch)
    # Landing fast-forwards the user's branch.
    landed = subprocess.run([*FTL, "campaign", "land", "--repo", str(repo), "--json"],
                            capture_output=True, text=True, env=ENV, timeout=60)
    assert json.loads(landed.stdout)["data"]["how"] == "fast-forward", landed.stderr
    assert (repo / "app" / "b.py").read_text().startswith("def b():")


def test_the_same_plan_in_a_shared_checkout_blocks_correct_work(tmp_path: Path) -> None:
    """Why isolation is the default: 001's project-wide verify sees 002's half-written file."""
    data, _ = run_example(tmp_path, "--jobs", "2", "--isolation", "shared")
    statuses = {t["seq"]: t for t in data["summary"]["tasks"]}
    assert statuses["001"]["status"] == "blocked"
    assert statuses["001"]["block_reason"].startswith("verify_failed")


def _edit_plan(tmp_path: Path) -> Path:
    """8 tasks each appending to its own file, and 2 pairs appending to the same line of one
    shared file each (the second of a pair finishes later, after its partner integrated)."""
    tasks = []
    for number in range(1, 9):
        seq = f"{number:03d}"
        tasks.append({"seq": seq, "slug": f"own-{number}", "delta": [f"own/{seq}.txt"],
                      "run": f"sleep 0.{number % 3 + 1} && echo t{seq} >> own/{seq}.txt",
                      "verify": f"grep -q t{seq} own/{seq}.txt", "depends": "none", "timeout_s": 60})
    for number, (target, sleep_s) in enumerate(
            [("pair-a.txt", 0.2), ("pair-a.txt", 0.9), ("pair-b.txt", 0.3), ("pair-b.txt", 1.0)],
            start=9):
        seq = f"{number:03d}"
        tasks.append({"seq": seq, "slug": f"pair-{number}", "delta": [target],
                      "run": f"sleep {sleep_s} && sed -i '1s/$/ t{seq}/' {target}",
                      "verify": f"grep -q t{seq} {target}", "depends": "none", "timeout_s": 60})
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "edit in parallel, some on the same lines", "tasks": tasks}))
    return plan


def test_disjoint_edits_integrate_and_conflicting_pairs_never_lose_an_edit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "own").mkdir(parents=True)
    for seq in range(1, 9):
        (repo / "own" / f"{seq:03d}.txt").write_text("start\n")
    (repo / "pair-a.txt").write_text("slot:\nunchanged\n")
    (repo / "pair-b.txt").write_text("slot:\nunchanged\n")
    (repo / ".gitignore").write_text(".ftl/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    proc = subprocess.run([*FTL, "campaign", "run", "--plan", str(_edit_plan(tmp_path)), "--repo",
                           str(repo), "--jobs", "12", "--json"],
                          capture_output=True, text=True, env=ENV, timeout=240)
    data = json.loads(proc.stdout)["data"]
    branch = data["summary"]["integration_branch"]
    tasks = {t["seq"]: t for t in data["summary"]["tasks"]}
    for seq, task in tasks.items():
        target = f"own/{seq}.txt" if int(seq) <= 8 else ("pair-a.txt" if int(seq) <= 10 else "pair-b.txt")
        if task["status"] == "complete":
            assert f"t{seq}" in git(repo, "show", f"{branch}:{target}"), seq
        else:
            reason = task["block_reason"]
            assert reason.startswith("merge_conflict") and "task" in reason, reason
    assert all(tasks[f"{n:03d}"]["status"] == "complete" for n in range(1, 9))
    log = events(repo)
    conflicts = [e for e in log if e["event"] == "MERGE_CONFLICT"]
    assert {e["task_seq"] for e in conflicts} == {"010", "012"}
    assert {(e["task_seq"], tuple(e["other_seqs"])) for e in conflicts if e["round"] == 1} == {
        ("010", ("009",)), ("012", ("011",))}
    reruns = [e for e in log if e["event"] == "RECOVERY_ATTEMPT" and e["strategy"] == "rebase_rerun"]
    assert {e["task_seq"] for e in reruns} == {"010", "012"}
    failures = [e for e in log if e["event"] == "TOOL_FAILURE" and e["error_type"] == "merge_conflict"]
    assert all(f["details"]["paths"] in (["pair-a.txt"], ["pair-b.txt"]) for f in failures)
    assert replay(sorted((repo / ".ftl" / "events").glob("*.jsonl"))).violations == []
    assert git(repo, "fsck", "--no-progress", "--no-dangling") == ""  # a replaced attempt dangles
