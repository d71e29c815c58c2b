"""Tests for ftl.engine.scheduler: dynamic starts, the jobs bound, blocks, resume, cancel and Ctrl-C.

Tasks coordinate through threading.Event / Barrier with generous safety timeouts; nothing
asserts on elapsed time. A safety timeout that fires turns into a failing assertion.
"""

from __future__ import annotations

import _thread
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl.errors import FtlError
from ftl.engine.scheduler import CancelToken, Scheduler, TaskOutcome, critical_path_priority

SAFETY_S = 10.0  # only reached when the scheduler misbehaves


class Recorder:
    """Thread-safe log of starts/finishes with a live concurrency count."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []  # (kind, seq, worker)
        self.running: dict[str, str] = {}
        self.max_running = 0
        self.lane_clash: list[tuple[str, str]] = []

    def begin(self, seq: str, worker: str) -> None:
        with self.lock:
            if worker in self.running.values():
                self.lane_clash.append((seq, worker))
            self.running[seq] = worker
            self.max_running = max(self.max_running, len(self.running))
            self.events.append(("run", seq, worker))

    def end(self, seq: str) -> None:
        with self.lock:
            del self.running[seq]

    def on_start(self, seq: str, worker: str) -> None:
        self.events.append(("start", seq, worker))

    def on_finish(self, outcome: TaskOutcome, worker: str) -> None:
        self.events.append(("finish", outcome.seq, worker))

    def kinds(self, kind: str) -> list[str]:
        return [seq for k, seq, _ in self.events if k == kind]


def runner(rec: Recorder, body=None):
    """A run_task that records itself, then runs ``body(seq, token)`` -> status (default complete)."""

    def run_task(seq: str, token: CancelToken, worker: str) -> TaskOutcome:
        rec.begin(seq, worker)
        try:
            status = body(seq, token) if body else "complete"
            return status if isinstance(status, TaskOutcome) else TaskOutcome(seq, status)
        finally:
            rec.end(seq)

    return run_task


def make(deps, rec: Recorder, body=None, **kw) -> Scheduler:
    return Scheduler(deps, run_task=runner(rec, body), on_start=rec.on_start,
                     on_finish=rec.on_finish, **kw)


# -- dynamic starts -------------------------------------------------------------------------

def test_task_starts_while_an_unrelated_task_still_runs():
    # 001 -> 003; 002 is long and independent. A wave scheduler would hold 003 until 002 ends.
    c_started = threading.Event()
    b_saw_c = []

    def body(seq, token):
        if seq == "002":
            b_saw_c.append(c_started.wait(SAFETY_S))
        if seq == "003":
            c_started.set()
        return "complete"

    rec = Recorder()
    out = make({"001": [], "002": [], "003": ["001"]}, rec, body, jobs=2).run()
    assert b_saw_c == [True]
    assert {s: o.status for s, o in out.items()} == {"001": "complete", "002": "complete",
                                                     "003": "complete"}


def test_ready_tasks_start_in_numeric_seq_order():
    rec = Recorder()
    make({"10": [], "9": [], "010a": [], "2": ["10"]}, rec, jobs=1).run()
    assert rec.kinds("start") == ["9", "10", "2", "010a"]


def test_priority_orders_ready_tasks_ties_by_seq():
    rec = Recorder()
    rank = {"001": 1, "002": 0, "003": 0, "004": 0}
    make({"001": [], "002": [], "003": [], "004": ["001"]}, rec, jobs=1,
         priority=rank.__getitem__).run()
    assert rec.kinds("start") == ["002", "003", "001", "004"]


def test_critical_path_priority_prefers_the_longest_remaining_chain():
    deps = {"001": [], "002": [], "003": ["002"], "004": ["003", "999"]}
    key = critical_path_priority(deps, {"001": 5.0, "002": 1.0, "003": 2.0, "004": 3.0})
    # (-bottom level, -work of the direct dependents); a seq outside the graph ranks (0, 0).
    assert [key(s) for s in ["001", "002", "003", "004", "zzz"]] == \
        [(-5.0, 0.0), (-6.0, -2.0), (-5.0, -3.0), (-3.0, 0.0), (0.0, 0.0)]
    rec = Recorder()
    make(deps, rec, jobs=1, priority=key).run()
    assert rec.kinds("start") == ["002", "003", "001", "004"]  # 003 ties 001, more behind it
    with pytest.raises(FtlError) as err:
        critical_path_priority({"001": ["002"], "002": ["001"]}, {})
    assert err.value.error_type == "cycle_detected"


def test_critical_path_ties_go_to_the_task_with_more_work_behind_it():
    # Budgets tie often: 001 and 002 both head a chain of 3, but 002 releases two tasks at once.
    deps = {"001": [], "002": [], "003": ["001"], "004": ["002"], "005": ["002"]}
    budgets = {"001": 1.0, "002": 1.0, "003": 2.0, "004": 2.0, "005": 1.0}
    key = critical_path_priority(deps, budgets)
    assert key("001")[0] == key("002")[0] == -3.0
    rec = Recorder()
    make(deps, rec, jobs=1, priority=key).run()
    assert rec.kinds("start")[:2] == ["002", "001"]


def test_never_more_than_jobs_and_lanes_are_reused():
    jobs = 3
    barrier = threading.Barrier(jobs, timeout=SAFETY_S)  # proves `jobs` tasks do run together

    def body(seq, token):
        barrier.wait()
        return "complete"

    rec = Recorder()
    out = make({f"{i:03d}": [] for i in range(1, 10)}, rec, body, jobs=jobs).run()
    assert all(o.status == "complete" for o in out.values()) and len(out) == 9
    assert rec.max_running == jobs
    assert rec.lane_clash == []
    assert {w for k, _, w in rec.events if k == "run"} == {"w1", "w2", "w3"}


def test_on_start_precedes_run_and_on_finish_precedes_dependents():
    rec = Recorder()
    make({"001": [], "002": ["001"]}, rec, jobs=2).run()
    order = [(k, s) for k, s, _ in rec.events]
    assert order == [("start", "001"), ("run", "001"), ("finish", "001"),
                     ("start", "002"), ("run", "002"), ("finish", "002")]


# -- blocks, errors, resume -----------------------------------------------------------------

def test_blocked_task_stops_its_descendants_only():
    rec = Recorder()
    deps = {"001": [], "002": ["001"], "003": ["002"], "004": [], "005": ["004"]}
    out = make(deps, rec, lambda s, t: "blocked" if s == "001" else "complete", jobs=2).run()
    assert {s: o.status for s, o in out.items()} == {"001": "blocked", "004": "complete",
                                                     "005": "complete"}
    assert set(rec.kinds("run")) == {"001", "004", "005"}


def test_run_task_exception_becomes_blocked_internal_error():
    def body(seq, token):
        if seq == "001":
            raise RuntimeError("boom")
        return "complete"

    rec = Recorder()
    out = make({"001": [], "002": ["001"], "003": []}, rec, body, jobs=2).run()
    assert out["001"].status == "blocked"
    assert out["001"].detail["error_type"] == "internal_error"
    assert out["001"].detail["exception"] == "RuntimeError"
    assert out["003"].status == "complete"
    assert "002" not in out and "002" not in rec.kinds("start")
    assert rec.kinds("finish").count("001") == 1


def test_run_task_returning_garbage_is_blocked():
    rec = Recorder()
    out = make({"001": [], "002": []}, rec,
               lambda s, t: TaskOutcome("999", "complete") if s == "001" else "complete",
               jobs=1).run()
    assert out["001"].status == "blocked"
    assert out["001"].detail["error_type"] == "internal_error"
    assert out["002"].status == "complete"


def test_resume_seeds_done_and_blocked_and_outside_deps():
    rec = Recorder()
    deps = {"001": [], "002": [], "003": ["001"], "004": ["002"], "005": ["999"], "006": ["004"]}
    out = make(deps, rec, jobs=2, done=["001", "777"], blocked=["002"]).run()
    assert set(out) == {"003", "005"}
    assert set(rec.kinds("run")) == {"003", "005"}


def test_done_task_counts_complete_even_if_its_own_dep_is_blocked():
    rec = Recorder()
    out = make({"001": [], "002": ["001"], "003": ["002"]}, rec, jobs=1,
               done=["002"], blocked=["001"]).run()
    assert set(out) == {"003"}


# -- cancel and Ctrl-C ----------------------------------------------------------------------

def _blocking_body(started: dict[str, threading.Event]):
    def body(seq, token):
        started[seq].set()
        return "cancelled" if token.wait(SAFETY_S) else "complete"
    return body


def test_cancel_from_another_thread_stops_running_and_starts_nothing():
    seqs = ["001", "002", "003", "004"]
    started = {s: threading.Event() for s in seqs}
    rec = Recorder()
    sched = make({s: [] for s in seqs}, rec, _blocking_body(started), jobs=2)

    def canceller():
        if started["001"].wait(SAFETY_S) and started["002"].wait(SAFETY_S):
            sched.cancel()

    t = threading.Thread(target=canceller)
    t.start()
    out = sched.run()
    t.join()
    assert {s: o.status for s, o in out.items()} == {"001": "cancelled", "002": "cancelled"}
    assert sorted(rec.kinds("finish")) == ["001", "002"]
    assert sorted(rec.kinds("start")) == ["001", "002"]
    assert sched.token.cancelled


def test_cancel_before_run_starts_nothing():
    token = CancelToken()
    token.cancel()
    rec = Recorder()
    assert make({"001": []}, rec, jobs=1, cancel=token).run() == {}
    assert rec.events == []


def test_token_event_is_the_flag_tool_calls_wait_on():
    token = CancelToken()
    event = token.event
    assert isinstance(event, threading.Event) and not event.is_set()
    assert token.event is event  # one event for the token's whole life
    token.cancel()
    assert event.is_set() and token.cancelled
    with pytest.raises(AttributeError):
        token.event = threading.Event()  # read-only


def test_keyboard_interrupt_cancels_reports_and_reraises():
    # run() runs in pytest's main thread; task 001 interrupts it like a Ctrl-C would.
    seqs = ["001", "002", "003", "004"]
    started = {s: threading.Event() for s in seqs}
    blocking = _blocking_body(started)

    def body(seq, token):
        if seq == "002":
            started["001"].wait(SAFETY_S)
            _thread.interrupt_main()
        return blocking(seq, token)

    rec = Recorder()
    sched = make({"001": [], "002": [], "003": [], "004": ["001"]}, rec, body, jobs=2)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    assert {s: o.status for s, o in sched.outcomes.items()} == {"001": "cancelled",
                                                                "002": "cancelled"}
    assert sorted(rec.kinds("finish")) == ["001", "002"]
    assert rec.running == {}


class _CtrlCAtLine:
    """A main-thread trace that raises KeyboardInterrupt at the n-th line run in ftl/engine/scheduler.py.

    It raises once (Python unsets a trace function that raised), which models one Ctrl-C
    landing at an arbitrary point of the scheduler thread, including inside bookkeeping.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.endswith("scheduler.py"):
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line":
            self.seen += 1
            if self.seen == self.n:
                raise KeyboardInterrupt
        return self._line


