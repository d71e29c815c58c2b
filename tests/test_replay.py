"""Tests for ftl.postmortem.replay: hand-built logs in tests/logs/ (one clean run, one file per planted
violation, a crash and its resume, a torn tail), two real logs of the failure drill (a clean run
and a run killed mid-EXECUTE then resumed into the same file), logs built here to break one rule
at a time, a log written by the real recovery protocol, the decision diff, the CLI, and a
fuzz that feeds replay arbitrary events."""

from __future__ import annotations

import json
import re
import threading
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl import events as ev
from ftl.surfaces.cli import main as ftl_main
from ftl.errors import FtlError
from ftl.engine.recovery import RecoveryProtocol, RetryPolicy, escalate_flaky
from ftl.postmortem.replay import RULES, Replay, diff_decisions, render_diff_text, render_text, replay

LOGS = Path(__file__).parent / "logs"
DRILL = LOGS / "drill.jsonl"
CRASH = LOGS / "drill_crash_resume.jsonl"


def _rules(result: Replay) -> list[tuple[str, int | None]]:
    return [(v.rule, v.seq) for v in result.violations]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (LOGS / name).read_text().splitlines()]


class _Log:
    """Builds a log record by record (seq and ts filled in), for one-rule-at-a-time tests."""

    def __init__(self, mode: str = "campaign", **start: object) -> None:
        self.records: list[dict] = []
        self.state: str | None = None
        self.add(ev.RUN_START, state=None, mode=mode, objective="o", resume=False, **start)

    def add(self, event: str, **fields: object) -> dict:
        fields.setdefault("state", self.state)
        record = {"seq": len(self.records) + 1, "ts": f"2026-11-21T10:00:{len(self.records):02d}.000Z",
                  "campaign_id": "c-built", "event": event, **fields}
        self.records.append(record)
        return record

    def enter(self, state: str, **fields: object) -> dict:
        self.state = state
        return self.add(ev.STATE_ENTRY, state=state, **fields)

    def move(self, trigger: str, to: str, **entry: object) -> None:
        self.add(ev.PHASE_TRANSITION, **{"from": self.state.lower(), "to": to.lower(), "trigger": trigger})
        self.enter(to, **entry)

    def to_execute(self, depends: dict[str, list[str]] | None = None) -> "_Log":
        self.enter("INIT")
        self.move("explore", "EXPLORE")
        self.move("plan", "PLAN")
        self.move("register", "REGISTER")
        depends = depends or {"001": []}
        self.add(ev.PLAN_REGISTERED, tasks=len(depends), seqs=list(depends), depends=depends,
                 slugs={s: f"task-{s}" for s in depends})
        self.move("execute", "EXECUTE")
        return self

    def failure(self, op: str, task: str | None, error_type: str, klass: str, decision: str,
                **extra: object) -> dict:
        failure = self.add(ev.TOOL_FAILURE, op_id=op, tool="run_verify", task_seq=task, attempt=1,
                           error_type=error_type, message=f"{error_type} happened")
        self.add(ev.FAILURE_CLASSIFIED, op_id=op, task_seq=task, failure_seq=failure["seq"],
                 error_type=error_type, klass=klass, decision=decision, **extra)
        return failure

    def finish_clean(self) -> "_Log":
        self.move("cascade", "CASCADE")
        self.add(ev.CASCADE_STATUS, cascade_state="none", unreachable=[])
        self.move("observe", "OBSERVE")
        self.move("complete", "COMPLETE")
        self.add(ev.RUN_END, outcome="complete", exit_code=0)
        return self

    def replay(self, tmp_path: Path, name: str = "built.jsonl") -> Replay:
        return replay([_write(tmp_path / name, self.records)])


# --------------------------------------------------------------------------- the clean runs

def test_clean_run_has_no_violations() -> None:
    result = replay([LOGS / "clean.jsonl"])
    assert result.violations == []
    assert (result.campaign_id, result.events, result.outcome, result.exit_code) == \
        ("c-clean", 30, "complete", 0)
    assert not result.torn_tail and result.invalid_lines == [] and result.crash_boundaries == []
    assert "invariants: all hold" in render_text(result)


def test_clean_run_timeline() -> None:
    result = replay([LOGS / "clean.jsonl"])
    assert [s.state for s in result.states] == [
        "INIT", "EXPLORE", "PLAN", "REGISTER", "EXECUTE", "CASCADE", "OBSERVE", "COMPLETE"]
    # ts advances 100 ms per seq; a state lasts from its entry to its PHASE_TRANSITION (RUN_END).
    assert [s.duration_ms for s in result.states] == [100, 200, 200, 200, 900, 200, 200, 100]
    assert [(s.trigger, s.to) for s in result.states][:2] == [("explore", "EXPLORE"), ("plan", "PLAN")]
    (attempt,) = result.attempts
    assert (attempt.seq, attempt.worker, attempt.attempt, attempt.status) == ("001", "w1", 1, "complete")
    assert attempt.failures == [17] and attempt.retries == 1
    (failure,) = result.failures
    assert (failure.seq, failure.error_type, failure.klass, failure.decision, failure.outcome) == \
        (17, "network_error", "transient", "retry", "retried")
    (retry,) = result.retries
    assert (retry["seq"], retry["attempt"], retry["wait_ms"], retry["op_id"]) == (19, 2, 500, "op1")
    assert result.cascade == [{"seq": 24, "event": ev.CASCADE_STATUS, "cascade_state": "none",
                               "unreachable": []}]
    json.dumps(result.to_json())


def test_returned_from_error_with_a_summary_is_clean() -> None:
    result = replay([LOGS / "returned_from_error.jsonl"])
    assert result.violations == []
    assert result.outcome == "returned" and result.exit_code == 4
    assert result.states[-1].state == "ERROR" and result.states[-1].error_type == "schema_invalid"
    assert result.failures[0].decision == "error" and result.failures[0].outcome == "error"
    assert result.summary["message"].startswith("Returned from ERROR")


def test_the_real_failure_drill_log_is_rebuilt() -> None:
    result = replay([DRILL])
    assert result.violations == [] and result.outcome == "complete_with_blocked" and result.exit_code == 3
    assert [s.state for s in result.states] == [
        "INIT", "EXPLORE", "PLAN", "REGISTER", "EXECUTE", "CASCADE", "OBSERVE", "COMPLETE"]
    statuses = {t.seq: (t.status, t.blocked_by) for t in result.ordered_tasks()}
    assert statuses == {"001": ("complete", []), "002": ("blocked", []), "003": ("blocked", ["002"]),
                        "004": ("blocked", ["002"]), "005": ("complete", []), "006": ("complete", [])}
    assert result.tasks["004"].depends == ["003", "006"] and result.tasks["002"].slug == "yaml-export"
    flaky, missing = result.failures
    assert (flaky.task_seq, flaky.error_type, flaky.klass, flaky.decision, flaky.outcome) == \
        ("001", "flaky_test", "transient", "retry", "retried")
    assert (missing.task_seq, missing.error_type, missing.klass, missing.outcome) == \
        ("002", "dependency_missing", "structural", "recovered:block_task")
    (block,) = result.blocks()
    assert (block["root"], block["error_type"], block["blocked"]) == ("002", "dependency_missing", ["003", "004"])
    assert "ModuleNotFoundError" in block["reason"]
    text = render_text(result)
    assert "root 002 (dependency_missing" in text and "blocks 003, 004" in text


