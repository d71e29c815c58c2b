"""Properties of the scheduler's start order on random DAGs, without threads or clocks.

A stepping executor (`ftl.executors.base.Executor`) runs each submitted call when the scheduler
asks for the next finished one, in an order hypothesis draws, so every interleaving of task
ends is reachable and the run is deterministic. It checks, at each hand-over, the two rules of
list scheduling the scheduler promises: no lane is idle while a task is ready (work
conservation), and the task handed over is the ready one with the lowest priority key.
"""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl.dag import critical_path, descendants, seq_key
from ftl.executors.base import Execute, Finished, Health
from ftl.engine.scheduler import Scheduler, TaskOutcome, critical_path_priority


class SteppingExecutor:
    """Runs one submitted call per `next_finished`, the one ``pick(running)`` chooses."""

    kind = "local"

    def __init__(self, deps: dict[str, list[str]], jobs: int, key: Callable[[str], Any],
                 done: set[str], blocked: set[str], pick: Callable[[list[str]], str]) -> None:
        self.deps, self.jobs, self.key, self.pick = deps, jobs, key, pick
        self.complete = set(done)
        self.blocked = set(blocked)
        self.submitted: set[str] = set(done) | set(blocked)
        self.running: dict[str, str] = {}
        self.execute: Execute | None = None
        self.violations: list[str] = []
        self.order: list[str] = []

    def ready(self) -> list[str]:
        return [s for s, ds in self.deps.items() if s not in self.submitted
                and all(d not in self.deps or d in self.complete for d in ds)]

    def start(self, slots: int, execute: Execute) -> None:
        self.execute = execute

    def submit(self, seq: str, worker: str) -> None:
        candidates = self.ready()
        best = min(candidates, key=lambda s: (self.key(s), seq_key(s)), default=None)
        if seq != best:
            self.violations.append(f"submitted {seq} while {best} ranks first among {candidates}")
        if worker in self.running.values():
            self.violations.append(f"lane {worker} given to {seq} while busy")
        self.submitted.add(seq)
        self.running[seq] = worker
        self.order.append(seq)

    def next_finished(self, timeout_s: float | None) -> Finished | None:
        idle = self.jobs - len(self.running)
        if idle > 0 and self.ready():
            self.violations.append(f"{idle} lane(s) idle while {self.ready()} are ready")
        if not self.running:
            self.violations.append("asked to wait with nothing running")
            return None
        seq = self.pick(sorted(self.running, key=seq_key))
        worker = self.running.pop(seq)
        assert self.execute is not None
        outcome = self.execute(seq, worker)
        if outcome.status == "complete":
            self.complete.add(seq)
        return Finished(seq, worker, outcome)

    def cancel(self) -> None:
        pass

    def heartbeat(self) -> Health:
        return Health("local", True, [], len(self.running))

    def close(self) -> None:
        pass


@st.composite
def cases(draw):
    n = draw(st.integers(1, 16))
    seqs = [f"{i:03d}" for i in range(1, n + 1)]
    deps = {seq: draw(st.lists(st.sampled_from(seqs[:i] + ["900"]), max_size=3, unique=True))
            for i, seq in enumerate(seqs)}  # "900" is outside the graph: counts as complete
    budgets = {seq: draw(st.integers(1, 3)) for seq in seqs}
    status = {seq: draw(st.sampled_from(["complete"] * 4 + ["blocked"])) for seq in seqs}
    seeded = {seq: draw(st.sampled_from(["pending"] * 4 + ["done", "blocked"])) for seq in seqs}
    return deps, budgets, status, seeded, draw(st.integers(1, 4))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.data())
def test_no_lane_idles_while_a_task_is_ready_and_the_best_ranked_starts(case, data):
    deps, budgets, status, seeded, jobs = case
    done = {s for s, v in seeded.items() if v == "done"}
    blocked = {s for s, v in seeded.items() if v == "blocked"}
    key = critical_path_priority(deps, {s: float(b) for s, b in budgets.items()})

    def pick(running: list[str]) -> str:
        return data.draw(st.sampled_from(running), label="next to finish")

    executor = SteppingExecutor(deps, jobs, key, done, blocked, pick)
    out = Scheduler(deps, jobs=jobs, priority=key, executor=executor, done=done, blocked=blocked,
                    run_task=lambda seq, token, worker: TaskOutcome(seq, status[seq])).run()

    # A hand-over of a task whose dependencies are not complete is a violation too: it is not
    # among the ready candidates.
    assert executor.violations == []
    assert set(out) == set(executor.order)
    complete = done | {s for s, o in out.items() if o.status == "complete"}
    for seq in set(deps) - done - blocked - set(out):  # never started: a dependency is not complete
        assert any(d in deps and d not in complete for d in deps[seq])


@settings(max_examples=150, deadline=None)
@given(cases())
def test_priority_is_the_bottom_level_and_ranks_a_task_before_its_dependents(case):
    deps, budgets, *_ = case
    durations = {s: float(b) for s, b in budgets.items()}
    key = critical_path_priority(deps, durations)
    for seq in deps:
        # Bottom level = the critical path of the task and what depends on it, transitively.
        below = {s: deps[s] for s in {seq} | descendants(deps, seq)}
        assert -key(seq)[0] == critical_path(below, durations)[0]
        dependents = [s for s in deps if seq in deps[s]]
        assert -key(seq)[1] == sum(durations[s] for s in dependents)
        assert all(key(seq) < key(s) for s in dependents)  # positive durations: strictly first
