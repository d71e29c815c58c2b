"""Benchmark: which start order (list-scheduling priority) gets closest to the lower bound.

The runner knows the DAG and each task's budget (the planner's only duration estimate), not the
true durations. Every rule below ranks the ready tasks from that knowledge alone; the schedule
is then simulated with zero overhead (`bench_overhead.simulate`) over the TRUE durations, and
compared with the lower bound max(critical path, work / jobs): ratio = bound / sim, 1.0 at best.

Cases: the generator of the 18-task DAG (`bench_overhead.dag_plan`: sleeps 0.3-3 s, budget =
round(seconds), min 1, up to 2 dependencies on any earlier task) with seeds 1..``--dags``, each
with a size drawn from 10-60 tasks and jobs from 2-4, plus the benchmark's own DAG (seed 11, 18
tasks, jobs 3) in its own column. ``win/loss`` counts the cases where a rule's schedule is
shorter / longer than the adopted rule's (``ftl``); ``z`` = (wins - losses) / sqrt(wins +
losses), a sign test: |z| < 2 is noise.

Rules (keys sort ascending; every rule ends with the seq):
  ftl          `ftl.engine.scheduler.critical_path_priority` (the adopted rule): bottom level, then the
               work of the direct dependents
  cp           bottom level, then seq (the rule before)
  cp+succwork  bottom level, then the work of all descendants (transitive)
  cp+desc      bottom level, then the number of descendants
  cp+own       bottom level, then the longer own budget (LPT)
  bl+tl        bottom level + top level (the longest chain through the task), then bottom level
  bl+work/j    bottom level + descendants' work / jobs
  seq          seq order (the scheduler without a priority)
Reference rows, not available to the runner: ``timeouts`` is `ftl` over each task's timeout (120 s
for every task here: what states/execute.py fed the scheduler before), ``oracle`` is `ftl` over
the true durations.

Last line: the benchmark DAG's shortest possible schedule over the TRUE durations (`optimal_span_s`,
an exhaustive branch and bound that may also hold a lane idle), against the bound: the bound is
reachable there, but only by a schedule that knows every duration before it starts.

Usage: python bench/bench_priority.py [--dags 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import DAG_JOBS, DAG_SEED, DAG_TASKS, dag_plan, lower_bound_s, simulate  # noqa: E402
from ftl.dag import descendants  # noqa: E402
from ftl.engine.scheduler import critical_path_priority  # noqa: E402

Deps = dict[str, list[str]]
Key = Callable[[str], Any]


def _levels(deps: Deps, weight: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(bottom level, top level) of every task: the longest chain from / to it, own weight
    counted in the bottom level only."""
    bottom = {s: -critical_path_priority(deps, weight)(s)[0] for s in deps}
    top: dict[str, float] = {}
    for seq in sorted(deps, key=int):  # deps point to lower seqs (dag_plan)
        top[seq] = max((top[d] + weight[d] for d in deps[seq]), default=0.0)
    return bottom, top


def rules(deps: Deps, budget: dict[str, float], jobs: int) -> dict[str, Key]:
    """Name -> ``seq -> key`` for every rule of the module doc, over ``budget``."""
    bottom, top = _levels(deps, budget)
    below = {s: descendants(deps, s) for s in deps}
    work_below = {s: sum(budget[d] for d in below[s]) for s in deps}
    ftl = critical_path_priority(deps, budget)
    return {
        "ftl": lambda s: ftl(s),
        "cp": lambda s: -bottom[s],
        "cp+succwork": lambda s: (-bottom[s], -work_below[s]),
        "cp+desc": lambda s: (-bottom[s], -len(below[s])),
        "cp+own": lambda s: (-bottom[s], -budget[s]),
        "bl+tl": lambda s: (-(bottom[s] + top[s]), -bottom[s]),
        "bl+work/j": lambda s: -(bottom[s] + work_below[s] / jobs),
        "seq": lambda s: 0,
    }


def ratios(seed: int, tasks: int, jobs: int) -> dict[str, float]:
    """bound / sim of every rule (and the reference rows) on one ``dag_plan``."""
    plan, durations = dag_plan(seed, tasks)
    deps: Deps = {t["seq"]: (t["depends"] if isinstance(t["depends"], list) else []) for t in plan["tasks"]}
    budget = {t["seq"]: float(t["budget"]) for t in plan["tasks"]}
    bound = lower_bound_s(plan, durations, jobs)
    keys = rules(deps, budget, jobs)
    keys["timeouts"] = critical_path_priority(deps, {t["seq"]: float(t["timeout_s"]) for t in plan["tasks"]})
    keys["oracle"] = critical_path_priority(deps, durations)
    return {name: bound / simulate(plan, durations, jobs, key) for name, key in keys.items()}


