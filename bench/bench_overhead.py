"""Benchmark: the runner's own cost per task, and its schedule on a DAG of short sleep tasks.

Two measurements on real campaigns (`ftl.engine.runner.Runner`, the real store, event log, tool server
and shell builder), each in a fresh git repository under a temporary directory:

* ``overhead``: a chain of ``--tasks`` tasks (jobs 1) whose run and verify commands are ``true``.
  Per task: its ``TASK_END.duration_ms`` (the attempt, from the worker's start to its end; a
  round's figure is the mean of its middle 60 %, `trimmed_mean`), and
  the EXECUTE span divided by the number of tasks (everything the runner does per task: the
  store transitions, events, workspace, two intent evaluations and two invocations). The
  baseline, measured in the same run, is what the two commands cost on their own: two
  ``sh -c true`` started with `subprocess.run`. Overhead = per-task time - baseline, per round
  (``--rounds`` campaigns, each with its own baselines; the median of the rounds). With a git
  worktree per task, each task's own git work (`git_timed_per_task`) comes off its time too.
  With the embedded server in the runner's process (the default) and as its subprocess over
  stdio (``server = "embedded:stdio"``).
* ``dag``: the 18-task DAG of issue 11 (sleeps of 0.3-3 s, seeded, jobs 3): the EXECUTE span
  (first ``TASK_START`` to last ``TASK_END``) against the lower bound max(critical path,
  total work / jobs); efficiency = bound / span (1.0 at best).

Usage: python bench/bench_overhead.py [--tasks 30] [--rounds 3] [--transport stdio,inproc] [--dag] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftl.config import Config  # noqa: E402
from ftl.events import read_events  # noqa: E402
from ftl.engine.runner import Runner, connect  # noqa: E402
from ftl.server.app import EMBEDDED_STDIO  # noqa: E402

DAG_SEED = 11
DAG_TASKS = 18
DAG_JOBS = 3
_clock = time.perf_counter  # the git timer's clock (a test counts its reads)


def git_repo(path: Path) -> Path:
    """An empty git repository with one commit (the builder compares against it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / ".gitignore").write_text(".ftl/\n")
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *argv],
                       cwd=path, check=True)
    return path


def _task(seq: int, run: str, depends: list[int], budget: int = 1) -> dict[str, Any]:
    return {"seq": f"{seq:03d}", "slug": f"task-{seq}", "type": "BUILD", "delta": [], "run": run,
            "verify": "true", "budget": budget, "timeout_s": 120,
            "depends": [f"{d:03d}" for d in depends] or "none"}


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


#: The `ftl.vcs.worktrees.Worktrees` methods a task's attempt calls: its isolation's git work.
GIT_STEPS = ("prepare", "renew", "reuse", "stage", "commit", "integrate", "release", "remove")