def test_ctrl_c_at_every_line_of_the_scheduler_thread_leaves_nothing_unreported():
    deps = {"001": [], "002": [], "003": ["001"], "004": ["002", "003"]}

    def pool_threads() -> set[threading.Thread]:
        # Only the scheduler's own workers: other tests' daemon threads may come and go.
        return {t for t in threading.enumerate() if t.name.startswith("ftl-task-") and t.is_alive()}

    baseline_threads = pool_threads()
    for n in range(1, 400):
        rec = Recorder()
        sched = make(deps, rec, jobs=2)
        trace = _CtrlCAtLine(n)
        previous = sys.gettrace()
        sys.settrace(trace)
        try:
            sched.run()
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(previous)
        assert rec.running == {}, n
        finished = set(rec.kinds("finish"))
        assert set(rec.kinds("run")) <= finished and set(rec.kinds("start")) <= finished, n
        assert finished == set(sched.outcomes), n
        for thread in threading.enumerate():  # a thread caught mid-start exits on its own
            if thread.name.startswith("ftl-task-"):
                thread.join(SAFETY_S)
        assert pool_threads() <= baseline_threads, n
        if not interrupted:  # n is past the last line of an uninterrupted run
            assert set(sched.outcomes) == set(deps)
            break
    else:
        pytest.fail("the scheduler ran more than 400 traced lines for 4 tasks")


