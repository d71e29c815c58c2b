"""Campaigns of Claude Code builders, end to end through the CLI, with the stand-in CLI
(`examples/claude-builder/stand_in_claude.py`): the shared rate gate, stalls resumed, the turn
budget, the spend limit, cost in status and postmortems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from ftl.errors import Route, kind
from ftl.events import read_events
from ftl.postmortem.html import render_html
from ftl.postmortem.replay import render_text, replay

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "claude-builder"
STAND_IN = EXAMPLE / "stand_in_claude.py"
ENV = {**os.environ, "PYTHON": sys.executable, "FTL_BIN": str(Path(sys.executable).parent / "ftl")}


def _events(repo: Path) -> list[dict]:
    (log,) = sorted((repo / ".ftl" / "events").glob("*.jsonl"))
    return list(read_events(log))


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _argv_log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "argv.jsonl").read_text().splitlines()]


def test_six_builders_one_usage_limit_every_start_waits_at_the_gate(tmp_path: Path) -> None:
    argv_dir = tmp_path / "argv"
    proc = subprocess.run(["bash", str(EXAMPLE / "run.sh"), "--json"], capture_output=True,
                          text=True, timeout=240,
                          env={**ENV, "FTL_WORK_DIR": str(tmp_path), "FTL_STAND_IN_LOG": str(argv_dir)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)["data"]
    assert {t["seq"]: t["status"] for t in data["summary"]["tasks"]} == {
        f"00{n}": "complete" for n in range(1, 7)}
    repo = tmp_path / "claude-builder"
    log = _events(repo)
    gate = [e for e in log if e["event"] == "RATE_GATE"]
    assert [(e["closed"], e.get("task_seq"), e.get("limit_kind")) for e in gate] == [
        (True, "001", "usage_limit"), (False, None, None)]
    opened = _ts(gate[1]["ts"])
    assert opened >= _ts(gate[0]["reopens_at"]) - 0.01
    # Only the task that met the limit failed, once, transiently; its retry was the protocol's.
    failures = [e for e in log if e["event"] == "TOOL_FAILURE"]
    assert [(e["task_seq"], e["error_type"]) for e in failures] == [("001", "rate_limited")]
    assert [e["decision"] for e in log if e["event"] == "FAILURE_CLASSIFIED"] == ["retry"]
    # Every agent start (TOOL_CALL, made after the gate check) once the gate closed waited until
    # it opened: 001's retry, and 005/006 unless 002/003 took longer than the pause.
    closed_at = _ts(gate[0]["ts"])
    calls = [e for e in log if e["event"] == "TOOL_CALL" and e["tool"] == "claude_builder"]
    later = [e for e in calls if e["seq"] > gate[0]["seq"]]
    assert "001" in {e["task_seq"] for e in later}
    assert all(_ts(e["ts"]) >= opened - 0.01 and e["seq"] > gate[1]["seq"] for e in later)
    assert sorted(e["task_seq"] for e in calls) == ["001", "001", "002", "003", "004", "005", "006"]
    runs = _argv_log(argv_dir)
    assert sorted((r["slug"], r["run"]) for r in runs if r["slug"] == "greet") == [
        ("greet", 1), ("greet", 2)]
    assert closed_at < opened
    # Cost per task and in total: TASK_END, status, the text and HTML postmortems.
    ends = {e["task_seq"]: e for e in log if e["event"] == "TASK_END"}
    assert all(ends[seq]["total_cost_usd"] > 0 and ends[seq]["usage"]["output_tokens"] > 0
               for seq in ends)
    status = subprocess.run([ENV["FTL_BIN"], "campaign", "status", "--repo", str(repo), "--json"],
                            capture_output=True, text=True, env=ENV, timeout=60)
    status_data = json.loads(status.stdout)["data"]
    total = round(sum(e["total_cost_usd"] for e in ends.values()), 6)
    assert status_data["campaign"]["cost_usd"] == total
    assert {t["seq"]: t["cost_usd"] for t in status_data["tasks"]} == {
        seq: e["total_cost_usd"] for seq, e in ends.items()}
    with replay([sorted((repo / ".ftl" / "events").glob("*.jsonl"))[0]]) as result:
        assert not result.violations
        text = render_text(result)
        html = render_html(result)
    assert f"agent cost: ${total:.4f} total" in text
    assert f"${ends['003']['total_cost_usd']:.4f} (3 turns)" in text
    assert "agent cost (total)" in html and f"${total:.4f}" in html


def _campaign(tmp_path: Path, tasks: list[dict], scenarios: dict, toml: str = "",
              claude_toml: str = "", jobs: int = 1) -> tuple[int, Path, list[dict]]:
    repo = tmp_path / "repo"
    (repo / "app").mkdir(parents=True)
    (repo / "app" / "__init__.py").write_text("")
    (repo / "ftl.toml").write_text(
        f'builder = "claude"\njobs = {jobs}\nretry_backoff_min_s = 0.05\n{toml}\n'
        f"[claude]\ncommand = {json.dumps([sys.executable, str(STAND_IN)])}\n{claude_toml}\n")
    plan = {"objective": "stand-in campaign", "tasks": [
        {"seq": t["seq"], "slug": t["slug"], "creates": t.get("creates", [f"app/{t['slug']}.py"]), "budget": 1,
         "verify": t.get("verify", f"test -f app/{t['slug']}.py"), "depends": "none"}
        for t in tasks]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    argv_dir = tmp_path / "argv"
    proc = subprocess.run([ENV["FTL_BIN"], "campaign", "run", "stand-in campaign", "--plan",
                           str(tmp_path / "plan.json"), "--repo", str(repo), "--json"],
                          capture_output=True, text=True, timeout=180,
                          env={**ENV, "FTL_STAND_IN_LOG": str(argv_dir),
                               "FTL_STAND_IN_SCENARIOS": json.dumps(scenarios)})
    return proc.returncode, repo, _argv_log(argv_dir) if argv_dir.exists() else []


def test_a_stalled_builder_is_killed_and_resumed_in_the_same_session(tmp_path: Path) -> None:
    code, repo, runs = _campaign(tmp_path, [{"seq": "001", "slug": "slow"}], {"slow": "stall_once"},
                                 claude_toml="idle_timeout_s = 1")
    assert code == 0
    log = _events(repo)
    (failure,) = [e for e in log if e["event"] == "TOOL_FAILURE"]
    assert failure["error_type"] == "stalled" and failure["details"]["idle_timeout_s"] == 1
    assert [e["decision"] for e in log if e["event"] == "FAILURE_CLASSIFIED"] == ["retry"]
    first, second = runs
    assert "--resume" not in first["argv"]
    session = failure["details"]["session_id"]
    assert second["argv"][second["argv"].index("--resume") + 1] == session
    end = next(e for e in log if e["event"] == "TASK_END")
    assert end["status"] == "complete" and end["session_id"] == session


def test_error_max_turns_ends_the_task_budget_exhausted_and_observes(tmp_path: Path) -> None:
    code, repo, runs = _campaign(tmp_path, [{"seq": "001", "slug": "big"}], {"big": "max_turns"})
    assert code == 3
    log = _events(repo)
    (failure,) = [e for e in log if e["event"] == "TOOL_FAILURE"]
    assert failure["error_type"] == "budget_exhausted" and failure["details"]["max_turns"] == 10
    assert [e["decision"] for e in log if e["event"] == "FAILURE_CLASSIFIED"] == ["structural"]
    assert not [e for e in log if e["event"] == "RETRY"]
    end = next(e for e in log if e["event"] == "TASK_END")
    assert (end["status"], end["error_type"]) == ("blocked", "budget_exhausted")
    assert kind("budget_exhausted").route is Route.OBSERVE
    assert "OBSERVE" in [e["state"] for e in log if e["event"] == "STATE_ENTRY"]
    assert len(runs) == 1 and runs[0]["argv"][runs[0]["argv"].index("--max-turns") + 1] == "10"


def test_max_cost_usd_stops_new_agent_starts(tmp_path: Path) -> None:
    tasks = [{"seq": f"00{n}", "slug": f"mod-{n}"} for n in range(1, 4)]
    code, repo, runs = _campaign(tmp_path, tasks, {}, toml="max_cost_usd = 0.02")
    assert code == 3
    ends = {e["task_seq"]: e for e in _events(repo) if e["event"] == "TASK_END"}
    assert [ends[s]["status"] for s in ("001", "002", "003")] == ["complete", "complete", "blocked"]
    assert ends["003"]["error_type"] == "budget_exhausted"
    failure = next(e for e in _events(repo) if e["event"] == "TOOL_FAILURE")
    assert "max_cost_usd" in failure["message"] and failure["task_seq"] == "003"
    assert len(runs) == 2  # the third agent never started


def test_claude_as_planner_clarify_then_plan_with_its_cost(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "app").mkdir(parents=True)
    (repo / "app" / "__init__.py").write_text("")
    (repo / "ftl.toml").write_text(
        'builder = "claude"\nplanner = "claude"\njobs = 1\n'
        f"[claude]\ncommand = {json.dumps([sys.executable, str(STAND_IN)])}\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    argv_dir = tmp_path / "argv"
    proc = subprocess.run([ENV["FTL_BIN"], "campaign", "run", "write a planned module", "--repo",
                           str(repo), "--json"], capture_output=True, text=True, timeout=180,
                          env={**ENV, "FTL_STAND_IN_LOG": str(argv_dir),
                               "FTL_STAND_IN_SCENARIOS": json.dumps({"planner": "clarify_once"})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = _events(repo)
    decisions = [e for e in log if e["event"] == "PLAN_DECISION"]
    assert [(d["decision"], d["tool"]) for d in decisions] == [("CLARIFY", "claude_planner"),
                                                               ("PROCEED", "claude_planner")]
    assert decisions[0]["questions"] == ["Which module should hold the greeting?"]
    assert all(d["total_cost_usd"] == 0.031 for d in decisions)
    runs = _argv_log(argv_dir)
    assert [r["slug"] for r in runs] == ["planner", "planner", "planned"]
    assert runs[0]["argv"][runs[0]["argv"].index("--agent") + 1] == "ftl:planner"
    assert runs[0]["argv"][runs[0]["argv"].index("--max-turns") + 1] == "30"


def test_a_build_that_fails_its_verify_keeps_its_cost(tmp_path: Path) -> None:
    # The agent was paid for whatever came after it: a block on verify keeps the build's cost
    # in the store, so status, the postmortem and a resumed run's spend limit count it.
    code, repo, runs = _campaign(tmp_path, [{"seq": "001", "slug": "half", "verify": "false"}], {})
    assert code == 3 and len(runs) == 1
    status = subprocess.run([ENV["FTL_BIN"], "campaign", "status", "--repo", str(repo), "--json"],
                            capture_output=True, text=True, check=True, env=ENV)
    (task,) = json.loads(status.stdout)["data"]["tasks"]
    end = next(e for e in _events(repo) if e["event"] == "TASK_END")
    assert task["status"] == "blocked" and end["total_cost_usd"] > 0
    assert task["cost_usd"] == end["total_cost_usd"]


def test_a_build_re_run_after_a_merge_conflict_keeps_both_rounds_cost(tmp_path: Path) -> None:
    # Two agents write the same new file at once: the second to integrate conflicts and is built
    # again on the new head. Both builds were paid for; the task's cost is their sum.
    tasks = [{"seq": seq, "slug": f"mod-{seq}", "creates": ["app/shared.py"],
              "verify": "test -f app/shared.py"} for seq in ("001", "002")]
    code, repo, runs = _campaign(tmp_path, tasks, {}, jobs=2)
    assert code == 0
    log = _events(repo)
    (conflict,) = [e for e in log if e["event"] == "MERGE_CONFLICT"]
    seq = conflict["task_seq"]
    assert sorted(r["slug"] for r in runs) == sorted(["mod-001", "mod-002", f"mod-{seq}"])
    end = next(e for e in log if e["event"] == "TASK_END" and e["task_seq"] == seq)
    one_run = round(0.01 + 0.0025 * int(seq), 4)  # the stand-in's price of one success
    assert end["status"] == "complete"
    assert end["total_cost_usd"] == round(2 * one_run, 6) and end["num_turns"] == 6


def test_a_planner_out_of_turns_ends_the_campaign_exit_4_and_keeps_its_cost(tmp_path: Path) -> None:
    from ftl import events as ev

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ftl.toml").write_text(
        'builder = "claude"\nplanner = "claude"\njobs = 1\n'
        f"[claude]\ncommand = {json.dumps([sys.executable, str(STAND_IN)])}\n")
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "base"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       check=True, capture_output=True)
    proc = subprocess.run([ENV["FTL_BIN"], "campaign", "run", "plan something", "--repo", str(repo),
                           "--json"], capture_output=True, text=True, timeout=180,
                          env={**ENV, "FTL_STAND_IN_SCENARIOS": json.dumps({"planner": "max_turns"})})
    # budget_exhausted routes to OBSERVE and ends in COMPLETE, which must not call it a success
    assert proc.returncode == 4 and "Traceback" not in proc.stderr
    answer = json.loads(proc.stdout)
    assert not answer["success"] and answer["data"]["ftl_error_type"] == "budget_exhausted"
    assert answer["error"].startswith("The plan step used up its budget: Claude Code stopped at "
                                      "its turn limit")
    log = next((repo / ".ftl" / "events").glob("*.jsonl"))
    with replay([log]) as checked:  # a RETURN with its summary ends the story, as from ERROR
        assert checked.violations == []
    failures = [e for e in _events(repo) if e["event"] == "TOOL_FAILURE" and e["tool"] == "claude_planner"]
    assert failures and all(f["details"]["agent_cost"]["total_cost_usd"] == 0.05 for f in failures)
    # a resume of this campaign starts its spend from what these paid runs cost
    with ev.EventLog(log, log.stem) as writer:
        writer.emit("RUN_START")
    assert ev.earlier_planner_spend_usd(log) == pytest.approx(0.05 * len(failures))


def test_a_resumed_error_keeps_its_own_message(tmp_path: Path, monkeypatch) -> None:
    from ftl.config import load_config
    from ftl.engine.machine import State
    from ftl.engine.runner import Runner, connect_in_process
    from ftl.states import HANDLERS

    monkeypatch.setenv("FTL_STAND_IN_SCENARIOS", json.dumps({"planner": "max_turns"}))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ftl.toml").write_text('builder = "claude"\nplanner = "claude"\njobs = 1\n'
                                   f"[claude]\ncommand = {json.dumps([sys.executable, str(STAND_IN)])}\n")
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "base"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       check=True, capture_output=True)
    real = HANDLERS[State.ERROR]

    def killed(run: object) -> None:  # the kill lands as ERROR is entered (its record is saved)
        raise KeyboardInterrupt

    monkeypatch.setitem(HANDLERS, State.ERROR, killed)
    with Runner(repo, load_config(None, repo), client_factory=connect_in_process) as runner:
        assert runner.start("plan something").exit_code == 130
    monkeypatch.setitem(HANDLERS, State.ERROR, real)
    with Runner(repo, load_config(None, repo), client_factory=connect_in_process) as runner:
        resumed = runner.resume()
    assert resumed.exit_code == 4
    assert "The plan step used up its budget: Claude Code stopped" in resumed.summary["message"]


def test_a_reused_agent_build_that_then_blocks_is_paid_once(tmp_path: Path) -> None:
    # The build finished (and was paid), ftl died during verify; the resume reuses the build,
    # its verify fails: the blocked attempt must not carry the earlier attempt's cost again.
    import signal
    import time

    from ftl.store import Store

    repo, check = tmp_path / "repo", tmp_path / "check.sh"
    repo.mkdir()
    (repo / "ftl.toml").write_text('builder = "claude"\njobs = 1\n'
                                   f"[claude]\ncommand = {json.dumps([sys.executable, str(STAND_IN)])}\n")
    check.write_text("sleep 60\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                       check=True, capture_output=True)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "x", "tasks": [{
        "seq": "001", "slug": "greet", "type": "BUILD", "delta": ["greet.py"],
        "verify": f"sh {check}", "budget": 3, "depends": "none"}]}))
    first = subprocess.Popen([ENV["FTL_BIN"], "campaign", "run", "--plan", str(plan), "--repo", str(repo)],
                             start_new_session=True, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            e["event"] == "TOOL_CALL" and e.get("tool") == "run_verify"
            for e in (_events(repo) if (repo / ".ftl" / "events").is_dir() else [])):
        time.sleep(0.1)
    time.sleep(0.3)
    os.killpg(first.pid, signal.SIGKILL)  # ftl and the verify it runs
    first.wait()
    check.write_text("exit 1\n")
    resumed = subprocess.run([ENV["FTL_BIN"], "campaign", "resume", "--repo", str(repo),
                              "--kill-leftovers"], env=ENV,
                             capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 3, resumed.stderr[-2000:]
    status = json.loads(subprocess.run([ENV["FTL_BIN"], "campaign", "status", "--repo", str(repo),
                                        "--json"], env=ENV, capture_output=True, text=True).stdout)
    with Store.for_repo(repo) as store:
        rows = store.workspaces(store.latest_campaign()["id"])
    assert [row["status"] for row in rows] == ["built", "blocked"]
    paid = rows[0]["result"]["total_cost_usd"]
    assert status["data"]["campaign"]["cost_usd"] == pytest.approx(paid)  # not twice