@contextmanager
def git_timed_per_task() -> Iterator[dict[str, float]]:
    """Time the git work of each task where the runner does it: while the block runs, every
    call of a `GIT_STEPS` method of `ftl.vcs.worktrees.Worktrees` adds its wall time (ms) to
    its task's entry of the yielded dict, keyed by the workspace id (``{seq}-{slug}``, as in
    ``TASK_START``). A call made inside another (``renew`` falling back to ``prepare``)
    counts once. The wrapper costs about 1 us per call."""
    from ftl.vcs.worktrees import Worktrees

    spent: dict[str, float] = defaultdict(float)
    depth = threading.local()

    def timed(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            outer = not getattr(depth, "value", 0)
            depth.value = getattr(depth, "value", 0) + 1
            started = _clock()
            try:
                return original(self, *args, **kwargs)
            finally:
                depth.value -= 1
                if outer:
                    first = args[0] if args else None
                    name = kwargs.get("name") or (first if isinstance(first, str) else first.name)
                    spent[name] += (_clock() - started) * 1000
        return wrapper

    originals = {step: getattr(Worktrees, step) for step in GIT_STEPS}
    for step, original in originals.items():
        setattr(Worktrees, step, timed(original))
    try:
        yield spent
    finally:
        for step, original in originals.items():
            setattr(Worktrees, step, original)


def run_campaign(plan: dict[str, Any], *, jobs: int, in_process: bool,
                 isolation: str = "auto") -> list[dict[str, Any]]:
    """Run ``plan`` to its end in a fresh repository with the embedded tool server in process
    (the default) or over stdio (``in_process`` False); ``isolation``: the config's task
    isolation, ``auto`` = a git worktree per task. Returns its events."""
    with tempfile.TemporaryDirectory(prefix="ftl-bench-") as tmp:
        repo = git_repo(Path(tmp) / "repo")
        config = Config(jobs=jobs, isolation=isolation, server=None if in_process else EMBEDDED_STDIO)
        with Runner(repo, config, client_factory=connect) as runner:
            result = runner.start(plan["objective"], plan_input=plan)
        if result.exit_code != 0:
            raise SystemExit(f"benchmark campaign ended with exit code {result.exit_code}: {result.summary}")
        return list(read_events(result.log_path))


def execute_span_s(events: list[dict[str, Any]]) -> float:
    """Seconds from the first ``TASK_START`` to the last ``TASK_END``."""
    starts = [_stamp(e) for e in events if e["event"] == "TASK_START"]
    ends = [_stamp(e) for e in events if e["event"] == "TASK_END"]
    return max(ends) - min(starts)


def command_samples_ms(repeat: int = 20) -> list[float]:
    """Costs (ms) of the two trivial commands of a task, run on their own, ``repeat`` times."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(["sh", "-c", "true"], check=True)
        subprocess.run(["sh", "-c", "true"], check=True)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def command_baseline_ms(repeat: int = 20) -> float:
    """Median cost (ms) of the two trivial commands of a task, run on their own."""
    return statistics.median(command_samples_ms(repeat))


def git_work_samples_ms(repeat: int = 20) -> list[float]:
    """Costs (ms) of the git work a worktree task needs, ``repeat`` tasks, done with
    `ftl.vcs.worktrees.Worktrees` on a fresh repository (no runner, no tool server): prepare
    the task's worktree (the previous task's, reset), stage, commit, integrate (a fast-forward)
    and release it. The task's two commands run where a task runs them (after prepare, after
    stage) and are not timed: the same git calls cost 0.4-1.4 ms more per task after two
    process starts than back to back (caches), and the runner's tasks pay that too."""
    from ftl.vcs.worktrees import Worktrees

    samples = []
    with tempfile.TemporaryDirectory(prefix="ftl-bench-") as tmp:
        trees = Worktrees(git_repo(Path(tmp) / "repo"), "bench")
        trees.ensure_integration()
        for number in range(repeat + 3):
            name = f"{number:03d}-task"
            started = time.perf_counter()
            tree = trees.prepare(name)
            spent = time.perf_counter() - started
            subprocess.run(["sh", "-c", "true"], cwd=tree.path, check=True)  # the build
            started = time.perf_counter()
            trees.stage(tree)
            spent += time.perf_counter() - started
            subprocess.run(["sh", "-c", "true"], cwd=tree.path, check=True)  # the verify
            started = time.perf_counter()
            commit = trees.commit(tree, seq=f"{number:03d}", slug="task", attempt=1, spec={})
            trees.integrate(commit, name=name)
            trees.release(tree)  # as the runner does: the next task reuses the worktree
            spent += time.perf_counter() - started
            if number >= 3:  # three warm-up rounds
                samples.append(spent * 1000)
    return samples


