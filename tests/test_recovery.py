"""Tests for ftl.engine.recovery: classification of command results, the retry policy, and the
emit -> classify -> retry protocol as it appears in a real event log (FTL ERROR_HANDLING)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from ftl import events as ev
from ftl.errors import FtlError
from ftl.engine.recovery import (RecoveryProtocol, RetryPolicy, classify_command, classify_exception,
                          escalate_flaky, retry_after_ms)

# --------------------------------------------------------------------------- classify_command


def _failed(output: str = "", **extra: Any) -> dict[str, Any]:
    return {"exit_code": 1, "output": output, "timed_out": False, **extra}


def test_timeout_flag_wins_over_everything() -> None:
    error = classify_command(_failed("429 Too Many Requests", timed_out=True, timeout_s=30,
                                     error_type="idiom_violation"), what="build", seq="002")
    assert error.error_type == "timeout" and error.transient
    assert error.details["timeout_s"] == 30
    assert error.message == "build of task 002 did not finish within 30 s."


def test_rate_limit_with_retry_after_header() -> None:
    error = classify_command(_failed("HTTP/1.1 429 Too Many Requests\nRetry-After: 7\n"),
                             what="build", seq="001")
    assert error.error_type == "rate_limited"
    assert error.retry_after_ms == 7000


@pytest.mark.parametrize("output", ["rate limit exceeded", "You are being rate-limited",
                                    "API ratelimit hit", "too many requests, slow down"])
def test_rate_limit_texts_without_a_hint(output: str) -> None:
    error = classify_command(_failed(output), what="build")
    assert error.error_type == "rate_limited"
    assert error.retry_after_ms is None


@pytest.mark.parametrize("output,expected", [
    ("Retry-After: 7", 7000),
    ("retry-after: 2.5s", 2500),
    ("retry_after_ms=1500", 1500),
    ("please retry after 250 ms", 250),
    ("Retry-After 3 seconds", 3000),
    ("no hint here", None),
    ("", None),
])
def test_retry_after_parsing(output: str, expected: int | None) -> None:
    assert retry_after_ms(output) == expected


@pytest.mark.parametrize("output", ["sqlite3.OperationalError: database is locked",
                                    "fatal: Unable to create '.git/index.lock': File exists",
                                    "could not obtain lock on row"])
def test_lock_contention(output: str) -> None:
    error = classify_command(_failed(output), what="build", seq="004")
    assert error.error_type == "lock_contention" and error.transient


@pytest.mark.parametrize("output", ["Connection refused", "connect ECONNRESET 10.0.0.1:443",
                                    "Temporary failure in name resolution",
                                    "503 Service Unavailable"])
def test_network_error(output: str) -> None:
    error = classify_command(_failed(output), what="build")
    assert error.error_type == "network_error" and error.transient


def test_failing_verify_is_a_possibly_flaky_test() -> None:
    error = classify_command(_failed("FAILED tests/test_app.py::test_add - assert 3 == 4"),
                             what="verify", seq="003")
    assert error.error_type == "flaky_test" and error.transient
    assert error.message == "Task 003's verify failed and may be flaky."


def test_transient_markers_beat_the_verify_default() -> None:
    error = classify_command(_failed("requests.exceptions.ConnectionError: Connection refused"),
                             what="verify", seq="003")
    assert error.error_type == "network_error"


@pytest.mark.parametrize("output,name", [
    ("ModuleNotFoundError: No module named 'numpy'", "ModuleNotFoundError"),
    ("bash: pnpm: command not found", "command not found"),
    ("ImportError: cannot import name 'x'", "ImportError"),
])
def test_missing_dependency_is_structural(output: str, name: str) -> None:
    error = classify_command(_failed(output), what="build", seq="005")
    assert error.error_type == "dependency_missing" and not error.transient
    assert error.details["name"] == name
    assert error.safe_details() == {"name": name}


def test_anything_else_is_task_failed() -> None:
    error = classify_command(_failed("SyntaxError: invalid syntax", exit_code=2), what="build",
                             seq="006")
    assert error.error_type == "task_failed" and not error.transient
    assert error.message == "Task 006's builder failed (exit 2)."


def test_reason_is_used_when_there_is_no_output() -> None:
    error = classify_command({"exit_code": 1, "reason": "database is locked"}, what="build")
    assert error.error_type == "lock_contention"


def test_agent_error_type_passes_through() -> None:
    error = classify_command(_failed("429 Too Many Requests", error_type="idiom_violation"),
                             what="build", seq="007")
    assert error.error_type == "idiom_violation"
    limited = classify_command(_failed("", error_type="rate_limited", retry_after_ms=1200),
                               what="build")
    assert limited.error_type == "rate_limited" and limited.retry_after_ms == 1200


def test_unknown_agent_error_type_fails_closed() -> None:
    assert classify_command(_failed("", error_type="made_up"), what="build").error_type == \
        "internal_error"


def test_output_tail_keeps_the_last_2000_characters() -> None:
    output = "a" * 5000 + "THE END"
    error = classify_command(_failed(output), what="build")
    assert error.details["output_tail"] == output[-2000:]
    assert "output_tail" not in error.safe_details()


@pytest.mark.parametrize("output,what,expected", [
    ("=== 1 failed, 429 passed in 3.20s ===", "verify", "flaky_test"),
    ("tests/test_x.py:429: AssertionError", "build", "task_failed"),
])
def test_a_number_429_in_test_output_is_not_a_rate_limit(output: str, what: str,
                                                          expected: str) -> None:
    assert classify_command(_failed(output), what=what, seq="001").error_type == expected


# --------------------------------------------------------------------------- classify_exception

def test_classify_exception() -> None:
    original = FtlError("cycle_detected", {"cycle": "001 -> 002 -> 001"})
    assert classify_exception(original) is original
    assert classify_exception(TimeoutError("slow")).error_type == "timeout"
    assert classify_exception(ConnectionRefusedError("nope")).error_type == "network_error"
    unknown = classify_exception(ValueError("secret path /home/me/.ssh/id_rsa"))
    assert unknown.error_type == "internal_error"
    assert unknown.details["exception"] == "ValueError"
    assert "id_rsa" not in unknown.message
    assert set(unknown.safe_details()) == {"correlation_id"}


# --------------------------------------------------------------------------- RetryPolicy

def test_attempts_for_each_class() -> None:
    policy = RetryPolicy()
    assert policy.attempts_for(FtlError("task_failed")) == 1
    assert policy.attempts_for(FtlError("network_error")) == 2
    assert policy.attempts_for(FtlError("timeout")) == 2
    assert policy.attempts_for(FtlError("flaky_test")) == 3
    assert policy.attempts_for(ValueError("x")) == 1
    assert policy.attempts_for(None) == 1
    custom = RetryPolicy(transient_retries=0, flaky_retries=1)
    assert custom.attempts_for(FtlError("network_error")) == 1
    assert custom.attempts_for(FtlError("flaky_test")) == 2


def test_wait_is_exponential_capped_and_honours_retry_after() -> None:
    policy = RetryPolicy(backoff_min_s=0.5, backoff_max_s=4.0)
    plain = FtlError("network_error")
    assert [policy.wait_s(n, plain) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.wait_s(1, FtlError("rate_limited", retry_after_ms=3500)) == 3.5
    assert policy.wait_s(3, FtlError("rate_limited", retry_after_ms=100)) == 2.0
    assert policy.wait_s(1, None) == 0.5


def test_a_servers_retry_after_is_honoured_up_to_its_own_cap() -> None:
    # A rate limit's window (a minute is common) is waited out even past the backoff's cap;
    # a server asking for a day is waited retry_after_max_s, then tried once more.
    policy = RetryPolicy(backoff_min_s=0.5, backoff_max_s=4.0, retry_after_max_s=120.0)
    assert policy.wait_s(1, FtlError("rate_limited", retry_after_ms=90_000)) == 90.0
    assert policy.wait_s(1, FtlError("rate_limited", retry_after_ms=86_400_000)) == 120.0
    assert policy.wait_s(9, FtlError("network_error")) == 4.0  # the backoff keeps its own cap
    assert RetryPolicy(backoff_min_s=8.0, backoff_max_s=4.0).wait_s(1, None) == 4.0
    assert RetryPolicy().retry_after_max_s == 300.0


@pytest.mark.parametrize("output,hint_ms", [
    ("HTTP 429\nRetry-After: 7", 7000), ("retry_after_ms=250", 250),
    ("rate limited; retry after 2 minutes", 120_000), ("Retry-After: 120 milliseconds", 120),
    ("retry-after: 1.5s", 1500), ("retry after 3 hours", 10_800_000), ("Retry-After: 30 sec", 30_000),
    ("retry after 5m", 300_000), ("retry-after-ms: 40", 40), ("nothing to see", None)])
def test_retry_after_hints_are_read_with_their_unit(output: str, hint_ms: int | None) -> None:
    assert retry_after_ms(output) == hint_ms


@pytest.mark.parametrize("output", ["API rate limits exceeded", "rate-limiting in effect",
                                    "Rate limited by upstream", "HTTP/1.1 429 Too Many Requests"])
def test_rate_limit_wordings_are_transient(output: str) -> None:
    assert classify_command(_failed(output), what="build", seq="001").error_type == "rate_limited"


# --------------------------------------------------------------------------- RecoveryProtocol

class Harness:
    """A protocol over a real event log with a recording sleep."""

    def __init__(self, tmp_path: Path, policy: RetryPolicy | None = None,
                 on_sleep: Callable[[float], None] | None = None) -> None:
        self.log = ev.EventLog(tmp_path / "c1.jsonl", "c1")
        self.log.state = "EXECUTE"
        self.sleeps: list[float] = []
        self.cancel = threading.Event()
        self.on_sleep = on_sleep

        def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)
            if self.on_sleep:
                self.on_sleep(seconds)

        self.protocol = RecoveryProtocol(self.log, policy or RetryPolicy(), sleep=sleep,
                                         cancel=self.cancel)

    def events(self) -> list[dict[str, Any]]:
        return list(ev.read_events(self.log.path))

    def names(self) -> list[str]:
        return [e["event"] for e in self.events()]


def _failing(*errors: BaseException, result: Any = None) -> tuple[Callable[[int], Any], list[int]]:
    """An action that raises ``errors`` in turn, then returns ``result``; records attempt numbers."""
    calls: list[int] = []

    def action(attempt: int) -> Any:
        calls.append(attempt)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return action, calls


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    harness = Harness(tmp_path)
    yield harness
    harness.log.close()


def test_success_first_time_writes_nothing(h: Harness) -> None:
    action, calls = _failing(result=42)
    assert h.protocol.run(action, tool="build", seq="001", state="EXECUTE") == 42
    assert calls == [1] and h.names() == [] and h.sleeps == []


def test_structural_failure_gets_one_attempt_and_no_retry(h: Harness) -> None:
    action, calls = _failing(FtlError("task_failed", {"seq": "001", "exit_code": 2}))
    with pytest.raises(FtlError) as raised:
        h.protocol.run(action, tool="build", seq="001", state="EXECUTE")
    assert raised.value.error_type == "task_failed"
    assert calls == [1] and h.sleeps == []
    failure, classified = h.events()
    assert failure["event"] == ev.TOOL_FAILURE and classified["event"] == ev.FAILURE_CLASSIFIED
    assert failure["seq"] < classified["seq"]
    assert classified["failure_seq"] == failure["seq"]
    assert (classified["decision"], classified["klass"], classified["max_attempts"]) == \
        ("structural", "structural", 1)
    assert failure["attempt"] == 1 and failure["tool"] == "build" and failure["task_seq"] == "001"
    assert failure["state"] == classified["state"] == "EXECUTE"
    assert failure["op_id"] == classified["op_id"]
    assert failure["error_type"] == "task_failed"


def test_transient_failure_is_retried_exactly_once_then_escalates(h: Harness) -> None:
    action, calls = _failing(FtlError("network_error"), FtlError("network_error"))
    with pytest.raises(FtlError) as raised:
        h.protocol.run(action, tool="invoke", state="EXECUTE")
    assert raised.value.error_type == "network_error"
    assert calls == [1, 2]
    assert h.sleeps == [0.5]
    events = h.events()
    assert [e["event"] for e in events] == [ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED, ev.RETRY,
                                            ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED]
    f1, c1, retry, f2, c2 = events
    assert f1["seq"] < c1["seq"] < retry["seq"] < f2["seq"] < c2["seq"]
    assert c1["failure_seq"] == f1["seq"] and c2["failure_seq"] == f2["seq"]
    assert c1["decision"] == "retry" and c1["klass"] == "transient" and c1["max_attempts"] == 2
    assert c2["decision"] == "escalate"
    assert retry["attempt"] == 2 and retry["wait_ms"] == 500
    assert retry["error_type"] == "network_error"
    assert len({e["op_id"] for e in events}) == 1
    assert [f1["attempt"], f2["attempt"]] == [1, 2]


def test_transient_then_success_returns_the_value(h: Harness) -> None:
    action, calls = _failing(FtlError("lock_contention"), result="built")
    assert h.protocol.run(action, tool="build", seq="002", state="EXECUTE") == "built"
    assert calls == [1, 2]
    assert h.names() == [ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED, ev.RETRY]


def test_flaky_verify_gets_two_retries_then_is_verify_failed(h: Harness) -> None:
    flaky = FtlError("flaky_test", {"seq": "003", "exit_code": 1})
    action, calls = _failing(flaky, flaky, flaky)
    with pytest.raises(FtlError) as raised:
        h.protocol.run(action, tool="verify", seq="003", state="EXECUTE", escalate=escalate_flaky)
    final = raised.value
    assert final.error_type == "verify_failed" and not final.transient
    assert final.details["seq"] == "003" and final.details["exit_code"] == 1
    assert final.details["op_id"] == h.events()[0]["op_id"]
    assert calls == [1, 2, 3]
    assert h.sleeps == [0.5, 1.0]
    events = h.events()
    assert [e["event"] for e in events] == [
        ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED, ev.RETRY,
        ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED, ev.RETRY,
        ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED]
    decisions = [e["decision"] for e in events if e["event"] == ev.FAILURE_CLASSIFIED]
    assert decisions == ["retry", "retry", "escalate"]
    assert [e["attempt"] for e in events if e["event"] == ev.RETRY] == [2, 3]
    assert all(e["max_attempts"] == 3 for e in events if e["event"] == ev.FAILURE_CLASSIFIED)


def test_flaky_verify_passing_on_second_try(h: Harness) -> None:
    action, calls = _failing(FtlError("flaky_test", {"seq": "003"}), result={"passed": True})
    assert h.protocol.run(action, tool="verify", seq="003", escalate=escalate_flaky) == {"passed": True}
    assert calls == [1, 2]


@pytest.mark.parametrize("hint_ms,expected_s", [(7000, 7.0), (100, 0.5), (None, 0.5),
                                                 (86_400_000, 300.0)])
def test_rate_limit_waits_the_larger_of_backoff_and_retry_after(h: Harness, hint_ms: int | None,
                                                               expected_s: float) -> None:
    action, _ = _failing(FtlError("rate_limited", {"retry_after_ms": hint_ms}, retry_after_ms=hint_ms),
                         result="ok")
    assert h.protocol.run(action, tool="invoke") == "ok"
    assert h.sleeps == [expected_s]
    retry = [e for e in h.events() if e["event"] == ev.RETRY][0]
    assert retry["wait_ms"] == int(expected_s * 1000)


def test_plain_exceptions_are_classified_before_retrying(h: Harness) -> None:
    action, calls = _failing(ConnectionResetError("peer reset"), result="ok")
    assert h.protocol.run(action, tool="invoke") == "ok"
    failure = h.events()[0]
    assert failure["error_type"] == "network_error"
    assert calls == [1, 2]


def test_unknown_exception_is_structural_internal_error(h: Harness) -> None:
    action, calls = _failing(KeyError("boom"))
    with pytest.raises(FtlError) as raised:
        h.protocol.run(action, tool="invoke")
    assert raised.value.error_type == "internal_error"
    assert calls == [1]
    assert h.events()[1]["decision"] == "structural"


def test_keyboard_interrupt_passes_through_unrecorded(h: Harness) -> None:
    action, calls = _failing(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        h.protocol.run(action, tool="invoke")
    assert calls == [1] and h.names() == []


def test_cancel_during_an_attempt_stops_further_attempts(h: Harness) -> None:
    def action(attempt: int) -> None:
        h.cancel.set()
        raise FtlError("network_error")

    with pytest.raises(FtlError) as raised:
        h.protocol.run(action, tool="invoke")
    assert raised.value.error_type == "network_error"
    assert h.sleeps == []
    assert h.names() == [ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED]
    assert h.events()[1]["decision"] == "escalate"


def test_cancel_during_the_backoff_stops_the_next_attempt(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.on_sleep = lambda _seconds: harness.cancel.set()  # Ctrl-C while waiting
    action, calls = _failing(FtlError("network_error"), result="ok")
    try:
        with pytest.raises(FtlError):
            harness.protocol.run(action, tool="invoke")
        assert calls == [1]
    finally:
        harness.log.close()


def test_recovery_attempt_is_recorded(h: Harness) -> None:
    h.protocol.recovery(strategy="block_task", success=True, state="EXECUTE", task_seq="004",
                        error_type="verify_failed")
    (event,) = h.events()
    assert event["event"] == ev.RECOVERY_ATTEMPT
    assert (event["strategy"], event["success"], event["task_seq"], event["state"]) == \
        ("block_task", True, "004", "EXECUTE")


def test_each_run_has_its_own_op_id(h: Harness) -> None:
    for _ in range(2):
        action, _calls = _failing(FtlError("task_failed"))
        with pytest.raises(FtlError):
            h.protocol.run(action, tool="build")
    ops = {e["op_id"] for e in h.events()}
    assert len(ops) == 2


def test_escalate_flaky_only_touches_flaky_tests() -> None:
    flaky = FtlError("flaky_test", {"seq": "009", "exit_code": 1})
    escalated = escalate_flaky(flaky)
    assert escalated.error_type == "verify_failed" and escalated.details == flaky.details
    other = FtlError("network_error")
    assert escalate_flaky(other) is other


# --------------------------------------------------------------------------- per-operation cancel

def test_an_operations_own_cancel_stops_its_retries(h: Harness) -> None:
    own = threading.Event()

    def action(attempt: int) -> None:
        own.set()  # the task's token is cancelled while its tool call fails
        raise FtlError("network_error")

    with pytest.raises(FtlError):
        h.protocol.run(action, tool="invoke", cancel=own)
    assert h.sleeps == [] and not h.cancel.is_set()
    assert h.events()[1]["decision"] == "escalate"


def test_an_operations_own_cancel_during_the_backoff_stops_the_next_attempt(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    own = threading.Event()
    harness.on_sleep = lambda _seconds: own.set()  # Ctrl-C while the task waits to retry
    action, calls = _failing(FtlError("rate_limited", retry_after_ms=5000), result="ok")
    try:
        with pytest.raises(FtlError) as raised:
            harness.protocol.run(action, tool="invoke", cancel=own)
        assert raised.value.error_type == "rate_limited"
        assert calls == [1] and harness.sleeps == [5.0]
    finally:
        harness.log.close()


def test_the_runs_cancel_still_stops_an_operation_with_its_own_event(h: Harness) -> None:
    def action(attempt: int) -> None:
        h.cancel.set()
        raise FtlError("network_error")

    with pytest.raises(FtlError):
        h.protocol.run(action, tool="invoke", cancel=threading.Event())
    assert h.sleeps == []


class RecordingEvent(threading.Event):
    """An event whose wait is recorded and ends at once, as if set during the wait."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.set()
        return True


