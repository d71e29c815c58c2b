"""No orphans (issue "crash safety", item 3): a SIGKILL of the ftl process alone takes a tool
server in its own process (``--server embedded:stdio``) with it (parent-death signal), and what a
build command left running in its process group is found in the ledger and killed by `ftl
campaign resume` before tasks run again, whether the tool server ran in ftl's process (the
default) or in its own."""

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
from ftl.processes import recorded
from ftl.postmortem.replay import replay

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


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".ftl/\n")
    for argv in (["git", "init", "-q"], ["git", "add", "-A"],
                 ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, check=True)
    return repo


def _run_then_kill_ftl_alone(tmp_path: Path, repo: Path, run: str, timeout_s: float,
                             server: str | None = None) -> None:
    """Start a campaign of one task, SIGKILL the ftl process alone once the task's command has
    started (tmp_path/started exists), and, with ``server`` ``embedded:stdio``, check that the
    tool server died with ftl (by default it runs in ftl's process: the build is ftl's child)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "orphans", "tasks": [
        {"seq": "001", "slug": "slow-build", "creates": ["out.txt"], "run": run,
         "verify": "test -s out.txt", "timeout_s": timeout_s}]}))
    proc = subprocess.Popen([*FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo),
                             *(["--server", server] if server else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait((tmp_path / "started").exists)
        children = _children_of(proc.pid)
        assert children, "the tool server (stdio) or the build (in process) runs as ftl's child"
        os.kill(proc.pid, signal.SIGKILL)  # ftl alone, not its process group
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    if server:
        _wait(lambda: not any(_alive(pid) for pid in children), timeout_s=10)  # died with ftl


def _events(repo: Path) -> list[dict]:
    return [e for log in sorted((repo / ".ftl" / "events").glob("*.jsonl")) for e in read_events(log)]


def _resume(repo: Path, release: Path | None = None) -> tuple[dict, list[dict]]:
    """``ftl campaign resume --json``; with ``release``, create that file once the resume
    announces it waits for the killed run's leftovers (ORPHANS_WAITING), so a leftover gated on
    it finishes while the resume waits, however slow the machine."""
    resumed = subprocess.Popen([*FTL, "campaign", "resume", "--repo", str(repo), "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if release is not None:
            _wait(lambda: any(e["event"] == "ORPHANS_WAITING" for e in _events(repo))
                  or resumed.poll() is not None)
            release.touch()
        out, err = resumed.communicate(timeout=120)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    data = json.loads(out)["data"]
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    assert replay(logs).violations == []
    assert recorded(repo / ".ftl" / "procs") == []
    return data, [e for log in logs for e in read_events(log)]


@pytest.mark.parametrize("server", [None, "embedded:stdio"])
def test_resume_waits_for_a_build_the_killed_run_left_and_reuses_it(tmp_path: Path, server: str | None) -> None:
    """The build finishes after ftl died: it records its own checkpoint, the resume waits for
    it instead of starting it again, and the build command completes exactly once."""
    repo, marker, release = _repo(tmp_path), tmp_path / "built", tmp_path / "release"
    # The build outlives ftl until the resume is waiting for it (bounded: 30 s).
    run = (f"touch {tmp_path / 'started'}; i=0; "
           f"until [ -e {release} ] || [ $i -ge 600 ]; do sleep 0.05; i=$((i + 1)); done; "
           f"echo ok > out.txt; echo done >> {marker}")
    _run_then_kill_ftl_alone(tmp_path, repo, run, timeout_s=60, server=server)
    data, events = _resume(repo, release=release)
    assert data["exit_code"] == 0, data
    assert marker.read_text().splitlines() == ["done"]
    waiting = [e for e in events if e["event"] == "ORPHANS_WAITING"]
    assert len(waiting) == 1 and waiting[0]["count"] == 1
    (reaped,) = [e for e in events if e["event"] == "RECOVERY_ATTEMPT"
                 and e["strategy"] == "reap_orphans"]
    assert reaped["groups"][0]["finished"] is True and reaped["groups"][0]["killed"] == []


def test_resume_kills_what_the_killed_run_left_once_its_deadline_passes(tmp_path: Path) -> None:
    """A leftover that would outlive its task's timeout (a background writer, a hang) is killed
    at that deadline, before the task runs again: it never writes into the repository."""
    repo, late, writer = _repo(tmp_path), tmp_path / "late", tmp_path / "writer.pid"
    run = (f"if [ -f {tmp_path / 'started'} ]; then echo ok > out.txt; else "
           f"(sleep 30; echo orphan >> {late}) & echo $! > {writer}; "
           f"touch {tmp_path / 'started'}; sleep 60; fi")
    _run_then_kill_ftl_alone(tmp_path, repo, run, timeout_s=4, server="embedded:stdio")
    data, events = _resume(repo)
    assert data["exit_code"] == 0, data
    # The background writer is gone (SIGKILL takes a moment to land): it can never write.
    pid = int(writer.read_text())
    try:
        _wait(lambda: not _alive(pid), timeout_s=5)
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the build's background process outlived the crash") from None
    assert not late.exists(), "the build's background process wrote after the crash"
    (reaped,) = [e for e in events if e["event"] == "RECOVERY_ATTEMPT"
                 and e["strategy"] == "reap_orphans"]
    assert reaped["groups"][0]["finished"] is False and reaped["groups"][0]["killed"]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"
