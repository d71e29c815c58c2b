"""Dynamic DAG scheduler: runs each task the moment its dependencies are complete, N at a time.

The runner's EXECUTE state hands the registered DAG to a `Scheduler`. Unlike FTL's wave loop
(compute the ready set, run it all, wait for the whole wave), a task here starts as soon as its
last dependency completes, so one slow task holds back only its own descendants. The ready set
comes from `graphlib.TopologicalSorter`; a task is marked done in the sorter only when its
outcome is ``complete``, so the descendants of a blocked or cancelled task never start (the
runner's CASCADE state deals with them).

What the scheduler does not do:
- Timeouts. Each task's wall-clock limit (``Config.task_timeout_s``: its ``timeout_s`` or
  budget x ``seconds_per_budget``) is enforced inside ``run_task``, which knows how to stop its
  own builder and how to report the failure (a ``blocked`` outcome with error_type
  ``timeout``). Keeping clocks out of the scheduler keeps it deterministic to test.
- Persistence. ``on_start`` / ``on_finish`` run in the scheduler thread, so the runner writes
  the store row and the event there (event before action) without locking.

Threads: ``run()`` is the scheduler thread; ``run_task`` runs on an executor
(`ftl.executors.base.Executor`: by default `ftl.executors.local.LocalExecutor`, a pool of at
most ``jobs`` driver threads; the Ray executor uses the same threads to drive tasks whose
commands run on a cluster). Ctrl-C (KeyboardInterrupt in the scheduler thread) cancels the shared token,
waits for the running tasks to return, reports them through ``on_finish`` and re-raises.
"""

from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from ftl.errors import FtlError
from ftl.executors.base import Executor

__all__ = ["CancelToken", "Scheduler", "TaskOutcome", "OUTCOME_STATUSES", "critical_path_priority"]

log = logging.getLogger(__name__)

OUTCOME_STATUSES = frozenset({"complete", "blocked", "cancelled"})

# How often the scheduler thread wakes while waiting for a task, in s. Only there so a Ctrl-C
# is seen promptly on platforms where a blocked lock wait is not interrupted by signals.
_POLL_S = 0.2


@dataclass(frozen=True)
class TaskOutcome:
    """How one run of one task ended.

    Attributes:
        seq: the task's seq (as given in the scheduler's ``deps``).
        status: ``complete`` (descendants may start), ``blocked`` (failed; descendants never
            start) or ``cancelled`` (stopped by the cancel token; resumable).
        detail: free-form context for the runner, e.g. ``{"error_type": "timeout"}``.

    Raises:
        FtlError(schema_invalid): ``status`` is not one of the three above.
    """

    seq: str
    status: str
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in OUTCOME_STATUSES:
            raise FtlError("schema_invalid", {
                "count": 1,
                "violations": [{"path": "status", "value": self.status,
                                "message": f"must be one of {sorted(OUTCOME_STATUSES)}"}],
            })


class CancelToken:
    """A thread-safe, one-way cancellation flag shared by the scheduler and its tasks.

    A task polls ``cancelled`` or sleeps with ``wait(timeout_s)``, which returns early when the
    token is cancelled, so cancellation never has to wait out a sleep.
    """

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        """Cancel; idempotent, callable from any thread."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def event(self) -> threading.Event:
        """The underlying event, for APIs that wait on a ``threading.Event`` (tool calls, retry
        backoffs). Read-only: cancel through `cancel`; never clear it."""
        return self._event

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds; True as soon as the token is cancelled, else False."""
        return self._event.wait(timeout_s)

    def __repr__(self) -> str:
        return f"CancelToken(cancelled={self.cancelled})"


RunTask = Callable[[str, CancelToken, str], TaskOutcome]
OnStart = Callable[[str, str], None]
OnFinish = Callable[[TaskOutcome, str], None]