def optimal_span_s(deps: Deps, durations: dict[str, float], jobs: int) -> float:
    """The shortest makespan (s) of ``deps`` on ``jobs`` identical lanes, by depth-first branch
    and bound: at each moment a lane frees, start any subset of the ready tasks that fits
    (leaving a lane idle is allowed), prune by max(now + longest remaining chain, now +
    remaining work / jobs) and by states already reached sooner. Exponential: small DAGs only
    (the 18-task benchmark DAG takes a few seconds)."""
    import itertools

    dependents: dict[str, list[str]] = {s: [] for s in deps}
    for seq, ds in deps.items():
        for d in ds:
            dependents[d].append(seq)
    tail: dict[str, float] = {}
    for seq in sorted(deps, key=int, reverse=True):  # deps point to lower seqs
        tail[seq] = durations[seq] + max((tail[k] for k in dependents[seq]), default=0.0)
    total = sum(durations.values())
    best = [simulate({"tasks": [{"seq": s, "depends": deps[s]} for s in deps]}, durations, jobs,
                     critical_path_priority(deps, durations))]
    reached: dict[Any, float] = {}

    def search(now: float, done: frozenset[str], running: list[tuple[float, str]]) -> None:
        if len(done) == len(deps):
            best[0] = min(best[0], now)
            return
        busy = {s for _, s in running}
        left = total - sum(durations[s] for s in done | busy) + sum(end - now for end, _ in running)
        chain = max([end - now + max((tail[k] for k in dependents[s]), default=0.0) for end, s in running]
                    + [tail[s] for s in deps if s not in done and s not in busy])
        if now + max(chain, left / jobs) >= best[0] - 1e-9:
            return
        key = (done, tuple(sorted((round(end - now, 6), s) for end, s in running)))
        if reached.get(key, float("inf")) <= now + 1e-9:
            return
        reached[key] = now
        ready = sorted((s for s in deps if s not in done and s not in busy and all(d in done for d in deps[s])),
                       key=lambda s: -tail[s])
        for size in range(min(jobs - len(running), len(ready)), -1, -1):
            for started in itertools.combinations(ready, size):
                lanes = sorted(running + [(now + durations[s], s) for s in started])
                if not lanes:
                    continue
                end = lanes[0][0]
                search(end, done | {s for t, s in lanes if t <= end + 1e-12},
                       [(t, s) for t, s in lanes if t > end + 1e-12])

    search(0.0, frozenset(), [])
    return best[0]


def study(dags: int) -> dict[str, Any]:
    """Run every rule on ``dags`` seeded cases and on the benchmark's DAG; see the module doc."""
    per_rule: dict[str, list[float]] = {}
    per_jobs: dict[tuple[str, int], list[float]] = {}
    for seed in range(1, dags + 1):
        rng = random.Random(10_000 + seed)  # size and jobs apart from the DAG's own stream
        tasks, jobs = rng.randint(10, 60), rng.randint(2, 4)
        for name, ratio in ratios(seed, tasks, jobs).items():
            per_rule.setdefault(name, []).append(ratio)
            per_jobs.setdefault((name, jobs), []).append(ratio)
    own_dag = ratios(DAG_SEED, DAG_TASKS, DAG_JOBS)
    adopted = per_rule["ftl"]
    rows = []
    for name, values in per_rule.items():
        wins = sum(v > a + 1e-9 for v, a in zip(values, adopted))
        losses = sum(v < a - 1e-9 for v, a in zip(values, adopted))
        rows.append({
            "rule": name, "mean": statistics.mean(values), "median": statistics.median(values),
            "min": min(values),
            **{f"jobs{j}": statistics.mean(per_jobs[(name, j)]) for j in (2, 3, 4) if (name, j) in per_jobs},
            "wins": wins, "losses": losses,
            "z": (wins - losses) / math.sqrt(wins + losses) if wins + losses else 0.0,
            "dag18": own_dag[name],
        })
    return {"dags": dags, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dags", type=int, default=1000, help="seeded DAGs (sizes 10-60, jobs 2-4)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    result = study(args.dags)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"bound / sim over {args.dags} seeded DAGs (10-60 tasks, jobs 2-4); dag18 = the 18-task DAG, jobs 3")
    print(f"{'rule':12} {'mean':>6} {'median':>6} {'min':>6} {'jobs2':>6} {'jobs3':>6} {'jobs4':>6} "
          f"{'win/loss vs ftl':>15} {'z':>5} {'dag18':>6}")
    for row in sorted(result["rows"], key=lambda r: -r["mean"]):
        print(f"{row['rule']:12} {row['mean']:6.4f} {row['median']:6.4f} {row['min']:6.4f} "
              f"{row['jobs2']:6.4f} {row['jobs3']:6.4f} {row['jobs4']:6.4f} "
              f"{row['wins']:7d}/{row['losses']:<7d} {row['z']:5.1f} {row['dag18']:6.4f}")
    plan, durations = dag_plan(DAG_SEED, DAG_TASKS)
    deps = {t["seq"]: (t["depends"] if isinstance(t["depends"], list) else []) for t in plan["tasks"]}
    best = optimal_span_s(deps, durations, DAG_JOBS)
    bound = lower_bound_s(plan, durations, DAG_JOBS)
    print(f"dag18, shortest schedule over the true durations (exhaustive): {best:.2f} s, "
          f"bound {bound:.2f} s: bound / optimum {bound / best:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
