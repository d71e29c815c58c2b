"""Crash safety with worktrees: a kill at each step of a task's life (build done, verify running,
commit made, commit integrated) and a resume neither loses a result, nor integrates one twice,
nor runs a finished build command again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftl.events import read_events
from ftl.postmortem.replay import replay

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="kill points need Linux")

# ``CHILD repo start|resume KILL PLAN_JSON``: dies with exit status 9 at the kill point.
CHILD = r'''
import json, os, sys
from pathlib import Path

from ftl.config import Config
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.transport import InProcessTransport
from ftl.engine.runner import Runner
from ftl.server.app import build_server
from ftl.vcs.worktrees import Worktrees

repo, mode, kill = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
plan = json.loads(sys.argv[4])


def kill_after(name):
    original = getattr(Worktrees, name)

    def patched(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        os._exit(9)

    setattr(Worktrees, name, patched)


class KillDuringVerify:
    def __init__(self, inner):
        self.inner = inner

    def evaluate(self, *args, **kwargs):
        return self.inner.evaluate(*args, **kwargs)

    def invoke(self, macro_id, args, **kwargs):
        if "command" in args and "timeout_s" in args:  # run_verify: the build is done
            if kill == "after_verify":  # verify ran (and wrote its files); its answer is lost
                self.inner.invoke(macro_id, args, **kwargs)
            os._exit(9)
        return self.inner.invoke(macro_id, args, **kwargs)

    def close(self):
        self.inner.close()


def client(config, root):
    inner = ManglecpClient(InProcessTransport(build_server(root, config, isolation="thread"),
                                              close_server=True), max_retries=0)
    return KillDuringVerify(inner) if kill in ("during_verify", "after_verify") else inner


if kill in ("commit", "integrate"):
    kill_after(kill)
runner = Runner(repo, Config(jobs=1, retry_backoff_min_s=0, retry_backoff_max_s=0,
                             isolation="worktree"),
                client_factory=client, sleep=lambda seconds: None)
result = runner.start("crash", plan_input=plan) if mode == "start" else runner.resume()
print(json.dumps({"outcome": result.outcome, "exit_code": result.exit_code,
                  "summary": result.summary}))
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def child(repo: Path, mode: str, kill: str, plan: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(repo), mode, kill, json.dumps(plan)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("kill", ["during_verify", "commit", "integrate"])
def test_a_kill_at_each_step_resumes_without_losing_or_repeating_work(tmp_path: Path,
                                                                      kill: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".ftl/\n")
    (repo / "base.txt").write_text("base\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    marker = tmp_path / "runs"
    plan = {"objective": "crash", "tasks": [
        {"seq": "001", "slug": "write", "creates": ["out.txt"],
         "run": f"echo built >> {marker} && echo result > out.txt",
         "verify": "grep -q result out.txt"},
        {"seq": "002", "slug": "after", "depends": "001", "creates": ["after.txt"],
         "run": "cat out.txt > after.txt", "verify": "grep -q result after.txt"}]}

    killed = child(repo, "start", kill, plan)
    assert killed.returncode == 9, killed.stderr[-2000:]
    resumed = child(repo, "resume", "none", plan)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout.splitlines()[-1])["summary"]
    assert summary["complete"] == 2, summary

    assert marker.read_text().splitlines() == ["built"]  # the build command ran once
    branch = summary["integration_branch"]
    assert git(repo, "show", f"{branch}:after.txt") == "result"
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    events = [e for log in logs for e in read_events(log)]
    integrated = [e["commit"] for e in events if e["event"] == "TASK_INTEGRATED"]
    assert len(integrated) == len(set(integrated))
    task_commits = git(repo, "log", "--no-merges", "--format=%(trailers:key=Ftl-Task,valueonly)",
                       branch).split()
    assert sorted(task_commits) == ["001", "002"]  # each result integrated exactly once
    recoveries = {e["strategy"] for e in events if e["event"] == "RECOVERY_ATTEMPT"}
    assert ("reuse_commit" in recoveries) == (kill in ("commit", "integrate"))
    assert ("reuse_build" in recoveries or "reuse_commit" in recoveries)
    assert replay(logs).violations == []
    assert git(repo, "fsck", "--no-progress", "--no-dangling") == ""
    assert git(repo, "rev-parse", "main") == git(repo, "rev-list", "--max-parents=0", "main")


def test_files_a_verify_wrote_before_a_kill_stay_out_of_the_resumed_commit(tmp_path: Path) -> None:
    # The build was staged before verify ran, as in a run without a crash; the resume verifies
    # the reused build again and commits what was staged, not what verify left in the folder
    # (a report outside the task's scope would have blocked it as out of scope).
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".ftl/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    plan = {"objective": "crash", "tasks": [
        {"seq": "001", "slug": "write", "creates": ["out.txt"], "run": "echo result > out.txt",
         "verify": "grep -q result out.txt && echo ok > verify-report.txt"}]}
    assert child(repo, "start", "after_verify", plan).returncode == 9
    resumed = child(repo, "resume", "none", plan)
    assert resumed.returncode == 0, resumed.stderr[-2000:] + resumed.stdout[-2000:]
    summary = json.loads(resumed.stdout.splitlines()[-1])["summary"]
    assert summary["complete"] == 1, summary
    files = git(repo, "ls-tree", "--name-only", summary["integration_branch"]).split()
    assert "out.txt" in files and "verify-report.txt" not in files
