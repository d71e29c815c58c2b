"""Each FTL error type produced by ftl's own checks in a real campaign run (issue 15 item 3).

Every test drives `Runner` on a scratch repository with ftl's embedded MangleCP server in
process and real shell commands; nothing is raised by hand. `ftl.surfaces.errors_doc.PRODUCED_BY` names
these tests (and a few elsewhere) as the producers shown in ``docs/errors.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ftl.config import Config
from ftl.events import read_events
from ftl.postmortem.replay import replay
from ftl.engine.runner import RunResult, Runner, connect_in_process

ROOT = Path(__file__).resolve().parents[1]
FAKE_AGENT = ROOT / "tests" / "tools" / "fake_agent.py"


def start(repo: Path, tasks: list[dict[str, Any]], *, revised: list[dict[str, Any]] | None = None,
          **config: Any) -> tuple[RunResult, list[dict[str, Any]]]:
    settings = {"jobs": 1, "explorer_timeout_s": 30, "retry_backoff_min_s": 0.01, **config}
    runner = Runner(repo, Config(**settings), client_factory=connect_in_process)
    plan = {"objective": "producer drill", "tasks": tasks}
    result = runner.start("producer drill", plan_input=plan,
                          revised_plan_input=None if revised is None else
                          {"objective": "producer drill", "tasks": revised})
    events = list(read_events(result.log_path))
    assert replay([result.log_path]).violations == []
    return result, events


def task(seq: str, run: str, verify: str = "true", **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "slug": f"task-{seq}", "creates": [f"out/{seq}"], "run": run,
            "verify": verify, "budget": 1, **extra}


def failures(events: list[dict[str, Any]]) -> list[str]:
    return [e["error_type"] for e in events if e["event"] == "TOOL_FAILURE"]


def routes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["error_type"], e["route"]) for e in events if e["event"] == "ERROR_ROUTE"]


def blocked_reason(result: RunResult, seq: str) -> str:
    return next(t for t in result.summary["tasks"] if t["seq"] == seq)["block_reason"] or ""


# A root task that fails and two dependents it makes unreachable (cascade drills).
FAILING_ROOT = [task("001", "echo 'boom' && exit 1"),
                task("002", "mkdir -p out && touch out/002", depends="001"),
                task("003", "mkdir -p out && touch out/003", depends="001")]
FIXED_ROOT = [task("001", "mkdir -p out && touch out/001")]


def test_build_past_its_timeout_is_timeout_then_budget_exhausted(tmp_path: Path) -> None:
    result, events = start(tmp_path, [task("001", "sleep 5", timeout_s=0.3)])
    assert result.exit_code == 3
    assert failures(events) == ["timeout", "timeout"]  # the first try and its one retry
    assert sum(e["event"] == "RETRY" for e in events) == 1
    assert blocked_reason(result, "001").startswith("budget_exhausted")


def test_no_explorer_left_is_quorum_failure(tmp_path: Path) -> None:
    result, events = start(tmp_path, [task("001", "true")],
                           gates={"expose": {"exclude": ["explore_*"]}})
    assert result.exit_code == 4
    assert routes(events) == [("quorum_failure", "return_partial")]
    assert result.summary["error"]["error_type"] == "quorum_failure"
    assert not any(e["event"] == "TOOL_CALL" and e["tool"].startswith("explore_") for e in events)


def test_plan_that_breaks_its_schema_is_schema_invalid(tmp_path: Path) -> None:
    result, events = start(tmp_path, [task("001", "true", slug="Not A Slug")])
    assert result.exit_code == 4
    assert routes(events) == [("schema_invalid", "return_errors")]
    assert result.summary["violations"][0]["path"] == "$.tasks[0].slug"


def test_plan_with_a_dependency_cycle_is_cycle_detected(tmp_path: Path) -> None:
    result, events = start(tmp_path, [task("001", "true", depends="002"),
                                      task("002", "true", depends="001")])
    assert result.exit_code == 4
    assert routes(events) == [("cycle_detected", "return_errors")]
    assert "001 -> 002 -> 001" in result.summary["cycle"] or "002 -> 001 -> 002" in result.summary["cycle"]


def test_verify_that_keeps_failing_is_verify_failed(tmp_path: Path) -> None:
    result, events = start(tmp_path, [task("001", "mkdir -p out && touch out/001", verify="false")])
    assert result.exit_code == 3
    assert set(failures(events)) == {"flaky_test"}  # transient while it might be flaky ...
    assert blocked_reason(result, "001").startswith("verify_failed")  # ... then structural


def test_change_outside_the_delta_is_workspace_invalid(tmp_path: Path) -> None:
    result, events = start(tmp_path, [task("001", "mkdir -p out && touch out/001 elsewhere.txt")])
    assert result.exit_code == 3
    assert failures(events) == ["workspace_invalid"]
    assert "elsewhere.txt" in blocked_reason(result, "001")


def test_replan_limit_reached_while_stuck_is_cascade_stuck(tmp_path: Path) -> None:
    planner = [sys.executable, str(FAKE_AGENT), "plan-json"]
    result, events = start(tmp_path, FAILING_ROOT, planner_command=planner, max_replans=0)
    assert result.exit_code == 4
    assert routes(events) == [("cascade_stuck", "cascade_analysis")]
    assert result.summary["cascade_analysis"]["unreachable_count"] == 2
    assert actions_after_analysis(events) == [("stuck", "cascade_stuck")]


def test_replanner_without_a_plan_is_decision_unknown(tmp_path: Path) -> None:
    planner = [sys.executable, str(FAKE_AGENT), "clarify"]
    result, events = start(tmp_path, FAILING_ROOT, planner_command=planner)
    assert result.exit_code == 3
    assert "decision_unknown" in failures(events)
    merge = [e for e in events if e["event"] == "CASCADE_MERGE_FAILED"]
    assert [e["error_type"] for e in merge] == ["decision_unknown"]
    assert actions_after_analysis(events) == [("replan", "CASCADE_REPLAN")]  # tried, then propagated
    assert {t["status"] for t in result.summary["tasks"]} == {"blocked"}


def test_execute_past_max_iterations_is_iteration_exhausted(tmp_path: Path) -> None:
    result, events = start(tmp_path, FAILING_ROOT, revised=FIXED_ROOT, max_iterations=1)
    assert ("iteration_exhausted", "cascade") in routes(events)
    assert actions_after_analysis(events)[0] == ("replan", "CASCADE_REPLAN")
    assert [e["state"] for e in events if e["event"] == "STATE_ENTRY"].count("EXECUTE") == 2


def test_the_same_ready_set_again_is_stuck_detected(tmp_path: Path) -> None:
    result, events = start(tmp_path, FAILING_ROOT, revised=FIXED_ROOT, stuck_threshold=1)
    ready = [e["seqs"] for e in events if e["event"] == "READY_TASKS"]
    assert ready[:2] == [["001"], ["001"]]  # the re-plan re-opened the same root
    assert ("stuck_detected", "cascade") in routes(events)


# --- issue 15 item 5: what CASCADE_ANALYSIS recommends is what the runner does next

def actions_after_analysis(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(recommendation, the cascade action that followed it) for every analysis."""
    pairs = []
    for index, event in enumerate(events):
        if event["event"] != "CASCADE_ANALYSIS":
            continue
        for later in events[index + 1:]:
            if later["event"] in ("CASCADE_REPLAN", "CASCADE_PROPAGATE"):
                pairs.append((event["recommendation"], later["event"]))
                break
            if later["event"] == "RECOVERY_ATTEMPT" and later.get("strategy") == "retry_root":
                pairs.append((event["recommendation"], "retry_root"))
                break
            if later["event"] == "ERROR_ROUTE":
                pairs.append((event["recommendation"], later["error_type"]))
                break
    return pairs