def trimmed_mean(values: list[float], cut: float = 0.2) -> float:
    """The mean of ``values`` without the lowest and the highest ``cut`` of them.

    A task's ``duration_ms`` is rounded to whole ms (unbiased), so the median of a round's
    tasks moves in 0.5-1 ms steps, too coarse for a 5 ms target; the mean of the middle 60 %
    resolves tenths of a ms and, like the median, ignores the odd slow task (a GC pass, a
    neighbour's burst)."""
    ordered = sorted(values)
    drop = int(len(ordered) * cut)
    return statistics.fmean(ordered[drop:len(ordered) - drop] or ordered)


def overhead(tasks: int, in_process: bool, isolation: str = "auto", rounds: int = 3) -> dict[str, Any]:
    """Per-task cost (ms) of a chain of trivial tasks; see the module doc. With worktrees
    (``isolation`` auto) each task's own git work, timed as it ran (`git_timed_per_task`),
    comes off that task's time before the mean (``overhead_ms``). For reference, the same git
    work done alone (`git_work_samples_ms`, ``git_alone_ms``) and the overhead against it
    (``overhead_git_alone_ms``): on this host that work costs 3 ms at a quiet moment and 7-17
    ms minutes later (disk contention), so a baseline timed beside the campaign rather than
    in it moved the 5 ms figure by +-2 ms between rounds.

    ``rounds`` campaigns, each with its own baselines measured around it (the commands and the
    git work, half of the samples before the campaign and half after); every figure is the
    median of the rounds' own values, so a change of load between rounds (the host drifts
    within minutes) moves a round's task time and its baselines together instead of skewing
    one against the other."""
    plan = {"objective": "overhead benchmark",
            "tasks": [_task(i, "true", [i - 1] if i > 1 else []) for i in range(1, tasks + 1)]}
    per_round: list[dict[str, float]] = []
    worktrees = isolation != "shared"
    for _ in range(rounds):
        before = command_samples_ms(10)
        git_before = git_work_samples_ms(10) if worktrees else []
        with git_timed_per_task() as git_by_task:
            events = run_campaign(plan, jobs=1, in_process=in_process, isolation=isolation)
        commands = statistics.median(before + command_samples_ms(10))
        git_alone = statistics.median(git_before + git_work_samples_ms(10)) if worktrees else 0.0
        names = {e["task_seq"]: e["workspace_id"] for e in events if e["event"] == "TASK_START"}
        ends = [(e["duration_ms"], git_by_task.get(names[e["task_seq"]], 0.0))
                for e in events if e["event"] == "TASK_END"]
        durations = [duration for duration, _ in ends]
        task_ms = trimmed_mean(durations)
        git_work = trimmed_mean([git for _, git in ends])
        without_git = trimmed_mean([duration - git for duration, git in ends])
        span_ms = execute_span_s(events) * 1000 / tasks
        per_round.append({"task_ms": task_ms, "task_median_ms": statistics.median(durations),
                          "span_per_task_ms": span_ms, "commands_ms": commands,
                          "git_work_ms": git_work, "git_alone_ms": git_alone,
                          "overhead_ms": without_git - commands,
                          "overhead_git_alone_ms": task_ms - commands - git_alone,
                          "overhead_with_git_ms": task_ms - commands,
                          "span_overhead_ms": span_ms - commands - git_work})
    row: dict[str, Any] = {"transport": "in-process" if in_process else "stdio", "isolation": isolation,
                           "tasks": tasks, "rounds": rounds}
    for key in per_round[0]:
        row[key] = round(statistics.median(r[key] for r in per_round), 1)
    row["overhead_rounds_ms"] = [round(r["overhead_ms"], 1) for r in per_round]
    return row


