"""Crash points and protocol edges of the runner, each at a chosen, deterministic moment.

A kill is simulated in a child process by wrapping one `Store` method (or the tool client) so
that it calls ``os._exit(9)`` right after (or before) the moment under test; the campaign is
then resumed and the outcome checked, counting the lines a task's run command appends to its
marker file (a run command that completed twice leaves two lines). The other tests drive the
runner in this process with an in-process tool server (thread-isolated evaluator, so a run
takes well under a second) and wrap the client or a store method to inject the failure.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ftl.engine import checkpoints
from ftl.engine import runner as runner_module
from ftl.config import Config
from ftl.errors import FtlError
from ftl.events import ms_between, parse_ts, read_events, utc_at
from ftl.engine.machine import Flow, State
from ftl.manglecp.client import MAX_RETRIES, ManglecpClient
from ftl.manglecp.transport import InProcessTransport
from ftl.models import Plan
from ftl.postmortem.replay import replay
from ftl.engine.runner import Next, Runner
from ftl.server.app import build_server, connect as app_connect
from ftl.states import HANDLERS
from ftl.states import build as build_state
from ftl.store import Store

ROOT = Path(__file__).resolve().parents[1]
CONFIG = Config(jobs=1, retry_backoff_min_s=0, retry_backoff_max_s=0, isolation="shared")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="kill points and flock need Linux")


def fast_client(config: Config, repo: Path) -> ManglecpClient:
    """The embedded server in this process, evaluating in a thread (no worker processes)."""
    return ManglecpClient(InProcessTransport(build_server(repo, config, isolation="thread"),
                                             close_server=True), max_retries=0)


# Runs in a child process: ``CHILD repo start|resume KILL INPUTS_JSON``; prints the result as JSON
# on its last line, or dies with exit status 9 at the kill point.
CHILD = r'''
import json, os, sys
from pathlib import Path

from ftl.config import Config
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.transport import InProcessTransport
from ftl.engine.runner import Runner
from ftl.server.app import build_server
from ftl.store import Store

repo, mode, kill = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
inputs = json.loads(sys.argv[4])


def kill_after(name, when):
    original = getattr(Store, name)

    def patched(self, *args, **kwargs):
        hit = when(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if hit:
            os._exit(9)
        return result

    setattr(Store, name, patched)


def reusing(store, campaign_id, workspace, **_):
    """The attempt being recorded resumes an earlier attempt's finished build."""
    return any(row["status"] in ("built", "complete")
               for row in store.workspaces(campaign_id, workspace["seq"]))


class KillDuringVerify:
    def __init__(self, inner):
        self.inner = inner

    def evaluate(self, *args, **kwargs):
        return self.inner.evaluate(*args, **kwargs)

    def invoke(self, macro_id, args, **kwargs):
        if "command" in args and "timeout_s" in args:  # run_verify: the build is done
            os._exit(9)
        return self.inner.invoke(macro_id, args, **kwargs)

    def close(self):
        self.inner.close()


def client(config, root):
    inner = ManglecpClient(InProcessTransport(build_server(root, config, isolation="thread"),
                                              close_server=True), max_retries=0)
    return KillDuringVerify(inner) if kill == "during_verify" else inner


KILLS = {
    "none": lambda: None,
    "during_verify": lambda: None,
    "after_create_campaign": lambda: kill_after("create_campaign", lambda *a, **k: True),
    "after_merge": lambda: kill_after("merge_revised_plan", lambda *a, **k: True),
    "after_reused_attempt_recorded": lambda: kill_after("record_workspace", reusing),
    "after_complete_recorded": lambda: kill_after(
        "transition_task", lambda self, cid, seq, status, *a, **k: (seq, status) == ("001", "complete")),
    "after_plan_state_saved": lambda: kill_after(
        "save_machine", lambda self, cid, state, *a, **k: state == "PLAN"),
}
KILLS[kill]()
runner = Runner(repo, Config(jobs=1, retry_backoff_min_s=0, retry_backoff_max_s=0, isolation="shared"),
                client_factory=client, sleep=lambda seconds: None)
if mode == "start":
    result = runner.start("crash points", plan_input=inputs["plan"],
                          revised_plan_input=inputs.get("revised"))
else:
    result = runner.resume()
