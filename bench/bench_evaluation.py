"""Benchmark: intent-evaluation latency of ftl's embedded MangleCP server, and its overhead over clingo.

For 100, 1,000 and 10,000 client facts the script sends the same ``build_task`` intent request
(facts: ``task/2``, ``task_has_run/1``, ``blocked/1`` and ``framework/1`` in equal parts) through
three paths, in the same run:

* ``stdio``: `ftl.manglecp.client`'s stdio transport to a ``python -m ftl.server.serve --stdio``
  subprocess (the runner's default): encoding, a pipe each way, the server's checks, its
  evaluation worker process, rendering;
* ``in-process``: `ManglecpServer.handle` called directly (no transport), still with the
  production evaluator (rules evaluated in a worker process);
* ``clingo``: clingo alone on the same program and facts: a fresh ``clingo.Control`` with the
  parsed rules, the facts added as symbols, ground, solve (what the worker does per request,
  without the server around it).

It prints p50 and p99 latency (ms) per path and size, and the server's overhead ratio
(p50 of the path / p50 of clingo alone). Latencies are wall-clock, per request, sequential
(one request in flight). The default run takes 15-60 s, depending on the machine.

Usage: python bench/bench_evaluation.py [--sizes 100,1000,10000] [--repeat 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftl.config import Config  # noqa: E402
from ftl.manglecp.facts import validate_facts  # noqa: E402
from ftl.manglecp.messages import envelope  # noqa: E402
from ftl.manglecp.transport import StdioTransport  # noqa: E402
from ftl.server.app import build_server  # noqa: E402
from ftl.server.evaluation.program import Program  # noqa: E402
from ftl.server.evaluation.symbols import fact_symbol  # noqa: E402

INTENT = "build_task"
EVAL_TIME_MS = 1_771_511_400_000


def make_facts(n: int) -> list[dict[str, Any]]:
    """``n`` valid facts for the ``build_task`` intent (a quarter of each predicate)."""
    facts: list[dict[str, Any]] = []
    for i in range(n):
        seq, kind = f"{i // 4:05d}", i % 4
        if kind == 0:
            facts.append({"pred": "task", "args": [seq, "BUILD"]})
        elif kind == 1:
            facts.append({"pred": "task_has_run", "args": [seq]})
        elif kind == 2:
            facts.append({"pred": "blocked", "args": [seq]})
        else:
            facts.append({"pred": "framework", "args": [f"fw{seq}"]})
    return facts


def request(facts: list[dict[str, Any]], number: int) -> dict[str, Any]:
    return envelope("intent_request", f"bench-{number}", {
        "intent": {"name": INTENT}, "facts": facts, "eval_time": EVAL_TIME_MS,
        "options": {"disclosure_preference": "full"}})


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``samples``."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def timed(call: Callable[[int], Any], repeat: int, warmup: int = 3) -> list[float]:
    """Latencies (ms) of ``repeat`` calls after ``warmup`` untimed ones."""
    for number in range(warmup):
        call(-1 - number)
    samples = []
    for number in range(repeat):
        started = time.perf_counter()
        call(number)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def check(reply: dict[str, Any]) -> None:
    if reply.get("type") != "intent_response" or not reply["payload"]["macro_tools"]:
        raise SystemExit(f"unexpected reply: {json.dumps(reply)[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="Fact counts, comma-separated.")
    parser.add_argument("--repeat", type=int, default=100, help="Timed requests per path and size.")
    parser.add_argument("--json", action="store_true", help="Print the results as JSON instead of a table.")
    options = parser.parse_args()
    sizes = [int(s) for s in options.sizes.split(",") if s.strip()]
    repo = Path(tempfile.mkdtemp(prefix="ftl-bench-"))
    config = Config()

    server = build_server(repo, config)  # production evaluator: worker processes
    stdio = StdioTransport([sys.executable, "-m", "ftl.server.serve", "--stdio", "--repo", str(repo),
                            "--config-json", config.model_dump_json()])
    evaluator = server.evaluator
    program = Program(evaluator.rule_texts, evaluator.server_facts, evaluator.hidden_predicates)
    results = []
    try:
        while stdio.manifest()["payload"]["status"] == "booting":
            stdio.wait_manifest(stdio.manifest(), 30)
        for n in sizes:
            facts = make_facts(n)
            repeat = max(10, options.repeat if n < 10_000 else options.repeat // 3)
            message = request(facts, 0)
            check(server.handle(message)[-1])
            check(stdio.request(message))

            normal, _ = validate_facts(facts, server.facts_profile)
            symbols = [fact_symbol("intent", [INTENT], None, 0)] + [
                fact_symbol(f.pred, list(f.args), f.t, EVAL_TIME_MS) for f in normal] + program.server_facts

            paths = {
                "stdio": timed(lambda i: check(stdio.request(request(facts, i))), repeat),
                "in-process": timed(lambda i: check(server.handle(request(facts, i))[-1]), repeat),
                "clingo": timed(lambda i: program._models(program._ground(symbols, False)), repeat),
            }
            base = percentile(paths["clingo"], 50)
            for path, samples in paths.items():
                p50 = percentile(samples, 50)
                results.append({"facts": n, "path": path, "requests": len(samples),
                                "p50_ms": round(p50, 2), "p99_ms": round(percentile(samples, 99), 2),
                                "overhead": round(p50 / base, 2) if base else None})
    finally:
        stdio.close()
        server.close()
    if options.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'facts':>6}  {'path':<11} {'n':>4}  {'p50 ms':>8}  {'p99 ms':>8}  {'x clingo':>8}")
    for row in results:
        print(f"{row['facts']:>6}  {row['path']:<11} {row['requests']:>4}  {row['p50_ms']:>8.2f}  "
              f"{row['p99_ms']:>8.2f}  {row['overhead']:>8.2f}")
    print("x clingo: p50 of the path / p50 of clingo alone (ground + solve) on the same program and facts.")


if __name__ == "__main__":
    main()