def test_keyboard_interrupt_inside_on_start_still_reports_the_announced_task():
    started = {"001": threading.Event()}
    rec = Recorder()

    def on_start(seq, worker):
        rec.on_start(seq, worker)
        if seq == "002":
            assert started["001"].wait(SAFETY_S)
            raise KeyboardInterrupt

    sched = Scheduler({"001": [], "002": [], "003": []}, jobs=2,
                      run_task=runner(rec, _blocking_body(started)),
                      on_start=on_start, on_finish=rec.on_finish)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    assert sched.outcomes["001"].status == "cancelled"
    assert sched.outcomes["002"] == TaskOutcome("002", "cancelled",
                                                {"reason": "interrupted_before_start"})
    assert sorted(rec.kinds("finish")) == ["001", "002"]
    assert rec.kinds("run") == ["001"]


def test_keyboard_interrupt_inside_on_finish_reports_that_outcome_again():
    calls = []

    def on_finish(outcome, worker):
        calls.append(outcome.seq)
        if len(calls) == 1:
            raise KeyboardInterrupt

    sched = Scheduler({"001": [], "002": ["001"]}, jobs=1,
                      run_task=lambda s, t, w: TaskOutcome(s, "complete"), on_finish=on_finish)
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    assert calls == ["001", "001"]  # at least once: the interrupted report is repeated
    assert set(sched.outcomes) == {"001"}


