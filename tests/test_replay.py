"""Tests for ftl.replay: hand-built logs in tests/logs/ (one clean run, one file per planted
violation, a crash and its resume, a torn tail) and a log written by the real recovery protocol."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ftl import events as ev
from ftl.errors import FtlError
from ftl.recovery import RecoveryProtocol, RetryPolicy, escalate_flaky
from ftl.replay import Replay, render_text, replay

LOGS = Path(__file__).parent / "logs"


def _rules(result: Replay) -> list[tuple[str, int | None]]:
    return [(v.rule, v.seq) for v in result.violations]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (LOGS / name).read_text().splitlines()]


# --------------------------------------------------------------------------- the clean run

def test_clean_run_has_no_violations() -> None:
    result = replay([LOGS / "clean.jsonl"])
    assert result.violations == []
    assert (result.campaign_id, result.events, result.outcome, result.exit_code) == \
        ("c-clean", 30, "complete", 0)
    assert not result.torn_tail and result.invalid_lines == [] and result.crash_boundaries == []


def test_clean_run_timeline() -> None:
    result = replay([LOGS / "clean.jsonl"])
    assert [s["state"] for s in result.states] == [
        "INIT", "EXPLORE", "PLAN", "REGISTER", "EXECUTE", "CASCADE", "OBSERVE", "COMPLETE"]
    # ts advances 100 ms per seq; a state lasts from its entry to the next entry (or RUN_END).
    assert [s["duration_ms"] for s in result.states] == [200, 300, 300, 300, 1000, 300, 300, 100]
    (attempt,) = result.attempts
    assert (attempt.seq, attempt.worker, attempt.attempt, attempt.status) == ("001", "w1", 1, "complete")
    (failure,) = result.failures
    assert (failure["seq"], failure["error_type"], failure["klass"], failure["decision"]) == \
        (17, "network_error", "transient", "retry")
    (retry,) = result.retries
    assert (retry["seq"], retry["attempt"], retry["wait_ms"], retry["op_id"]) == (19, 2, 500, "op1")
    assert result.cascade == [{"seq": 24, "event": ev.CASCADE_STATUS, "cascade_state": "none",
                               "unreachable": []}]
    json.dumps(result.to_json())


def test_returned_from_error_with_a_summary_is_clean() -> None:
    result = replay([LOGS / "returned_from_error.jsonl"])
    assert result.violations == []
    assert result.outcome == "returned" and result.exit_code == 4
    assert result.states[-1]["state"] == "ERROR"
    assert result.states[-1]["error_type"] == "schema_invalid"
    assert result.failures[0]["decision"] == "error"


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
    assert _rules(result) == [("classify_before_act", 8)]


def test_a_task_still_running_at_the_end_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("clean.jsonl") if r["event"] != ev.TASK_END]
    result = replay([_write(tmp_path / "running.jsonl", records)])
    assert _rules(result) == [("task_transitions", 30)]


def test_a_completed_run_outside_complete_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("clean.jsonl") if not (r["event"] == ev.STATE_ENTRY
                                                         and r["state"] == "COMPLETE")]
    result = replay([_write(tmp_path / "nocomplete.jsonl", records)])
    assert _rules(result) == [("ends_properly", 30)]


def test_a_returned_run_without_return_is_reported(tmp_path: Path) -> None:
    records = [r for r in _lines("returned_from_error.jsonl") if r["event"] != ev.RETURN]
    result = replay([_write(tmp_path / "noreturn.jsonl", records)])
    assert _rules(result) == [("ends_properly", 14)]


# --------------------------------------------------------------------------- crash, resume, torn

def test_crash_then_resume_replays_clean_with_a_crash_boundary() -> None:
    result = replay([LOGS / "crashed.jsonl", LOGS / "resume.jsonl"])
    assert result.violations == []
    assert result.crash_boundaries == [17]
    assert result.outcome == "complete"
    # The attempt that died with the process stays visible, without an end.
    assert [(a.attempt, a.status) for a in result.attempts] == [(1, None), (2, "complete")]
    # The state the crash interrupted is closed at the resume's RUN_START.
    execute = [s for s in result.states if s["state"] == "EXECUTE"]
    assert execute[0]["end"] == _lines("resume.jsonl")[0]["ts"]
    text = render_text(result)
    assert "crash boundary before seq 17 (the run was resumed)" in text
    assert "invariants: all hold" in text
    assert "001 attempt 1 on w1: interrupted" in text


def test_the_crashed_log_alone_ends_without_run_end() -> None:
    assert _rules(replay([LOGS / "crashed.jsonl"])) == [("ends_properly", None)]


def test_logs_in_the_wrong_order_break_seq() -> None:
    result = replay([LOGS / "resume.jsonl", LOGS / "crashed.jsonl"])
    assert ("seq_increasing", 1) in _rules(result)


def test_torn_last_line_sets_torn_tail_and_keeps_the_rest() -> None:
    result = replay([LOGS / "torn_tail.jsonl"])
    assert result.torn_tail and result.invalid_lines == []
    assert result.events == 29
    assert _rules(result) == [("ends_properly", None)]  # the torn line was RUN_END itself
    assert "warning: the last line was torn" in render_text(result)


def test_a_corrupt_middle_line_is_listed_and_skipped(tmp_path: Path) -> None:
    lines = (LOGS / "clean.jsonl").read_text().splitlines()
    lines[9] = lines[9][:30]  # cut line 10 (STATE_ENTRY REGISTER) in the middle
    path = tmp_path / "corrupt.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = replay([path])
    assert result.invalid_lines == [10] and not result.torn_tail
    assert result.events == 29
    # PLAN_REGISTERED now seems to run after PLAN was left: the postmortem says so.
    assert _rules(result) == [("action_in_state", 11)]


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


# --------------------------------------------------------------------------- real writer

def test_a_log_written_by_the_recovery_protocol_replays_clean(tmp_path: Path) -> None:
    path = tmp_path / "c-real.jsonl"
    with ev.EventLog(path, "c-real") as log:
        protocol = RecoveryProtocol(log, RetryPolicy(), sleep=lambda _s: None,
                                    cancel=threading.Event())
        log.emit(ev.RUN_START, mode="campaign", resume=False)
        log.state = "INIT"
        log.emit(ev.STATE_ENTRY)
        log.emit(ev.PHASE_TRANSITION, **{"from": "init", "to": "execute", "trigger": "execute"})
        log.state = "EXECUTE"
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

        with pytest.raises(FtlError):
            protocol.run(invoke, tool="invoke", seq="001", state="EXECUTE")
        protocol.recovery(strategy="block_task", success=True, state="EXECUTE", task_seq="001")
        log.emit(ev.TASK_END, task_seq="001", worker="w1", status="blocked")
        log.emit(ev.PHASE_TRANSITION, **{"from": "execute", "to": "complete", "trigger": "complete"})
        log.state = "COMPLETE"
        log.emit(ev.STATE_ENTRY)
        log.emit(ev.RUN_END, state=None, outcome="complete_with_blocked", exit_code=3)
    result = replay([path])
    assert result.violations == []
    assert len(result.retries) == 3  # two for the flaky verify, one for the transient call
    assert [f["decision"] for f in result.failures] == ["retry", "retry", "retry", "escalate"]
    assert result.recoveries[0]["strategy"] == "block_task"
