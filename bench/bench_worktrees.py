"""Benchmark: what a git worktree per task costs, against the shared checkout, in the same run.

Two measurements on a fresh repository of each size (a small one, and one of ``--files`` files in
nested folders, ~5,000 by default):

* **campaign**: the same plan of ``--tasks`` independent tasks (each writes one new file; verify
  is ``test -s``) runs twice in process (``Runner`` with the in-process tool server, one job, so
  task times add up): ``isolation = "shared"`` and ``isolation = "worktree"``. The per-task figure
  is the mean of the tasks' ``TASK_END`` durations; the overhead of isolation is the difference,
  per task, and the ratio worktree / shared.
* **steps**: `ftl.vcs.worktrees.Worktrees` alone, per task: prepare (``git worktree add`` at the
  integration head), stage + commit, integrate (fast-forward), and finish (remove the worktrees),
  medians in ms.

Usage: python bench/bench_worktrees.py [--tasks 50] [--files 5000]
Target (issue "Parallel tasks that cannot hurt each other"): under 100 ms of isolation overhead
per task on a small repository.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftl.config import Config  # noqa: E402
from ftl.events import read_events  # noqa: E402
from ftl.engine.runner import Runner, connect_in_process  # noqa: E402
from ftl.vcs.worktrees import Worktrees  # noqa: E402

TARGET_MS = 100.0


def make_repo(root: Path, files: int) -> Path:
    root.mkdir(parents=True)
    (root / ".gitignore").write_text(".ftl/\n")
    for index in range(files):
        folder = root / "src" / f"pkg{index // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{index:05d}.py").write_text(f"VALUE = {index}\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                 ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=root, check=True, capture_output=True)
    return root


def plan(tasks: int) -> dict:
    return {"objective": "bench", "tasks": [
        {"seq": f"{n:03d}", "slug": f"t{n}", "creates": [f"out/{n:03d}.txt"],
         "run": f"mkdir -p out && echo {n} > out/{n:03d}.txt", "verify": f"test -s out/{n:03d}.txt",
         "depends": "none"} for n in range(1, tasks + 1)]}


def campaign_ms(repo: Path, isolation: str, tasks: int) -> float:
    config = Config(jobs=1, isolation=isolation, explorer_timeout_s=60)
    with Runner(repo, config, client_factory=connect_in_process) as runner:
        result = runner.start("bench", plan_input=plan(tasks))
    durations = [e["duration_ms"] for e in read_events(result.log_path)
                 if e["event"] == "TASK_END" and e.get("status") == "complete"]
    assert len(durations) == tasks, (result.outcome, len(durations))
    return statistics.mean(durations)


def steps_ms(repo: Path, tasks: int) -> dict[str, float]:
    trees = Worktrees(repo, "c-bench-steps")
    timings: dict[str, list[float]] = {"prepare": [], "stage+commit": [], "integrate": []}
    spec = {"run": "x", "verify": "true", "delta": [], "creates": []}
    for n in range(1, tasks + 1):
        start = time.perf_counter()
        tree = trees.prepare(f"{n:03d}-t")
        timings["prepare"].append(time.perf_counter() - start)
        (tree.path / f"new-{n}.txt").write_text("x\n")
        start = time.perf_counter()
        trees.stage(tree)
        commit = trees.commit(tree, seq=f"{n:03d}", slug="t", attempt=1, spec=spec)
        timings["stage+commit"].append(time.perf_counter() - start)
        start = time.perf_counter()
        trees.integrate(commit, name=f"{n:03d}-t")
        timings["integrate"].append(time.perf_counter() - start)
    start = time.perf_counter()
    trees.finish()
    finish = (time.perf_counter() - start) / tasks
    result = {name: statistics.median(values) * 1000 for name, values in timings.items()}
    result["finish (per task)"] = finish * 1000
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--files", type=int, default=5000)
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as scratch:
        sizes = [("small repository (10 files)", 10)]
        if args.files != 10:
            sizes.append((f"repository of {args.files:,} files", args.files))
        for label, files in sizes:
            base = Path(scratch) / f"r{files}"
            shared = campaign_ms(make_repo(base / "shared", files), "shared", args.tasks)
            isolated = campaign_ms(make_repo(base / "worktree", files), "worktree", args.tasks)
            steps = steps_ms(make_repo(base / "steps", files), args.tasks)
            overhead = isolated - shared
            print(f"{label}, {args.tasks} tasks, one job:")
            print(f"  per task, shared    : {shared:7.1f} ms   1.00x")
            print(f"  per task, worktree  : {isolated:7.1f} ms   {isolated / shared:.2f}x")
            print(f"  isolation overhead  : {overhead:7.1f} ms per task")
            print("  steps (median ms)   : " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()))
            if files <= 10:
                met = overhead <= TARGET_MS
                ok &= met
                print(f"  target <= {TARGET_MS:.0f} ms per task on a small repository: "
                      f"{'OK' if met else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