# --------------------------------------------------------------------------- planted violations

PLANTED = [
    # (file, the exact violations (rule, seq) it must produce)
    ("retry_before_classified.jsonl", [("classify_before_act", 18), ("emit_before_retry", 18)]),
    ("two_transient_retries.jsonl", [("retry_limit", 22)]),
    ("three_flaky_retries.jsonl", [("retry_limit", 25)]),
    ("action_outside_state.jsonl", [("action_in_state", 7)]),
    ("error_without_type.jsonl", [("error_state", 11)]),
    ("error_misrouted.jsonl", [("error_route", 19)]),
    ("seq_not_increasing.jsonl", [("seq_increasing", 12)]),
    ("task_restarted.jsonl", [("task_transitions", 18)]),
    ("no_run_end.jsonl", [("ends_properly", None)]),
    ("return_without_summary.jsonl", [("ends_properly", 13)]),
]


@pytest.mark.parametrize("name,expected", PLANTED, ids=[p[0].removesuffix(".jsonl") for p in PLANTED])
def test_each_planted_violation_is_reported_with_rule_and_seq(name: str, expected: list) -> None:
    result = replay([LOGS / name])
    assert _rules(result) == expected
    text = render_text(result)
    assert f"violations ({len(expected)}):" in text
    for rule, seq in expected:
        assert f"seq {seq}: [{rule}]" in text
        assert rule in RULES


def test_planted_logs_differ_from_the_clean_run_only_where_planted() -> None:
    """Guards the fixtures: the transient-retry log is the clean run plus one extra retry round."""
    clean, planted = _lines("clean.jsonl"), _lines("two_transient_retries.jsonl")
    assert [e["event"] for e in planted[:19]] == [e["event"] for e in clean[:19]]
    assert [e["event"] for e in planted[19:22]] == [ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED, ev.RETRY]
    assert planted[20]["decision"] == "retry" and planted[20]["failure_seq"] == 20


def test_violation_messages_name_the_problem() -> None:
    assert replay([LOGS / "seq_not_increasing.jsonl"]).violations[0].message == "seq 12 after 20"
    misrouted = replay([LOGS / "error_misrouted.jsonl"]).violations[0].message
    assert "cycle_detected" in misrouted and "return_errors" in misrouted
    flaky = replay([LOGS / "three_flaky_retries.jsonl"]).violations[0].message
    assert "limit 2" in flaky


def test_action_naming_another_state_is_reported(tmp_path: Path) -> None:
    records = _lines("clean.jsonl")
    records[4] = {**records[4], "state": "PLAN"}  # EXPLORER_RESULT while in EXPLORE
    result = replay([_write(tmp_path / "wrong.jsonl", records)])
    assert _rules(result) == [("action_in_state", 5)]
    assert "names state PLAN, current EXPLORE" in result.violations[0].message


def test_leaving_error_without_a_route_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("error_misrouted.jsonl") if r["event"] != ev.ERROR_ROUTE]
    result = replay([_write(tmp_path / "noroute.jsonl", records)])
    assert _rules(result) == [("error_route", 20)]


def test_a_failure_never_classified_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("returned_from_error.jsonl") if r["event"] != ev.FAILURE_CLASSIFIED]
    result = replay([_write(tmp_path / "unclassified.jsonl", records)])
    # Going to ERROR is an action on the failure: reported there, and again at the end.
    assert _rules(result) == [("classify_before_act", 10), ("classify_before_act", 8)]


def test_a_task_still_running_at_the_end_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("clean.jsonl") if r["event"] != ev.TASK_END]
    result = replay([_write(tmp_path / "running.jsonl", records)])
    assert _rules(result) == [("task_transitions", 30)]


def test_a_completed_run_outside_complete_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("clean.jsonl") if not (r["event"] == ev.STATE_ENTRY
                                                         and r["state"] == "COMPLETE")]
    result = replay([_write(tmp_path / "nocomplete.jsonl", records)])
    assert ("ends_properly", 30) in _rules(result)


def test_a_returned_run_without_return_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("returned_from_error.jsonl") if r["event"] != ev.RETURN]
    result = replay([_write(tmp_path / "noreturn.jsonl", records)])
    assert _rules(result) == [("ends_properly", 14)]


# --------------------------------------------------------------------------- one rule at a time

def test_a_built_clean_log_is_clean(tmp_path: Path) -> None:
    log = _Log().to_execute()
    log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
    log.add(ev.TASK_END, task_seq="001", worker="w1", status="complete")
    assert log.finish_clean().replay(tmp_path).violations == []


def test_an_illegal_state_transition_is_reported(tmp_path: Path) -> None:
    log = _Log()
    log.enter("INIT")
    log.move("explore", "EXPLORE")
    log.move("plan", "PLAN")
    log.move("execute", "EXECUTE")  # PLAN cannot go straight to EXECUTE
    result = log.replay(tmp_path)
    (violation,) = [v for v in result.violations if v.rule == "state_transitions"]
    assert violation.seq == 7 and "PLAN -execute-> EXECUTE" in violation.message


def test_entering_another_state_than_the_transition_named_is_reported(tmp_path: Path) -> None:
    log = _Log()
    log.enter("INIT")
    log.add(ev.PHASE_TRANSITION, **{"from": "init", "to": "explore", "trigger": "explore"})
    log.enter("PLAN")
    assert ("state_transitions", 4) in _rules(log.replay(tmp_path))


def test_the_task_flow_has_its_own_transitions(tmp_path: Path) -> None:
    log = _Log(mode="task")
    log.enter("INIT")
    for trigger, state in (("explore", "EXPLORE"), ("plan", "PLAN"), ("build", "BUILD"),
                           ("observe", "OBSERVE"), ("complete", "COMPLETE")):
        log.move(trigger, state)
    log.add(ev.RUN_END, outcome="complete", exit_code=0)
    assert log.replay(tmp_path).violations == []


def test_error_entered_by_another_trigger_or_without_a_failure_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute()
    log.add(ev.PHASE_TRANSITION, **{"from": "execute", "to": "error", "trigger": "cascade"})
    rules = _rules(log.replay(tmp_path))
    assert ("error_state", len(log.records)) in rules  # not 'fail', and no TOOL_FAILURE first
    assert [r for r, _ in rules].count("error_state") == 2


def test_error_must_take_the_route_it_wrote(tmp_path: Path) -> None:
    log = _Log().to_execute()
    log.failure("op1", None, "stuck_detected", "structural", "error")
    log.move("fail", "ERROR", error_type="stuck_detected", route="cascade")
    log.add(ev.ERROR_ROUTE, error_type="stuck_detected", route="cascade")
    log.move("observe", "OBSERVE")  # the route said CASCADE
    assert ("error_route", len(log.records) - 1) in _rules(log.replay(tmp_path))


def test_documented_route_overrides_are_accepted(tmp_path: Path) -> None:
    # A PLAN-routed error from outside EXPLORE returns a summary (states/error.py).
    log = _Log().to_execute()
    log.failure("op1", None, "timeout", "transient", "error")
    log.move("fail", "ERROR", error_type="timeout", route="plan")
    log.add(ev.ERROR_ROUTE, error_type="timeout", route="summary")
    log.add(ev.RETURN, reason="timeout", route="summary", summary={"message": "m"})
    log.add(ev.RUN_END, outcome="returned", exit_code=4)
    assert log.replay(tmp_path).violations == []


