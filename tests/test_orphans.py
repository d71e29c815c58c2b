"""No orphans (issue "crash safety", item 3): a SIGKILL of the ftl process alone takes the tool
server with it (parent-death signal), and what a build command left running in its process
group is found in the ledger and killed by `ftl campaign resume` before tasks run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftl.events import read_events
from ftl.replay import replay

FTL = [sys.executable, "-m", "ftl"]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals need Linux")


def _wait(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def _children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != b"Z":
                found.append(int(name))
    return found


def test_a_kill_of_ftl_alone_leaves_no_server_and_resume_reaps_the_builds_leftovers(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".ftl/\n")
    for argv in (["git", "init", "-q"], ["git", "add", "-A"],
                 ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, check=True)
    started, late = tmp_path / "started", tmp_path / "late"
    # First attempt: leave a background writer behind (it would write `late` in 8 s) and hang.
    run = (f"if [ -f {started} ]; then echo ok > out.txt; else touch {started}; "
           f"(sleep 8; echo orphan >> {late}) & sleep 60; fi")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "orphans", "tasks": [
        {"seq": "001", "slug": "leave-a-child", "creates": ["out.txt"], "run": run,
         "verify": "test -s out.txt", "timeout_s": 120}]}))
    proc = subprocess.Popen([*FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(started.exists)
        server = _children_of(proc.pid)
        assert server, "the tool server runs as ftl's child"
        os.kill(proc.pid, signal.SIGKILL)  # ftl alone, not its process group
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait(lambda: not any(_alive(pid) for pid in server), timeout_s=10)  # died with ftl
    resumed = subprocess.run([*FTL, "campaign", "resume", "--repo", str(repo), "--json"],
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    time.sleep(9)  # past the moment the orphan would have written
    assert not late.exists(), "the build's background process outlived the crash"
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    events = [e for log in logs for e in read_events(log)]
    reaped = [e for e in events if e["event"] == "RECOVERY_ATTEMPT" and e["strategy"] == "reap_orphans"]
    assert len(reaped) == 1 and reaped[0]["groups"][0]["killed"]
    assert replay(logs).violations == []
    assert not list((repo / ".ftl" / "procs").glob("*.json"))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"
