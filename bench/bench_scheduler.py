"""Benchmark: how close the dynamic scheduler gets to the best possible wall time, vs FTL waves.

For each seeded random DAG of sleep tasks, the script runs the tasks three times with real
threads: with `ftl.engine.scheduler.Scheduler` in its default start order (lowest ready seq first),
with the same scheduler given `critical_path_priority` (the ready task heading the longest
remaining chain first), and with FTL-style waves (run the whole ready set, at most `jobs` at
once, wait for all of it, repeat). Each wall time is compared with the lower bound
max(critical path, total work / jobs) that no schedule can beat, and the default run also with
a zero-overhead simulation of its own rule, which separates the scheduler's overhead from what
the start order leaves on the table.

Usage: python bench/bench_scheduler.py [--dags 5] [--tasks 40] [--jobs 4] [--seed 1]
       [--min-ms 20] [--max-ms 200]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftl.engine.scheduler import CancelToken, Scheduler, TaskOutcome, critical_path_priority  # noqa: E402

try:  # ftl.dag is written separately; use it when it is there
    from ftl.dag import critical_path as _dag_critical_path  # type: ignore[attr-defined]
except ImportError:
    _dag_critical_path = None

Deps = dict[str, list[str]]


def random_dag(rng: random.Random, n: int, min_ms: int, max_ms: int) -> tuple[Deps, dict[str, float]]:
    """A DAG of n tasks ("001".."n"), each depending on 0-3 of the 8 tasks before it.

    Returns (deps, durations in s). Deps only point to lower seqs, so it is acyclic.
    """
    seqs = [f"{i:03d}" for i in range(1, n + 1)]
    deps: Deps = {}
    for i, seq in enumerate(seqs):
        window = seqs[max(0, i - 8):i]
        k = min(len(window), rng.choice([0, 1, 1, 2, 2, 3]))
        deps[seq] = sorted(rng.sample(window, k))
    durations = {seq: rng.uniform(min_ms, max_ms) / 1000.0 for seq in seqs}
    return deps, durations


def longest_path(deps: Deps, durations: dict[str, float]) -> tuple[float, list[str]]:
    """Critical path of a DAG whose deps point to lower seqs: (length in s, seqs on it)."""
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for seq in sorted(deps, key=int):
        best = max(deps[seq], key=lambda d: finish[d], default=None)
        finish[seq] = durations[seq] + (finish[best] if best else 0.0)
        via[seq] = best
    end = max(finish, key=finish.get)
    path = [end]
    while via[path[-1]]:
        path.append(via[path[-1]])
    return finish[end], path[::-1]


def critical_path(deps: Deps, durations: dict[str, float]) -> tuple[float, list[str]]:
    if _dag_critical_path is not None:
        return _dag_critical_path(deps, durations)
    return longest_path(deps, durations)


def simulate_greedy(deps: Deps, durations: dict[str, float], jobs: int) -> float:
    """Makespan in s of the scheduler's rule with zero overhead (event simulation)."""
    remaining = {seq: set(ds) for seq, ds in deps.items()}
    dependents: dict[str, list[str]] = {seq: [] for seq in deps}
    for seq, ds in deps.items():
        for d in ds:
            dependents[d].append(seq)
    ready = [int(s) for s, ds in remaining.items() if not ds]
    heapq.heapify(ready)
    running: list[tuple[float, str]] = []
    now = 0.0
    while ready or running:
        while ready and len(running) < jobs:
            seq = f"{heapq.heappop(ready):03d}"
            heapq.heappush(running, (now + durations[seq], seq))
        now, seq = heapq.heappop(running)
        for child in dependents[seq]:
            remaining[child].discard(seq)
            if not remaining[child]:
                heapq.heappush(ready, int(child))
    return now


def run_dynamic(deps: Deps, durations: dict[str, float], jobs: int, priority=None) -> float:
    """Wall time in s of the sleep tasks under ftl.engine.scheduler.Scheduler."""
    def run_task(seq: str, token: CancelToken, worker: str) -> TaskOutcome:
        time.sleep(durations[seq])
        return TaskOutcome(seq, "complete")

    scheduler = Scheduler(deps, jobs=jobs, run_task=run_task, priority=priority)
    start = time.perf_counter()
    outcomes = scheduler.run()
    wall = time.perf_counter() - start
    assert len(outcomes) == len(deps) and all(o.status == "complete" for o in outcomes.values())
    return wall