def _seq_key(seq: Hashable) -> tuple:
    """Start order among ready tasks: numeric seqs by value ("9" before "10"), others after."""
    text = str(seq).strip()
    if text.isdigit():
        return (0, int(text), text)
    return (1, 0, text)


def critical_path_priority(deps: Mapping[str, Sequence[str]],
                           durations: Mapping[str, float]) -> Callable[[str], tuple[float, float]]:
    """A ``priority`` for `Scheduler` that starts the task heading the longest remaining chain.

    List scheduling with "highest level first" (Graham, Hu; HEFT's upward rank on identical
    lanes): a task's level is its bottom level, its own duration plus the longest chain of
    duration through its dependents. When more tasks are ready than lanes are free, this starts
    the one the critical path runs through, which the plain seq order may leave waiting.
    Equal levels are common when the durations are whole budgets; among those, the task whose
    direct dependents hold more work starts first (it releases more to run in parallel), then
    the lower seq. bench/bench_priority.py compares rules on 4,000 seeded DAGs: the tie-breaks
    (this one, seq, all descendants' work or count, own duration) are within noise of each
    other (0.9816-0.9819 of the lower bound; sign test |z| < 2), "bottom + top level" is worse
    (0.978), and so are a flat estimate (0.966: e.g. the same timeout for every task) and no
    priority (0.961). This tie-break is the cheapest of the best (linear, no descendant sets).

    Args:
        deps: seq -> seqs it depends on (deps outside the graph are ignored).
        durations: seq -> expected duration in s (e.g. budget x seconds_per_budget; an upper
            limit such as a timeout is not an estimate); a missing seq counts as 0.

    Returns:
        ``seq -> (-bottom_level, -work of its direct dependents)`` (lower starts first; unknown
        seqs get ``(0.0, 0.0)``). Cost: linear in tasks + edges.

    Raises:
        FtlError(cycle_detected): the dependencies form a cycle.
    """
    dependents: dict[str, list[str]] = {seq: [] for seq in deps}
    for seq, ds in deps.items():
        for d in dict.fromkeys(ds):  # a dependency listed twice is one edge
            if d in dependents:
                dependents[d].append(seq)
    try:
        order = list(TopologicalSorter({s: [d for d in ds if d in deps] for s, ds in deps.items()})
                     .static_order())
    except CycleError as exc:
        cycle = [str(s) for s in exc.args[1]]
        raise FtlError("cycle_detected", {"cycle": " -> ".join(cycle), "violations": cycle}) from None

    def own(seq: str) -> float:
        return float(durations.get(seq, 0.0))

    key: dict[str, tuple[float, float]] = {}
    level: dict[str, float] = {}
    for seq in reversed(order):  # dependents first
        level[seq] = own(seq) + max((level[c] for c in dependents[seq]), default=0.0)
        key[seq] = (-level[seq], -sum(own(c) for c in dependents[seq]))
    return lambda seq: key.get(seq, (0.0, 0.0))


