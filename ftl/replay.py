"""Postmortem: rebuild a campaign's run from its event log alone and check the protocol.

`replay(paths)` streams one or more logs of a campaign (a crashed run and its resume form one
story; the crash boundary is where a ``RUN_START`` with ``resume: true`` follows a run that
never wrote ``RUN_END``). It keeps only what the timeline needs, so memory stays flat in the
number of events. Invariants checked (design.md §6), each violation with its ``seq``:

- ``seq`` strictly increasing;
- every ``TOOL_FAILURE`` is classified (``FAILURE_CLASSIFIED`` naming its ``failure_seq``)
  before any retry or recovery of that operation;
- every ``RETRY`` follows a failure of its operation classified ``retry``;
- at most one retry per operation for a transient failure (two for a flaky verify);
- no action outside a state: every action event lies between a ``STATE_ENTRY`` and the next
  ``PHASE_TRANSITION`` and names that state;
- ERROR is entered as a state with an ``error_type`` and handled by that type's route;
- task transitions are legal (no start of a complete task, no second start without an end
  unless a crash intervened);
- the run ends in COMPLETE or a ``RETURN`` with a summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from ftl import events as ev
from ftl.errors import Route, kind

# Routes the ERROR handler may take instead of the row's own (see states/error.py).
_ROUTE_FALLBACKS = {Route.SUMMARY.value, Route.OBSERVE.value}


@dataclass
class Violation:
    seq: int | None
    rule: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "rule": self.rule, "message": self.message}


@dataclass
class TaskAttempt:
    seq: str
    worker: str | None
    attempt: int | None
    start: str
    end: str | None = None
    status: str | None = None
    error_type: str | None = None


@dataclass
class Replay:
    """What a log says happened. Built by `replay`."""

    campaign_id: str | None = None
    states: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[TaskAttempt] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    cascade: list[dict[str, Any]] = field(default_factory=list)
    crash_boundaries: list[int] = field(default_factory=list)
    outcome: str | None = None
    exit_code: int | None = None
    events: int = 0
    torn_tail: bool = False
    invalid_lines: list[int] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "campaign_id": self.campaign_id, "events": self.events, "outcome": self.outcome,
            "exit_code": self.exit_code, "states": self.states,
            "tasks": [a.__dict__ for a in self.attempts], "failures": self.failures,
            "retries": self.retries, "recoveries": self.recoveries, "cascade": self.cascade,
            "crash_boundaries": self.crash_boundaries, "torn_tail": self.torn_tail,
            "invalid_lines": self.invalid_lines,
            "violations": [v.to_json() for v in self.violations],
        }


def _ts(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


class _Checker:
    def __init__(self, result: Replay) -> None:
        self.r = result
        self.last_seq = 0
        self.state: str | None = None
        self.in_state = False
        self.run_open = False
        self.ended = False
        self.unclassified: dict[int, dict[str, Any]] = {}
        self.op_decision: dict[str, str] = {}
        self.op_kind: dict[str, str] = {}
        self.op_retries: dict[str, int] = {}
        self.running: dict[str, TaskAttempt] = {}
        self.completed: set[str] = set()
        self.pending_error: dict[str, Any] | None = None
        self.returned = False

    def violation(self, event: dict[str, Any] | None, rule: str, message: str) -> None:
        self.r.violations.append(Violation(event.get("seq") if event else None, rule, message))

    def feed(self, e: dict[str, Any]) -> None:
        r = self.r
        r.events += 1
        name, seq, state = e.get("event"), e.get("seq"), e.get("state")
        r.campaign_id = r.campaign_id or e.get("campaign_id")
        if not isinstance(seq, int) or seq <= self.last_seq:
            self.violation(e, "seq_increasing", f"seq {seq} after {self.last_seq}")
        if isinstance(seq, int):
            self.last_seq = max(self.last_seq, seq)

        if name == ev.RUN_START:
            if self.run_open and not self.ended:
                r.crash_boundaries.append(seq)
                self.running.clear()  # in-flight attempts died with the process
                self.unclassified.clear()  # a failure cut off by the crash is not the resume's
                self._close_state(e)
            self.run_open, self.ended, self.in_state, self.state = True, False, False, None
            self.returned = False
            return
        if name == ev.RUN_END:
            self.ended = True
            r.outcome, r.exit_code = e.get("outcome"), e.get("exit_code")
            self._close_state(e)
            if e.get("outcome") in ("returned",) and not self.returned:
                self.violation(e, "ends_properly", "run returned without a RETURN summary")
            if str(e.get("outcome", "")).startswith("complete") and self.state != "COMPLETE" \
                    and not (r.states and r.states[-1]["state"] == "COMPLETE"):
                self.violation(e, "ends_properly", "run completed outside COMPLETE")
            for attempt in self.running.values():
                self.violation(e, "task_transitions", f"task {attempt.seq} still running at the end")
            return
        if name == ev.STATE_ENTRY:
            self._close_state(e)
            self.state, self.in_state = state, True
            r.states.append({"state": state, "start": e.get("ts"), "end": None, "duration_ms": None,
                             "error_type": e.get("error_type"), "seq": seq})
            if state == "ERROR":
                if not e.get("error_type"):
                    self.violation(e, "error_state", "ERROR entered without an error_type")
                self.pending_error = {"error_type": e.get("error_type"), "seq": seq}
            return
        if name == ev.PHASE_TRANSITION:
            self.in_state = False
            if self.pending_error is not None:
                self.violation(e, "error_route", "left ERROR without an ERROR_ROUTE")
                self.pending_error = None
            return
        if name in (ev.LOG_REPAIRED, ev.RESUME):
            return
        if name in ev.ACTION_EVENTS:
            if not self.in_state:
                self.violation(e, "action_in_state", f"{name} outside any state")
            elif state != self.state:
                self.violation(e, "action_in_state", f"{name} names state {state}, current {self.state}")
        getattr(self, f"on_{str(name).lower()}", lambda _e: None)(e)

    def _close_state(self, e: dict[str, Any]) -> None:
        if self.r.states and self.r.states[-1]["end"] is None:
            current = self.r.states[-1]
            current["end"] = e.get("ts")
            start, end = _ts(current["start"]), _ts(e.get("ts"))
            if start and end:
                current["duration_ms"] = int((end - start).total_seconds() * 1000)

    # --- per-event handlers ---
    def on_tool_failure(self, e: dict[str, Any]) -> None:
        if not isinstance(e.get("seq"), int):
            return
        self.unclassified[e.get("seq")] = e
        op = e.get("op_id")
        if op:
            self.op_kind[op] = e.get("error_type", "")
        self.r.failures.append({"seq": e.get("seq"), "tool": e.get("tool"), "task_seq": e.get("task_seq"),
                                "error_type": e.get("error_type"), "message": e.get("message"),
                                "attempt": e.get("attempt"), "op_id": op, "state": e.get("state"),
                                "klass": None, "decision": None})

    def on_failure_classified(self, e: dict[str, Any]) -> None:
        failure = self.unclassified.pop(e.get("failure_seq"), None)
        if failure is None:
            self.violation(e, "classify_before_act", "classification of an unknown failure")
            return
        for entry in reversed(self.r.failures):
            if entry["seq"] == failure.get("seq"):
                entry["klass"], entry["decision"] = e.get("klass"), e.get("decision")
                break
        if e.get("op_id"):
            self.op_decision[e["op_id"]] = e.get("decision", "")

    def _check_classified(self, e: dict[str, Any]) -> None:
        op, task = e.get("op_id"), e.get("task_seq")
        for failure in self.unclassified.values():
            same = failure.get("op_id") == op if op is not None else (
                task is None or failure.get("task_seq") == task)
            if same:
                self.violation(e, "classify_before_act",
                               f"{e.get('event')} before failure {failure['seq']} was classified")
                break

    def on_retry(self, e: dict[str, Any]) -> None:
        self._check_classified(e)
        op = e.get("op_id")
        self.r.retries.append({"seq": e.get("seq"), "op_id": op, "tool": e.get("tool"),
                               "attempt": e.get("attempt"), "wait_ms": e.get("wait_ms"),
                               "error_type": e.get("error_type")})
        if self.op_decision.get(op) != "retry":
            self.violation(e, "emit_before_retry", f"RETRY of {op} without a failure classified retry")
        self.op_retries[op] = self.op_retries.get(op, 0) + 1
        limit = 2 if self.op_kind.get(op) == "flaky_test" else 1
        if self.op_retries[op] > limit:
            self.violation(e, "retry_limit", f"{self.op_retries[op]} retries of {op} (limit {limit})")

    def on_recovery_attempt(self, e: dict[str, Any]) -> None:
        self._check_classified(e)
        self.r.recoveries.append({"seq": e.get("seq"), "strategy": e.get("strategy"),
                                  "success": e.get("success"), "error_type": e.get("error_type")})

    def on_error_route(self, e: dict[str, Any]) -> None:
        if self.pending_error is None:
            self.violation(e, "error_route", "ERROR_ROUTE outside ERROR")
            return
        expected = kind(self.pending_error["error_type"] or "internal_error").route.value
        route = e.get("route")
        if route != expected and route not in _ROUTE_FALLBACKS:
            self.violation(e, "error_route", f"{self.pending_error['error_type']} routed to {route}, "
                                             f"registry says {expected}")
        self.pending_error = None

    def on_return(self, e: dict[str, Any]) -> None:
        self.returned = True
        if not e.get("summary"):
            self.violation(e, "ends_properly", "RETURN without a summary")

    def on_task_start(self, e: dict[str, Any]) -> None:
        task = str(e.get("task_seq") or "")
        if task in self.completed:
            self.violation(e, "task_transitions", f"task {task} started again after completing")
        if task in self.running:
            self.violation(e, "task_transitions", f"task {task} started twice")
        attempt = TaskAttempt(task, e.get("worker"), e.get("attempt"), e.get("ts"))
        self.running[task] = attempt
        self.r.attempts.append(attempt)

    def on_task_end(self, e: dict[str, Any]) -> None:
        task = str(e.get("task_seq") or "")
        attempt = self.running.pop(task, None)
        if attempt is None:
            self.violation(e, "task_transitions", f"task {task} ended without a start")
            return
        attempt.end, attempt.status, attempt.error_type = e.get("ts"), e.get("status"), e.get("error_type")
        if e.get("status") == "complete":
            self.completed.add(task)

    def on_cascade_propagate(self, e: dict[str, Any]) -> None:
        self.r.cascade.append({"seq": e.get("seq"), "event": ev.CASCADE_PROPAGATE,
                               "propagated": e.get("propagated", [])})

    def on_cascade_replan(self, e: dict[str, Any]) -> None:
        self.r.cascade.append({"seq": e.get("seq"), "event": ev.CASCADE_REPLAN, "affected": e.get("affected")})

    def on_cascade_status(self, e: dict[str, Any]) -> None:
        self.r.cascade.append({"seq": e.get("seq"), "event": ev.CASCADE_STATUS,
                               "cascade_state": e.get("cascade_state"),
                               "unreachable": e.get("unreachable", [])})

    def finish(self) -> None:
        for failure in self.unclassified.values():
            self.violation(failure, "classify_before_act", "failure never classified")
        if not self.ended:
            self.violation(None, "ends_properly", "the log ends without RUN_END (crashed, not resumed)")
        elif self.r.outcome not in ("complete", "complete_with_blocked", "returned", "cancelled"):
            self.violation(None, "ends_properly", f"unknown outcome {self.r.outcome}")


def replay(paths: Iterable[Path]) -> Replay:
    """Rebuild the run from ``paths`` (in order) and check every invariant."""
    result = Replay()
    report = ev.ReadReport()
    checker = _Checker(result)
    for event in ev.iter_many(paths, report):
        checker.feed(event)
    checker.finish()
    result.torn_tail, result.invalid_lines = report.torn_tail, report.invalid_lines
    return result


def render_text(result: Replay) -> str:
    """A plain-text timeline for terminals and notes."""
    lines = [f"campaign {result.campaign_id}: {result.events} events, outcome {result.outcome} "
             f"(exit {result.exit_code})"]
    if result.torn_tail:
        lines.append("warning: the last line was torn (crash mid-write); it was skipped")
    for boundary in result.crash_boundaries:
        lines.append(f"crash boundary before seq {boundary} (the run was resumed)")
    lines.append("states:")
    for s in result.states:
        extra = f" error_type={s['error_type']}" if s.get("error_type") else ""
        lines.append(f"  {s['state']:<9} {s['duration_ms'] if s['duration_ms'] is not None else '-':>8} ms{extra}")
    lines.append("tasks:")
    for a in result.attempts:
        lines.append(f"  {a.seq} attempt {a.attempt} on {a.worker}: {a.status or 'interrupted'}"
                     + (f" ({a.error_type})" if a.error_type else ""))
    if result.failures:
        lines.append("failures:")
        for f in result.failures:
            lines.append(f"  seq {f['seq']} {f['tool']} {f['error_type']} [{f['klass']}] -> {f['decision']}")
    if result.retries:
        lines.append("retries:")
        for r in result.retries:
            lines.append(f"  seq {r['seq']} {r['tool']} attempt {r['attempt']} after {r['wait_ms']} ms")
    if result.recoveries:
        lines.append("recoveries:")
        for r in result.recoveries:
            lines.append(f"  seq {r['seq']} {r['strategy']} success={r['success']}")
    if result.violations:
        lines.append(f"violations ({len(result.violations)}):")
        for v in result.violations:
            lines.append(f"  seq {v.seq}: [{v.rule}] {v.message}")
    else:
        lines.append("invariants: all hold")
    return "\n".join(lines) + "\n"