def test_on_start_error_stops_new_starts_and_lets_running_tasks_finish():
    release = threading.Event()
    rec = Recorder()

    def on_start(seq, worker):
        if seq == "002":
            release.set()
            raise OSError("store is read-only")
        rec.on_start(seq, worker)

    def body(seq, token):
        assert release.wait(SAFETY_S)
        return "cancelled" if token.cancelled else "complete"

    sched = Scheduler({"001": [], "002": [], "003": ["001"]}, jobs=2,
                      run_task=runner(rec, body), on_start=on_start, on_finish=rec.on_finish)
    with pytest.raises(OSError, match="read-only"):
        sched.run()
    assert {s: o.status for s, o in sched.outcomes.items()} == {"001": "complete"}
    assert rec.kinds("run") == ["001"] and rec.kinds("finish") == ["001"]
    assert not sched.token.cancelled


def test_on_finish_error_stops_new_starts_and_propagates():
    def on_finish(outcome, worker):
        raise ValueError("event log full")

    sched = Scheduler({"001": [], "002": ["001"]}, jobs=1,
                      run_task=lambda s, t, w: TaskOutcome(s, "complete"), on_finish=on_finish)
    with pytest.raises(ValueError, match="event log full"):
        sched.run()
    assert set(sched.outcomes) == {"001"}


# -- input validation -----------------------------------------------------------------------

def _noop(seq, token, worker):
    return TaskOutcome(seq, "complete")


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_bad_jobs_is_a_configuration_error(jobs):
    with pytest.raises(FtlError) as err:
        Scheduler({"001": []}, jobs=jobs, run_task=_noop)
    assert err.value.error_type == "configuration_error"