class Scheduler:
    """Run a DAG of tasks with at most ``jobs`` at once, each as soon as its deps are complete.

    Args:
        deps: seq -> seqs it depends on. Deps that are not keys of ``deps`` count as complete
            (tasks of an earlier plan, or already merged work).
        jobs: maximum number of tasks running at once (``--jobs``; default CPU count in Config).
        run_task: ``(seq, token, worker) -> TaskOutcome``, called in a worker thread. Should
            return soon after ``token`` is cancelled. Anything it raises becomes a ``blocked``
            outcome with ``detail["error_type"] == "internal_error"`` (the traceback goes to
            this module's logger).
        on_start: ``(seq, worker)``, called in the scheduler thread before the task is handed
            to a worker (the runner writes its event and store row here: event before action).
            If it raises, no further task starts; running tasks finish normally and are
            reported, then ``run()`` re-raises the error.
        on_finish: ``(outcome, worker)``, called in the scheduler thread after the task
            returned and before any task it unblocked starts. If it raises, it is treated like
            an ``on_start`` failure. Called at least once for every task whose ``on_start``
            was entered: a Ctrl-C inside ``on_finish`` repeats that call during the drain, and
            a Ctrl-C between ``on_start`` and the hand-over reports ``cancelled`` with
            ``detail["reason"] == "interrupted_before_start"``, so it should tolerate a
            repeat (errors it raises during a Ctrl-C drain are logged and noted on the
            KeyboardInterrupt).
        done: seqs already complete (resume); never run, count as complete.
        blocked: seqs already blocked (resume); never run, their descendants never start.
        cancel: a token to share with the caller (e.g. a signal handler or an MCP cancel
            request); a new one when None.
        priority: ``seq -> sort key``; when several tasks are ready, the lowest key starts
            first, ties by seq. None: by seq number (``"9"`` before ``"10"``). See
            `critical_path_priority`.
        executor: where ``run_task`` calls run (`ftl.executors.base.Executor`); a new
            `ftl.executors.local.LocalExecutor` when None. The scheduler starts it with
            ``min(jobs, runnable tasks)`` slots and closes it before ``run()`` returns.
        interrupt: an event another thread sets to stop the run (`ftl.engine.runner.Runner`'s
            ``interrupt``): the scheduler then cancels its token, as `cancel` does.

    Worker names are ``"w1"`` .. ``"w{jobs}"``; a name is used by at most one running task at
    a time and the lowest free name is taken first, so a name is a lane of a Gantt chart.

    Raises:
        FtlError(configuration_error): ``jobs`` is not an integer >= 1.
        FtlError(cycle_detected): the dependencies form a cycle (``details["cycle"]``).
        FtlError(conflict): a seq is both in ``done`` and in ``blocked``.
        FtlError(schema_invalid): a ``deps`` value is a string instead of a list of seqs.
    """

    def __init__(self, deps: Mapping[str, Sequence[str]], *, jobs: int, run_task: RunTask,
                 on_start: OnStart | None = None, on_finish: OnFinish | None = None,
                 done: Iterable[str] = (), blocked: Iterable[str] = (),
                 cancel: CancelToken | None = None,
                 priority: Callable[[str], Any] | None = None,
                 executor: Executor | None = None,
                 interrupt: threading.Event | None = None) -> None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise FtlError("configuration_error", {
                "problem": f"jobs must be an integer >= 1, got {jobs!r}",
            })
        self._jobs = jobs
        self._run_task = run_task
        self._on_start = on_start
        self._on_finish = on_finish
        self._token = cancel if cancel is not None else CancelToken()
        self._interrupt = interrupt
        self._priority = priority
        if executor is None:
            from ftl.executors.local import LocalExecutor

            executor = LocalExecutor()
        self._executor = executor

        bad = sorted((str(seq) for seq, ds in deps.items() if isinstance(ds, (str, bytes))))
        if bad:
            raise FtlError("schema_invalid", {
                "count": len(bad),
                "violations": [{"path": f"deps.{seq}", "message": "must be a list of seqs, not a string"}
                               for seq in bad],
            })
        graph = {seq: tuple(d for d in ds if d in deps) for seq, ds in deps.items()}
        try:
            TopologicalSorter(graph).prepare()
        except CycleError as exc:
            cycle = [str(s) for s in exc.args[1]]
            raise FtlError("cycle_detected", {"cycle": " -> ".join(cycle), "violations": cycle}) from None

        self._done_seed = frozenset(s for s in done if s in deps)
        self._blocked_seed = frozenset(s for s in blocked if s in deps)
        both = sorted(self._done_seed & self._blocked_seed, key=_seq_key)
        if both:
            raise FtlError("conflict", {
                "what": f"task(s) {', '.join(map(str, both))} are both done and blocked; "
                        "fix the resume state so each task has one status",
            })
        # Done tasks leave the graph; their dependents treat them as complete.
        self._sorter: TopologicalSorter = TopologicalSorter()
        for seq, ds in graph.items():
            if seq not in self._done_seed:
                self._sorter.add(seq, *(d for d in ds if d not in self._done_seed))

        self._ready: list[tuple[Any, tuple, str]] = []      # heap by (priority, _seq_key)
        self._free_workers: list[int] = list(range(1, jobs + 1))  # heap of lane numbers
        self._running: dict[str, str] = {}                  # seq -> worker, submitted or being
        self._outcomes: dict[str, TaskOutcome] = {}
        # Written by the task calls (list.append is atomic) before the executor reports them, so
        # an interrupt in the scheduler thread can never lose an outcome; read here in order.
        self._finish_log: list[tuple[str, str, TaskOutcome]] = []
        self._reaped = 0
        self._stop_error: BaseException | None = None
        self._started = False
        self._pending = sum(1 for s in graph if s not in self._done_seed and s not in self._blocked_seed)

    # -- public ---------------------------------------------------------------------------

    @property
    def token(self) -> CancelToken:
        """The token handed to every ``run_task`` call."""
        return self._token

    @property
    def outcomes(self) -> dict[str, TaskOutcome]:
        """Outcomes reported so far in this run (also readable after ``run()`` raised)."""
        return dict(self._outcomes)

    def cancel(self) -> None:
        """Stop: no task starts from now on, running tasks see their token cancelled.

        Callable from any thread. ``run()`` returns once the running tasks have returned.
        """
        self._token.cancel()

    def run(self) -> dict[str, TaskOutcome]:
        """Run until nothing more can start and nothing runs; call once.

        Returns:
            seq -> outcome for every task run in this call (tasks seeded as done or blocked,
            and tasks that never became ready, are absent).

        Raises:
            KeyboardInterrupt: after cancelling the token, waiting for every running task and
                reporting it through ``on_finish``. A second Ctrl-C during that wait abandons
                it (unreported tasks then count as interrupted; resume re-runs them). An
                unexpected error inside the scheduler itself takes the same path.
            Exception: the first error raised by ``on_start`` / ``on_finish``, after the
                running tasks finished and were reported.
            FtlError(invalid_state): ``run()`` was already called on this scheduler.
        """
        if self._started:
            raise FtlError("invalid_state", {"trigger": "run", "state": "scheduler already ran"})
        self._started = True
        pool = self._executor
        try:
            pool.start(max(1, min(self._jobs, self._pending)), self._execute)
            self._loop(pool)
            pool.close()
        except BaseException as interrupt:  # Ctrl-C, or a bug here: never leave tasks running
            self._token.cancel()
            pool.cancel()
            self._drain_after_interrupt(pool, interrupt)
            raise
        if self._stop_error is not None:
            raise self._stop_error
        return dict(self._outcomes)

    # -- scheduler thread -----------------------------------------------------------------

    def _loop(self, pool: Executor) -> None:
        self._sorter.prepare()
        self._collect_ready()
        while True:
            self._start_ready(pool)
            if not self._running:
                return
            if self._interrupt is not None and self._interrupt.is_set():
                self._token.cancel()  # seen within one poll (_POLL_S)
            if self._token.cancelled:
                pool.cancel()  # a cancel from outside (signal, MCP): stop remote work too
            if pool.next_finished(_POLL_S) is None:
                continue
            self._reap()

    def _collect_ready(self) -> None:
        for seq in self._sorter.get_ready():
            if seq not in self._blocked_seed:  # a seeded block never runs and is never done
                rank = self._priority(seq) if self._priority is not None else 0
                heapq.heappush(self._ready, (rank, _seq_key(seq), seq))

    def _may_start(self) -> bool:
        return self._stop_error is None and not self._token.cancelled

    def _start_ready(self, pool: Executor) -> None:
        while self._ready and self._free_workers and self._may_start():
            *_, seq = heapq.heappop(self._ready)
            worker = f"w{heapq.heappop(self._free_workers)}"
            # Registered before on_start so an interrupt inside it still gets an on_finish.
            self._running[seq] = worker
            if self._on_start is not None:
                try:
                    self._on_start(seq, worker)
                except Exception as exc:  # noqa: BLE001 - re-raised by run() after the drain
                    del self._running[seq]
                    heapq.heappush(self._free_workers, int(worker[1:]))
                    self._stop(exc, "on_start", seq)
                    return
            pool.submit(seq, worker)

    def _reap(self) -> None:
        """Handle every outcome the workers logged since the last call, in finishing order."""
        while self._reaped < len(self._finish_log):
            seq, worker, outcome = self._finish_log[self._reaped]
            self._running.pop(seq, None)
            heapq.heappush(self._free_workers, int(worker[1:]))
            self._outcomes[seq] = outcome
            if outcome.status == "complete":
                self._sorter.done(seq)
                self._collect_ready()
            self._report(outcome, worker)
            # Counted only once reported: an interrupt inside on_finish reports it again.
            self._reaped += 1

    def _report(self, outcome: TaskOutcome, worker: str) -> None:
        if self._on_finish is None:
            return
        try:
            self._on_finish(outcome, worker)
        except Exception as exc:  # noqa: BLE001 - re-raised by run() after the drain
            self._stop(exc, "on_finish", outcome.seq)

    def _stop(self, exc: BaseException, where: str, seq: str) -> None:
        if self._stop_error is None:
            self._stop_error = exc
        else:
            log.error("%s failed for task %s after an earlier callback error", where, seq,
                      exc_info=exc)
            self._stop_error.add_note(f"also: {where} for task {seq} raised {exc!r}")

    def _drain_after_interrupt(self, pool: Executor, interrupt: BaseException) -> None:
        pool.close()  # every task handed to the executor has returned and logged its outcome
        pending = self._finish_log[self._reaped:]
        self._reaped = len(self._finish_log)
        finished = {seq for seq, _, _ in pending}
        # Announced by on_start but interrupted before reaching a worker.
        for seq, worker in sorted(self._running.items(), key=lambda item: _seq_key(item[0])):
            if seq not in finished:
                pending.append((seq, worker, TaskOutcome(
                    seq, "cancelled", {"reason": "interrupted_before_start"})))
        self._running.clear()
        for seq, worker, outcome in pending:
            self._outcomes[seq] = outcome
            if self._on_finish is None:
                continue
            try:
                self._on_finish(outcome, worker)
            except Exception as exc:  # noqa: BLE001 - the interrupt takes precedence
                log.error("on_finish failed for task %s during Ctrl-C", seq, exc_info=exc)
                interrupt.add_note(f"on_finish for task {seq} raised {exc!r}")

    # -- worker threads -------------------------------------------------------------------

    def _execute(self, seq: str, worker: str) -> TaskOutcome:
        try:
            if self._token.cancelled:  # cancelled between submit and pick-up: do not start
                outcome = TaskOutcome(seq, "cancelled", {"reason": "cancelled_before_start"})
            else:
                outcome = self._checked(seq, self._run_task(seq, self._token, worker))
        except BaseException as exc:  # noqa: BLE001 - last fence: a task never crashes the run
            log.error("run_task raised for task %s on %s", seq, worker, exc_info=exc)
            outcome = TaskOutcome(seq, "blocked", {
                "error_type": "internal_error", "reason": "run_task raised",
                "exception": type(exc).__name__,
            })
        self._finish_log.append((seq, worker, outcome))
        return outcome

    @staticmethod
    def _checked(seq: str, outcome: object) -> TaskOutcome:
        if isinstance(outcome, TaskOutcome) and outcome.seq == seq:
            return outcome
        log.error("run_task for task %s returned %r, not its TaskOutcome", seq, outcome)
        return TaskOutcome(seq, "blocked", {
            "error_type": "internal_error", "reason": "run_task returned no TaskOutcome for this seq",
        })