def test_the_default_sleep_waits_on_the_operations_cancel(tmp_path: Path) -> None:
    log = ev.EventLog(tmp_path / "c1.jsonl", "c1")
    try:
        protocol = RecoveryProtocol(log, RetryPolicy(backoff_max_s=2.0, retry_after_max_s=3.0))
        own = RecordingEvent()  # no injected sleep: the protocol waits on the cancel event
        action, calls = _failing(FtlError("rate_limited", retry_after_ms=86_400_000), result="ok")
        with pytest.raises(FtlError):
            protocol.run(action, tool="invoke", cancel=own)
        assert own.waits == [3.0]  # capped, and woken by the operation's cancel
        assert calls == [1]
        run_cancel = RecordingEvent()
        protocol = RecoveryProtocol(log, RetryPolicy(backoff_max_s=2.0), cancel=run_cancel)
        action, calls = _failing(FtlError("network_error"), result="ok")
        with pytest.raises(FtlError):
            protocol.run(action, tool="invoke")
        assert run_cancel.waits == [0.5] and calls == [1]
    finally:
        log.close()


# --------------------------------------------------------------------------- review 14 item 4

@pytest.mark.parametrize("output", [
    "error Your lockfile needs to be updated, but yarn was run with `--frozen-lockfile`.",
    "ERR_PNPM_OUTDATED_LOCKFILE  Cannot install with \"frozen-lockfile\" because "
    "pnpm-lock.yaml is not up to date with package.json",
])
def test_a_stale_package_lockfile_is_not_lock_contention(output: str) -> None:
    error = classify_command(_failed(output), what="build", seq="001")
    assert error.error_type == "task_failed" and not error.transient


