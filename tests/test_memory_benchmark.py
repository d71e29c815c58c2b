"""Tests for ftl.memory.benchmark (the measurable part of FTL's benchmark.py) and lib/benchmark.py.
Benchmarks run here on small sizes and few iterations: the tests check what is measured and
recorded, not how fast it is (that is the command's job)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ftl.memory import benchmark
from ftl.memory.benchmark import BenchmarkResult, RunLog, synthetic_entries

LIB = Path(__file__).resolve().parent.parent / "lib"


def test_synthetic_entries_are_reproducible_and_never_merge() -> None:
    from ftl.memory import scoring

    entries = synthetic_entries(40, 20)
    assert entries == synthetic_entries(40, 20) and entries != synthetic_entries(40, 20, seed=7)
    failures = [e["trigger"] for e in entries if e["type"] == "failure"]
    # memory merges near-duplicate triggers, which would shrink the store being measured
    assert not any(scoring.is_near_duplicate(a, b) for i, a in enumerate(failures) for b in failures[i + 1:])


def test_pruning_measures_a_store_of_the_requested_size() -> None:
    time_ms, failures, patterns = benchmark.pruning(failures=30, patterns=12, keep_failures=10, keep_patterns=4)
    assert (time_ms.name, time_ms.unit) == ("prune_time", "ms") and time_ms.value > 0
    assert (failures.value, patterns.value) == (20, 8)


def test_retrieval_times_both_paths_with_the_plain_one_as_baseline() -> None:
    plain, ranked = benchmark.retrieval(sizes=(12,), iterations=2)
    assert (plain.name, ranked.name) == ("retrieval_no_semantic_12", "retrieval_semantic_12")
    assert plain.value > 0 and ranked.baseline is not None and ranked.baseline > 0
    assert ranked.improvement == round((ranked.baseline - ranked.value) / ranked.baseline * 100, 2)


def test_matching_scores_the_labelled_pairs_with_bm25() -> None:
    accuracy, mean, best = benchmark.matching()
    assert accuracy.unit == "%" and accuracy.value >= 75.0  # bm25 separates the sample pairs
    assert 0 < mean.value <= best.value


def test_run_log_records_lists_and_compares_runs(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    assert log.runs() == [] and log.run("nope") == []
    log.record("a", [BenchmarkResult("prune_time", "prune_time", 10.0, "ms", timestamp="2026-01-01T00:00:00")])
    log.record("b", [BenchmarkResult("prune_time", "prune_time", 15.0, "ms", timestamp="2026-01-02T00:00:00"),
                     BenchmarkResult("pruned_failures", "entries_removed", 3, "entries",
                                     timestamp="2026-01-02T00:00:00")])
    assert [r["run_id"] for r in log.runs()] == ["b", "a"] and log.runs()[0]["metrics"] == 2
    assert [r["id"] for r in log.run("b")] == [2, 3] and log.run("b")[0]["metadata"] == {"unit": "ms"}
    compared = log.compare("a", "b")["metrics"]
    assert compared["prune_time"] == {"run_a": 10.0, "run_b": 15.0, "diff_percent": 50.0}
    assert compared["pruned_failures"] == {"run_a": None, "run_b": 3, "diff_percent": None}


def _ftl(repo: Path, *args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(LIB / "benchmark.py"), "--repo", str(repo), "--output", "ftl",
                           *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stdout


def test_script_prints_ftl_shapes_and_refuses_the_simulation(tmp_path: Path) -> None:
    assert _ftl(tmp_path, "report", "--json") == (0, json.dumps({"error": "No benchmark runs found"}, indent=2) + "\n")
    assert _ftl(tmp_path, "get-run", "--run-id", "nope") == (0, "[]\n")
    code, out = _ftl(tmp_path, "learning")
    assert code == 1 and "random numbers" in json.loads(out)["error"]
    code, out = _ftl(tmp_path, "matching")  # the quick one: 16 sample entries
    results = json.loads(out)
    assert code == 0 and [r["name"] for r in results] == ["semantic_matching_accuracy", "hybrid_score_mean",
                                                          "hybrid_score_max"]
    (run,) = json.loads(_ftl(tmp_path, "list-runs")[1])
    assert run["metrics"] == 3
    code, text = _ftl(tmp_path, "report")
    accuracy = results[0]["value"]
    assert code == 0 and f"Run ID: {run['run_id']}" in text and f"semantic_matching_accuracy: {accuracy} %" in text