def test_cycle_is_reported_with_its_path():
    with pytest.raises(FtlError) as err:
        Scheduler({"001": ["003"], "002": ["001"], "003": ["002"], "004": []}, jobs=1,
                  run_task=_noop, done=["002"])
    assert err.value.error_type == "cycle_detected"
    assert set(err.value.details["violations"]) == {"001", "002", "003"}


def test_done_and_blocked_overlap_is_a_conflict():
    with pytest.raises(FtlError) as err:
        Scheduler({"001": []}, jobs=1, run_task=_noop, done=["001"], blocked=["001"])
    assert err.value.error_type == "conflict"


def test_string_deps_value_is_rejected():
    with pytest.raises(FtlError) as err:
        Scheduler({"001": [], "002": "001"}, jobs=1, run_task=_noop)
    assert err.value.error_type == "schema_invalid"


def test_bad_outcome_status_is_rejected():
    with pytest.raises(FtlError) as err:
        TaskOutcome("001", "done")
    assert err.value.error_type == "schema_invalid"


def test_run_is_single_use():
    sched = Scheduler({"001": []}, jobs=1, run_task=_noop)
    sched.run()
    with pytest.raises(FtlError) as err:
        sched.run()
    assert err.value.error_type == "invalid_state"


def test_cancel_token_wait():
    token = CancelToken()
    assert token.wait(0) is False and not token.cancelled
    token.cancel()
    assert token.wait(SAFETY_S) is True and token.cancelled


# -- property: random DAGs ------------------------------------------------------------------

@st.composite
def dags(draw):
    n = draw(st.integers(1, 14))
    seqs = [f"{i:03d}" for i in range(1, n + 1)]
    deps = {}
    for i, seq in enumerate(seqs):
        lower = seqs[:i] + ["900"]  # "900" is outside the graph: counts as complete
        deps[seq] = draw(st.lists(st.sampled_from(lower), max_size=3, unique=True))
    status = {s: draw(st.sampled_from(["complete", "complete", "blocked", "cancelled", "raise"]))
              for s in seqs}
    seeded = {s: draw(st.sampled_from(["pending", "pending", "pending", "done", "blocked"]))
              for s in seqs}
    jobs = draw(st.integers(1, 4))
    return deps, status, seeded, jobs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_respect_dependencies(case):
    deps, status, seeded, jobs = case
    done = {s for s, v in seeded.items() if v == "done"}
    blocked = {s for s, v in seeded.items() if v == "blocked"}
    lock = threading.Lock()
    completed = set(done)
    violations, runs = [], []
    rec = Recorder()

    def body(seq, token):
        with lock:
            runs.append(seq)
            missing = [d for d in deps[seq] if d in deps and d not in completed]
            if missing:
                violations.append((seq, missing))
        if status[seq] == "raise":
            raise RuntimeError(seq)
        if status[seq] == "complete":
            with lock:
                completed.add(seq)
        return status[seq]

    out = make(deps, rec, body, jobs=jobs, done=done, blocked=blocked).run()

    expected_ok: set[str] = set(done)
    expected_run: set[str] = set()
    for seq in sorted(deps):  # deps only point to lower seqs
        if seq in done or seq in blocked:
            continue
        if all(d not in deps or d in expected_ok for d in deps[seq]):
            expected_run.add(seq)
            if status[seq] == "complete":
                expected_ok.add(seq)

    assert violations == []
    assert sorted(runs) == sorted(set(runs)), "a task ran twice"
    assert set(runs) == expected_run == set(out)
    assert rec.max_running <= jobs and rec.lane_clash == []
    assert sorted(rec.kinds("start")) == sorted(rec.kinds("finish")) == sorted(expected_run)
    for seq, outcome in out.items():
        want = "blocked" if status[seq] == "raise" else status[seq]
        assert outcome.status == want
