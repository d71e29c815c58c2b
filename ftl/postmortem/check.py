"""The invariant checker: folds a log's events, in order, into a `Replay` and notes every broken rule.

Per-event work only, no history: what can still change (running attempts, open failures and
operations) stays in memory; a record nothing can change any more goes to the `Replay`'s spool.
`ftl.postmortem.replay.replay` feeds it the events `ftl.postmortem.read` yields.

Invariants checked, each violation reported with the ``seq`` of the event that broke it
(design.md §6 and §5; rule names in `RULES`):

- ``seq_increasing``: ``seq`` strictly increases across every file of the story;
- ``emit_before_retry``: a ``RETRY`` or an op's ``RECOVERY_ATTEMPT`` follows a ``TOOL_FAILURE``
  of that operation (a retry only after one classified ``retry``);
- ``classify_before_act``: every ``TOOL_FAILURE`` is classified (``FAILURE_CLASSIFIED`` naming
  its ``failure_seq``) before a retry, a recovery, a task end or a move to ERROR acts on it, and
  never left unclassified;
- ``retry_limit``: at most ``transient_retries`` retries (1) per operation for a transient
  failure, ``flaky_verify_retries`` (2) for a flaky verify, none for a structural one (limits
  from the ``RUN_START`` config when it has them);
- ``action_in_state``: every action event lies between a ``STATE_ENTRY`` and the next
  ``PHASE_TRANSITION`` and names that state;
- ``error_state``: ERROR is entered through the ``fail`` trigger as a state with an
  ``error_type``;
- ``error_route``: ERROR writes ``ERROR_ROUTE`` with that type's registry route (or one of the
  handler's documented overrides) and then takes that route;
- ``state_transitions``: every ``PHASE_TRANSITION`` is one of the machine's transitions
  (`ftl.engine.machine.TRANSITIONS` for the run's flow) and the next ``STATE_ENTRY`` is its target;
- ``task_transitions``: a task starts only when pending with its dependencies complete (when
  ``PLAN_REGISTERED`` lists them), never twice without an end (unless a crash intervened),
  never again after completing, and restarts after a block only after a successful re-plan;
- ``ends_properly``: the story ends with ``RUN_END`` after COMPLETE, or after a ``RETURN`` with
  a summary (a cancelled run is reported, not a violation);
- ``integration``: a task's result is integrated at most once, and only the commit made after
  its verify passed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ftl import events as ev
from ftl.errors import REGISTRY, Route, kind
from ftl.postmortem.spool import task_sort_key
from ftl.postmortem.timeline import (
    NODES_KEPT, NO_ROOTS, WARNINGS_LISTED, Failure, Replay, RunSegment, StateSpan, TaskAttempt, TaskInfo,
    Violation,
)

RULES: dict[str, str] = {
    "seq_increasing": "seq strictly increases across the story",
    "emit_before_retry": "TOOL_FAILURE precedes any retry or recovery of that failure",
    "classify_before_act": "every failure is classified before an action is taken on it",
    "retry_limit": "at most one retry of a transient failure (two for a flaky verify), none of a "
                   "structural one",
    "action_in_state": "no action outside a state",
    "error_state": "ERROR is entered through 'fail' as a state with an error_type",
    "error_route": "ERROR is handled by its error_type's route",
    "state_transitions": "every state change is a transition of the machine",
    "task_transitions": "task starts and ends follow the task lifecycle",
    "ends_properly": "the run ends in COMPLETE or a RETURN with a summary",
    "integration": "a task's result is integrated at most once, and only the commit made after "
                   "its verify passed",
}

# ERROR handler overrides of the registry route (states/error.py): too many ERROR entries or a
# PLAN route from outside EXPLORE -> summary; a CASCADE route in the TASK flow -> observe.
_MAX_ERROR_ENTRIES = 5
_ROUTE_TARGETS = {Route.PLAN.value: "PLAN", Route.CASCADE.value: "CASCADE",
                  Route.OBSERVE.value: "OBSERVE"}
_ENDED_TASK = frozenset({"complete", "blocked", "cancelled", "pending"})
_MESSAGE_LIMIT = 300  # characters of a failure message kept (the log keeps the whole text)
_intern = sys.intern  # worker, status and error_type repeat on every attempt: keep one copy


def _seq_key(seq: str) -> tuple[int, str]:
    return (task_sort_key(seq), str(seq))  # the task table's order


def _s(value: Any) -> str | None:
    """A text field as str (None stays None): a log is untrusted input, types included."""
    return value if isinstance(value, str) or value is None else str(value)


def _t(value: Any) -> str | None:
    """`_s` for names that repeat (tools, states, error types, task seqs, op ids): one copy each."""
    return _intern(value) if type(value) is str else _s(value)


def _i(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(slots=True)
class _Op:
    """Bookkeeping for one recovery-protocol operation (one ``op_id``)."""

    task_seq: str | None
    failure: Failure | None = None
    retries: int = 0


class Checker:
    """Folds events into a `Replay` and records violations. Per-event work only: no history.

    Use: ``checker = Checker(result)``; ``checker.file = name`` before each file's events;
    ``checker.feed(event)`` per event (a dict, untrusted: every field may be missing or of any
    type); ``checker.finish()`` once at the end; ``checker.handlers.clear()`` to drop the bound
    methods (a cycle that would keep the spool open until a GC).
    """

    def __init__(self, result: Replay) -> None:
        self.r = result
        self.count = 0
        self.first_ts: str | None = None
        self.campaign_id: str | None = None
        self.prev_seq: int | None = None
        self.prev_ts: str | None = None
        self.last_seq = 0
        self.run_index = -1
        self.integration_count = 0  # TASK_INTEGRATED events (and crash-lost ones) so far
        self.segment: RunSegment | None = None
        self.state: str | None = None
        self.span: StateSpan | None = None
        self.in_state = False
        self.expect_entry: str | None = None  # target of the last PHASE_TRANSITION
        self.flow = "campaign"
        self.transitions: set[tuple[str, str, str]] = set()
        self.transient_retries = 1
        self.flaky_retries = 2
        self.unclassified: dict[int, Failure] = {}
        # Failures not yet settled (written to r.failures), by their key there; a failure settles
        # once nothing can change it any more (`_settle_failures`).
        self.open_failures: dict[int, Failure] = {}
        self.state_failures: dict[int, Failure] = {}  # open failures logged in the current state
        self.task_open: dict[str, list[int]] = {}  # keys of each task's open failures
        self.state_failure_count = 0
        self.ops: dict[str, _Op] = {}
        self.running: dict[str, TaskAttempt] = {}
        self.attempt_keys: dict[str, int] = {}  # key in r.attempts of each running attempt
        self.task_failures: dict[str, Failure] = {}  # last failure of each running task
        self.replan_open = False
        self.error: dict[str, Any] | None = None  # ERROR entered, route not yet written
        self.route_target: str | None = None  # state the route promised to go to
        self.error_entries = 0
        self.error_origin: str | None = None
        self.explored = False  # an explorer returned a usable (ok / partial) result
        self.returned = False
        self.ended = False
        self._set_flow("campaign")
        self.handlers = {
            ev.RUN_START: self.on_run_start, ev.RUN_END: self.on_run_end,
            ev.STATE_ENTRY: self.on_state_entry, ev.PHASE_TRANSITION: self.on_phase_transition,
            ev.TOOL_FAILURE: self.on_tool_failure, ev.FAILURE_CLASSIFIED: self.on_failure_classified,
            ev.RETRY: self.on_retry, ev.RECOVERY_ATTEMPT: self.on_recovery_attempt,
            ev.ERROR_ROUTE: self.on_error_route, ev.RETURN: self.on_return,
            ev.TASK_START: self.on_task_start, ev.TASK_END: self.on_task_end,
            ev.PLAN_REGISTERED: self.on_plan_registered,
            ev.CASCADE_STATUS: self.on_cascade_status, ev.CASCADE_ANALYSIS: self.on_cascade_analysis,
            ev.CASCADE_REPLAN: self.on_cascade_replan, ev.CASCADE_PROPAGATE: self.on_cascade_propagate,
            ev.CASCADE_MERGE_FAILED: self.on_cascade_merge_failed,
            ev.LOG_REPAIRED: self.on_log_repaired, ev.RESUME: self.on_resume,
            ev.TASK_COMMIT: self.on_task_commit, ev.TASK_INTEGRATED: self.on_task_integrated,
            ev.EXPLORER_RESULT: self.on_explorer_result,
        }
        self.actions = ev.ACTION_EVENTS
        self.file = ""

    def _set_flow(self, flow: str) -> None:
        from ftl.engine.machine import TRANSITIONS, Flow

        try:
            rows = TRANSITIONS[Flow(flow)]
        except ValueError:
            rows = TRANSITIONS[Flow.CAMPAIGN]
        self.flow = flow
        self.transitions = {
            (source, row["trigger"], row["dest"])
            for row in rows
            for source in (row["source"] if isinstance(row["source"], list) else [row["source"]])
        }

    def violation(self, seq: int | None, rule: str, message: str) -> None:
        self.r.violations.append(Violation(seq, rule, message))

    # --- the hot path ---
    def feed(self, e: dict[str, Any]) -> None:
        self.count += 1
        get = e.get
        seq = get("seq")
        if type(seq) is int and seq > self.last_seq:
            self.last_seq = seq
        else:
            self.violation(seq if type(seq) is int else None, "seq_increasing",
                           f"seq {seq} after {self.last_seq}")
            if type(seq) is not int:
                seq = None
        ts = get("ts")
        if type(ts) is not str:
            ts = _s(ts)
        if self.first_ts is None:
            self.first_ts = ts
        campaign = get("campaign_id")
        if campaign != self.campaign_id:
            self._campaign(campaign)
        name = get("event")
        if type(name) is not str:
            name = _s(name)
        if name in self.actions:
            if not self.in_state:
                self.violation(seq, "action_in_state", f"{name} outside any state")
            elif get("state") != self.state:
                self.violation(seq, "action_in_state",
                               f"{name} names state {e.get('state')}, current {self.state}")
        handler = self.handlers.get(name)
        if handler is not None:
            handler(e, seq, ts)
        self.prev_seq = seq
        # What a resume writes on the crashed run's behalf (the repaired tail, a recovered
        # TASK_END) is stamped at the resume: that is not when the crashed run was last alive.
        if name != ev.LOG_REPAIRED and e.get("recovered") is not True:
            self.prev_ts = ts

    def _campaign(self, campaign: Any) -> None:
        r = self.r
        if self.campaign_id is None and r.campaign_id is None:
            self.campaign_id = r.campaign_id = _s(campaign)
        else:
            name = "(none)" if campaign is None else str(campaign)
            if name not in r.other_campaigns and len(r.other_campaigns) < WARNINGS_LISTED:
                r.other_campaigns.append(name)

    def _close_segment(self) -> None:
        if self.segment is not None:
            self.segment.last_seq, self.segment.last_ts = self.prev_seq, self.prev_ts

    # --- runs and states ---
    def on_run_start(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        r = self.r
        previous = self.segment
        self._close_segment()
        if previous is not None and previous.outcome is None:
            # The previous process died: its in-flight work is cut, not wrong.
            previous.interrupted_state = self.state
            previous.interrupted_tasks = sorted(self.running, key=_seq_key)
            # The state lasted until the dead process's last event, not until the resume.
            self._close_span(previous.last_ts, None, None, interrupted=True)
            for failure in self.unclassified.values():
                failure.outcome = failure.outcome or "interrupted"
            for failure in self.state_failures.values():
                failure.outcome = failure.outcome or "interrupted"
            for task in self.running:
                info = r.tasks.get(task)
                if info is not None and info.status == "running":
                    info.status = "interrupted"
        self.run_index += 1
        self.segment = RunSegment(self.run_index, seq, _s(ts), bool(e.get("resume")), self.file,
                                  pid=_i(e.get("pid")), last_seq=seq, last_ts=_s(ts))
        r.runs.append(self.segment)
        r.objective = r.objective or _s(e.get("objective"))
        mode = e.get("mode")
        if isinstance(mode, str) and mode != self.flow:
            self._set_flow(mode)
        r.flow = self.flow
        config = e.get("config")
        if isinstance(config, dict):
            transient, flaky = _i(config.get("transient_retries")), _i(config.get("flaky_verify_retries"))
            if transient is not None:  # 0 is a limit too: no retry at all
                self.transient_retries = transient
            if flaky is not None:
                self.flaky_retries = flaky
        self._settle_attempts()
        self.task_failures.clear()
        self.unclassified.clear()
        self.ops.clear()
        self._settle_failures(everything=True)
        self.state_failures, self.state_failure_count = {}, 0
        self.state, self.in_state, self.expect_entry = None, False, None
        self.error, self.route_target, self.returned, self.ended = None, None, False, False

    def on_run_end(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        r = self.r
        outcome = _s(e.get("outcome"))
        r.outcome, r.exit_code = outcome, _i(e.get("exit_code"))
        self.ended = True
        if self.segment is not None:
            self.segment.end_seq, self.segment.end = seq, ts
            self.segment.outcome, self.segment.exit_code = outcome or "unknown", r.exit_code
        self._close_span(ts, None, None)
        if outcome in ("cancelled", "stopped"):
            for attempt in self.running.values():
                attempt.status = attempt.status or "cancelled"
            self._settle_attempts()
            return
        if outcome == "returned" and not self.returned:
            self.violation(seq, "ends_properly", "run returned without a RETURN summary")
        if str(outcome or "").startswith("complete") and self.state != "COMPLETE":
            self.violation(seq, "ends_properly", f"run completed in {self.state}, not in COMPLETE")
        for task in sorted(self.running, key=_seq_key):
            self.violation(seq, "task_transitions", f"task {task} still running at the end")
        for failure in self.unclassified.values():
            self.violation(failure.seq, "classify_before_act", "failure never classified")
        self.unclassified.clear()

    def _close_span(self, ts: str | None, trigger: str | None, to: str | None, *,
                    interrupted: bool = False) -> None:
        span = self.span
        if span is None or span.end is not None:
            return
        span.end, span.trigger, span.to = ts, trigger, to
        span.duration_ms = ev.ms_between(span.start, ts)
        span.interrupted = span.interrupted or interrupted

    def on_state_entry(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        state = _t(e.get("state"))
        resumed = bool(e.get("resumed"))
        if self.expect_entry is not None and state != self.expect_entry:
            self.violation(seq, "state_transitions",
                           f"entered {state} after a transition to {self.expect_entry}")
        elif self.expect_entry is None and self.span is not None and self.span.run == self.run_index \
                and not resumed:
            self.violation(seq, "state_transitions", f"entered {state} without a PHASE_TRANSITION")
        elif self.expect_entry is None and self.span is None and state != "INIT" and not resumed:
            self.violation(seq, "state_transitions", f"the run starts in {state}, not INIT")
        self._close_span(ts, None, None)
        self.expect_entry = None
        if self.route_target is not None and state != self.route_target:
            self.violation(seq, "error_route", f"ERROR routed to {self.route_target} but entered {state}")
        self.route_target = None
        self.state, self.in_state = state, True
        self.state_failures, self.state_failure_count = {}, 0
        if self.span is not None:
            self.r.states.append(self.span)  # closed above: no later event changes it
        self.span = StateSpan(str(state), seq, _s(ts), self.run_index, resumed=resumed,
                              error_type=_t(e.get("error_type")))
        if state == "ERROR":
            self.error_entries += 1
            if not e.get("error_type"):
                self.violation(seq, "error_state", "ERROR entered without an error_type")
            self.error = {"error_type": _t(e.get("error_type")), "seq": seq}

    def on_phase_transition(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        source = str(e.get("from") or "").upper()
        dest = str(e.get("to") or "").upper()
        trigger = str(e.get("trigger") or "")
        if not self.in_state:
            self.violation(seq, "state_transitions", f"transition {trigger} outside any state")
        elif source != self.state:
            self.violation(seq, "state_transitions", f"transition from {source} while in {self.state}")
        if (source, trigger, dest) not in self.transitions:
            self.violation(seq, "state_transitions",
                           f"{source} -{trigger}-> {dest} is not a transition of the {self.flow} flow")
        if dest == "ERROR":
            if trigger != "fail":
                self.violation(seq, "error_state", f"ERROR entered by '{trigger}', not 'fail'")
            if not self.state_failure_count and not any(
                    f.state == self.state for f in self.unclassified.values()):
                self.violation(seq, "error_state", f"{self.state} failed without a TOOL_FAILURE")
            for failure in self.unclassified.values():
                self.violation(seq, "classify_before_act",
                               f"moved to ERROR before failure {failure.seq} was classified")
            for failure in self.state_failures.values():
                if failure.outcome is None:
                    failure.outcome, failure.outcome_seq = "error", seq
            self.error_origin = self.state
        if self.error is not None:
            self.violation(seq, "error_route", "left ERROR without an ERROR_ROUTE")
            self.error = None
        if self.route_target is not None and dest != self.route_target:
            self.violation(seq, "error_route", f"ERROR routed to {self.route_target} but went to {dest}")
            self.route_target = None
        self._close_span(ts, trigger, dest)
        self.in_state = False
        self.expect_entry = dest
        # Operations never outlive their state (the recovery protocol runs inside a handler).
        self.ops.clear()
        self.state_failures, self.state_failure_count = {}, 0
        self._settle_failures()

    # --- failures and the recovery protocol ---
    def on_tool_failure(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        message = _s(e.get("message"))
        if message is not None and len(message) > _MESSAGE_LIMIT:
            message = message[:_MESSAGE_LIMIT] + "..."
        task = _t(e.get("task_seq"))
        failure = Failure(seq, _s(ts), _t(e.get("state")), _t(e.get("tool")), task, _t(e.get("op_id")),
                          _i(e.get("attempt")), _t(e.get("error_type")), message, self.run_index)
        key = self.r.failures.reserve()
        self.open_failures[key] = failure
        if task is not None:
            self.task_open.setdefault(task, []).append(key)
        if seq is not None:
            self.unclassified[seq] = failure
        self.state_failures[key] = failure
        self.state_failure_count += 1
        op = failure.op_id
        if op:
            state = self.ops.get(op)
            if state is None:
                self.ops[op] = _Op(task, failure)
            else:
                state.failure = failure
        if task is not None:
            self.task_failures[task] = failure
            attempt = self.running.get(task)
            if attempt is not None and seq is not None:
                if attempt.failures is None:
                    attempt.failures = [seq]
                else:
                    attempt.failures.append(seq)

    def on_failure_classified(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        failure = self.unclassified.pop(_i(e.get("failure_seq")), None)
        if failure is None:
            self.violation(seq, "classify_before_act",
                           f"classification of failure {e.get('failure_seq')}, which is unknown or "
                           "already classified")
            return
        failure.klass, failure.decision, failure.classified_seq = _t(e.get("klass")), _t(e.get("decision")), seq
        registry = REGISTRY.get(str(failure.error_type))
        if registry is not None and failure.klass and failure.klass != registry.klass.value:
            self.violation(seq, "classify_before_act",
                           f"{failure.error_type} classified {failure.klass}; the registry says "
                           f"{registry.klass.value}")

    def _unclassified_of(self, op: str | None, task: str | None) -> Failure | None:
        for failure in self.unclassified.values():
            if (op is not None and failure.op_id == op) or (
                    op is None and task is not None and failure.task_seq == task):
                return failure
        return None

    def on_retry(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        op, task = _t(e.get("op_id")), _t(e.get("task_seq"))
        self.r.retries.append({"seq": seq, "ts": _s(ts), "op_id": op, "tool": _t(e.get("tool")),
                               "task_seq": task, "attempt": _i(e.get("attempt")),
                               "wait_ms": _i(e.get("wait_ms")), "error_type": _t(e.get("error_type")),
                               "run": self.run_index})
        pending = self._unclassified_of(op, task)
        if pending is not None:
            self.violation(seq, "classify_before_act", f"RETRY before failure {pending.seq} was classified")
        state = self.ops.get(op) if op else None
        failure = state.failure if state is not None else None
        if failure is None or failure.decision != "retry":
            self.violation(seq, "emit_before_retry", f"RETRY of {op} without a failure classified retry")
        if state is None:
            return
        state.retries += 1
        if failure is not None:
            failure.outcome, failure.outcome_seq = "retried", seq
            if failure.klass == "structural":
                self.violation(seq, "retry_limit", f"{failure.error_type} is structural; {op} was retried")
                return
            limit = self.flaky_retries if failure.error_type == "flaky_test" else self.transient_retries
            if state.retries > limit:
                self.violation(seq, "retry_limit", f"{state.retries} retries of {op} (limit {limit})")
        attempt = self.running.get(task) if task is not None else None
        if attempt is not None:
            attempt.retries += 1

    def on_recovery_attempt(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        op, task = _t(e.get("op_id")), _t(e.get("task_seq"))
        strategy, success = _t(e.get("strategy")), e.get("success") is True
        self.r.recoveries.append({"seq": seq, "ts": _s(ts), "strategy": strategy, "success": success,
                                  "error_type": _t(e.get("error_type")), "task_seq": task, "op_id": op,
                                  "state": _t(e.get("state")), "run": self.run_index})
        pending = self._unclassified_of(op, task)
        if pending is not None:
            self.violation(seq, "classify_before_act",
                           f"RECOVERY_ATTEMPT before failure {pending.seq} was classified")
        if strategy == "reuse_commit" and task is not None:  # committed before a crash
            self.r.tasks.evict()
            info = self._task(task)
            info.commit = _s(e.get("commit"))
            if e.get("integrated") is True and info.integrated is None:
                self.integration_count += 1  # its TASK_INTEGRATED was lost with the crash
                info.integrated = self.integration_count
        failure: Failure | None = None
        if op:
            state = self.ops.get(op)
            failure = state.failure if state is not None else None
            if failure is None:
                self.violation(seq, "emit_before_retry", f"recovery of {op} without a TOOL_FAILURE of it")
        elif task is not None:
            failure = self.task_failures.get(task)
        if failure is not None:
            failure.outcome = f"{'recovered' if success else 'failed'}:{strategy}"
            failure.outcome_seq = seq
        attempt = self.running.get(task) if task is not None else None
        if attempt is not None and strategy:
            attempt.recoveries = [*(attempt.recoveries or ()), strategy]
        if strategy in ("replan", "retry_root") and success:
            self.replan_open = True  # the merge may reopen blocked tasks (CASCADE's retry too)

    # --- ERROR ---
    def on_error_route(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        if self.error is None:
            self.violation(seq, "error_route", "ERROR_ROUTE outside ERROR")
            return
        error_type = self.error["error_type"] or "internal_error"
        expected = kind(error_type).route.value
        route = _s(e.get("route"))
        allowed = {expected}
        if self.error_entries > _MAX_ERROR_ENTRIES:
            allowed.add(Route.SUMMARY.value)
        if expected == Route.PLAN.value and (self.error_origin != "EXPLORE" or not self.explored):
            allowed.add(Route.SUMMARY.value)  # no partial exploration to plan with
        if expected == Route.CASCADE.value and self.flow == "task":
            allowed.add(Route.OBSERVE.value)
        if route not in allowed:
            self.violation(seq, "error_route", f"{error_type} routed to {route}, registry says {expected}")
        if self.error["error_type"] and e.get("error_type") not in (None, self.error["error_type"]):
            self.violation(seq, "error_route", f"ERROR_ROUTE names {e.get('error_type')}, ERROR was "
                                               f"entered with {self.error['error_type']}")
        self.route_target = _ROUTE_TARGETS.get(str(route))
        self.error = None

    def on_explorer_result(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        if e.get("status") in ("ok", "partial"):
            self.explored = True

    def on_return(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.returned = True
        summary = e.get("summary")
        self.r.summary = summary if isinstance(summary, dict) else None
        if not summary:
            self.violation(seq, "ends_properly", "RETURN without a summary")
        if self.route_target is not None:
            self.violation(seq, "error_route", f"RETURN after a route to {self.route_target}")
            self.route_target = None

    # --- tasks ---
    def _task(self, seq: str) -> TaskInfo:
        info = self.r.tasks.get(seq)
        if info is None:
            info = self.r.tasks.add(seq, TaskInfo(seq))
        return info

    def on_plan_registered(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        depends = e.get("depends") if isinstance(e.get("depends"), dict) else {}
        slugs = e.get("slugs") if isinstance(e.get("slugs"), dict) else {}
        for task in [str(t) for t in _list(e.get("seqs")) if isinstance(t, (str, int))] or list(depends):
            self.r.tasks.evict()  # between records: no TaskInfo is held across this call
            info = self._task(task)
            if task in depends:
                info.depends = [str(d) for d in _list(depends[task])]
            info.slug = _s(slugs.get(task, info.slug))

    def on_task_start(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        tasks = self.r.tasks
        tasks.evict()  # before any TaskInfo is looked up: none is held across this call
        info = self._task(str(e.get("task_seq") or ""))
        task = info.seq  # one str object per task, shared by its attempts
        if info.slug is None:
            workspace = str(e.get("workspace_id") or "")
            info.slug = workspace[len(task) + 1:] if workspace.startswith(task + "-") else None
        if task in self.running:
            self.violation(seq, "task_transitions", f"task {task} started twice")
            self._settle_attempts(task)  # the first start's attempt stays cut
        elif info.status == "complete":
            self.violation(seq, "task_transitions", f"task {task} started again after completing")
        elif info.status == "blocked" and not self.replan_open:
            self.violation(seq, "task_transitions", f"task {task} started while blocked, without a re-plan")
        if info.depends:
            open_deps = []
            for dep in info.depends:
                dep_info = tasks.get(dep)
                if dep_info is None or dep_info.status == "complete":
                    continue
                if dep_info.status == "interrupted":
                    dep_info.status = "complete"  # the store let its dependent start
                else:
                    open_deps.append(dep)
            if open_deps:
                self.violation(seq, "task_transitions",
                               f"task {task} started before {', '.join(open_deps)} completed")
        attempt = TaskAttempt(task, _t(e.get("worker")), _i(e.get("attempt")), ts, seq, self.run_index,
                              node=_t(e.get("node")))
        self.running[task] = attempt
        self.attempt_keys[task] = self.r.attempts.reserve()
        info.status, info.attempts = "running", info.attempts + 1
        if info.blocked_by:
            info.blocked_by = NO_ROOTS
        info.error_type = info.reason = None

    def on_task_end(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        task = str(e.get("task_seq") or "")
        attempt = self.running.pop(task, None)
        if attempt is None:
            self.violation(seq, "task_transitions", f"task {task} ended without a start")
            return
        status = e.get("status")
        status = _intern(status) if type(status) is str else _s(status)
        if status not in _ENDED_TASK:
            self.violation(seq, "task_transitions", f"task {task} ended with unknown status {status}")
        pending = self._unclassified_of(None, task) if self.unclassified else None
        if pending is not None:
            self.violation(seq, "classify_before_act",
                           f"task {task} ended before failure {pending.seq} was classified")
        end = ts
        if e.get("recovered") is True:  # written by the resume: the stored span says when it ended
            begun, took = ev.parse_ts(attempt.start), _i(e.get("duration_ms"))
            if begun is not None and took is not None and took >= 0:
                try:
                    end = ev.utc_at(begun.timestamp() + took / 1000)
                except (OverflowError, ValueError, OSError):  # a span past any calendar
                    end = ts
                if self.prev_ts is None or (end is not None and end > self.prev_ts):
                    self.prev_ts = end  # the crashed run was alive at least until then
        attempt.end, attempt.end_seq, attempt.status = end, seq, status
        # Where it ran, when the start could not say (a Ray task's node is known once it ran).
        if attempt.worker is None:
            attempt.worker = _t(e.get("worker"))
        if attempt.node is None:
            attempt.node = _t(e.get("node"))
        error_type = e.get("error_type")
        attempt.error_type = _intern(error_type) if type(error_type) is str else _s(error_type)
        attempt.duration_ms = _i(e.get("duration_ms"))
        attempt.commit = _s(e.get("commit"))
        cost, usage = e.get("total_cost_usd"), e.get("usage")
        if type(cost) in (int, float) and cost >= 0:
            attempt.cost_usd = float(cost)
            self.r.agent_cost_usd += float(cost)
        attempt.num_turns = _i(e.get("num_turns"))
        if isinstance(usage, dict):
            attempt.tokens = sum(v for v in usage.values() if type(v) is int and v > 0)
            self.r.agent_tokens += attempt.tokens
        if attempt.duration_ms is None:
            attempt.duration_ms = ev.ms_between(attempt.start, ts)
        info = self.r.tasks[attempt.seq]
        info.status = "pending" if status == "cancelled" else str(status)
        if status == "blocked":
            info.error_type = attempt.error_type
            failure = self.task_failures.get(task)
            info.reason = failure.message if failure is not None else None
        if self.task_failures:
            self.task_failures.pop(task, None)
        if self.ops:
            for op in [op for op, state in self.ops.items() if state.task_seq == task]:
                del self.ops[op]
        self._write_attempt(attempt, self.attempt_keys.pop(task))
        self._settle_failures(task)

    # --- worktree results ---
    def on_task_commit(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.tasks.evict()
        self._task(str(e.get("task_seq") or "")).commit = _s(e.get("commit"))

    def on_task_integrated(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.tasks.evict()
        info = self._task(str(e.get("task_seq") or ""))
        commit = _s(e.get("commit"))
        if info.integrated is not None:
            self.violation(seq, "integration", f"task {info.seq} integrated twice")
        elif commit is None or commit != info.commit:
            self.violation(seq, "integration",
                           f"task {info.seq} integrated commit {str(commit)[:12]}, not the one "
                           "committed after its verify passed")
        self.integration_count += 1
        info.integrated = self.integration_count
        self.r.integrations.add({"seq": seq, "ts": _s(ts), "order": self.integration_count,
                                 "task_seq": info.seq, "commit": commit, "head": _s(e.get("head")),
                                 "fast_forward": e.get("fast_forward") is True,
                                 "run": self.run_index})

    # --- cascade ---
    def on_cascade_status(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_STATUS, "cascade_state": _s(e.get("cascade_state")),
                               "unreachable": _list(e.get("unreachable"))})

    def on_cascade_analysis(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_ANALYSIS,
                               "recommendation": _s(e.get("recommendation")), "roots": _list(e.get("roots"))})

    def on_cascade_replan(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_REPLAN, "affected": e.get("affected")})

    def on_cascade_merge_failed(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_MERGE_FAILED,
                               "error_type": e.get("error_type"), "error": e.get("error")})

    def on_cascade_propagate(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        propagated = _list(e.get("propagated"))
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_PROPAGATE, "propagated": propagated})
        for item in propagated:
            if not isinstance(item, dict):
                continue
            self.r.tasks.evict()  # between records: no TaskInfo is held across this call
            info = self._task(str(item.get("seq")))
            if info.status == "complete":
                self.violation(seq, "task_transitions", f"complete task {info.seq} propagated as blocked")
                continue
            info.status = "blocked"
            info.blocked_by = [str(root) for root in _list(item.get("blocked_by"))]

    def on_resume(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        # Tasks the crash cut that the store still had running go back to pending; the others
        # had their outcome committed but not logged (a kill between the commit and TASK_END).
        for task in _list(e.get("reset_tasks")):
            info = self.r.tasks.get(str(task))
            if info is not None and info.status == "interrupted":
                info.status = "pending"

    def on_log_repaired(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.repaired.append({"seq": seq, "truncated_bytes": e.get("truncated_bytes")})

    # --- settling: records nothing can change any more leave memory for the spool ---
    def _settle_attempts(self, task: str | None = None) -> None:
        """Write out the running attempt of ``task`` (default: every one) as it stands."""
        keys = self.attempt_keys
        for name in [task] if task is not None else list(self.running):
            self._write_attempt(self.running.pop(name), keys.pop(name))

    def _write_attempt(self, attempt: TaskAttempt, key: int) -> None:
        """Spool a finished (or cut) attempt and count it on its node (`Replay.nodes`)."""
        node = attempt.node
        if node is not None:
            nodes = self.r.nodes
            if node in nodes:
                nodes[node] += 1
            elif len(nodes) < NODES_KEPT:
                nodes[node] = 1
            else:
                self.r.nodes_cut = True
        self.r.attempts.add(attempt, key)

    def _settle_failures(self, task: str | None = None, *, everything: bool = False) -> None:
        """Write out the open failures (of ``task`` only, when given) that no later event can
        change: classified, and held by no operation, task or classification of the recovery
        protocol. At a task's end only those with an outcome go (an ERROR of the state may still
        claim the others); ``everything`` at a run's end or crash."""
        if task is not None:
            keys = self.task_open.pop(task, None)
            if not keys:
                return
        else:
            keys = list(self.open_failures)
        add, open_failures = self.r.failures.add, self.open_failures
        kept: list[int] = []
        for key in keys:
            failure = open_failures.get(key)
            if failure is None:
                continue
            if not everything and (self._held(failure) or (task is not None and failure.outcome is None)):
                kept.append(key)
                continue
            add(failure, key)
            del open_failures[key]
            self.state_failures.pop(key, None)
            if task is None and failure.task_seq is not None:
                self._unindex(failure.task_seq, key)
        if task is not None and kept:
            self.task_open[task] = kept

    def _held(self, failure: Failure) -> bool:
        """Whether the recovery protocol can still change ``failure`` (O(1) look-ups)."""
        if failure.task_seq is not None and self.task_failures.get(failure.task_seq) is failure:
            return True
        op = self.ops.get(failure.op_id) if failure.op_id else None
        if op is not None and op.failure is failure:
            return True
        return failure.seq is not None and self.unclassified.get(failure.seq) is failure

    def _unindex(self, task: str, key: int) -> None:
        keys = self.task_open.get(task)
        if keys is not None:
            try:
                keys.remove(key)
            except ValueError:
                return
            if not keys:
                del self.task_open[task]

    def finish(self) -> None:
        r = self.r
        r.events, r.first_ts, r.last_ts = self.count, self.first_ts, self.prev_ts
        self._close_segment()
        if self.segment is None:
            self.violation(None, "ends_properly", "the log holds no RUN_START")
        elif not self.ended:
            for failure in self.unclassified.values():
                failure.outcome = failure.outcome or "interrupted"
            self.violation(None, "ends_properly", "the log ends without RUN_END (crashed, not resumed)")
            self.segment.interrupted_state = self.state
            self.segment.interrupted_tasks = sorted(self.running, key=_seq_key)
            if self.span is not None and self.span.end is None:
                self.span.interrupted = True
                self.span.duration_ms = ev.ms_between(self.span.start, r.last_ts)
        elif r.outcome not in ("complete", "complete_with_blocked", "returned", "cancelled", "stopped"):
            self.violation(None, "ends_properly", f"unknown outcome {r.outcome}")
        if self.span is not None:
            r.states.append(self.span)
            self.span = None
        self._settle_attempts()
        self._settle_failures(everything=True)