def run_waves(deps: Deps, durations: dict[str, float], jobs: int) -> tuple[float, int]:
    """Wall time in s and wave count under FTL-style waves."""
    done: set[str] = set()
    waves = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while len(done) < len(deps):
            wave = sorted((s for s, ds in deps.items() if s not in done and set(ds) <= done), key=int)
            list(pool.map(lambda s: time.sleep(durations[s]), wave))  # waits for the whole wave
            done.update(wave)
            waves += 1
    return time.perf_counter() - start, waves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dags", type=int, default=5, help="number of random DAGs")
    parser.add_argument("--tasks", type=int, default=40, help="tasks per DAG")
    parser.add_argument("--jobs", type=int, default=4, help="parallel tasks at most")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first DAG")
    parser.add_argument("--min-ms", type=int, default=20, help="shortest task, ms")
    parser.add_argument("--max-ms", type=int, default=200, help="longest task, ms")
    args = parser.parse_args(argv)

    source = "ftl.dag.critical_path" if _dag_critical_path else "bench longest_path"
    print(f"{args.dags} DAGs x {args.tasks} tasks, jobs={args.jobs}, "
          f"durations {args.min_ms}-{args.max_ms} ms, critical path from {source}")
    print("wall times in s; eff = bound / wall (1.0 = optimal); ovh = simulated / wall")
    print(f"{'dag':>4} {'cp':>5} {'work/j':>6} {'bound':>5} {'sim':>5} {'dyn':>5} {'dyn-cp':>6} "
          f"{'waves':>5} {'#w':>3} | {'eff dyn':>7} {'eff cp':>6} {'eff wave':>8} {'ovh':>5} "
          f"{'dyn/wave':>8}")
    eff_dyn, eff_cp, eff_wave, ratios, overheads = [], [], [], [], []
    for i in range(args.dags):
        rng = random.Random(args.seed + i)
        deps, durations = random_dag(rng, args.tasks, args.min_ms, args.max_ms)
        cp, _ = critical_path(deps, durations)
        work = sum(durations.values()) / args.jobs
        bound = max(cp, work)
        sim = simulate_greedy(deps, durations, args.jobs)
        dyn = run_dynamic(deps, durations, args.jobs)
        dyn_cp = run_dynamic(deps, durations, args.jobs, critical_path_priority(deps, durations))
        wave, n_waves = run_waves(deps, durations, args.jobs)
        eff_dyn.append(bound / dyn)
        eff_cp.append(bound / dyn_cp)
        eff_wave.append(bound / wave)
        ratios.append(wave / dyn)
        overheads.append(sim / dyn)
        print(f"{args.seed + i:>4} {cp:5.2f} {work:6.2f} {bound:5.2f} {sim:5.2f} {dyn:5.2f} "
              f"{dyn_cp:6.2f} {wave:5.2f} {n_waves:3d} | {eff_dyn[-1]:7.3f} {eff_cp[-1]:6.3f} "
              f"{eff_wave[-1]:8.3f} {overheads[-1]:5.3f} {ratios[-1]:7.2f}x")

    def summary(values: list[float]) -> str:
        return f"{statistics.mean(values):.3f} [min {min(values):.3f}]"

    print()
    print("efficiency = bound / wall, mean [min]:")
    print(f"  dynamic, seq order      {summary(eff_dyn)}")
    print(f"  dynamic, critical path  {summary(eff_cp)}")
    print(f"  waves (FTL)             {summary(eff_wave)}")
    print(f"scheduler overhead: seq-order wall vs its zero-overhead simulation {summary(overheads)}")
    print(f"speedup of dynamic (seq order) over waves: {statistics.mean(ratios):.2f}x mean")
    for name, values in (("seq order", eff_dyn), ("critical path", eff_cp)):
        met = statistics.mean(values) >= 0.95
        print(f"target mean efficiency >= 0.95, dynamic {name}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