def test_retrying_a_structural_failure_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute()
    log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
    log.failure("op1", "001", "task_failed", "structural", "retry")
    retry = log.add(ev.RETRY, op_id="op1", tool="run_verify", task_seq="001", attempt=2, wait_ms=1)
    result = log.replay(tmp_path)
    assert ("retry_limit", retry["seq"]) in _rules(result)


def test_a_classification_that_contradicts_the_registry_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute()
    failure = log.failure("op1", None, "network_error", "structural", "structural")
    assert ("classify_before_act", failure["seq"] + 1) in _rules(log.replay(tmp_path))


def test_the_retry_limit_comes_from_the_run_config(tmp_path: Path) -> None:
    log = _Log(config={"transient_retries": 2, "flaky_verify_retries": 2}).to_execute()
    for attempt in (1, 2):
        log.failure("op1", None, "network_error", "transient", "retry")
        log.add(ev.RETRY, op_id="op1", tool="invoke", attempt=attempt + 1, wait_ms=5,
                error_type="network_error")
    assert [r for r, _ in _rules(log.replay(tmp_path))].count("retry_limit") == 0


def test_a_task_started_before_its_dependency_completed_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute({"001": [], "002": ["001"]})
    log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
    start = log.add(ev.TASK_START, task_seq="002", worker="w2", attempt=1)
    result = log.replay(tmp_path)
    assert ("task_transitions", start["seq"]) in _rules(result)
    assert "before 001 completed" in result.violations[0].message


def test_a_dependency_cut_by_a_crash_may_have_completed(tmp_path: Path) -> None:
    """A kill between the store's 'complete' and TASK_END: the resume starts the dependent."""
    log = _Log().to_execute({"001": [], "002": ["001"]})
    log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
    log.add(ev.RUN_START, state=None, mode="campaign", resume=True)
    log.add(ev.RESUME, state=None, from_state="EXECUTE", reset_tasks=[])
    log.enter("EXECUTE", resumed=True)
    log.add(ev.TASK_START, task_seq="002", worker="w1", attempt=1)
    log.add(ev.TASK_END, task_seq="002", worker="w1", status="complete")
    result = log.finish_clean().replay(tmp_path)
    assert result.violations == [] and result.crash_boundaries == [13]
    assert result.runs[0].interrupted_tasks == ["001"]
    assert result.tasks["001"].status == "complete"  # inferred: the store let 002 start


def test_a_task_the_resume_reset_is_pending_again(tmp_path: Path) -> None:
    log = _Log().to_execute({"001": [], "002": []})
    for task in ("001", "002"):
        log.add(ev.TASK_START, task_seq=task, worker=f"w{task[-1]}", attempt=1)
    log.add(ev.RUN_START, state=None, mode="campaign", resume=True)
    log.add(ev.RESUME, state=None, from_state="EXECUTE", reset_tasks=["002"])
    result = log.replay(tmp_path)
    # 002 was still running in the store: back to pending. 001's end was committed, not logged.
    assert result.tasks["002"].status == "pending" and result.tasks["001"].status == "interrupted"


def test_a_blocked_task_restarts_only_after_a_replan(tmp_path: Path) -> None:
    def build(replan: bool) -> _Log:
        log = _Log().to_execute()
        log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
        log.failure("op1", "001", "task_failed", "structural", "structural")
        log.add(ev.RECOVERY_ATTEMPT, strategy="block_task", success=True, task_seq="001", op_id="op1",
                error_type="task_failed")
        log.add(ev.TASK_END, task_seq="001", worker="w1", status="blocked", error_type="task_failed")
        log.move("cascade", "CASCADE")
        if replan:
            log.add(ev.CASCADE_REPLAN, affected=2)
            log.add(ev.RECOVERY_ATTEMPT, strategy="replan", success=True, merged=1)
        log.move("execute", "EXECUTE")
        log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=2)
        log.failure("op2", "001", "network_error", "transient", "retry")
        log.add(ev.RETRY, op_id="op2", tool="run_verify", task_seq="001", attempt=2, wait_ms=5)
        log.add(ev.TASK_END, task_seq="001", worker="w1", status="complete")
        return log.finish_clean()

    without = build(False).replay(tmp_path, "a.jsonl")
    assert [r for r, _ in _rules(without)] == ["task_transitions"]
    assert "started while blocked, without a re-plan" in without.violations[0].message
    result = build(True).replay(tmp_path, "b.jsonl")
    assert result.violations == []
    first, second = result.attempts
    # Every attempt keeps its own failures, not only the last one.
    assert [result.failure(s).error_type for s in first.failures] == ["task_failed"]
    assert [result.failure(s).error_type for s in second.failures] == ["network_error"]
    assert first.recoveries == ["block_task"] and second.retries == 1
    assert result.tasks["001"].status == "complete" and result.tasks["001"].attempts == 2


def test_a_recovery_of_an_unknown_operation_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute()
    recovery = log.add(ev.RECOVERY_ATTEMPT, strategy="block_task", success=True, op_id="op9")
    assert _rules(log.replay(tmp_path))[0] == ("emit_before_retry", recovery["seq"])


def test_ending_a_task_before_its_failure_is_classified_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute()
    log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
    log.add(ev.TOOL_FAILURE, op_id="op1", tool="shell_builder", task_seq="001", error_type="task_failed")
    end = log.add(ev.TASK_END, task_seq="001", worker="w1", status="blocked")
    assert ("classify_before_act", end["seq"]) in _rules(log.replay(tmp_path))


