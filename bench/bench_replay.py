"""Benchmark: `ftl.postmortem.replay.replay` on a large event log against a bare parse of the same file.

The script writes a seeded, realistic campaign log (default 1,000,000 events) into a temporary
directory: a run that registers a large plan and executes it with 8 workers, where some builds
fail transiently and are retried, some verifies are flaky (retried up to twice), some tasks
fail structurally and block (with cascade propagation to their dependents), explorers and
observers run, and the process crashes once and is resumed into the same file. Failure
events carry a realistic output tail (0.3 to 2 KB), so lines vary from 150 B to 2.5 KB.

Then it measures, each in a fresh subprocess (so peak memory is the process's own):

- ``parse``: ``json.loads`` of every line, nothing kept: the baseline of the target;
- ``orjson``: ``orjson.loads`` of every line (the parser replay uses), for reference;
- ``import``: a process that only imports ``ftl.postmortem.replay`` (the memory floor of any replay);
- ``replay``: the full postmortem (invariants, timeline, attempts, failures, cascade);
- ``replay+text``: that, then the text postmortem streamed to /dev/null (``ftl replay LOG``).

and prints events/s, the ratios to the bare parse (target: at most 2x) and peak RSS
(``VmHWM``) for each. ``--sizes`` measures several log sizes with the same mix: flat memory
means the replay's peak RSS stays the same as the log grows tenfold.

``--nodes N`` places the workers on N nodes (the driver and N-1 Ray nodes; issue 14's
``node`` on every ``TASK_START``/``TASK_END``), so the text postmortem names a node per attempt;
the default, 0, writes no ``node`` (a log from before issue 14, byte for byte).

Usage: python bench/bench_replay.py [--sizes 100000,1000000] [--repeat 3] [--seed 7] [--nodes 0]
       [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_DUMPS = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


class _Writer:
    """Writes events with seq and ts filled in, like `ftl.events.EventLog` does."""

    def __init__(self, handle, campaign_id: str, start: datetime) -> None:
        self.handle, self.campaign_id = handle, campaign_id
        self.seq, self.now = 0, start
        self.state: str | None = None

    def emit(self, event: str, *, state: object = "", step_ms: float = 3.0, **fields: object) -> dict:
        self.seq += 1
        self.now += timedelta(milliseconds=step_ms)
        record = {"ts": self.now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                  "seq": self.seq, "campaign_id": self.campaign_id, "event": event,
                  "state": self.state if state == "" else state, **fields}
        self.handle.write(_DUMPS(record) + "\n")
        return record

    def enter(self, state: str, **fields: object) -> None:
        self.state = state
        self.emit("STATE_ENTRY", **fields)

    def move(self, trigger: str, to: str) -> None:
        self.emit("PHASE_TRANSITION", **{"from": self.state.lower(), "to": to.lower(), "trigger": trigger})
        self.enter(to)


def _tail(rng: random.Random) -> str:
    words = ("error", "Traceback", "File", "line", "assert", "module", "tally", "FAILED", "expected")
    return " ".join(rng.choice(words) for _ in range(rng.randint(40, 300)))


CONFIG = {"agent_command": None, "explorer_quorum": 3, "explorer_timeout_s": 300.0,
          "flaky_verify_retries": 2, "jobs": 8, "max_clarifications": 5, "max_iterations": 20,
          "max_replan_new_tasks": 20, "max_replans": 2, "output_limit_bytes": 65536,
          "planner_command": None, "replan_threshold": 2, "retry_backoff_max_s": 30.0,
          "retry_backoff_min_s": 0.5, "seconds_per_budget": 60.0, "server": None,
          "stuck_threshold": 3, "transient_retries": 1, "verify_timeout_s": 300.0}


def generate(path: Path, events: int, seed: int, nodes: int = 0) -> dict[str, int]:
    """Write a log of about ``events`` events, the workers on ``nodes`` nodes (0: no ``node``
    field); return counts of what it holds."""
    rng = random.Random(seed)
    node_ids = ["driver"] + [f"{0x3f2a9c1b0d00 + i:012x}" for i in range(1, nodes)]

    def where(worker: str) -> dict[str, str]:
        # Worker wN runs on node N mod nodes; the seeded choices of the mix stay the same.
        return {"node": node_ids[int(worker[1:]) % nodes]} if nodes else {}

    # About 4.43 events per task with this mix (measured), so size the plan from the target.
    tasks = max(10, int(events / 4.43))
    seqs = [f"{i:06d}" for i in range(1, tasks + 1)]
    depends = {s: ([seqs[i - 1 - rng.randint(0, min(i - 1, 30))]] if i and rng.random() < 0.7 else [])
               for i, s in enumerate(seqs)}
    counts = {"tasks": tasks, "failures": 0, "retries": 0, "blocked": 0}
    op = 0
    with open(path, "w", encoding="utf-8") as handle:
        w = _Writer(handle, "c-bench", datetime(2026, 11, 21, tzinfo=timezone.utc))

        def start_run(resume: bool) -> None:
            w.state = None
            w.emit("RUN_START", state=None, mode="campaign", objective="benchmark campaign",
                   resume=resume, pid=4242, config=CONFIG)

        start_run(False)
        w.enter("INIT")
        w.move("explore", "EXPLORE")
        for mode in ("structure", "pattern", "memory", "delta"):
            w.emit("TOOL_CALL", tool=f"explore_{mode}", intent="explore_codebase", macro_id="m-1", task_seq=None)
        for mode in ("structure", "pattern", "memory", "delta"):
            w.emit("EXPLORER_RESULT", mode=mode, status="ok")
        w.move("plan", "PLAN")
        w.emit("TOOL_CALL", tool="load_plan", intent="plan_campaign", macro_id="m-2", task_seq=None)
        w.emit("PLAN_DECISION", decision="PROCEED", tool="load_plan", questions=[])
        w.move("register", "REGISTER")
        # A plan this large is registered in one event in ftl too; keep it bounded here.
        w.emit("PLAN_REGISTERED", tasks=tasks, seqs=seqs[:2000],
               depends={s: depends[s] for s in seqs[:2000]})
        w.move("execute", "EXECUTE")
        w.emit("READY_TASKS", count=8, iteration=1, seqs=seqs[:8])
        crash_at = int(tasks * 0.6)
        running: list[tuple[str, str, int]] = []  # (seq, worker, remaining steps)
        blocked: set[str] = set()
        done: set[str] = set()
        waiting: list[str] = []  # next tasks in seq order whose dependencies are not done yet
        index = 0
        started_count = 0
        while index < tasks or running or waiting:
            while len(running) < 8 and (index < tasks or waiting):
                # The ready task with the lowest seq among the next few (dynamic scheduling).
                while len(waiting) < 16 and index < tasks:
                    waiting.append(seqs[index])
                    index += 1
                pick_seq = None
                for candidate in waiting:
                    if any(d in blocked for d in depends[candidate]):
                        waiting.remove(candidate)
                        blocked.add(candidate)
                        pick_seq = ""
                        break
                    if all(d in done for d in depends[candidate]):
                        pick_seq = candidate
                        break
                if pick_seq == "":
                    continue
                if pick_seq is None:
                    break  # nothing ready until a running task ends
                waiting.remove(pick_seq)
                seq = pick_seq
                started_count += 1
                used = {w for _, w, _ in running}
                worker = next(f"w{i}" for i in range(1, 9) if f"w{i}" not in used)
                w.emit("TASK_START", task_seq=seq, worker=worker, attempt=1, workspace_id=f"{seq}-task",
                       **where(worker))
                running.append((seq, worker, 0))
                if started_count == crash_at:  # the process dies here; the resume appends to this file
                    for seq_r, worker_r, _ in running:
                        w.emit("TOOL_CALL", tool="shell_builder", intent="build_task", macro_id="m-3",
                               task_seq=seq_r)
                    w.now += timedelta(seconds=40)
                    start_run(True)
                    w.emit("RESUME", state=None, from_state="EXECUTE", reset_tasks=[s for s, _, _ in running])
                    w.enter("EXECUTE", resumed=True)
                    w.emit("READY_TASKS", count=len(running), iteration=2, seqs=[s for s, _, _ in running])
                    restarted = []
                    for seq_r, _worker, _ in running:
                        worker_r = f"w{len(restarted) + 1}"
                        w.emit("TASK_START", task_seq=seq_r, worker=worker_r, attempt=2,
                               workspace_id=f"{seq_r}-task", **where(worker_r))
                        restarted.append((seq_r, worker_r, 0))
                    running = restarted
            if not running:
                continue
            # Advance one running task by one whole attempt (interleaving between tasks).
            pick = rng.randrange(len(running))
            seq, worker, _ = running.pop(pick)
            op += 1
            roll = rng.random()
            w.emit("TOOL_CALL", tool="shell_builder", intent="build_task", macro_id="m-3", task_seq=seq)
            if roll < 0.03:  # structural: block, recover in state
                f = w.emit("TOOL_FAILURE", op_id=f"op{op}", tool="shell_builder", task_seq=seq, attempt=1,
                           error_type="dependency_missing", message="A required dependency is missing.",
                           details={"exit_code": 1, "output_tail": _tail(rng), "seq": seq})
                w.emit("FAILURE_CLASSIFIED", op_id=f"op{op}", tool="shell_builder", task_seq=seq,
                       failure_seq=f["seq"], error_type="dependency_missing", klass="structural",
                       decision="structural", max_attempts=1)
                w.emit("RECOVERY_ATTEMPT", op_id=f"op{op}", strategy="block_task", success=True,
                       task_seq=seq, error_type="dependency_missing")
                w.emit("TASK_END", task_seq=seq, worker=worker, status="blocked",
                       error_type="dependency_missing", duration_ms=None, **where(worker))
                blocked.add(seq)
                counts["failures"] += 1
                counts["blocked"] += 1
                continue
            if roll < 0.13:  # transient build failure, retried once
                f = w.emit("TOOL_FAILURE", op_id=f"op{op}", tool="shell_builder", task_seq=seq, attempt=1,
                           error_type="network_error", message="A network call failed.",
                           details={"exit_code": 1, "output_tail": _tail(rng), "seq": seq})
                w.emit("FAILURE_CLASSIFIED", op_id=f"op{op}", tool="shell_builder", task_seq=seq,
                       failure_seq=f["seq"], error_type="network_error", klass="transient",
                       decision="retry", max_attempts=2)
                w.emit("RETRY", op_id=f"op{op}", tool="shell_builder", task_seq=seq, attempt=2,
                       error_type="network_error", wait_ms=500)
                w.emit("TOOL_CALL", tool="shell_builder", intent="build_task", macro_id="m-3", task_seq=seq)
                counts["failures"] += 1
                counts["retries"] += 1
            op += 1
            w.emit("TOOL_CALL", tool="run_verify", intent="verify_task", macro_id="m-4", task_seq=seq)
            if rng.random() < 0.06:  # flaky verify: one or two retries
                for attempt in range(1, 2 + (rng.random() < 0.2)):
                    f = w.emit("TOOL_FAILURE", op_id=f"op{op}", tool="run_verify", task_seq=seq,
                               attempt=attempt, error_type="flaky_test",
                               message=f"Task {seq}'s verify failed and may be flaky.",
                               details={"exit_code": 1, "output_tail": _tail(rng), "seq": seq})
                    w.emit("FAILURE_CLASSIFIED", op_id=f"op{op}", tool="run_verify", task_seq=seq,
                           failure_seq=f["seq"], error_type="flaky_test", klass="transient",
                           decision="retry", max_attempts=3)
                    w.emit("RETRY", op_id=f"op{op}", tool="run_verify", task_seq=seq, attempt=attempt + 1,
                           error_type="flaky_test", wait_ms=500 * attempt)
                    w.emit("TOOL_CALL", tool="run_verify", intent="verify_task", macro_id="m-4", task_seq=seq)
                    counts["failures"] += 1
                    counts["retries"] += 1
            w.emit("TASK_END", task_seq=seq, worker=worker, status="complete", error_type=None,
                   duration_ms=rng.randint(50, 5000), **where(worker))
            done.add(seq)
        w.move("cascade", "CASCADE")
        unreachable = sorted(s for s in blocked if depends[s] and any(d in blocked for d in depends[s]))
        roots = {s: [d for d in depends[s] if d in blocked][:1] for s in unreachable}
        w.emit("CASCADE_STATUS", cascade_state="stuck" if unreachable else "none",
               unreachable=[{"seq": s, "blocked_by": roots[s]} for s in unreachable[:2000]])
        w.emit("CASCADE_PROPAGATE", propagated=[{"seq": s, "blocked_by": roots[s]} for s in unreachable[:2000]])
        w.move("observe", "OBSERVE")
        w.emit("TOOL_CALL", tool="observer", intent="observe_outcomes", macro_id="m-5", task_seq=None)
        w.emit("OBSERVATION", skipped=False, failures_extracted=3, patterns_extracted=1)
        w.move("complete", "COMPLETE")
        w.emit("RUN_END", outcome="complete_with_blocked", exit_code=3)
        counts["events"] = w.seq
    return counts


MODES = ("parse", "orjson", "import", "replay", "replay+text")


def measure(mode: str, path: Path) -> dict[str, object]:
    """Run one measurement (one of `MODES`) in this process."""
    extra: dict[str, object] = {}
    if mode == "import":
        started = time.perf_counter()
        import ftl.postmortem.replay  # noqa: F401

        events = 0
    elif mode in ("parse", "orjson"):
        if mode == "orjson":
            import orjson

            loads, open_mode = orjson.loads, "rb"
        else:
            loads, open_mode = json.loads, "r"
        started = time.perf_counter()
        events = 0
        with open(path, open_mode) as handle:
            for line in handle:
                loads(line)
                events += 1
    else:
        from ftl.postmortem.replay import replay, text_lines

        started = time.perf_counter()  # throughput: the import's one-time cost is the "import" row
        with replay([path]) as result:
            if mode == "replay+text":
                with open(os.devnull, "w", encoding="utf-8") as sink:
                    sink.writelines(text_lines(result))
            events = result.events
            extra = {"violations": len(result.violations), "attempts": len(result.attempts),
                     "failures": len(result.failures), "tasks": len(result.tasks),
                     "crash_boundaries": result.crash_boundaries[:3]}
    seconds = time.perf_counter() - started
    maxrss_kb = _peak_rss_kb()
    return {"mode": mode, "events": events, "seconds": round(seconds, 3),
            "events_per_s": int(events / seconds) if seconds and events else 0,
            "maxrss_mb": round(maxrss_kb / 1024, 1),
            **extra}


def _peak_rss_kb() -> int:
    """Peak resident memory of this process's own address space, in KiB.

    Linux's ``VmHWM`` is reset by exec; ``ru_maxrss`` is not (after fork+exec it still holds
    the parent's peak), so it is only the fallback on systems without /proc.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(mode: str, path: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, __file__, "--measure", mode, str(path)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated event counts")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=0,
                        help="place the workers on this many nodes (0: logs without node)")
    parser.add_argument("--dir", type=Path, help="where to write the logs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (best is kept)")
    parser.add_argument("--measure", nargs=2, metavar=("MODE", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]))))
        return 0

    work = Path(args.dir or tempfile.mkdtemp(prefix="ftl-bench-replay-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            path = work / f"c-bench-{size}.jsonl"
            t0 = time.perf_counter()
            counts = generate(path, size, args.seed, args.nodes)
            gen_s = time.perf_counter() - t0
            mb = path.stat().st_size / 1e6
            print(f"log: {counts['events']:,} events, {mb:,.0f} MB ({counts['tasks']:,} tasks, "
                  f"{counts['failures']:,} failures, {counts['retries']:,} retries, {counts['blocked']:,} "
                  f"blocked, one crash) written in {gen_s:.1f} s", flush=True)
            best: dict[str, dict] = {}
            for _ in range(max(1, args.repeat)):
                for mode in MODES:  # interleaved, so drift in machine load hits every mode alike
                    m = _child(mode, path)
                    if mode not in best or m["seconds"] < best[mode]["seconds"]:
                        best[mode] = m
            base = best["parse"]["seconds"]
            for mode in MODES:
                m = best[mode]
                rate = f"{m['events_per_s']:>9,} events/s" if m["events"] else " " * 18
                ratio = f"{m['seconds'] / base:5.2f}x parse" if mode != "import" else " " * 11
                print(f"  {mode:<12}: {rate}  {m['seconds']:>6.2f} s  {ratio}  peak RSS {m['maxrss_mb']:>6.1f} MB")
            rep = best["replay"]
            print(f"  kept on disk: {rep['attempts']:,} attempts, {rep['failures']:,} failures, "
                  f"{rep['tasks']:,} tasks; {rep['violations']} violations")
            for mode in ("replay", "replay+text"):
                ratio = best[mode]["seconds"] / base
                print(f"  {mode} / bare json.loads parse: {ratio:.2f}x (target <= 2x): "
                      f"{'OK' if ratio <= 2 else 'OVER'}")
            rows.append({"events": counts["events"], "mb": round(mb, 1), **best,
                         "ratio": round(best["replay"]["seconds"] / base, 3),
                         "ratio_text": round(best["replay+text"]["seconds"] / base, 3)})
        print(json.dumps(rows))
    finally:
        if not args.keep and args.dir is None:
            for path in work.glob("c-bench-*.jsonl"):
                path.unlink()
            work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
