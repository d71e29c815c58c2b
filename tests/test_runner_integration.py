"""End-to-end runs of the real CLI on real repositories: the failure drill, crash and resume,
Ctrl-C, the TASK flow, bad input, and every ERROR route through a real run context."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftl.config import Config
from ftl.errors import FtlError, REGISTRY, Route
from ftl.events import read_events
from ftl.engine.machine import Flow, Tracked
from ftl.postmortem.replay import replay
from ftl.engine.runner import Finish, Next, Runner
from ftl.store import Store

ROOT = Path(__file__).resolve().parents[1]
FTL = [sys.executable, "-m", "ftl"]


def ftl(*args: str, cwd: Path | None = None, check: bool = False, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run([*FTL, *args], cwd=cwd or ROOT, capture_output=True, text=True, env=env,
                          timeout=300, **kw)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".gitignore").write_text(".ftl/\nmarkers/\nout/\n")
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
                   cwd=path, check=True)
    return path


def events_of(repo: Path) -> list[dict]:
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    assert len(logs) == 1
    return list(read_events(logs[0]))


def test_failure_drill_ends_as_expected(tmp_path: Path) -> None:
    work = tmp_path / "failure-drill"
    env = {**os.environ, "PYTHON": sys.executable, "FTL_BIN": str(Path(sys.executable).parent / "ftl")}
    script = ROOT / "examples" / "failure-drill" / "run.sh"
    metrics = tmp_path / "metrics.prom"
    proc = subprocess.run(["bash", str(script), "--jobs", "2", "--json", "--metrics-file", str(metrics)],
                          capture_output=True, text=True,
                          env={**env, "FTL_WORK_DIR": str(tmp_path)}, timeout=300, cwd=ROOT)
    expected = json.loads((ROOT / "examples" / "failure-drill" / "expected.json").read_text())
    assert proc.returncode == expected["exit_code"], proc.stderr[-3000:]
    envelope = json.loads(proc.stdout)
    assert envelope["success"] is True and envelope["error"] is None
    assert envelope["meta"]["version"] == "response-v2"
    assert any(w["code"] == "PARTIAL_FAILURE" for w in envelope["meta"]["warning_details"])
    tasks = {t["seq"]: t for t in envelope["data"]["summary"]["tasks"]}
    assert {seq: t["status"] for seq, t in tasks.items()} == expected["tasks"]
    for seq, roots in expected.get("blocked_by", {}).items():
        assert tasks[seq]["blocked_by"] == roots

    repo = Path(envelope["data"]["summary"].get("repo") or work)
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    result = replay(logs)
    assert result.violations == []
    events = [e for e in read_events(logs[0])]
    # TOOL_FAILURE before each retry, RECOVERY_ATTEMPT after the final failure.
    retry = next(e for e in events if e["event"] == "RETRY")
    failure = next(e for e in events if e["event"] == "TOOL_FAILURE" and e.get("op_id") == retry["op_id"])
    assert failure["seq"] < retry["seq"]
    blocked_failure = next(e for e in events if e["event"] == "TOOL_FAILURE" and e.get("tool") == "shell_builder")
    recovery = next(e for e in events if e["event"] == "RECOVERY_ATTEMPT" and e.get("strategy") == "block_task")
    assert blocked_failure["seq"] < recovery["seq"]
    assert any(e["event"] == "CASCADE_PROPAGATE" for e in events)
    assert any(e["event"] == "CASCADE_ANALYSIS" for e in events)
    counters = metrics.read_text()
    assert 'ftl_tasks_total{status="blocked"} 1.0' in counters  # 002 itself; 003/004 by propagation
    assert 'ftl_retries_total{kind="flaky_test",outcome="retried"} 1.0' in counters


def _marker_plan(tmp_path: Path, count: int = 10, sleep_s: float = 0.4,
                 gate: Path | None = None) -> Path:
    """A plan whose run commands count their completions in <tmp_path>/markers/<seq> (one line
    each; outside the repository, so the count survives worktrees and their removal).

    Each run command first sleeps ``sleep_s``; with ``gate``, it sleeps only while that file is
    absent, so the run a test interrupts is slow and the resume after it is not."""
    markers = tmp_path / "markers"
    wait = f"sleep {sleep_s}" if gate is None else f"{{ test -e {gate} || sleep {sleep_s}; }}"
    tasks = []
    for i in range(1, count + 1):
        seq = f"{i:03d}"
        deps = [f"{i - 1:03d}"] if i > 2 else "none"
        tasks.append({"seq": seq, "slug": f"step-{i}", "delta": [], "creates": [],
                      "run": f"{wait} && mkdir -p {markers} && echo done >> {markers}/{seq}",
                      "verify": f"test -s {markers}/{seq}", "depends": deps, "timeout_s": 30})
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "count completions", "tasks": tasks}))
    return plan


def _wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _started(repo: Path) -> int:
    logs = list((repo / ".ftl" / "events").glob("*.jsonl"))
    if not logs:
        return 0
    return sum(1 for e in read_events(logs[0]) if e["event"] == "TASK_START")


def _server_args(server: str | None) -> list[str]:
    return [] if server is None else ["--server", server]


# The embedded tool server runs in ftl's process by default, and as its subprocess over stdio
# with --server embedded:stdio: crash, interrupt and resume hold for both.
@pytest.mark.parametrize("kill_after_starts, server", [(2, None), (5, "embedded:stdio")])
def test_sigkill_then_resume_runs_each_task_to_completion_once(tmp_path: Path, kill_after_starts: int,
                                                               server: str | None) -> None:
    repo, gate = git_repo(tmp_path / "repo"), tmp_path / "resumed"
    plan = _marker_plan(tmp_path, gate=gate)
    proc = subprocess.Popen([*FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo), "--jobs", "2",
                             *_server_args(server)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _started(repo) >= kill_after_starts)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    gate.touch()  # commands still sleeping from the killed run finish as before; new ones at once
    resumed = ftl("campaign", "resume", "--repo", str(repo), "--json", *_server_args(server))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads(resumed.stdout)["data"]["summary"]
    assert summary["complete"] == summary["total"] == 10
    for i in range(1, 11):
        lines = (tmp_path / "markers" / f"{i:03d}").read_text().splitlines()
        assert lines == ["done"], f"task {i:03d} completed {len(lines)} times"
    store = Store.for_repo(repo)
    assert store.integrity_check() == "ok"
    logs = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    result = replay(logs)
    assert result.violations == [], [v.to_json() for v in result.violations]
    assert result.crash_boundaries, "the log should show the crash boundary"


@pytest.mark.parametrize("server", [None, "embedded:stdio"])
def test_ctrl_c_cancels_cleanly_and_resume_finishes(tmp_path: Path, server: str | None) -> None:
    repo, gate = git_repo(tmp_path / "repo"), tmp_path / "resumed"
    plan = _marker_plan(tmp_path, count=6, sleep_s=1.0, gate=gate)
    proc = subprocess.Popen([*FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo), "--jobs", "2",
                             *_server_args(server)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: _started(repo) >= 2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    gate.touch()
    assert proc.returncode == 130, err[-2000:]
    events = events_of(repo)
    assert events[-1]["event"] == "RUN_END" and events[-1]["outcome"] == "cancelled"
    store = Store.for_repo(repo)
    campaign = store.active_campaign()
    assert campaign is not None
    assert all(t["status"] != "running" for t in store.tasks(campaign["id"]))
    resumed = ftl("campaign", "resume", "--repo", str(repo), "--json")
    assert resumed.returncode == 0, resumed.stderr
    for i in range(1, 7):
        assert (tmp_path / "markers" / f"{i:03d}").read_text().splitlines() == ["done"]
    assert replay(sorted((repo / ".ftl" / "events").glob("*.jsonl"))).violations == []


def test_an_interrupt_from_another_thread_stops_the_run_as_ctrl_c_does(tmp_path: Path) -> None:
    # What an MCP client's cancel of campaign_run does: the runner's interrupt event, set from
    # another thread, cancels the running tasks and ends the run cancelled and resumable.
    repo, gate = git_repo(tmp_path / "repo"), tmp_path / "resumed"
    plan = json.loads(_marker_plan(tmp_path, count=6, sleep_s=5.0, gate=gate).read_text())
    interrupt = threading.Event()
    starts: list[str] = []

    def on_event(event: dict) -> None:
        if event["event"] == "TASK_START":
            starts.append(event["task_seq"])
            if len(starts) == 2:
                threading.Timer(0.2, interrupt.set).start()

    began = time.monotonic()
    with Runner(repo, Config(jobs=2, retry_backoff_min_s=0), on_event=on_event,
                interrupt=interrupt) as runner:
        result = runner.start("count completions", plan_input=plan)
    assert result.outcome == "cancelled" and result.exit_code == 130
    assert time.monotonic() - began < 5.0  # the 5 s sleeps were stopped, not waited out
    events = events_of(repo)
    assert events[-1]["event"] == "RUN_END" and events[-1]["resumable"] is True
    assert [e["status"] for e in events if e["event"] == "TASK_END"] == ["cancelled", "cancelled"]
    assert "CASCADE" not in [e["state"] for e in events if e["event"] == "STATE_ENTRY"]
    gate.touch()
    with Runner(repo, Config(jobs=2)) as runner:
        assert runner.resume().outcome == "complete"
    for i in range(1, 7):
        assert (tmp_path / "markers" / f"{i:03d}").read_text().splitlines() == ["done"]
    assert replay(sorted((repo / ".ftl" / "events").glob("*.jsonl"))).violations == []


def test_task_flow_builds_and_verifies(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    proc = ftl("task", "write a greeting", "--run", "mkdir -p out && echo hi > out/greeting",
               "--verify", "grep -q hi out/greeting", "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["summary"]["flow"] == "task" and data["summary"]["complete"] == 1
    assert data["summary"]["message"].startswith("Task flow complete. 1 complete, 0 blocked.")
    states = [e["state"] for e in events_of(repo) if e["event"] == "STATE_ENTRY"]
    assert states == ["INIT", "EXPLORE", "PLAN", "BUILD", "OBSERVE", "COMPLETE"]
    # The store was closed (checkpointed into ftl.db), not left to the collector at exit.
    assert not (repo / ".ftl" / "ftl.db-wal").exists()


def test_a_task_without_a_run_command_and_no_agent_says_how_to_build_it(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    proc = ftl("task", "make it so", "--verify", "true", "--repo", str(repo), "--json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (task,) = json.loads(proc.stdout)["data"]["summary"]["tasks"]
    assert task["block_reason"].startswith("tool_not_exposed: Task 001 has no run command")
    assert "agent_command" in task["block_reason"] and 'builder = "claude"' in task["block_reason"]


def test_invalid_plan_is_bad_input_with_every_violation(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    plan = tmp_path / "bad.json"
    plan.write_text(json.dumps({"objective": "x", "tasks": [
        {"seq": "001", "slug": "Bad Slug", "verify": "true"},
        {"seq": "002", "slug": "ok", "verify": "", "depends": "009"}]}))
    proc = ftl("campaign", "run", "--plan", str(plan), "--repo", str(repo), "--json")
    assert proc.returncode == 2
    envelope = json.loads(proc.stdout)
    assert envelope["success"] is False and envelope["error"]
    paths = {v["path"] for v in envelope["data"]["details"]["violations"]}
    assert "$.tasks[0].slug" in paths and "$.tasks[1].verify" in paths
    assert any("009" in v["message"] for v in envelope["data"]["details"]["violations"])
    assert "Traceback" not in proc.stdout + proc.stderr and str(tmp_path) not in proc.stdout
    assert not (repo / ".ftl" / "events").exists() or not list((repo / ".ftl" / "events").iterdir())


class _NoTools:
    """A MangleCP client stand-in for route tests: no tool is ever selected."""

    def evaluate(self, intent, facts, **kwargs):
        return {"macro_tools": []}

    def invoke(self, macro_id, args, **kwargs):  # pragma: no cover - never selected
        raise AssertionError("no invoke expected")


ROUTE_TRIGGERS = {Route.PLAN: "plan", Route.CASCADE: "cascade", Route.OBSERVE: "observe"}


@pytest.mark.parametrize("error_type", sorted(REGISTRY))
def test_every_error_type_takes_its_route(tmp_path: Path, error_type: str) -> None:
    from ftl.states import error as error_state

    runner = Runner(tmp_path, Config(), client_factory=lambda config, repo: _NoTools())
    campaign = runner.store.create_campaign("routes")
    run = runner._make_run(campaign, Tracked(), None, None)
    run.error = FtlError(error_type, {"violations": [{"path": "$.x", "message": "m"}], "questions": ["q?"]})
    run.error_origin = "EXPLORE"
    run.exploration = {"_meta": {"modes_completed": ["structure"]}}  # partial data: timeout -> PLAN
    run.machine_state = "ERROR"
    step = error_state.enter(run)
    route = REGISTRY[error_type].route
    if route in ROUTE_TRIGGERS:
        assert isinstance(step, Next) and step.trigger == ROUTE_TRIGGERS[route]
    else:
        assert isinstance(step, Finish) and step.exit_code == 4
        assert step.summary["route"] in (route.value, Route.SUMMARY.value)
        assert step.summary["error"]["error_type"] == error_type
        if route is Route.RETURN_ERRORS:
            assert step.summary["violations"]
        if route is Route.RETURN_QUESTIONS:
            assert step.summary["questions"] == ["q?"]
    events = [e["event"] for e in read_events(run.log.path)]
    assert "ERROR_ROUTE" in events
    run.log.close()


def test_task_flow_routes_cascade_errors_to_observe(tmp_path: Path) -> None:
    from ftl.states import error as error_state

    runner = Runner(tmp_path, Config(), client_factory=lambda config, repo: _NoTools())
    run = runner._make_run(runner.store.create_campaign("t", flow="task"), Tracked(), None, None)
    run.error = FtlError("stuck_detected", {"count": 3})
    assert run.flow is Flow.TASK
    assert error_state.enter(run) == Next("observe")
    run.log.close()


FAKE_AGENT = ROOT / "tests" / "tools" / "fake_agent.py"


def _agent_config(builder_mode: str, planner_mode: str = "plan-markdown") -> Config:
    return Config(jobs=2, explorer_timeout_s=30, retry_backoff_min_s=0.01,
                  agent_command=[sys.executable, str(FAKE_AGENT), builder_mode],
                  planner_command=[sys.executable, str(FAKE_AGENT), planner_mode])


def test_planner_agent_and_agent_builder_run_a_campaign(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    result = Runner(repo, _agent_config("complete")).start("write a.py")
    assert result.exit_code == 0, result.summary
    assert not (repo / "a.py").exists()  # the user's checkout is untouched until landing
    branch = result.summary["integration_branch"]
    written = subprocess.run(["git", "show", f"{branch}:a.py"], cwd=repo, capture_output=True,
                             text=True, check=True).stdout
    assert written.startswith("# written by the fake agent")
    events = list(read_events(result.log_path))
    decision = next(e for e in events if e["event"] == "PLAN_DECISION")
    assert decision["decision"] == "PROCEED" and decision["tool"] == "agent_planner"
    assert any(e["event"] == "TOOL_CALL" and e["tool"] == "agent_builder" for e in events)
    assert replay([result.log_path]).violations == []


def test_rate_limited_agent_waits_its_retry_after_then_blocks(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    delays: list[float] = []
    result = Runner(repo, _agent_config("rate-limit-json"), sleep=delays.append).start("write a.py")
    assert result.exit_code == 3
    assert delays == [1.5]  # the agent's retry_after_ms (1500) beat the 10 ms backoff
    events = list(read_events(result.log_path))
    failures = [e for e in events if e["event"] == "TOOL_FAILURE" and e["tool"] == "agent_builder"]
    assert [f["error_type"] for f in failures] == ["rate_limited", "rate_limited"]
    assert sum(e["event"] == "RETRY" for e in events) == 1
    assert replay([result.log_path]).violations == []


def test_planner_that_keeps_asking_exhausts_clarifications(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    config = _agent_config("complete", planner_mode="clarify").model_copy(update={"max_clarifications": 2})
    result = Runner(repo, config).start("do something vague")
    assert result.exit_code == 4
    assert result.summary["error"]["error_type"] == "clarify_exhausted"
    assert "Which database?" in result.summary["questions"]
    entries = [e for e in read_events(result.log_path) if e["event"] == "STATE_ENTRY"]
    assert [e["state"] for e in entries].count("PLAN") == 3  # 1 + max_clarifications rounds
    assert replay([result.log_path]).violations == []


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_campaign_runs_against_a_separate_http_manglecp_server(tmp_path: Path) -> None:
    import httpx

    repo = git_repo(tmp_path / "repo")
    port = _free_port()
    server = subprocess.Popen([*FTL, "serve", "--http", f"127.0.0.1:{port}", "--repo", str(repo)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/.well-known/manglecp/manifest.json", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait_for(up, timeout_s=30)
        plan = _marker_plan(tmp_path, count=3, sleep_s=0.05)
        proc = ftl("campaign", "run", "--plan", str(plan), "--repo", str(repo), "--server", url, "--json")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        events = events_of(repo)
        calls = {e["tool"] for e in events if e["event"] == "TOOL_CALL"}
        assert {"explore_structure", "load_plan", "shell_builder", "run_verify", "observer"} <= calls
        assert replay(sorted((repo / ".ftl" / "events").glob("*.jsonl"))).violations == []
    finally:
        server.terminate()
        server.wait(timeout=15)


def test_replan_with_a_partial_revised_plan_recovers_the_campaign(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    tasks = [
        {"seq": "001", "slug": "root", "creates": ["out/1"], "run": "echo 'boom: bad config' && exit 1",
         "verify": "test -f out/1"},
        {"seq": "002", "slug": "middle", "creates": ["out/2"], "run": "mkdir -p out && touch out/2",
         "verify": "test -f out/2", "depends": "001"},
        {"seq": "003", "slug": "leaf", "creates": ["out/3"], "run": "mkdir -p out && touch out/3",
         "verify": "test -f out/3", "depends": "002"},
    ]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "replan drill", "tasks": tasks}))
    revised = tmp_path / "revised.json"  # lists only the task it fixes; 002/003 stay as they are
    revised.write_text(json.dumps({"objective": "replan drill", "tasks": [
        {"seq": "001", "slug": "root", "creates": ["out/1"], "run": "mkdir -p out && touch out/1",
         "verify": "test -f out/1"}]}))
    proc = ftl("campaign", "run", "--plan", str(plan), "--revised-plan", str(revised), "--repo", str(repo),
               "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads(proc.stdout)["data"]["summary"]
    assert summary["complete"] == 3 and summary["replans"] == 1
    events = events_of(repo)
    names = [e["event"] for e in events]
    assert "CASCADE_REPLAN" in names
    replan = next(e for e in events if e["event"] == "RECOVERY_ATTEMPT" and e["strategy"] == "replan")
    assert replan["success"] is True and replan["merged"] == 1
    entries = [e["state"] for e in events if e["event"] == "STATE_ENTRY"]
    assert entries.count("EXECUTE") == 2
    assert replay(sorted((repo / ".ftl" / "events").glob("*.jsonl"))).violations == []


def test_a_crash_as_the_campaign_is_marked_finished_leaves_no_worktree_and_resume_ends_it(
        tmp_path: Path, monkeypatch) -> None:
    # A kill between "campaign finished" and the cleanup of its worktrees used to leave task
    # worktrees and branches that no resume would touch (resume saw no active campaign).
    from ftl.engine.runner import connect_in_process

    repo = git_repo(tmp_path / "repo")
    plan = {"objective": "finish window", "tasks": [
        {"seq": f"00{n}", "slug": f"t{n}", "type": "BUILD", "delta": [f"f{n}.txt"],
         "run": f"echo {n} > f{n}.txt", "verify": "true", "budget": 1,
         "depends": "none" if n == 1 else ["001"]} for n in (1, 2, 3)]}
    real = Store.finish_campaign

    def crash(self: Store, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # stands for the kill: nothing after this line runs

    monkeypatch.setattr(Store, "finish_campaign", crash)
    with Runner(repo, Config(jobs=2), client_factory=connect_in_process) as runner:
        runner.start("finish window", plan_input=plan)
    worktrees = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=repo, check=True,
                               capture_output=True, text=True).stdout
    assert worktrees.count("worktree ") == 1  # only the main checkout
    branches = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/heads/ftl"], cwd=repo,
                              check=True, capture_output=True, text=True).stdout.split()
    assert not any("/task/" in branch for branch in branches), branches
    monkeypatch.setattr(Store, "finish_campaign", real)
    with Runner(repo, Config(jobs=2), client_factory=connect_in_process) as runner:
        resumed = runner.resume()  # the campaign is still active: the resume finishes it
    assert resumed.outcome == "complete" and resumed.exit_code == 0
    with Runner(repo, Config(jobs=2), client_factory=connect_in_process) as runner:
        with pytest.raises(FtlError) as nothing:  # and says so when asked again
            runner.resume()
    assert nothing.value.error_type == "conflict" and "is complete, not active" in nothing.value.message


def test_a_campaign_started_from_its_intent_keeps_the_runs_isolation(tmp_path: Path) -> None:
    # `ftl campaign run --isolation shared` killed before it recorded its campaign: the resume
    # starts it from the intent, in the shared checkout it asked for (it used to take the
    # resume's own setting: a worktree in a git repository).
    from ftl.engine.intent import write_intent
    from ftl.engine.runner import connect_in_process

    repo = git_repo(tmp_path / "repo")
    plan = {"objective": "shared by request", "tasks": [
        {"seq": "001", "slug": "a", "type": "BUILD", "delta": ["a.txt"], "run": "echo a > a.txt",
         "verify": "test -f a.txt", "budget": 1, "depends": "none"}]}
    assert write_intent(repo, {"objective": None, "plan": plan, "revised_plan": None,
                               "flow": "campaign", "isolation": "shared"})
    with Runner(repo, Config(), client_factory=connect_in_process) as runner:
        result = runner.resume()
        campaign = runner.store.get_campaign(result.campaign_id)
    assert result.outcome == "complete" and campaign["inputs"]["isolation"] == "shared"
    assert (repo / "a.txt").read_text() == "a\n"  # built in the checkout, not in a worktree