@pytest.mark.parametrize("output", [
    # pytest: the assertion, its E line and the short summary all mention the message
    ">       assert client.get('/x').status == 'ok', 'rate limited'\n"
    "E       AssertionError: rate limited\n"
    "FAILED tests/test_api.py::test_x - AssertionError: rate limited\n"
    "=== 1 failed in 0.12s ===",
    "E       assert 'rate limited' == 'ok'",
])
def test_an_assertion_about_a_rate_limit_is_not_a_rate_limit(output: str) -> None:
    assert classify_command(_failed(output), what="verify", seq="001").error_type == "flaky_test"
    assert classify_command(_failed(output), what="build", seq="001").error_type == "task_failed"


def test_a_missing_module_wins_over_a_refused_connection() -> None:
    output = ("WARNING: Retrying after connection broken: Connection refused\n"
              "Traceback (most recent call last):\n  File \"app.py\", line 1, in <module>\n"
              "ModuleNotFoundError: No module named 'redis'")
    error = classify_command(_failed(output), what="build", seq="001")
    assert error.error_type == "dependency_missing" and error.details["name"] == "ModuleNotFoundError"


def test_transient_markers_are_read_in_the_last_lines_only() -> None:
    early = "Connection refused (retrying)\n" + "".join(f"step {i} ok\n" for i in range(30))
    assert classify_command(_failed(early + "make: *** [all] Error 2"),
                            what="build").error_type == "task_failed"
    assert classify_command(_failed("step 1 ok\n" * 30 + "curl: (7) Connection refused"),
                            what="build").error_type == "network_error"


def test_an_early_missing_file_does_not_hide_the_network_error_a_command_stopped_on() -> None:
    from ftl.engine.recovery import classify_command

    log = "ls: cannot access 'build/': No such file or directory\n" + "Collecting x\n" * 20 + \
        "pip._vendor.urllib3.exceptions.ReadTimeoutError: Read timed out.\n"
    assert classify_command({"exit_code": 1, "output": log}, what="build").error_type == "network_error"
    stopped = "Collecting x\n" * 20 + "cat: config.yml: No such file or directory\n"
    assert classify_command({"exit_code": 1, "output": stopped}, what="build").error_type == "dependency_missing"
    module = "ModuleNotFoundError: No module named 'x'\n" + "retrying\n" * 20 + "Connection refused\n"
    assert classify_command({"exit_code": 1, "output": module}, what="build").error_type == "dependency_missing"