def dag_plan(seed: int = DAG_SEED, tasks: int = DAG_TASKS) -> tuple[dict[str, Any], dict[str, float]]:
    """The seeded DAG of sleep tasks (0.3-3 s; each depends on up to 2 earlier tasks)."""
    rng = random.Random(seed)
    durations: dict[str, float] = {}
    items = []
    for i in range(1, tasks + 1):
        seconds = round(rng.uniform(0.3, 3.0), 2)
        depends = sorted(rng.sample(range(1, i), k=min(i - 1, rng.choice((0, 1, 1, 2))))) if i > 1 else []
        durations[f"{i:03d}"] = seconds
        # a planner's budget grows with the work: 1-3 here, the runner's only duration estimate
        items.append(_task(i, f"sleep {seconds}", depends, budget=max(1, round(seconds))))
    return {"objective": "scheduler benchmark", "tasks": items}, durations


def lower_bound_s(plan: dict[str, Any], durations: dict[str, float], jobs: int) -> float:
    """max(critical path, total work / jobs), s."""
    finish: dict[str, float] = {}
    for task in plan["tasks"]:  # seq order is a topological order here
        deps = task["depends"] if isinstance(task["depends"], list) else []
        finish[task["seq"]] = durations[task["seq"]] + max((finish[d] for d in deps), default=0.0)
    return max(max(finish.values()), sum(durations.values()) / jobs)


def simulate(plan: dict[str, Any], durations: dict[str, float], jobs: int,
             priority: Callable[[str], Any] | None = None) -> float:
    """Span (s) of a list schedule with zero overhead: whenever a lane is free, the ready task
    with the lowest ``priority(seq)`` starts (ties by seq) and runs for ``durations[seq]``.

    ``priority`` None: the runner's own rule, `ftl.engine.scheduler.critical_path_priority` over the
    budgets (states/execute.py feeds it budget x seconds_per_budget, the same order).
    ``bound / sim`` is what the start order allows; ``sim / span`` is what the runner's own
    work costs.
    """
    from ftl.engine.scheduler import critical_path_priority

    deps = {t["seq"]: (t["depends"] if isinstance(t["depends"], list) else []) for t in plan["tasks"]}
    if priority is None:
        priority = critical_path_priority(deps, {t["seq"]: float(t["budget"]) for t in plan["tasks"]})
    done_at: dict[str, float] = {}
    running: list[tuple[float, str]] = []
    now = 0.0
    pending = set(deps)
    while pending or running:
        ready = sorted((s for s in pending if all(d in done_at and done_at[d] <= now for d in deps[s])),
                       key=lambda s: (priority(s), int(s)))
        for seq in ready[:jobs - len(running)]:
            pending.discard(seq)
            running.append((now + durations[seq], seq))
        running.sort()
        now, seq = running.pop(0)
        done_at[seq] = now
    return now


def dag_efficiency(in_process: bool = True) -> dict[str, Any]:
    """The 18-task DAG through a real campaign (jobs 3, the default in-process tool server):
    span, bound and efficiency."""
    plan, durations = dag_plan()
    events = run_campaign(plan, jobs=DAG_JOBS, in_process=in_process)
    span = execute_span_s(events)
    bound = lower_bound_s(plan, durations, DAG_JOBS)
    sim = simulate(plan, durations, DAG_JOBS)
    return {"transport": "in-process" if in_process else "stdio", "tasks": DAG_TASKS, "jobs": DAG_JOBS,
            "span_s": round(span, 3), "bound_s": round(bound, 3), "sim_s": round(sim, 3),
            "efficiency": round(bound / span, 3), "order_efficiency": round(bound / sim, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=30, help="Tasks in the overhead chain.")
    parser.add_argument("--rounds", type=int, default=3, help="Campaigns per figure (median of their own values).")
    parser.add_argument("--transport", default="stdio,inproc", help="stdio and/or inproc, comma-separated.")
    parser.add_argument("--dag", action="store_true", help="Also run the 18-task DAG (about 15 s).")
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    options = parser.parse_args()
    rows: list[dict[str, Any]] = [overhead(options.tasks, name == "inproc", rounds=options.rounds)
                                  for name in options.transport.split(",") if name]
    if options.dag:
        rows.append(dag_efficiency())
    if options.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
