"""FTL-compatible ``benchmark.py``: benchmarks of ftl's memory and the records of their runs.

FTL benchmark.py (enzokro/crinzo-plugins ``ftl/lib/benchmark.py``, commit 89a2f8e): ``run``,
``retrieval``, ``matching``, ``pruning``, ``report [--json]``, ``get-run --run-id ID``,
``compare --run-a ID --run-b ID``, ``list-runs``, over `ftl.memory.benchmark` (what each one
measures is there). FTL's ``learning`` simulated a learning loop with random numbers and
measured nothing of the system, so it is refused with that reason rather than imitated
(docs/ftl-compat.md, ``benchmark-scope``). Runs are recorded in ``<repo>/.ftl/benchmarks.jsonl``.
Output and exit codes: see ``lib/_common.py``; the FTL output mode prints FTL's JSON (lists of
results at indent 2) and ``report``'s text.
"""

from __future__ import annotations

from dataclasses import asdict

import click

from _common import Env, FtlRefusal, FtlText, Reply, command, script_group, wrap

cli = script_group("benchmark.py", "Benchmarks of ftl's memory (FTL benchmark.py).")


def _measured(env: Env, bench) -> Reply:
    """Run one benchmark, record it under a new run id, print its results."""
    from ftl.memory.benchmark import RunLog, new_run_id

    results = bench()
    run_id = new_run_id()
    RunLog(env.repo).record(run_id, results)
    items = [asdict(r) for r in results]
    return Reply({"run_id": run_id, "items": items}, ftl=items)


@command(cli, "run")
def run_all(env: Env) -> Reply:
    """Run retrieval, matching and pruning under one run id and record them.

    data: {run_id, retrieval, semantic, pruning: [{name, metric, value, unit, baseline,
    improvement, timestamp}], metadata: {timestamp, embeddings_available: false}}.
    """
    from ftl.memory.benchmark import RunLog
    from ftl.memory.benchmark import run_all as bench_all

    return Reply(bench_all(RunLog(env.repo)))


@command(cli, "retrieval")
def retrieval(env: Env) -> Reply:
    """ms per memory context call at 10-500 failures, without and with an objective.
    data: {run_id, items: [result]} (FTL output: the list)."""
    from ftl.memory.benchmark import retrieval as bench

    return _measured(env, bench)


@command(cli, "matching")
def matching(env: Env) -> Reply:
    """bm25 relevance accuracy (%) on labelled pairs and the hybrid score distribution.
    data: {run_id, items: [result]} (FTL output: the list)."""
    from ftl.memory.benchmark import matching as bench

    return _measured(env, bench)


@command(cli, "pruning")
def pruning(env: Env) -> Reply:
    """ms to prune 500 failures and 200 patterns to 100 / 50, and how many went.
    data: {run_id, items: [result]} (FTL output: the list)."""
    from ftl.memory.benchmark import pruning as bench

    return _measured(env, bench)


@command(cli, "learning")
def learning(env: Env) -> Reply:
    """Refused: FTL's learning benchmark was a random-number simulation, not a measurement.
    VALIDATION_ERROR (exit 2; FTL output: {"error"}, exit 1)."""
    message = ("benchmark.py learning is not provided: FTL's version simulated token costs with random "
               "numbers and measured nothing of the system; use run, retrieval, matching or pruning.")
    raise FtlRefusal("schema_invalid", {"count": 1, "violations": [
        {"path": "COMMAND", "message": "learning is not provided", "fix": "use run, retrieval, matching or pruning"}]},
        message=message, ftl_payload={"error": message})


@command(cli, "report")
@click.option("--json", "as_json", is_flag=True, help="JSON {run_id, metrics, timestamp} instead of text.")
def report(env: Env, as_json: bool) -> Reply:
    """The latest recorded run (running every benchmark first when there is none, as FTL did;
    ``--json`` does not run anything).

    data: {run_id, metrics: [{id, run_id, metric, value, metadata, created_at}], timestamp,
    text}; FTL output: the text, or with --json {run_id, metrics, timestamp} (no run:
    {"error": "No benchmark runs found"}, exit 0).
    """
    from ftl.memory.benchmark import RunLog, run_all as bench_all
    from ftl.memory.benchmark import report as render

    log = RunLog(env.repo)
    runs = log.runs(limit=1)
    if not runs and as_json:
        return Reply({"error": "No benchmark runs found"}, ftl={"error": "No benchmark runs found"})
    run_id = runs[0]["run_id"] if runs else bench_all(log)["run_id"]
    metrics = log.run(run_id)
    data = {"run_id": run_id, "metrics": metrics, "timestamp": metrics[0]["created_at"] if metrics else None}
    if as_json:
        return Reply(data, ftl=data)
    text = render(run_id, metrics)
    return Reply({**data, "text": text}, ftl=FtlText(text))


@command(cli, "get-run")
@click.option("--run-id", required=True, help="Run id (list-runs).")
def get_run(env: Env, run_id: str) -> Reply:
    """The recorded metrics of a run. data: {"items": [{id, run_id, metric, value, metadata,
    created_at}]} ([] for an unknown id, as in FTL)."""
    from ftl.memory.benchmark import RunLog

    rows = RunLog(env.repo).run(run_id)
    return Reply(wrap(rows), ftl=rows)


@command(cli, "compare")
@click.option("--run-a", required=True, help="First run id.")
@click.option("--run-b", required=True, help="Second run id.")
def compare(env: Env, run_a: str, run_b: str) -> Reply:
    """Two runs side by side. data: {run_a, run_b, metrics: {name: {run_a, run_b,
    diff_percent}}} (diff_percent = (b - a) / a x 100)."""
    from ftl.memory.benchmark import RunLog

    result = RunLog(env.repo).compare(run_a, run_b)
    return Reply(result, ftl=result)


@command(cli, "list-runs")
def list_runs(env: Env) -> Reply:
    """The 10 newest runs. data: {"items": [{run_id, metrics: n, created_at}]}."""
    from ftl.memory.benchmark import RunLog

    runs = RunLog(env.repo).runs()
    return Reply(wrap(runs), ftl=runs)

