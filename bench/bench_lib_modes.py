"""Benchmark: the FTL output mode of lib/*.py against the envelope mode, call for call.

The script prepares one repository (a campaign with a 40-task plan registered, 200 memory
entries), then times the same read-only calls (campaign status, ready-tasks, cascade-status,
plan read, memory context with an objective, memory stats) as fresh processes, alternating the
two modes (``FTL_OUTPUT=ftl`` and the default envelope) so both see the same machine load. It
prints p50 and p90 wall time per call and mode, and the ratio ftl/envelope (target: 1.0 within
noise: the FTL mode does the same work and only prints a different JSON value).

Usage: python bench/bench_lib_modes.py [--repeat 15] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "lib"

CALLS = [
    ("campaign", ["status"]), ("campaign", ["ready-tasks"]), ("campaign", ["cascade-status"]),
    ("plan", ["read", "--id", "1"]), ("memory", ["context", "--objective", "parser token import error"]),
    ("memory", ["stats"]),
]


def call(repo: Path, script: str, args: list[str], mode: str, stdin: str = "") -> float:
    env = {**os.environ}
    env.pop("FTL_OUTPUT", None)
    if mode == "ftl":
        env["FTL_OUTPUT"] = "ftl"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(LIB / f"{script}.py"), "--repo", str(repo), *args],
                          input=stdin, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} ({mode}) failed: {done.stdout[:300]} {done.stderr[:300]}")
    return elapsed


def prepare(repo: Path) -> None:
    tasks = [{"seq": f"{i:03d}", "slug": f"task-{i}", "delta": [f"src/m{i}.py"], "verify": "true",
              "depends": "none" if i == 1 else f"{i - 1:03d}" if i % 3 else ["001", f"{i - 1:03d}"]}
             for i in range(1, 41)]
    call(repo, "campaign", ["create", "build the parser"], "envelope")
    call(repo, "plan", ["write"], "envelope", json.dumps({"objective": "build the parser", "tasks": tasks}))
    call(repo, "campaign", ["add-tasks"], "envelope", json.dumps({"objective": "build the parser", "tasks": tasks}))
    sys.path.insert(0, str(ROOT))
    from ftl.memory import MemoryStore
    from ftl.store import Store

    with Store.for_repo(repo) as store:
        memory = MemoryStore(store)
        for i in range(200):
            memory.add({"name": f"failure-{i}", "type": "failure", "cost": 100 + 37 * i,
                        "trigger": f"ImportError {i}: cannot import name token{i} from module parser{i % 7}",
                        "fix": f"define token{i} before use"}, validate=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftl-bench-lib-", dir=args.dir) as tmp:
        repo = Path(tmp)
        prepare(repo)
        print(f"{'call':38} {'env p50':>8} {'ftl p50':>8} {'env p90':>8} {'ftl p90':>8} {'ratio':>6}")
        ratios = []
        for script, argv in CALLS:
            times = {"envelope": [], "ftl": []}
            for _ in range(args.repeat):
                for mode in ("envelope", "ftl"):
                    times[mode].append(call(repo, script, argv, mode))
            p50 = {m: statistics.median(t) for m, t in times.items()}
            p90 = {m: statistics.quantiles(t, n=10)[-1] for m, t in times.items()}
            ratio = p50["ftl"] / p50["envelope"]
            ratios.append(ratio)
            name = f"{script} {' '.join(argv)}"[:38]
            print(f"{name:38} {p50['envelope'] * 1000:7.0f}ms {p50['ftl'] * 1000:7.0f}ms "
                  f"{p90['envelope'] * 1000:7.0f}ms {p90['ftl'] * 1000:7.0f}ms {ratio:6.2f}")
        print(f"mean ratio ftl/envelope: {statistics.mean(ratios):.3f} (target 1.0 within noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