print(json.dumps({"outcome": result.outcome, "exit_code": result.exit_code}))
'''


def child(repo: Path, mode: str, kill: str = "none", inputs: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(repo), mode, kill, json.dumps(inputs or {})],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def killed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 9, f"expected the kill point to be reached:\n{proc.stdout}\n{proc.stderr[-3000:]}"


def git_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".gitignore").write_text(".ftl/\nmarkers/\nout/\n")
    for name, text in (files or {}).items():
        (path / name).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                        *args], cwd=path, check=True, capture_output=True)
    return path


def marker_task(seq: str, depends: Any = "none") -> dict:
    """A task whose run command appends one line to markers/<seq> each time it completes."""
    return {"seq": seq, "slug": f"step-{seq}", "delta": [], "creates": [f"markers/{seq}"],
            "run": f"mkdir -p markers && echo done >> markers/{seq}",
            "verify": f"test -s markers/{seq}", "depends": depends, "timeout_s": 30}


def marker_lines(repo: Path, seq: str) -> int:
    path = repo / "markers" / seq
    return path.read_text().count("done") if path.exists() else 0


def resume(repo: Path, **kwargs: Any):
    with Runner(repo, CONFIG, client_factory=fast_client, sleep=lambda seconds: None, **kwargs) as runner:
        result = runner.resume()
        tasks = {row["seq"]: row for row in runner.store.tasks(result.campaign_id)}
    return result, tasks


def start(repo: Path, plan: dict, *, config: Config = CONFIG, client_factory=fast_client,
          flow: Flow = Flow.CAMPAIGN, sleep=lambda seconds: None):
    with Runner(repo, config, client_factory=client_factory, sleep=sleep) as runner:
        result = runner.start("crash points", plan_input=plan, flow=flow)
        tasks = {row["seq"]: row for row in runner.store.tasks(result.campaign_id)}
    return result, tasks


def logs(repo: Path) -> list[Path]:
    return sorted((repo / ".ftl" / "events").glob("*.jsonl"))


def events(repo: Path) -> list[dict]:
    (path,) = logs(repo)
    return list(read_events(path))


class Wrapped:
    """A tool client that passes everything through except what ``on_invoke`` intercepts."""

    def __init__(self, inner: Any, on_invoke) -> None:
        self.inner = inner
        self.on_invoke = on_invoke
        self.closed = 0

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.evaluate(*args, **kwargs)

    def invoke(self, macro_id: str, args: dict, **kwargs: Any) -> Any:
        return self.on_invoke(lambda: self.inner.invoke(macro_id, args, **kwargs), args, kwargs)

    def close(self) -> None:
        self.closed += 1
        self.inner.close()


def wrapping(on_invoke, made: list | None = None):
    def factory(config: Config, repo: Path) -> Wrapped:
        client = Wrapped(fast_client(config, repo), on_invoke)
        if made is not None:
            made.append(client)
        return client
    return factory


def is_build(args: dict) -> bool:
    return "workspace" in args


# --------------------------------------------------------------------------- 1: lost build reply

@pytest.mark.parametrize("lost", ["network_error", "timeout"])
def test_a_lost_build_reply_is_not_answered_by_running_the_command_again(tmp_path: Path, lost: str) -> None:
    repo = git_repo(tmp_path / "repo")
    lost_once: list[bool] = []

    def on_invoke(call, args, kwargs):
        reply = call()
        if is_build(args) and not lost_once:
            lost_once.append(True)
            raise FtlError(lost, {"what": "invoke"})  # the command ran; its reply never came
        return reply

    result, tasks = start(repo, {"objective": "x", "tasks": [marker_task("001")]},
                          client_factory=wrapping(on_invoke))
    assert result.outcome == "complete", result.summary
    assert marker_lines(repo, "001") == 1
    story = events(repo)
    assert [e["decision"] for e in story if e["event"] == "FAILURE_CLASSIFIED"] == ["retry"]
    reuse = [e for e in story if e["event"] == "RECOVERY_ATTEMPT"]
    assert [(e["strategy"], e["task_seq"]) for e in reuse] == [("reuse_build", "001")]
    assert sum(e["event"] == "TOOL_CALL" and e["tool"] == "shell_builder" for e in story) == 1
    assert replay(logs(repo)).violations == []


def test_a_failed_command_is_still_retried_after_a_transient_failure(tmp_path: Path) -> None:
    """No checkpoint (the command did not exit 0): the retry runs it again, by design."""
    repo = git_repo(tmp_path / "repo")
    calls: list[int] = []

    def on_invoke(call, args, kwargs):
        if is_build(args):
            calls.append(1)
            if len(calls) == 1:
                raise FtlError("network_error", {"what": "invoke"})  # never reached the server
        return call()

    result, _ = start(repo, {"objective": "x", "tasks": [marker_task("001")]},
                      client_factory=wrapping(on_invoke))
    assert result.outcome == "complete"
    assert calls == [1, 1] and marker_lines(repo, "001") == 1


# --------------------------------------------------------------------------- 2: reused build row

def test_kill_right_after_a_reused_build_is_recorded_keeps_the_checkpoint(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    inputs = {"plan": {"objective": "x", "tasks": [marker_task("001")]}}
    killed(child(repo, "start", "during_verify", inputs))  # built, verify never answered
    assert marker_lines(repo, "001") == 1
    killed(child(repo, "resume", "after_reused_attempt_recorded"))
    result, tasks = resume(repo)
    assert result.outcome == "complete", result.summary
    assert marker_lines(repo, "001") == 1
    with Store.for_repo(repo) as store:
        rows = store.workspaces(result.campaign_id, "001")
    assert [w["status"] for w in rows] == ["built", "built", "complete"]
    # the build that ran is the first row's; the others carry it as reused, so an agent's
    # cost on it is counted once (status, the spend limit)
    assert not rows[0]["result"].get("reused_build")
    assert rows[1]["result"]["reused_build"] and rows[2]["result"]["build"]["reused_build"]
    assert replay(logs(repo)).violations == []


def test_a_kill_between_a_tasks_stored_end_and_its_log_line_is_logged_by_the_resume(tmp_path: Path) -> None:
    # the store says 001 is complete, the log's last word on it is its TASK_START: the resume
    # does not run it again, so it writes the TASK_END the kill kept, inside the crashed run
    repo = git_repo(tmp_path / "repo")
    inputs = {"plan": {"objective": "x", "tasks": [marker_task("001"), marker_task("002", ["001"])]}}
    killed(child(repo, "start", "after_complete_recorded", inputs))
    assert [e["event"] for e in events(repo) if e.get("task_seq") == "001"][-1] != "TASK_END"
    result, tasks = resume(repo)
    assert result.outcome == "complete", result.summary
    assert marker_lines(repo, "001") == 1 and marker_lines(repo, "002") == 1
    log = events(repo)
    resumed_at = [e["seq"] for e in log if e["event"] == "RUN_START"][-1]
    ends = [e for e in log if e["event"] == "TASK_END" and e["task_seq"] == "001"]
    assert [(e["status"], e.get("recovered")) for e in ends] == [("complete", True)]
    assert isinstance(ends[0]["duration_ms"], int)  # the stored span, not the time ftl was down
    assert ends[0]["seq"] < resumed_at  # written into the run it belongs to
    with replay(logs(repo)) as story:
        assert story.violations == []
        assert [a.status for a in story.attempts if a.seq == "001"] == ["complete"]
    # Resumed an hour later: what the resume wrote for the crashed run is stamped then, but the
    # crashed run's last state and the recovered attempt still end when that run was last alive.
    (path,) = logs(repo)
    first = next(e["seq"] for e in log if e["event"] == "LOG_REPAIRED" or e.get("recovered"))
    later = [{**e, "ts": utc_at(parse_ts(e["ts"]).timestamp() + 3600)} if e["seq"] >= first else e
             for e in log]
    path.write_text("".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in later))
    with replay([path]) as story:
        assert story.violations == []
        crashed = [span for span in story.states if span.run == story.runs[0].index]
        assert crashed[-1].interrupted and crashed[-1].duration_ms < 60_000
        assert story.runs[0].last_ts < later[first]["ts"]
        (done,) = [a for a in story.attempts if a.seq == "001"]
        assert abs(ms_between(done.start, done.end) - ends[0]["duration_ms"]) <= 1


def _rows_run(store: Store, campaign_id: str, repo: Path) -> SimpleNamespace:
    return SimpleNamespace(store=store, campaign_id=campaign_id, repo=repo)


def test_resume_walks_back_over_attempts_that_died_before_their_command(tmp_path: Path) -> None:
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["id"]
        spec = {"workspace_id": "001-a", "seq": "001", "run": "make", "delta": ["a"], "creates": []}
        store.record_workspace(cid, {**spec, "attempt": 1})
        store.finish_workspace(cid, "001-a", 1, "built", {"status": "complete", "delivered": "ran: make"})
        store.record_workspace(cid, {**spec, "attempt": 2})
        store.reset_running(cid)  # attempt 2 died before its command: abandoned, no checkpoint
        run = _rows_run(store, cid, tmp_path)
        assert build_state._already_built(run, "001", spec)[0] == {"status": "complete",
                                                                   "delivered": "ran: make"}
        # A changed command (a re-plan revised the task) never reuses the old build.
        assert build_state._already_built(run, "001", {**spec, "run": "make all"}) is None
        store.record_workspace(cid, {**spec, "attempt": 3})
        store.finish_workspace(cid, "001-a", 3, "blocked", {"reason": "verify failed"})
        assert build_state._already_built(run, "001", spec) is None  # a block ends the walk


def test_resume_does_not_walk_back_past_a_worktree_attempt_that_died(tmp_path: Path) -> None:
    # Attempt 1 built in its worktree; attempt 2 (after a crash and a cleaned folder) prepared
    # a fresh worktree at the same base and died mid-build: that folder holds a half-written
    # build, not attempt 1's, so nothing is reused.
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("x")["id"]
        spec = {"workspace_id": "001-a", "seq": "001", "run": "make", "delta": ["a"], "creates": [],
                "workdir": ".ftl/worktrees/001-a", "base_commit": "b" * 40}
        store.record_workspace(cid, {**spec, "attempt": 1})
        store.finish_workspace(cid, "001-a", 1, "built", {"status": "complete", "delivered": "ran: make"})
        run = _rows_run(store, cid, tmp_path)
        assert build_state._already_built(run, "001", spec) is not None
        store.record_workspace(cid, {**spec, "attempt": 2})
        store.reset_running(cid)  # attempt 2 died before its command completed: abandoned
        assert build_state._already_built(run, "001", spec) is None


def _one_abandoned_attempt(store: Store, repo: Path) -> tuple[Any, str, dict]:
    """A campaign whose task 001 has one attempt, abandoned by a crash: (run, its id, spec)."""
    cid = store.create_campaign("x")["id"]
    spec = {"workspace_id": "001-a", "seq": "001", "run": "make", "delta": [], "creates": []}
    store.record_workspace(cid, {**spec, "attempt": 1})
    store.reset_running(cid)
    return _rows_run(store, cid, repo), cid, spec


def test_an_abandoned_attempt_with_its_checkpoint_counts_as_built(tmp_path: Path) -> None:
    with Store.for_repo(tmp_path) as store:
        run, cid, spec = _one_abandoned_attempt(store, tmp_path)
        assert build_state._already_built(run, "001", spec) is None
        checkpoint = checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, cid, "001-a", 1))
        checkpoint.journal.write_text("\n001-a-2 .\n\n001-a-1 .")  # another attempt; a line not ended
        assert build_state._already_built(run, "001", spec) is None
        with checkpoint.journal.open("a") as journal:
            journal.write("\n")  # the line is whole now
        assert build_state._already_built(run, "001", spec)[0]["from_checkpoint"] is True


def test_a_checkpoint_file_an_earlier_ftl_wrote_still_counts(tmp_path: Path) -> None:
    """Before the journal, each build's checkpoint was an empty file of its own; a campaign
    such an ftl left behind resumes with them."""
    with Store.for_repo(tmp_path) as store:
        run, cid, spec = _one_abandoned_attempt(store, tmp_path)
        legacy = tmp_path / ".ftl" / "checkpoints" / cid / "001-a-1.built"
        legacy.parent.mkdir(parents=True)
        legacy.touch()
        assert build_state._already_built(run, "001", spec)[0]["from_checkpoint"] is True


def _append(checkpoint: checkpoints.Checkpoint, text: str) -> None:
    with checkpoint.journal.open("a") as journal:
        journal.write(text)


def test_the_journal_is_read_as_it_grows_and_again_when_it_is_made_anew(tmp_path: Path) -> None:
    first = checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, "c-1", "001-a", 1))
    second = checkpoints.checkpoint_for(tmp_path, "c-1", "002-b", 1)
    tenth = checkpoints.checkpoint_for(tmp_path, "c-1", "001-a", 10)
    assert first.journal.read_text() == "" and not checkpoints.written(first)
    _append(first, "\n001-a-10 .\n")
    assert checkpoints.written(tenth) and not checkpoints.written(first)  # no prefix match
    _append(first, "\n001-a-1 .\n")
    assert checkpoints.written(first) and not checkpoints.written(second)
    _append(first, "\n002-b-1 .\n")
    assert checkpoints.written(second)
    # removed and made again, with no look in between: the new file is read from its start
    first.journal.unlink()
    first.journal.write_text("\n002-b-1 .\n")
    assert checkpoints.written(second) and not checkpoints.written(first)
    first.journal.unlink()  # the folder emptied (a new .ftl): nothing counts any more
    assert not checkpoints.written(second)


def test_a_journal_that_cannot_be_made_leaves_the_build_without_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / ".ftl").mkdir()
    (tmp_path / ".ftl" / "checkpoints").write_text("a file where the folder goes")
    assert checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, "c-1", "001-a", 1)) is None


def test_a_reader_evicted_while_in_use_answers_and_keeps_no_file_open(tmp_path: Path) -> None:
    held = checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, "c-0", "001-a", 1))
    _append(held, "\n001-a-1 .\n")
    reader = checkpoints._reader(held.journal)
    for number in range(1, checkpoints._READERS_KEPT + 2):  # pushes the first reader out
        checkpoints.written(checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, f"c-{number}", "x", 1)))
    before = len(os.listdir("/proc/self/fd"))
    assert reader.has("001-a-1")
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_write_cut_short_does_not_swallow_the_next_builds_line(tmp_path: Path) -> None:
    """A full disk can cut a marker's one write: that line lacks its end and counts for
    nothing, and the next build's line still starts on a line of its own."""
    cut = checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, "c-1", "007-a", 1))
    after = checkpoints.checkpoint_for(tmp_path, "c-1", "008-add-tests", 1)
    _append(cut, "\n007-")  # the cut write
    done = subprocess.run(["/bin/sh", "-c", checkpoints.wrap("true", after)], timeout=10)
    assert done.returncode == 0
    assert checkpoints.written(after) and not checkpoints.written(cut)
    shorter = checkpoints.checkpoint_for(tmp_path, "c-1", "001-a", 1)
    _append(cut, "\n001-a-10")  # cut before its end: not 001-a-10, and not 001-a-1 either
    _append(cut, "\n")
    assert not checkpoints.written(shorter)
    assert not checkpoints.written(checkpoints.checkpoint_for(tmp_path, "c-1", "001-a", 10))


# --------------------------------------------------------------------------- 3: one driver per repo

def test_a_second_driver_is_refused_and_leaves_the_running_task_alone(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    seen: list[Any] = []

    def on_invoke(call, args, kwargs):
        if is_build(args) and not seen:
            with Runner(repo, CONFIG, client_factory=fast_client) as second:
                with pytest.raises(FtlError) as refused:
                    second.resume()
                seen.append(refused.value)
                seen.append(second.store.active_campaign())
                seen.append(second.store.tasks(seen[-1]["id"])[0]["status"])
        return call()

    result, _ = start(repo, {"objective": "x", "tasks": [marker_task("001")]},
                      client_factory=wrapping(on_invoke))
    error, campaign, status = seen
    assert error.error_type == "conflict"
    assert error.details["what"] == (f"campaign {campaign['id']} is being run by another ftl "
                                     f"process (pid {os.getpid()})")
    assert status == "running"  # the refused resume reset nothing
    assert result.outcome == "complete" and marker_lines(repo, "001") == 1


HOLDER = r'''
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\n".encode())
print("locked", flush=True)
sys.stdin.read()
'''


def test_the_lock_names_the_holder_and_dies_with_it(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / ".ftl").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(repo / ".ftl" / "run.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        made: list = []
        with Runner(repo, CONFIG, client_factory=lambda c, r: made.append(1)) as runner:
            with pytest.raises(FtlError) as refused:
                runner.start("x", plan_input={"objective": "x", "tasks": [marker_task("001")]})
            assert runner.store.active_campaign() is None  # nothing created, nothing connected
        assert refused.value.error_type == "conflict"
        assert f"(pid {holder.pid})" in refused.value.details["what"]
        assert made == []
    finally:
        holder.kill()  # SIGKILL: the kernel drops the flock with the process
        holder.wait()
    result, _ = start(repo, {"objective": "x", "tasks": [marker_task("001")]})
    assert result.outcome == "complete"


# --------------------------------------------------------------------------- 4: re-plan merge

def _replan_task(seq: str, run: str, depends: Any) -> dict:
    return {"seq": seq, "slug": f"s{seq}", "delta": [], "creates": [f"out/{seq}"], "run": run,
            "verify": f"test -e out/{seq}", "depends": depends, "timeout_s": 30}


def test_kill_right_after_the_replan_merge_resumes_into_execute(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    inputs = {
        "plan": {"objective": "x", "tasks": [
            _replan_task("001", "exit 1", "none"),
            _replan_task("002", "mkdir -p out && touch out/002", ["001"]),
            _replan_task("003", "mkdir -p out && touch out/003", ["001"])]},
        "revised": {"objective": "x", "tasks": [_replan_task("001", "mkdir -p out && touch out/001", "none")]},
    }
    killed(child(repo, "start", "after_merge", inputs))
    with Store.for_repo(repo) as store:
        stored = store.active_campaign()
    assert stored["machine_state"] == "CASCADE"
    assert stored["tracked"]["replan_count"] == 1 and stored["tracked"]["replan_merged"] is True
    result, tasks = resume(repo)
    assert result.outcome == "complete", result.summary
    assert {seq: row["status"] for seq, row in tasks.items()} == {
        "001": "complete", "002": "complete", "003": "complete"}
    assert result.summary["pending"] == 0 and result.summary["replans"] == 1
    story = list(read_events(logs(repo)[0]))
    resumed = story[next(i for i, e in enumerate(story) if e["event"] == "RESUME"):]
    replan = next(e for e in resumed if e["event"] == "RECOVERY_ATTEMPT")
    assert (replan["strategy"], replan["success"], replan["resumed"]) == ("replan", True, True)
    assert [e["to"] for e in resumed if e["event"] == "PHASE_TRANSITION"][0] == "execute"
    with Store.for_repo(repo) as store:
        assert "replan_merged" not in store.get_campaign(result.campaign_id)["tracked"]
    assert replay(logs(repo)).violations == []


# --------------------------------------------------------------------------- 5: inputs, exploration

def test_kill_right_after_the_campaign_is_created_still_resumes_with_its_plan(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    killed(child(repo, "start", "after_create_campaign",
                 {"plan": {"objective": "x", "tasks": [marker_task("001")]}}))
    result, tasks = resume(repo)
    assert (result.outcome, result.exit_code) == ("complete", 0), result.summary
    assert tasks["001"]["status"] == "complete" and marker_lines(repo, "001") == 1


def test_resume_reloads_the_exploration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = git_repo(tmp_path / "repo")
    killed(child(repo, "start", "after_plan_state_saved",
                 {"plan": {"objective": "x", "tasks": [marker_task("001")]}}))
    seen: list[dict] = []
    original = HANDLERS[State.PLAN]

    def plan_entry(run):
        seen.append(run.exploration)
        return original(run)

    monkeypatch.setitem(HANDLERS, State.PLAN, plan_entry)
    result, _ = resume(repo)
    assert result.outcome == "complete"
    with Store.for_repo(repo) as store:
        saved = store.exploration(result.campaign_id)
    assert saved and seen == [saved]
    assert set(saved) >= {"_meta", "structure"}


# --------------------------------------------------------------------------- 6: capped, cancellable waits

def test_a_huge_retry_after_is_capped_and_a_cancel_during_the_backoff_stops_the_build(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    cancels: list[threading.Event] = []
    delays: list[float] = []

    def on_invoke(call, args, kwargs):
        if is_build(args):
            cancels.append(kwargs["cancel"])
            raise FtlError("rate_limited", {"what": "invoke"}, retry_after_ms=86_400_000)
        return call()

    def sleep(seconds: float) -> None:  # Ctrl-C arrives while the build waits to retry
        delays.append(seconds)
        cancels[-1].set()

    config = Config(jobs=1, retry_backoff_min_s=0.5, retry_backoff_max_s=30, retry_after_max_s=45,
                    isolation="shared")
    result, tasks = start(repo, {"objective": "x", "tasks": [marker_task("001")]}, config=config,
                          client_factory=wrapping(on_invoke), sleep=sleep)
    assert delays == [45.0]  # a day's retry-after, capped at retry_after_max_s
    assert len(cancels) == 1  # no further attempt after the cancel
    ends = [e for e in events(repo) if e["event"] == "TASK_END"]
    assert [(e["task_seq"], e["status"]) for e in ends] == [("001", "cancelled")]
    assert tasks["001"]["status"] == "pending"


# --------------------------------------------------------------------------- 7: file scope

def test_with_one_job_a_task_writing_another_tasks_file_is_blocked(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo", {"a.txt": "x\n", "b.txt": "x\n", "c.txt": "x\n"})
    plan = {"objective": "x", "tasks": [
        {"seq": "001", "slug": "one", "delta": ["a.txt"], "run": "echo 1 >> a.txt", "verify": "true",
         "depends": "none"},
        {"seq": "002", "slug": "two", "delta": ["b.txt"], "run": "echo 2 >> a.txt; echo 2 >> b.txt",
         "verify": "true", "depends": ["001"]},
        {"seq": "003", "slug": "three", "delta": ["c.txt"], "run": "echo 3 >> c.txt", "verify": "true",
         "depends": "none"}]}
    result, tasks = start(repo, plan)
    assert {seq: row["status"] for seq, row in tasks.items()} == {
        "001": "complete", "002": "blocked", "003": "complete"}
    assert tasks["002"]["block_reason"].startswith("workspace_invalid")
    assert "a.txt" in tasks["002"]["block_reason"]


def _scope_run(jobs: int, flow: Flow = Flow.CAMPAIGN, graph: tuple = ({}, {})) -> SimpleNamespace:
    def task(seq: str, depends: list[str]) -> dict:
        return {"seq": seq, "slug": f"t{seq}", "delta": [f"{seq}.txt"], "creates": [f"new/{seq}"],
                "verify": "true", "depends": depends or "none"}

    plan = Plan.model_validate({"objective": "x", "tasks": [
        task("001", []), task("002", ["001"]), task("003", ["002"]), task("004", []), task("005", [])]})
    reads: list[str] = []

    def task_graph(campaign_id: str) -> tuple:
        reads.append(campaign_id)
        return graph

    return SimpleNamespace(flow=flow, config=Config(jobs=jobs), current_plan=plan, campaign_id="c-1",
                           task_isolation=lambda task: "shared", graph_reads=reads,
                           store=SimpleNamespace(task_graph=task_graph))


def test_only_tasks_that_can_run_alongside_are_excluded_from_the_scope_check() -> None:
    rows = [{"seq": "001", "depends": [], "status": "complete"},
            {"seq": "002", "depends": ["001"], "status": "running"},
            {"seq": "003", "depends": ["002"], "status": "pending"},
            {"seq": "004", "depends": [], "status": "running"},
            {"seq": "005", "depends": [], "status": "blocked"}]
    graph = ({r["seq"]: r["depends"] for r in rows}, {r["seq"]: r["status"] for r in rows})
    one_job, task_flow, parallel = (_scope_run(jobs=1, graph=graph),
                                    _scope_run(jobs=4, flow=Flow.TASK, graph=graph),
                                    _scope_run(jobs=4, graph=graph))
    assert build_state._concurrent_paths(one_job, "002") == []
    assert build_state._concurrent_paths(task_flow, "002") == []
    # 001 is an ancestor, 003 a descendant, 005 has finished: only 004 can run alongside 002.
    assert build_state._concurrent_paths(parallel, "002") == ["004.txt", "new/004"]
    # Only the run that can have tasks alongside reads the whole graph (issue 11 item 4).
    assert (one_job.graph_reads, task_flow.graph_reads, parallel.graph_reads) == ([], [], ["c-1"])


# --------------------------------------------------------------------------- 10: errors outside tool calls

def test_an_error_before_the_workspace_exists_blocks_through_the_protocol(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = git_repo(tmp_path / "repo")

    def broken(*args: Any, **kwargs: Any):
        raise RuntimeError("workspace assembly broke")

    monkeypatch.setattr(build_state, "build_workspace", broken)
    result, tasks = start(repo, {"objective": "x", "tasks": [marker_task("001"), marker_task("002", ["001"])]})
    assert {seq: row["status"] for seq, row in tasks.items()} == {"001": "blocked", "002": "blocked"}
    assert tasks["001"]["block_reason"].startswith("internal_error")
    story = events(repo)
    failure = next(e for e in story if e["event"] == "TOOL_FAILURE")
    classified = next(e for e in story if e["event"] == "FAILURE_CLASSIFIED")
    recovery = next(e for e in story if e["event"] == "RECOVERY_ATTEMPT")
    assert (failure["tool"], failure["task_seq"], failure["error_type"]) == ("run_task", "001", "internal_error")
    assert classified["failure_seq"] == failure["seq"] and classified["decision"] == "structural"
    assert (recovery["strategy"], recovery["task_seq"]) == ("block_task", "001")
    assert failure["seq"] < classified["seq"] < recovery["seq"]
    end = next(e for e in story if e["event"] == "TASK_END")
    assert end["error_type"] == "internal_error"
    assert "run_task raised" not in tasks["001"]["block_reason"]
    assert replay(logs(repo)).violations == []
    # The traceback went to the server-side log, keyed by the correlation id.
    correlation_id = failure["details"]["correlation_id"]
    assert correlation_id in (repo / ".ftl" / "ftl.log").read_text()


def test_a_store_error_after_the_build_blocks_and_finishes_the_workspace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = git_repo(tmp_path / "repo")
    original = Store.finish_workspace

    def contended(self, campaign_id, workspace_id, attempt, status, result):
        if status == "built":
            raise FtlError("lock_contention", {"resource": "store .ftl/ftl.db"})
        return original(self, campaign_id, workspace_id, attempt, status, result)

    monkeypatch.setattr(Store, "finish_workspace", contended)
    result, tasks = start(repo, {"objective": "x", "tasks": [marker_task("001")]})
    assert tasks["001"]["status"] == "blocked"
    assert tasks["001"]["block_reason"].startswith("lock_contention")
    with Store.for_repo(repo) as store:
        (workspace,) = store.workspaces(result.campaign_id, "001")
    assert workspace["status"] == "blocked"
    story = events(repo)
    classified = [e for e in story if e["event"] == "FAILURE_CLASSIFIED"]
    assert [(e["error_type"], e["klass"], e["decision"]) for e in classified] == [
        ("lock_contention", "transient", "escalate")]
    assert replay(logs(repo)).violations == []


# --------------------------------------------------------------------------- 11: errors outside states

def test_a_failing_machine_save_still_ends_the_log_and_closes_the_client(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = git_repo(tmp_path / "repo")
    original = Store.save_machine
    made: list[Wrapped] = []

    def save(self, campaign_id, state, tracked, **kwargs):
        if state == "EXPLORE":
            raise FtlError("lock_contention", {"resource": "store .ftl/ftl.db"})
        return original(self, campaign_id, state, tracked, **kwargs)

    monkeypatch.setattr(Store, "save_machine", save)
    with Runner(repo, CONFIG, client_factory=wrapping(lambda call, a, k: call(), made)) as runner:
        with pytest.raises(FtlError) as stopped:
            runner.start("x", plan_input={"objective": "x", "tasks": [marker_task("001")]})
    assert stopped.value.error_type == "lock_contention"
    assert made[0].closed == 1
    last = events(repo)[-1]
    assert (last["event"], last["outcome"], last["resumable"], last["error_type"]) == (
        "RUN_END", "stopped", True, "lock_contention")
    monkeypatch.setattr(Store, "save_machine", original)
    result, _ = resume(repo)  # still active, still resumable
    assert result.outcome == "complete" and marker_lines(repo, "001") == 1


def test_an_illegal_trigger_goes_to_error_like_a_failing_handler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = git_repo(tmp_path / "repo")
    monkeypatch.setitem(HANDLERS, State.INIT, lambda run: Next("no_such_trigger"))
    made: list[Wrapped] = []
    result, _ = start(repo, {"objective": "x", "tasks": [marker_task("001")]},
                      client_factory=wrapping(lambda call, a, k: call(), made))
    assert (result.outcome, result.exit_code) == ("returned", 4)
    assert made[0].closed == 1
    story = events(repo)
    failure = next(e for e in story if e["event"] == "TOOL_FAILURE")
    assert (failure["state"], failure["error_type"]) == ("INIT", "invalid_state")
    assert [e["state"] for e in story if e["event"] == "STATE_ENTRY"] == ["INIT", "ERROR"]
    assert story[-1]["event"] == "RUN_END"
    assert replay(logs(repo)).violations == []


# --------------------------------------------------------------------------- 12: no silent retries

def test_the_runners_clients_never_retry_on_their_own(tmp_path: Path) -> None:
    remote = Config(server="http://127.0.0.1:9")
    assert runner_module.connect(remote, tmp_path).max_retries == 0
    local = runner_module.connect_in_process(Config(), tmp_path)
    try:
        assert local.max_retries == 0
    finally:
        local.close()
    assert app_connect(tmp_path, remote).max_retries == MAX_RETRIES  # other callers keep the default


# --------------------------------------------------------------------------- 16: server log, close

def test_the_server_log_is_attached_only_during_a_drive_and_the_runner_closes_its_store(
        tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    logger = logging.getLogger("ftl")
    level = logger.level
    during: list[list[logging.Handler]] = []

    def on_invoke(call, args, kwargs):
        during.append([h for h in logger.handlers if isinstance(h, logging.FileHandler)])
        return call()

    with Runner(repo, CONFIG, client_factory=wrapping(on_invoke)) as runner:
        runner.start("x", plan_input={"objective": "x", "tasks": [marker_task("001")]})
    handler = during[0][-1]
    assert handler.baseFilename == str((repo / ".ftl" / "ftl.log").resolve())
    assert handler.level == logging.INFO
    assert handler not in logger.handlers and logger.level == level
    with pytest.raises(FtlError) as closed:
        runner.store.active_campaign()
    assert closed.value.error_type == "invalid_state"


# --------------------------------------------------------------------------- 17: TASK flow blocks

def test_task_flow_blocks_the_dependents_of_a_blocked_task(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    failing = {**marker_task("001"), "run": "echo 'boom: bad input' && exit 1"}
    plan = {"objective": "x", "tasks": [failing, marker_task("002", ["001"]), marker_task("003", ["002"])]}
    result, tasks = start(repo, plan, flow=Flow.TASK)
    assert (result.outcome, result.exit_code) == ("complete_with_blocked", 3)
    assert result.summary["pending"] == 0
    assert {seq: (row["status"], row["blocked_by"]) for seq, row in tasks.items()} == {
        "001": ("blocked", []), "002": ("blocked", ["001"]), "003": ("blocked", ["001"])}
    propagate = next(e for e in events(repo) if e["event"] == "CASCADE_PROPAGATE")
    assert propagate["state"] == "BUILD"
    assert replay(logs(repo)).violations == []


def test_a_ctrl_c_between_a_tasks_stored_end_and_its_log_line_still_logs_it(tmp_path: Path,
                                                                              monkeypatch) -> None:
    # The Ctrl-C lands in on_finish after the store recorded 001 complete: the scheduler's
    # drain repeats the report, which must still write 001's TASK_END before the RUN_END (a
    # repeat that stopped at "already stored" left the attempt without an end, and the resume
    # then wrote one after the RUN_END: a task ended without a start, to the postmortem).
    from ftl.events import EventLog

    repo = git_repo(tmp_path / "repo")
    emit = EventLog.emit
    interrupted: list[str] = []

    def cut_once(self, event: str, **fields: Any):
        if event == "TASK_END" and fields.get("task_seq") == "001" and not interrupted:
            interrupted.append("001")
            raise KeyboardInterrupt
        return emit(self, event, **fields)

    monkeypatch.setattr(EventLog, "emit", cut_once)
    plan = {"objective": "x", "tasks": [marker_task("001"), marker_task("002", ["001"])]}
    result, _ = start(repo, plan)
    assert result.outcome == "cancelled" and interrupted == ["001"]
    log = events(repo)
    kinds = [(e["event"], e.get("task_seq")) for e in log]
    assert ("TASK_END", "001") in kinds and kinds.index(("TASK_END", "001")) < kinds.index(("RUN_END", None))
    monkeypatch.setattr(EventLog, "emit", emit)
    result, tasks = resume(repo)
    assert result.outcome == "complete", result.summary
    assert marker_lines(repo, "001") == 1  # stored complete: never built again
    ends = [e for e in events(repo) if e["event"] == "TASK_END" and e["task_seq"] == "001"]
    assert [(e["status"], e.get("recovered")) for e in ends] == [("complete", None)]
    with replay(logs(repo)) as story:
        assert story.violations == []


def test_a_cancel_during_a_first_round_merge_conflict_leaves_the_task_resumable(tmp_path: Path) -> None:
    # A Ctrl-C while the first-round conflict is handled: the task is cancelled (pending
    # again; its commit stays on its branch for the resume to integrate or re-run), not
    # blocked for good with its dependents cut off. The second round's conflict still blocks.
    from ftl.events import EventLog
    from ftl.vcs.worktrees import MergeConflict

    recoveries: list[dict] = []
    finished: list[str] = []
    with EventLog(tmp_path / "c.jsonl", "c") as log:
        run = SimpleNamespace(log=log, machine_state="EXECUTE", campaign_id="c",
                              recovery=SimpleNamespace(recovery=lambda **kw: recoveries.append(kw)),
                              store=SimpleNamespace(finish_workspace=lambda *a, **kw: finished.append(a[3])))
        workspace = SimpleNamespace(seq="002", workspace_id="002-b", attempt=1)
        commit = SimpleNamespace(commit="c0ffee", base="ba5e")
        conflict = MergeConflict(["f.txt"], ["001"])
        cancel = threading.Event()
        cancel.set()
        outcome = build_state._conflicted(run, workspace, commit, conflict, 1, cancel)
        assert outcome.status == "cancelled" and recoveries == [] and finished == []
        cancel.clear()
        assert build_state._conflicted(run, workspace, commit, conflict, 1, cancel) is None
        assert [r["strategy"] for r in recoveries] == ["rebase_rerun"]
        blocked = build_state._conflicted(run, workspace, commit, conflict, 2, cancel)
        assert blocked.status == "blocked" and finished == ["blocked"]


@pytest.mark.parametrize("shell, trap", [("/bin/sh", None), ("bash", False), ("dash", True)])
@pytest.mark.parametrize("command, status, written", [
    ("true", 0, True),
    ("false", 1, False),
    ("exit 0", 0, True),               # exit anywhere still reaches the EXIT trap
    ("f() { exit 0; }\nf", 0, True),
    ("exit 4", 4, False),
    ("set -e; false; echo never", 1, False),
    ("echo done # a trailing comment", 0, True),
    ("cat <<EOF\nhere\nEOF", 0, True),
    ("set -C; true", 0, True),         # noclobber does not stop the checkpoint
    ("IFS=1; exit 10", 10, False),     # an IFS the command set does not split the status
    ("IFS=0; true", 0, True),
    ("kill -TERM $$", -15, False),     # killed: never a checkpoint
    # the command could replace the shell or the trap: the subshell wrapper
    ("trap 'echo own' EXIT; true", 0, True),
    ("exec true", 0, True),
    ("exec false", 1, False),
    (". /dev/null; true", 0, True),
    ("eval 'exit 0'", 0, True),
    ("ftl_checkpoint() { exit 7; }; true", 0, True),  # the wrapper's own names: a subshell
    ("unset -f ftl_checkpoint; true", 0, True),
    ("printf() { exit 5; }; true", 0, True),  # `command printf` is the builtin all the same
    ("command () { exit 3; }; true", 0, True),  # the one function the write could call
    ("printf 'built %s\\n' ok >&2", 0, True),  # a printf of its own is no reason for a subshell
    ("ulimit -f 0; true", 0, True),  # a file-size limit would kill the write (SIGXFSZ)
])
def test_the_build_wrapper_writes_the_checkpoint_exactly_on_exit_0(tmp_path: Path, shell: str,
                                                                   trap: bool | None, command: str,
                                                                   status: int, written: bool) -> None:
    """Under /bin/sh as configured here (the EXIT-trap form where it is dash), under bash in the
    subshell form ftl uses where /bin/sh is not dash, and under dash in the trap form."""
    import shutil

    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    # quoting: a quote and a space in the folder, a quote in the marker
    checkpoint = checkpoints.prepare(checkpoints.checkpoint_for(tmp_path / "it's a dir", "c-1", "001-a'b", 1))
    wrapped = checkpoints.wrap(command, checkpoint, trap=trap)
    done = subprocess.run([shell, "-c", wrapped], capture_output=True, text=True, timeout=10)
    assert (done.returncode, checkpoints.written(checkpoint)) == (status, written), done.stderr
    assert checkpoint.journal.read_text() == ("\n001-a'b-1 .\n" if written else "")
    owns = checkpoints.OWNS_THE_SHELL.search(command) is not None
    trapped = checkpoints.sh_is_dash() if trap is None else trap
    assert wrapped.startswith("(\n") == (owns or not trapped)


@pytest.mark.parametrize("shell, trap", [("/bin/sh", None), ("bash", False), ("dash", True)])
def test_a_build_stopped_at_its_timeout_leaves_no_checkpoint(tmp_path: Path, shell: str,
                                                             trap: bool | None) -> None:
    """The timeout stops the group with SIGTERM: a checkpoint would make the retry take the
    killed build as done. (bash runs an EXIT trap on such a signal, with the status of the last
    command that finished: why the trap form is used only where /bin/sh is dash.)"""
    import shutil

    from ftl.server.tools.proc import run_command

    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    checkpoint = checkpoints.prepare(checkpoints.checkpoint_for(tmp_path, "c-1", "001-a", 1))
    wrapped = checkpoints.wrap("true; sleep 5", checkpoint, trap=trap)
    result = run_command([shell, "-c", wrapped], cwd=tmp_path, timeout_s=0.5)
    assert result.timed_out and not checkpoints.written(checkpoint)
