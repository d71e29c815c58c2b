"""Benchmark: where the 18-task DAG's EXECUTE span goes beyond the tasks' own sleeps.

Runs `bench_overhead.dag_plan` as a real campaign (the default in-process tool server, a git worktree per task,
jobs 3) and reads its event log. The realized critical chain is walked back from the last
``TASK_END``: each task was released either by its last dependency's ``TASK_END`` or by the
previous ``TASK_END`` on its lane (worker), whichever came later. Along that chain the span
splits exactly into:

* ``sleep``: the tasks' commands (the work the bound counts);
* ``scheduler``: from the releasing ``TASK_END`` to the task's ``TASK_START`` (the scheduler
  thread: the ready set, the lane, ``on_start``'s store row and event);
* the runner's work inside each task, by phase (event to event):
  ``prepare`` ``TASK_START`` -> build ``TOOL_CALL`` (store reads, workspace, worktree, intent);
  ``build`` build call -> verify call, minus the sleep (the builder's spawn, change scan, the
  verify intent); ``verify+commit`` verify call -> ``TASK_COMMIT``; ``integrate``
  ``TASK_COMMIT`` -> ``TASK_INTEGRATED``; ``report`` ``TASK_INTEGRATED`` -> ``TASK_END`` (the
  worker's return, the scheduler's wake-up, ``on_finish``'s store row and event).

The same phases are also given as medians over all tasks (ms). Event stamps have 1 ms
resolution, so single gaps below 1 ms read as 0 or 1.

Usage: python bench/bench_gaps.py [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import DAG_JOBS, _stamp, dag_plan, lower_bound_s, run_campaign  # noqa: E402

PHASES = ("prepare", "build", "verify+commit", "integrate", "report")


def task_times(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """seq -> {event name or TOOL_CALL:intent: time in s, "worker": lane}."""
    tasks: dict[str, dict[str, Any]] = {}
    for event in events:
        seq = event.get("task_seq")
        if not seq:
            continue
        name = event["event"] + (f":{event['intent']}" if event["event"] == "TOOL_CALL" else "")
        tasks.setdefault(seq, {})[name] = _stamp(event)
        if event["event"] == "TASK_START":
            tasks[seq]["worker"] = event["worker"]
    return tasks


def phases(times: dict[str, Any], sleep_s: float) -> dict[str, float]:
    """The runner's phases of one task (s); see the module doc."""
    return {"prepare": times["TOOL_CALL:build_task"] - times["TASK_START"],
            "build": times["TOOL_CALL:verify_task"] - times["TOOL_CALL:build_task"] - sleep_s,
            "verify+commit": times["TASK_COMMIT"] - times["TOOL_CALL:verify_task"],
            "integrate": times["TASK_INTEGRATED"] - times["TASK_COMMIT"],
            "report": times["TASK_END"] - times["TASK_INTEGRATED"]}


def critical_chain(deps: dict[str, list[str]], tasks: dict[str, dict[str, Any]]) -> list[tuple[str, str | None]]:
    """[(seq, the seq whose TASK_END released it or None)], first task first."""
    def releaser(seq: str) -> str | None:
        start = tasks[seq]["TASK_START"]
        before = [d for d in deps[seq]]
        before += [s for s, t in tasks.items()
                   if t["worker"] == tasks[seq]["worker"] and t["TASK_END"] <= start and s != seq]
        return max(before, key=lambda s: tasks[s]["TASK_END"], default=None)

    seq: str | None = max(tasks, key=lambda s: tasks[s]["TASK_END"])
    chain = []
    while seq is not None:
        by = releaser(seq)
        chain.append((seq, by))
        seq = by
    return chain[::-1]


def breakdown(events: list[dict[str, Any]], plan: dict[str, Any], sleeps: dict[str, float]) -> dict[str, Any]:
    """The span of one run split along its critical chain, and per-task phase medians (ms)."""
    deps = {t["seq"]: (t["depends"] if isinstance(t["depends"], list) else []) for t in plan["tasks"]}
    tasks = task_times(events)
    chain = critical_chain(deps, tasks)
    first = min(t["TASK_START"] for t in tasks.values())
    span = max(t["TASK_END"] for t in tasks.values()) - first
    along = {"sleep": 0.0, "scheduler": tasks[chain[0][0]]["TASK_START"] - first, **{p: 0.0 for p in PHASES}}
    for seq, by in chain:
        if by is not None:
            along["scheduler"] += tasks[seq]["TASK_START"] - tasks[by]["TASK_END"]
        along["sleep"] += sleeps[seq]
        for name, seconds in phases(tasks[seq], sleeps[seq]).items():
            along[name] += seconds
    per_task = {name: statistics.median(phases(t, sleeps[s])[name] * 1000 for s, t in tasks.items())
                for name in PHASES}
    gaps = [tasks[s]["TASK_START"] - tasks[by]["TASK_END"] for s, by in chain if by is not None]
    bound = lower_bound_s(plan, sleeps, DAG_JOBS)
    return {"span_s": round(span, 3), "bound_s": round(bound, 3), "efficiency": round(bound / span, 3),
            "chain": [seq for seq, _ in chain],
            "chain_s": {k: round(v, 3) for k, v in along.items()},
            "chain_check_s": round(sum(along.values()) - span, 3),  # 0 up to stamp rounding
            "scheduler_gap_max_ms": round(max(gaps, default=0.0) * 1000, 1),
            "task_median_ms": {k: round(v, 1) for k, v in per_task.items()},
            "task_overhead_median_ms": round(statistics.median(
                (t["TASK_END"] - t["TASK_START"] - sleeps[s]) * 1000 for s, t in tasks.items()), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="campaigns to run (about 11 s each)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    plan, sleeps = dag_plan()
    rows = [breakdown(run_campaign(plan, jobs=DAG_JOBS, in_process=True), plan, sleeps)
            for _ in range(args.runs)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