def test_propagating_a_block_onto_a_complete_task_is_reported(tmp_path: Path) -> None:
    log = _Log().to_execute()
    log.add(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
    log.add(ev.TASK_END, task_seq="001", worker="w1", status="complete")
    log.move("cascade", "CASCADE")
    bad = log.add(ev.CASCADE_PROPAGATE, propagated=[{"seq": "001", "blocked_by": ["009"]}])
    assert ("task_transitions", bad["seq"]) in _rules(log.replay(tmp_path))


def test_a_kill_between_run_end_and_the_store_resumes_cleanly(tmp_path: Path) -> None:
    """RUN_END is written before the store finishes the campaign; a resume then finishes again."""
    log = _Log().to_execute()
    log.finish_clean()
    log.add(ev.RUN_START, state=None, mode="campaign", resume=True)
    log.add(ev.RESUME, state=None, from_state="COMPLETE", reset_tasks=[])
    log.enter("COMPLETE", resumed=True)
    log.add(ev.RUN_END, outcome="complete", exit_code=0)
    result = log.replay(tmp_path)
    assert result.violations == [] and result.crash_boundaries == [] and len(result.runs) == 2


# --------------------------------------------------------------------------- crash, resume, torn

def test_crash_then_resume_replays_clean_with_a_crash_boundary() -> None:
    result = replay([LOGS / "crashed.jsonl", LOGS / "resume.jsonl"])
    assert result.violations == []
    assert result.crash_boundaries == [17]
    assert result.outcome == "complete"
    # The attempt that died with the process stays visible, without an end.
    assert [(a.attempt, a.status) for a in result.attempts] == [(1, None), (2, "complete")]
    # The state the crash cut ends at the dead process's last event, not at the resume.
    execute = [s for s in result.states if s.state == "EXECUTE"]
    assert execute[0].end == _lines("crashed.jsonl")[-1]["ts"] and execute[0].interrupted
    assert execute[1].resumed
    text = render_text(result)
    assert "crash boundary before seq 17 (the run was resumed)" in text
    assert "tasks in flight: 001" in text
    assert "invariants: all hold" in text
    assert "001 attempt 1 on w1: interrupted" in text


def test_a_real_crash_and_resume_in_one_file() -> None:
    """ftl's resume appends to the same log: the boundary is found inside one file."""
    result = replay([CRASH])
    assert result.violations == [] and result.crash_boundaries == [32]
    crashed, resumed = result.runs
    assert crashed.crashed and crashed.last_seq == 31 and crashed.interrupted_state == "EXECUTE"
    assert crashed.interrupted_tasks == ["001", "006"]
    assert (resumed.resume, resumed.outcome, resumed.exit_code) == (True, "complete_with_blocked", 3)
    interrupted = [(a.seq, a.run) for a in result.attempts if a.status is None]
    assert interrupted == [("001", 0), ("006", 0)]
    assert {t.seq: t.status for t in result.ordered_tasks()} == {
        "001": "complete", "002": "blocked", "003": "blocked", "004": "blocked",
        "005": "complete", "006": "complete"}


def test_the_same_story_split_into_two_files_replays_the_same(tmp_path: Path) -> None:
    records = [json.loads(line) for line in CRASH.read_text().splitlines()]
    first = _write(tmp_path / "crashed.jsonl", [r for r in records if r["seq"] < 32])
    second = _write(tmp_path / "resumed.jsonl", [r for r in records if r["seq"] >= 32])
    split, whole = replay([first, second]), replay([CRASH])
    assert split.to_json() | {"files": None, "runs": None} == whole.to_json() | {"files": None, "runs": None}
    assert [r.file for r in split.runs] == ["crashed.jsonl", "resumed.jsonl"]


def test_the_crashed_log_alone_ends_without_run_end() -> None:
    assert _rules(replay([LOGS / "crashed.jsonl"])) == [("ends_properly", None)]


def test_logs_in_the_wrong_order_break_seq() -> None:
    result = replay([LOGS / "resume.jsonl", LOGS / "crashed.jsonl"])
    assert ("seq_increasing", 1) in _rules(result)


def test_torn_last_line_sets_torn_tail_and_keeps_the_rest() -> None:
    result = replay([LOGS / "torn_tail.jsonl"])
    assert result.torn_tail and result.torn_tails == ["torn_tail.jsonl"] and result.invalid_lines == []
    assert result.events == 29
    assert _rules(result) == [("ends_properly", None)]  # the torn line was RUN_END itself
    assert "warning: torn_tail.jsonl: the last line was torn" in render_text(result)


def test_a_torn_tail_before_the_resume_is_a_warning_not_a_violation(tmp_path: Path) -> None:
    records = CRASH.read_text().splitlines(keepends=True)
    crashed = "".join(r for r in records if json.loads(r)["seq"] < 32) + records[31][:40]
    (tmp_path / "a.jsonl").write_text(crashed)
    (tmp_path / "b.jsonl").write_text("".join(r for r in records if json.loads(r)["seq"] >= 32))
    result = replay([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert result.torn_tails == ["a.jsonl"] and result.violations == []
    assert any("torn" in w for w in result.warnings())


def test_a_repaired_tail_is_reported_as_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "c-rep.jsonl"
    path.write_text(json.dumps({"seq": 1, "ts": "2026-11-21T10:00:00.000Z", "campaign_id": "c-rep",
                                "event": "RUN_START", "state": None}) + "\n" + '{"seq": 2, "ev')
    with ev.EventLog(path, "c-rep") as log:  # opening repairs the tail and says so
        log.emit(ev.RUN_START, state=None, resume=True)
    result = replay([path])
    assert result.repaired == [{"seq": 2, "truncated_bytes": 14}]
    assert any("cut a torn tail of 14 bytes" in w for w in result.warnings())


def test_a_corrupt_middle_line_is_listed_and_skipped(tmp_path: Path) -> None:
    lines = (LOGS / "clean.jsonl").read_text().splitlines()
    lines[9] = lines[9][:30]  # cut line 10 (STATE_ENTRY REGISTER) in the middle
    path = tmp_path / "corrupt.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = replay([path])
    assert result.invalid_lines == [{"file": "corrupt.jsonl", "line": 10}] and not result.torn_tail
    assert result.events == 29
    # PLAN_REGISTERED now seems to run after PLAN was left: the postmortem says so.
    assert ("action_in_state", 11) in _rules(result)


def test_glued_and_absurdly_nested_lines_are_listed_not_fatal(tmp_path: Path) -> None:
    lines = (LOGS / "clean.jsonl").read_text().splitlines()
    lines[3] = lines[3] + lines[4]  # two records on one line (an append after a torn tail)
    lines[6] = "[" * 100_000
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = replay([path])
    assert result.invalid_lines == [{"file": "odd.jsonl", "line": 4}, {"file": "odd.jsonl", "line": 7}]


def test_an_event_without_seq_is_a_violation_not_a_crash() -> None:
    result = replay([LOGS / "missing_seq.jsonl"])
    assert ("seq_increasing", None) in _rules(result)


def test_a_crash_between_failure_and_classification_resumes_clean(tmp_path: Path) -> None:
    crashed = _lines("crashed.jsonl")
    crashed.append({**crashed[-1], "seq": 17, "event": ev.TOOL_FAILURE, "op_id": "op1",
                    "error_type": "network_error", "attempt": 1})
    resume = [{**r, "seq": r["seq"] + 1} for r in _lines("resume.jsonl")]
    result = replay([_write(tmp_path / "a.jsonl", crashed), _write(tmp_path / "b.jsonl", resume)])
    assert result.crash_boundaries == [18]
    assert result.violations == []
    assert result.failures[0].outcome == "interrupted"


def test_parallel_tasks_recovery_is_not_blamed_for_another_tasks_failure(tmp_path: Path) -> None:
    records = _lines("clean.jsonl")[:14]  # up to READY_TASKS in EXECUTE

    def add(event: str, **fields: object) -> dict:
        record = {"seq": len(records) + 1, "ts": "2026-11-21T10:00:05.000Z", "campaign_id": "c-par",
                  "event": event, "state": "EXECUTE", **fields}
        records.append(record)
        return record

    for task in ("001", "002"):
        add(ev.TASK_START, task_seq=task, worker=f"w{task[-1]}", attempt=1)
    b = add(ev.TOOL_FAILURE, op_id="opB", tool="run_builder", task_seq="002", error_type="task_failed")
    add(ev.FAILURE_CLASSIFIED, op_id="opB", task_seq="002", failure_seq=b["seq"],
        error_type="task_failed", klass="structural", decision="structural")
    a = add(ev.TOOL_FAILURE, op_id="opA", tool="run_verify", task_seq="001", error_type="flaky_test")
    add(ev.RECOVERY_ATTEMPT, strategy="block_task", success=True, task_seq="002",
        error_type="task_failed")  # task 002 blocks while task 001's failure is being classified
    add(ev.FAILURE_CLASSIFIED, op_id="opA", task_seq="001", failure_seq=a["seq"],
        error_type="flaky_test", klass="transient", decision="retry")
    add(ev.RETRY, op_id="opA", tool="run_verify", task_seq="001", attempt=2, wait_ms=500,
        error_type="flaky_test")
    add(ev.TASK_END, task_seq="002", worker="w2", status="blocked", error_type="task_failed")
    add(ev.TASK_END, task_seq="001", worker="w1", status="complete")
    add(ev.PHASE_TRANSITION, **{"from": "execute", "to": "cascade", "trigger": "cascade"})
    for record in _lines("clean.jsonl")[22:]:
        add(record["event"], **{k: v for k, v in record.items()
                                if k not in ("seq", "ts", "campaign_id", "event")})
    result = replay([_write(tmp_path / "parallel.jsonl", records)])
    assert result.violations == []
    assert result.failure(b["seq"]).outcome == "recovered:block_task"


# --------------------------------------------------------------------------- real writer

def test_a_log_written_by_the_recovery_protocol_replays_clean(tmp_path: Path) -> None:
    path = tmp_path / "c-real.jsonl"
    with ev.EventLog(path, "c-real") as log:
        protocol = RecoveryProtocol(log, RetryPolicy(), sleep=lambda _s: None,
                                    cancel=threading.Event())
        log.emit(ev.RUN_START, mode="campaign", resume=False)
        for source, trigger, dest in ((None, None, "INIT"), ("INIT", "explore", "EXPLORE"),
                                      ("EXPLORE", "plan", "PLAN"), ("PLAN", "register", "REGISTER"),
                                      ("REGISTER", "execute", "EXECUTE")):
            if source:
                log.emit(ev.PHASE_TRANSITION, **{"from": source.lower(), "to": dest.lower(), "trigger": trigger})
            log.state = dest
            log.emit(ev.STATE_ENTRY)
        log.emit(ev.TASK_START, task_seq="001", worker="w1", attempt=1)
        flaky = FtlError("flaky_test", {"seq": "001"})
        outcomes = iter([flaky, flaky, None])

        def verify(_attempt: int) -> str:
            error = next(outcomes)
            if error is not None:
                raise error
            return "passed"

        assert protocol.run(verify, tool="run_verify", seq="001", state="EXECUTE",
                            escalate=escalate_flaky) == "passed"

        def invoke(_attempt: int) -> None:
            raise FtlError("network_error")

        with pytest.raises(FtlError) as caught:
            protocol.run(invoke, tool="invoke", seq="001", state="EXECUTE")
        protocol.recovery(strategy="block_task", success=True, state="EXECUTE", task_seq="001",
                          error=caught.value)
        log.emit(ev.TASK_END, task_seq="001", worker="w1", status="blocked")
        log.emit(ev.PHASE_TRANSITION, **{"from": "execute", "to": "cascade", "trigger": "cascade"})
        for source, trigger, dest in (("CASCADE", "observe", "OBSERVE"), ("OBSERVE", "complete", "COMPLETE")):
            log.state = source
            if source == "CASCADE":
                log.emit(ev.STATE_ENTRY)
            log.emit(ev.PHASE_TRANSITION, **{"from": source.lower(), "to": dest.lower(), "trigger": trigger})
            log.state = dest
            log.emit(ev.STATE_ENTRY)
        log.emit(ev.RUN_END, outcome="complete_with_blocked", exit_code=3)
    result = replay([path])
    assert result.violations == []
    assert len(result.retries) == 3  # two for the flaky verify, one for the transient call
    assert [f.decision for f in result.failures] == ["retry", "retry", "retry", "escalate"]
    assert result.recoveries[0]["strategy"] == "block_task"
    assert result.failures[-1].outcome == "recovered:block_task"
    assert result.attempts[0].retries == 3 and len(result.attempts[0].failures) == 4


# --------------------------------------------------------------------------- memory

def _peak_bytes(path: Path) -> int:
    tracemalloc.start()
    try:
        replay([path])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_number_of_events(tmp_path: Path) -> None:
    """Events that add nothing to the story (tool calls, here 8x more of them) cost no memory:
    replay keeps the story, never the lines."""
    def log(path: Path, calls: int) -> Path:
        records = _lines("clean.jsonl")
        head, tail = records[:15], records[15:]
        filler = [{**records[15], "details": "x" * 300} for _ in range(calls)]
        numbered = [{**r, "seq": i + 1} for i, r in enumerate(head + filler + tail)]
        for r in numbered:  # keep failure_seq pointing at the renumbered TOOL_FAILURE
            if r["event"] == ev.FAILURE_CLASSIFIED:
                r["failure_seq"] = r["seq"] - 1
        return _write(path, numbered)

    small, large = log(tmp_path / "small.jsonl", 2_000), log(tmp_path / "large.jsonl", 16_000)
    assert replay([large]).violations == [] and replay([large]).events == 16_030
    assert _peak_bytes(large) < _peak_bytes(small) + 64 * 1024


_PEAKS = r"""
import json, sys, tracemalloc
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import ftl.postmortem.spool
from bench_replay import generate
from ftl.postmortem.replay import replay, text_lines

ftl.postmortem.spool.TASK_CACHE = 256
out = []
for events in (4_000, 4_000, 32_000):  # the first: warm-up (SQLite statements, decoders)
    path = Path(sys.argv[2]) / f"{events}.jsonl"
    generate(path, events, seed=3)
    tracemalloc.start()
    with replay([path]) as result:
        lines = sum(1 for _ in text_lines(result))
        attempts = len(result.attempts)
    assert lines > attempts
    out.append((tracemalloc.get_traced_memory()[1], attempts))
    tracemalloc.stop()
print(json.dumps(out[1:]))
"""


def test_memory_does_not_grow_with_the_number_of_task_attempts(tmp_path: Path) -> None:
    """The story itself (attempts, failures, retries, tasks) goes to the spool: eight times the
    tasks cost no more memory to replay and render as text (the task cache is made small so the
    bound shows at test sizes; the bench shows it at a million events with the defaults).
    Measured in a fresh interpreter: what earlier tests left in this one's caches must not
    count."""
    import subprocess
    import sys

    bench = Path(__file__).parent.parent / "bench"
    done = subprocess.run([sys.executable, "-c", _PEAKS, str(bench), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (small, small_attempts), (large, large_attempts) = json.loads(done.stdout)
    assert large_attempts > 7 * small_attempts
    # Before the spool each attempt kept ~0.9 KB and each task ~0.3 KB: the larger log's 6,000
    # more attempts were ~7 MB more. What remains are fixed-size buffers (a batch of cascade
    # pairs, a merge heap, the task cache).
    assert large < small + 1536 * 1024, (small, large)


# --------------------------------------------------------------------------- decision diff

def test_a_run_has_the_same_decisions_as_itself_whatever_the_timing(tmp_path: Path) -> None:
    records = _lines("drill.jsonl")
    shifted = []
    for r in records:  # other timestamps, durations, workers and op ids
        r = {**r, "ts": r["ts"].replace("T04:", "T09:")}
        for key, value in (("worker", "w9"), ("op_id", "opX"), ("duration_ms", 1), ("pid", 1)):
            if key in r:
                r[key] = value
        shifted.append(r)
    # Swap two events of parallel tasks (005 and 001 started in the other order).
    i, j = next(k for k, r in enumerate(shifted) if r["event"] == ev.TASK_START), None
    j = i + 1
    shifted[i], shifted[j] = {**shifted[j], "seq": shifted[i]["seq"]}, {**shifted[i], "seq": shifted[j]["seq"]}
    diff = diff_decisions([DRILL], [_write(tmp_path / "other.jsonl", shifted)])
    assert diff.same, render_diff_text(diff)
    assert "same decisions" in render_diff_text(diff)


def test_the_first_differing_decision_is_found(tmp_path: Path) -> None:
    records = _lines("drill.jsonl")
    classified = next(r for r in records if r["event"] == ev.FAILURE_CLASSIFIED and r["task_seq"] == "001")
    changed = [({**r, "decision": "escalate"} if r is classified else r) for r in records]
    diff = diff_decisions([DRILL], [_write(tmp_path / "other.jsonl", changed)])
    first = diff.first()
    assert not diff.same and first.lane == "task 001"
    assert first.a.event == ev.FAILURE_CLASSIFIED and dict(first.a.fields)["decision"] == "retry"
    assert dict(first.b.fields)["decision"] == "escalate" and first.a.seq == classified["seq"]
    text = render_diff_text(diff, "drill", "other")
    assert "first difference: lane 'task 001'" in text and "decision=escalate" in text


def test_a_crashed_run_differs_from_a_clean_one_where_work_was_redone() -> None:
    diff = diff_decisions([DRILL], [CRASH])
    lanes = {d.lane for d in diff.lanes}
    assert {"task 001", "task 006"} <= lanes  # both were cut by the crash and started again
    assert "task 005" not in lanes and "task 002" not in lanes


def _reference_diff(a: list[dict], b: list[dict], context: int = 3) -> list[tuple]:
    """The diff by definition: every lane's decisions in lists, compared position by position."""
    from ftl.postmortem.diff import DECISION_FIELDS, _field_text, _lane

    def lanes(events: list[dict]) -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = {}
        for e in events:
            wanted = DECISION_FIELDS.get(e.get("event"))
            if wanted is None or (e.get("event") == ev.STATE_ENTRY and e.get("resumed")):
                continue
            key = (e["event"], tuple((k, _field_text(e.get(k))) for k in wanted))
            out.setdefault(_lane(e), []).append((key, e.get("seq")))
        return out

    la, lb, diffs = lanes(a), lanes(b), []
    for lane in sorted(set(la) | set(lb), key=lambda name: (name != "run", name)):
        xs, ys = la.get(lane, []), lb.get(lane, [])
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            if x is None or y is None or x[0] != y[0]:
                diffs.append((lane, i, x, y, [c[0] for c in xs[max(0, i - context):i]]))
                break
    return diffs


_DECISION_EVENTS = st.one_of(
    st.builds(lambda s: {"event": ev.STATE_ENTRY, "state": s}, st.sampled_from(["PLAN", "EXECUTE", "ÉTAT"])),
    st.builds(lambda t, status: {"event": ev.TASK_END, "task_seq": t, "status": status},
              st.sampled_from(["001", "002", "10", "\ud800"]), st.sampled_from(["complete", "blocked"])),
    st.builds(lambda m: {"event": ev.EXPLORER_RESULT, "mode": m, "status": "ok"}, st.sampled_from(["a", "b"])),
    st.builds(lambda: {"event": ev.TOOL_CALL, "state": "EXECUTE", "intent": "i", "tool": "t"}),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_DECISION_EVENTS, max_size=25), st.lists(_DECISION_EVENTS, max_size=25),
       st.integers(0, 3))
def test_decision_diff_matches_its_definition(tmp_path: Path, a: list[dict], b: list[dict],
                                              context: int) -> None:
    """The streamed, spooled diff finds exactly the differences that comparing every lane's
    full list of decisions finds (lanes with non-ASCII names and lone surrogates included)."""
    a = [{**e, "seq": i + 1} for i, e in enumerate(a)]
    b = [{**e, "seq": i + 1} for i, e in enumerate(b)]
    diff = diff_decisions([_write(tmp_path / "a.jsonl", a)], [_write(tmp_path / "b.jsonl", b)],
                          context=context)
    got = [(d.lane, d.index, d.a and (d.a.key(), d.a.seq), d.b and (d.b.key(), d.b.seq),
            [c.key() for c in d.context]) for d in diff.lanes]
    assert got == _reference_diff(a, b, context)
    assert diff.same == (got == [])


def test_decision_diff_memory_does_not_grow_with_the_runs(tmp_path: Path) -> None:
    """Both runs' decisions go to the spool: diffing runs four times longer costs no more
    memory (before, both runs' decision tuples were held: ~1.2 GB at a million events, so the
    12,000 more events here would have cost about 14 MiB)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    from bench_replay import generate

    def peak(events: int) -> int:
        a, b = tmp_path / f"a{events}.jsonl", tmp_path / f"b{events}.jsonl"
        generate(a, events, seed=3)
        lines = a.read_text(encoding="utf-8").splitlines(keepends=True)
        # The same run, but one late task ends blocked instead of complete: one lane differs.
        at = max(i for i, line in enumerate(lines) if '"status":"complete"' in line)
        lines[at] = lines[at].replace('"status":"complete"', '"status":"blocked"')
        b.write_text("".join(lines), encoding="utf-8")
        tracemalloc.start()
        try:
            diff = diff_decisions([a], [b])
            assert len(diff.lanes) == 1 and diff.lanes[0].a.seq == json.loads(lines[at])["seq"]
            assert diff.a_count > events // 2
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(2_000)  # warm-up
    small, large = peak(4_000), peak(16_000)
    assert large < small + 1024 * 1024, (small, large)


# --------------------------------------------------------------------------- CLI

def _cli(*args: str) -> object:
    return CliRunner().invoke(ftl_main, ["replay", *args])


def test_cli_check_exit_codes() -> None:
    assert _cli(str(DRILL), "--check").exit_code == 0
    bad = _cli(str(LOGS / "two_transient_retries.jsonl"), "--check")
    assert bad.exit_code == 1 and "seq 22: [retry_limit]" in bad.output
    assert _cli(str(LOGS / "two_transient_retries.jsonl")).exit_code == 0  # report only
    missing = _cli("no-such.jsonl", "--json")
    assert missing.exit_code == 2 and json.loads(missing.output)["success"] is False


def test_cli_json_envelope_carries_the_replay_and_warnings() -> None:
    out = _cli(str(LOGS / "torn_tail.jsonl"), "--format", "json")
    envelope = json.loads(out.output)
    assert envelope["success"] is True and envelope["meta"]["version"] == "response-v2"
    assert envelope["data"]["torn_tail"] is True and envelope["data"]["check"]["passed"] is False
    assert any(w["code"] == "LOG_TAIL_REPAIRED" for w in envelope["meta"]["warning_details"])
    data = json.loads(_cli(str(CRASH), "--json").output)["data"]
    assert data["crash_boundaries"] == [32] and data["blocks"][0]["root"] == "002"
    assert {t["seq"] for t in data["task_status"]} == {"001", "002", "003", "004", "005", "006"}


def test_cli_output_file_and_html(tmp_path: Path) -> None:
    out = _cli(str(DRILL), "-o", str(tmp_path / "pm.txt"))
    assert out.exit_code == 0 and "invariants: all hold" in (tmp_path / "pm.txt").read_text()
    out = _cli(str(CRASH), "--format", "html", "-o", str(tmp_path / "pm.html"), "--check")
    assert out.exit_code == 0 and (tmp_path / "pm.html").read_text().startswith("<!DOCTYPE html>")
    refused = _cli(str(DRILL), "--format", "html", "--json")
    assert refused.exit_code == 2 and "--output" in refused.output
    envelope = json.loads(_cli(str(DRILL), "--format", "html", "--json", "-o", str(tmp_path / "x.html")).output)
    assert envelope["data"]["check"]["passed"] is True and (tmp_path / "x.html").is_file()


def test_cli_against(tmp_path: Path) -> None:
    same = _cli(str(DRILL), "--against", str(DRILL))
    assert same.exit_code == 0 and "same decisions" in same.output
    differ = _cli(str(DRILL), "--against", str(CRASH), "--json")
    assert differ.exit_code == 1
    diff = json.loads(differ.output)["data"]["diff"]
    assert diff["same"] is False and diff["first"]["lane"] in ("task 001", "task 006", "run")


# --------------------------------------------------------------------------- fuzz

_EVENT_NAMES = [ev.RUN_START, ev.RUN_END, ev.STATE_ENTRY, ev.PHASE_TRANSITION, ev.TOOL_FAILURE,
                ev.FAILURE_CLASSIFIED, ev.RETRY, ev.RECOVERY_ATTEMPT, ev.TASK_START, ev.TASK_END,
                ev.CASCADE_PROPAGATE, ev.PLAN_REGISTERED, ev.ERROR_ROUTE, ev.RETURN, "NOT_AN_EVENT"]
_SCALAR = st.none() | st.booleans() | st.integers(-3, 40) | st.text(max_size=6)
_ANY = _SCALAR | st.lists(_SCALAR, max_size=3) | st.dictionaries(st.text(max_size=4), _SCALAR, max_size=3) \
    | st.lists(st.dictionaries(st.sampled_from(["seq", "blocked_by"]), _SCALAR | st.lists(_SCALAR, max_size=2)),
               max_size=2)
_FIELDS = ["state", "task_seq", "op_id", "failure_seq", "decision", "klass", "error_type", "status",
           "from", "to", "trigger", "route", "summary", "propagated", "seqs", "depends", "config",
           "duration_ms", "ts", "worker", "attempt", "resume", "resumed", "success", "strategy"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(_EVENT_NAMES), st.integers(0, 30),
                          st.dictionaries(st.sampled_from(_FIELDS), _ANY, max_size=6)), max_size=25))
def test_replay_never_raises_on_arbitrary_events(tmp_path: Path, items: list) -> None:
    """Bad input gives violations, never a traceback; every renderer copes with it."""
    from ftl.postmortem.html import render_html

    records = [{**fields, "event": name, "seq": seq, "campaign_id": "c-fuzz"} for name, seq, fields in items]
    path = tmp_path / "fuzz.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn')
    result = replay([path])
    render_text(result)
    render_html(result)
    json.dumps(result.to_json(), default=str)
    diff_decisions([path], [path])


# --------------------------------------------------------------------------- ftl diagram

_MERMAID_LINE = re.compile(r"^(stateDiagram-v2|    \[\*\] --> INIT|    [A-Z]+ --> [A-Z]+: [a-z]+( \[[a-z_]+\])?"
                           r"|    note right of ERROR: .+|    COMPLETE --> \[\*\]|    ERROR --> \[\*\]: return)$")


@pytest.mark.parametrize("flow", ["campaign", "task"])
def test_diagram_machine_draws_every_transition_of_the_flow(flow: str) -> None:
    from ftl.engine.machine import TRANSITIONS, Flow

    out = CliRunner().invoke(ftl_main, ["diagram", "machine", "--flow", flow])
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert all(_MERMAID_LINE.match(line) for line in lines), [l for l in lines if not _MERMAID_LINE.match(l)]
    edges = {tuple(re.match(r"    (\w+) --> (\w+): (\w+)", line).groups()) for line in lines
             if re.match(r"    [A-Z]+ --> [A-Z]+: ", line)}
    expected = {(source, row["dest"], row["trigger"]) for row in TRANSITIONS[Flow(flow)] if row["trigger"] != "fail"
                for source in (row["source"] if isinstance(row["source"], list) else [row["source"]])}
    assert edges == expected
    assert ("BUILD" in out.output) == (flow == "task") and ("REGISTER" in out.output) == (flow == "campaign")


def test_diagram_plan_draws_the_plans_dag() -> None:
    plan = Path(__file__).resolve().parents[1] / "examples" / "failure-drill" / "plan.json"
    out = CliRunner().invoke(ftl_main, ["diagram", "plan", str(plan)])
    assert out.exit_code == 0 and out.output.startswith("flowchart LR\n")
    nodes = re.findall(r'^    t(\d+)\["(\d+) ([a-z0-9-]+)"\]$', out.output, re.M)
    assert [(n, s) for n, s, _ in nodes] == [(f"00{i}", f"00{i}") for i in range(1, 7)]
    edges = set(re.findall(r"^    t(\d+) --> t(\d+)$", out.output, re.M))
    assert edges == {("001", "002"), ("002", "003"), ("003", "004"), ("006", "004"), ("005", "006")}


def test_diagram_plan_rejects_an_invalid_plan(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"objective": "x", "tasks": [{"seq": "001", "slug": "a", "verify": "true",
                                                            "depends": "009"}]}))
    out = CliRunner().invoke(ftl_main, ["diagram", "plan", str(bad)])
    assert out.exit_code == 2 and "009" in out.output and "Traceback" not in out.output


def test_cli_escapes_text_the_output_cannot_encode(tmp_path: Path) -> None:
    """A log may hold a lone surrogate (valid JSON): the postmortem shows it escaped instead
    of failing half-way through the output."""
    records = _lines("drill.jsonl")
    for r in records:
        if r.get("task_seq") == "001":
            r["task_seq"] = "\ud800"
    log = _write(tmp_path / "surrogate.jsonl", records)
    result = _cli(str(log))
    assert result.exit_code == 0, result.output
    assert "  \\ud800 attempt 1 on w1: complete" in result.output  # the rest of the report follows
    assert "task \\ud800 run_verify attempt 1: flaky_test" in result.output
    out = tmp_path / "pm.txt"
    assert _cli(str(log), "-o", str(out)).exit_code == 0
    assert "\\ud800 attempt 1" in out.read_text(encoding="utf-8")


def test_cli_stops_quietly_when_the_reader_goes_away(tmp_path: Path) -> None:
    """``ftl replay LOG | head`` ends with exit 0 and nothing on stderr when head closes the
    pipe (a real process: the pipe and its EPIPE are the operating system's)."""
    import subprocess
    import sys

    records = _lines("drill.jsonl")
    big = _write(tmp_path / "big.jsonl", records[:1] + [
        {**records[1], "seq": i + 2, "event": ev.LOG_REPAIRED, "truncated_bytes": 1} for i in range(30_000)])
    proc = subprocess.Popen([sys.executable, "-m", "ftl", "replay", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"campaign ")
    proc.stdout.close()  # the reader leaves while ~30,000 warning lines are still to come
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and stderr == ""


def test_cli_says_what_to_do_when_the_spool_cannot_be_written(monkeypatch) -> None:
    """A long log spills its records to a temporary database; a full or unwritable $TMPDIR is a
    clear error (exit 2, what to set), not a traceback."""
    import sqlite3

    import ftl.postmortem.spool

    def unwritable(self, sql, rows):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ftl.postmortem.spool.Spool, "write", unwritable)
    result = _cli(str(DRILL), "--json")
    assert result.exit_code == 2
    payload = json.loads(result.output)
    assert payload["success"] is False and "TMPDIR" in payload["error"]
    assert "Traceback" not in result.output and "disk is full" not in result.output


# --------------------------------------------------------------------------- hostile logs (review)

def _blocked_tasks_log(path: Path, count: int) -> Path:
    """One EXECUTE stay in which ``count`` tasks each fail once, are classified structural
    (no retry, no recovery event: the failure keeps no outcome) and end blocked."""
    log = _Log()
    log.enter("INIT")
    log.move("explore", "EXPLORE")
    log.move("plan", "PLAN")
    log.move("register", "REGISTER")
    log.move("execute", "EXECUTE")
    for i in range(count):
        task = f"{i:05d}"
        log.add(ev.TASK_START, task_seq=task, worker="w1", attempt=1)
        failure = log.add(ev.TOOL_FAILURE, task_seq=task, op_id=f"op{i}", tool="shell_builder",
                          attempt=1, error_type="merge_conflict", message="m")
        log.add(ev.FAILURE_CLASSIFIED, task_seq=task, op_id=f"op{i}", failure_seq=failure["seq"],
                error_type="merge_conflict", klass="structural", decision="structural")
        log.add(ev.TASK_END, task_seq=task, status="blocked", error_type="merge_conflict")
    return _write(path, log.records)


def test_settling_failures_is_linear_in_the_tasks(tmp_path: Path, monkeypatch) -> None:
    """A task's end looks at that task's open failures only: failures that keep no outcome (a
    structural block without a recovery event) must not be rescanned at every later task end."""
    from ftl.postmortem.check import Checker

    looked = [0]
    held = Checker._held

    def counting(self, failure):
        looked[0] += 1
        return held(self, failure)

    monkeypatch.setattr(Checker, "_held", counting)
    for count in (200, 800):
        looked[0] = 0
        with replay([_blocked_tasks_log(tmp_path / f"{count}.jsonl", count)]) as result:
            assert len(result.failures) == count and all(f.klass == "structural" for f in result.failures)
        assert looked[0] <= 3 * count, (count, looked[0])  # a rescan would be count**2 / 2


def test_a_seq_past_64_bits_is_diffed(tmp_path: Path) -> None:
    records = _lines("clean.jsonl")[:4]
    big = [{**r, "seq": 2**63 + i} for i, r in enumerate(records)]
    diff = diff_decisions([_write(tmp_path / "a.jsonl", big)], [_write(tmp_path / "b.jsonl", big[:2])])
    assert not diff.same and diff.first().a.seq == 2**63 + 2


def test_a_line_nested_too_deep_for_the_encoders_is_skipped(tmp_path: Path) -> None:
    """orjson reads 1,023 levels; the JSON writers fail near 1,000: such a line is reported
    like any unreadable line instead of breaking the JSON postmortem half-way."""
    records = _lines("clean.jsonl")
    nested: object = "bottom"
    for _ in range(900):
        nested = [nested]
    deep = {**records[-1], "summary": {"message": "m", "nested": nested}}
    log = _write(tmp_path / "deep.jsonl", records[:-1] + [deep])
    result = _cli(str(log), "--format", "json")
    data = json.loads(result.output)["data"]  # valid JSON from start to end
    assert data["invalid_lines"] == [{"file": "deep.jsonl", "line": len(records)}]
    shallow = {**records[-1], "summary": {"message": "m", "nested": [[["ok"]]]}}
    assert replay([_write(tmp_path / "ok.jsonl", records[:-1] + [shallow])]).invalid_lines == []


def test_unicode_whitespace_around_a_record_is_tolerated(tmp_path: Path) -> None:
    records = _lines("clean.jsonl")
    body = "".join(json.dumps(r) + ("\u00a0" if i == 3 else "") + "\n" for i, r in enumerate(records))
    path = tmp_path / "ws.jsonl"
    path.write_text(body + "\u3000\n", encoding="utf-8")
    result = replay([path])
    assert result.events == len(records) and result.invalid_lines == [] and not result.violations


def test_garbage_warnings_are_counted_not_listed_and_a_missing_campaign_id_is_named(tmp_path: Path) -> None:
    records = _lines("clean.jsonl")
    lines = [json.dumps(r) for r in records[:3]] + ["not json"] * 500 + [json.dumps(r) for r in records[3:]]
    lines.insert(5, json.dumps({k: v for k, v in records[3].items() if k != "campaign_id"} | {"seq": 4}))
    path = tmp_path / "garbage.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = replay([path])
    notes = result.warnings()
    assert len(result.invalid_lines) == 500 and len(notes) < 30
    assert any("480 more lines are not JSON objects" in n for n in notes)
    assert any(n.startswith("events of other campaigns were read: (none)") for n in notes)
    assert "480 more lines" in render_text(result)


def test_integration_invariants_catch_a_double_or_unverified_integration(tmp_path: Path) -> None:
    from ftl.events import EventLog

    path = tmp_path / "c.jsonl"
    with EventLog(path, "c-int") as log:
        log.emit("RUN_START", state=None, mode="campaign", objective="x", resume=False)
        log.emit("STATE_ENTRY", state="INIT")
        log.emit("TASK_START", state="INIT", task_seq="001", worker="w1", attempt=1)
        log.emit("TASK_COMMIT", state="INIT", task_seq="001", commit="a" * 40, base="0" * 40)
        log.emit("TASK_INTEGRATED", state="INIT", task_seq="001", commit="a" * 40, head="a" * 40,
                 fast_forward=True)
        log.emit("TASK_INTEGRATED", state="INIT", task_seq="001", commit="a" * 40, head="a" * 40,
                 fast_forward=True)
        log.emit("TASK_INTEGRATED", state="INIT", task_seq="002", commit="b" * 40, head="c" * 40,
                 fast_forward=False)
        log.emit("TASK_END", state="INIT", task_seq="001", worker="w1", status="complete",
                 commit="a" * 40)
    result = replay([path])
    found = [v.message for v in result.violations if v.rule == "integration"]
    assert found == ["task 001 integrated twice",
                     "task 002 integrated commit bbbbbbbbbbbb, not the one committed after its "
                     "verify passed"]
    text = render_text(result)
    assert "#1 seq 5 task 001 commit aaaaaaaaaaaa (fast-forward)" in text
    assert "001 attempt 1 on w1: complete" in text and "commit aaaaaaaaaaaa" in text