def test_without_a_planner_the_analysis_recommends_what_happens(tmp_path: Path) -> None:
    result, events = start(tmp_path, FAILING_ROOT)
    assert result.exit_code == 3
    assert actions_after_analysis(events) == [("propagate", "CASCADE_PROPAGATE")]


def flaky_network_root(counter: Path, failures: int) -> list[dict[str, Any]]:
    """A root whose command fails like a refused connection for its first ``failures`` runs."""
    script = (f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; "
              f"if [ $n -lt {failures} ]; then echo 'curl: (7) Connection refused' >&2; exit 7; fi; "
              "mkdir -p out && touch out/001")
    return [task("001", script), *FAILING_ROOT[1:]]


def test_a_transient_root_is_retried_once_before_propagation(tmp_path: Path) -> None:
    # Attempt 1 fails twice (the try and its protocol retry); CASCADE re-opens it; attempt 2 works.
    (tmp_path / "repo").mkdir()
    result, events = start(tmp_path / "repo", flaky_network_root(tmp_path / "count", failures=2))
    assert result.exit_code == 0, result.summary
    assert actions_after_analysis(events) == [("retry", "retry_root")]
    assert {t["status"] for t in result.summary["tasks"]} == {"complete"}


def test_a_transient_root_that_fails_again_is_propagated(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    result, events = start(tmp_path / "repo", flaky_network_root(tmp_path / "count", failures=99))
    assert result.exit_code == 3
    assert actions_after_analysis(events) == [("retry", "retry_root"),
                                              ("propagate", "CASCADE_PROPAGATE")]
    assert (tmp_path / "count").read_text().strip() == "4"  # 2 attempts x (try + retry)


# --- issue 15 item 5: an approver that never answers is asked once per task attempt

def test_an_approver_that_never_answers_is_asked_once_per_attempt(tmp_path: Path) -> None:
    asked = tmp_path / "asked"
    approver = [sys.executable, "-c", "import sys, time; open(sys.argv[1], 'a').write('asked\\n'); "
                                      "time.sleep(30)", str(asked)]
    gates = {"governance": {"rules": [{"match": {"tool": "shell_builder"}, "action": "approve"}]},
             "approval": {"mode": "command", "command": approver, "timeout_s": 0.5,
                          "on_timeout": "deny"}}
    (tmp_path / "repo").mkdir()
    result, events = start(tmp_path / "repo", [task("001", "mkdir -p out && touch out/001")],
                           gates=gates)
    assert result.exit_code == 3
    assert asked.read_text().splitlines() == ["asked"]  # once, not once more by a retry
    assert failures(events) == ["approval_timeout"]
    classified = [e for e in events if e["event"] == "FAILURE_CLASSIFIED"]
    assert [(e["error_type"], e["klass"]) for e in classified] == [("approval_timeout", "structural")]
    assert not any(e["event"] == "RETRY" for e in events)
    assert blocked_reason(result, "001").startswith("approval_timeout")
