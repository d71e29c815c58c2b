"""Where a task's time goes, inside a real campaign: a phase table of one task attempt.

Runs a chain of ``--tasks`` trivial tasks (run and verify ``true``, jobs 1, the in-process tool
server) in a fresh git repository, once to warm up and once measured, with a thin timer wrapped
around each function of `PROBES` (about 1 us per call). For every task attempt (the worker
thread's `ftl.states.build.run_task`) it takes each probe's time inclusive and exclusive of the
probes called inside it, and prints per probe the median over the tasks (the first five left
out) of calls, inclusive and exclusive microseconds. ``(task)`` is `run_task`'s own exclusive
time: everything between the probes.

Exclusive times add up to the task's duration, so the table says which steps a change has to
remove, and `run_all.py`'s overhead rows say whether it did. Times in a campaign run 1.5-2x
those of the same functions called in a loop (caches, the other thread): measure here.

Usage: python bench/bench_task_phases.py [--tasks 80] [--isolation shared|auto] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_overhead  # noqa: E402

# (module, attribute path, label). Commands: the process start and the wait for its exit.
PROBES = (
    ("ftl.states.build", "run_task", "(task)"),
    ("ftl.store.tasks", "TasksMixin.blocked_seqs", "store: blocked seqs"),
    ("ftl.store.tasks", "TasksMixin.tasks", "store: task rows"),
    ("ftl.memory.store", "MemoryStore.context", "store: memory context"),
    ("ftl.store.workspaces", "WorkspacesMixin.workspaces", "store: workspace rows"),
    ("ftl.store.workspaces", "WorkspacesMixin.record_workspace", "store: record workspace"),
    ("ftl.store.workspaces", "WorkspacesMixin.finish_workspace", "store: finish workspace"),
    ("ftl.engine.workspaces", "build_workspace", "workspace spec"),
    ("ftl.engine.checkpoints", "prepare", "checkpoint: prepare"),
    ("ftl.engine.checkpoints", "written", "checkpoint: read"),
    ("ftl.engine.tools", "ToolClient.call", "tool call (client)"),
    ("ftl.events", "EventLog.emit", "event line"),
    ("ftl.manglecp.server", "ManglecpServer._handle", "tool call (server)"),
    ("ftl.manglecp.server", "ManglecpServer._outcome", "tool outcome"),
    ("ftl.server.tools.proc", "run_command", "run_command"),
    ("ftl.server.tools.proc", "pid_counters", "pid counters"),
    ("ftl.server.tools.proc", "_stop_group", "group sweep"),
    ("ftl.processes", "record", "ledger: record"),
    ("ftl.processes", "release", "ledger: release"),
    ("subprocess", "Popen.__init__", "command: start"),
    ("ftl.server.tools.proc", "_exited", "command: exit check"),
    ("ftl.vcs.libgit", "status", "git: status"),
    ("ftl.vcs.worktrees", "Worktrees.prepare", "git: prepare"),
    ("ftl.vcs.worktrees", "Worktrees.stage", "git: stage"),
    ("ftl.vcs.worktrees", "Worktrees.commit", "git: commit"),
    ("ftl.vcs.worktrees", "Worktrees.integrate", "git: integrate"),
    ("ftl.vcs.worktrees", "Worktrees.release", "git: release"),
    ("ftl.server.tools.context", "resolve_workdir", "workdir check"),
)

_local = threading.local()
_tasks: list[dict[str, list[float]]] = []  # per task: label -> [calls, inclusive s, exclusive s]


def _wrap(module: str, attribute: str, label: str) -> None:
    owner: Any = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        stack = getattr(_local, "stack", None)
        if label == "(task)":
            stack = _local.stack = []
            _local.totals = defaultdict(lambda: [0, 0.0, 0.0])
        elif stack is None:  # outside a task attempt (the scheduler thread, the baseline)
            return original(*args, **kwargs)
        stack.append(0.0)  # time spent in probes called inside this one
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent = time.perf_counter() - started
            inner = stack.pop()
            if stack:
                stack[-1] += spent
            entry = _local.totals[label]
            entry[0] += 1
            entry[1] += spent
            entry[2] += spent - inner
            if label == "(task)":
                _tasks.append(dict(_local.totals))
                _local.stack = None

    setattr(owner, name, timed)
    if not path:  # a function imported by name elsewhere: rebind those names too
        for loaded in list(sys.modules.values()):
            if loaded is not None and getattr(loaded, "__name__", "").startswith("ftl") \
                    and getattr(loaded, name, None) is original:
                setattr(loaded, name, timed)


def phases(tasks: int, isolation: str) -> list[dict[str, Any]]:
    """The phase table (see the module doc): ``[{"phase", "calls", "inclusive_us",
    "exclusive_us"}]``, the task's total first."""
    importlib.import_module("ftl.states.build")
    for probe in PROBES:
        _wrap(*probe)
    plan = {"objective": "phase benchmark",
            "tasks": [bench_overhead._task(i, "true", [i - 1] if i > 1 else []) for i in range(1, tasks + 1)]}
    bench_overhead.run_campaign(plan, jobs=1, in_process=True, isolation=isolation)  # warm-up
    _tasks.clear()
    bench_overhead.run_campaign(plan, jobs=1, in_process=True, isolation=isolation)
    measured = _tasks[5:] or _tasks
    rows = []
    for _, _, label in PROBES:
        if not any(label in task for task in measured):
            continue
        values = [task.get(label, [0, 0.0, 0.0]) for task in measured]
        rows.append({"phase": label, "calls": statistics.median(v[0] for v in values),
                     "inclusive_us": round(statistics.median(v[1] for v in values) * 1e6),
                     "exclusive_us": round(statistics.median(v[2] for v in values) * 1e6)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=80, help="Tasks in the chain.")
    parser.add_argument("--isolation", default="shared", choices=("shared", "auto"),
                        help="shared checkout, or auto (a git worktree per task).")
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    options = parser.parse_args()
    rows = phases(options.tasks, options.isolation)
    if options.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'phase':28} {'calls':>5} {'inclusive us':>13} {'exclusive us':>13}")
    for row in sorted(rows, key=lambda r: (r["phase"] != "(task)", -r["exclusive_us"])):
        print(f"{row['phase']:28} {row['calls']:>5g} {row['inclusive_us']:>13} {row['exclusive_us']:>13}")


if __name__ == "__main__":
    main()
