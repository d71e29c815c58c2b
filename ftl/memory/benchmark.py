"""Benchmarks of ftl's memory, the measurable part of FTL's ``lib/benchmark.py`` (commit 89a2f8e):
retrieval time, relevance matching quality and prune time, each on a scratch store it fills
itself, plus the run records FTL kept (``.ftl/benchmarks.jsonl``, one metric per line).

What is measured, and how it differs from FTL's (docs/ftl-compat.md, ``benchmark-scope``):

* retrieval: ms per `MemoryStore.context` call on stores of 10 to 500 failures (and half as
  many patterns), without and with an objective. FTL built such data but timed its real
  memory instead; here the scratch store of each size is the one timed.
* matching: accuracy (%) of bm25 relevance on labelled (query, stored trigger, should match)
  pairs at FTL's 0.5 threshold, and the mean / max hybrid score of every sample trigger for
  every sample objective. FTL measured this only with embeddings installed.
* pruning: ms to prune 500 failures and 200 patterns down to 100 / 50, and how many went.

FTL's ``learning`` benchmark drew random numbers and measured nothing of the system, so it has
no counterpart. Result objects keep FTL's shape: ``{name, metric, value, unit, baseline,
improvement, timestamp}`` (``improvement`` = (baseline - value) / baseline x 100, %).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import jsonlines

from ftl.memory import scoring

RECORDS = Path(".ftl") / "benchmarks.jsonl"
RETRIEVAL_SIZES = (10, 50, 100, 250, 500)
RETRIEVAL_ITERATIONS = 100
RETRIEVAL_OBJECTIVE = "retry the database connection after a timeout"
MATCH_THRESHOLD = 0.5  # FTL's relevance threshold for injected memory
SEED = 42  # reproducible synthetic memory, as FTL's

#: Failure triggers of the kind builders hit (ftl's own samples).
SAMPLE_TRIGGERS = (
    "ModuleNotFoundError: No module named 'yaml' when importing the config loader",
    "TypeError: unsupported operand type(s) for +: 'int' and 'NoneType' in the totals report",
    "ValueError: could not convert string to float: 'n/a' while parsing prices",
    "KeyError: 'user_id' missing from the session payload",
    "AttributeError: 'NoneType' object has no attribute 'strip' in the header parser",
    "IndexError: list index out of range reading the last CSV row",
    "FileNotFoundError: settings.toml not found in the working directory",
    "sqlite3.OperationalError: database is locked during the migration",
    "TimeoutError: the database connection timed out after 30 seconds",
    "PermissionError: cannot write the cache directory under /var",
    "json.decoder.JSONDecodeError: Expecting value at line 1 column 1 of the API response",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in the legacy export",
    "RecursionError: maximum recursion depth exceeded walking the dependency tree",
    "AssertionError: expected 3 tokens from tokenize('a b c'), got 1",
    "ImportError: cannot import name 'tokenize' from partially initialized module 'src.parser'",
    "pytest collected 0 items: test files are not named test_*.py",
)

#: Objectives a campaign might carry, for the hybrid score distribution.
SAMPLE_OBJECTIVES = (
    "Load configuration from YAML with defaults",
    "Sum report totals when some values are missing",
    "Parse price columns that contain placeholders",
    "Keep user sessions across requests",
    "Retry the database connection after a timeout",
    "Split input text into tokens for the parser",
    "Run the migration while other writers hold the database",
    "Decode legacy exports with mixed encodings",
)

#: (query, stored trigger index, should the trigger reach the threshold).
MATCH_PAIRS = (
    ("No module named yaml", 0, True),
    ("database connection timed out", 8, True),
    ("database is locked while migrating", 7, True),
    ("cannot import name tokenize from src.parser", 14, True),
    ("could not convert string to float", 2, True),
    ("No module named yaml", 9, False),
    ("database connection timed out", 11, False),
    ("render the landing page with a hero image", 3, False),
    ("configure the git remote for deployment", 6, False),
)


@dataclass
class BenchmarkResult:
    """One measured number (FTL's BenchmarkResult shape); ``improvement`` in % against ``baseline``."""

    name: str
    metric: str
    value: float
    unit: str
    baseline: float | None = None
    improvement: float | None = None
    timestamp: str = ""

    def __post_init__(self) -> None:
        self.timestamp = self.timestamp or _now().isoformat()
        if self.baseline is not None and self.baseline > 0:
            self.improvement = round((self.baseline - self.value) / self.baseline * 100, 2)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Clock:
    """A settable clock for the scratch store, so synthetic entries get ages (decay)."""

    def __init__(self) -> None:
        self.moment = _now()

    def __call__(self) -> datetime:
        return self.moment


@contextmanager
def _scratch(entries: list[dict[str, Any]]) -> Iterator[Any]:
    """A temporary `ftl.store.Store` holding ``entries`` (each with ``age_days``); yields its
    `MemoryStore` and removes the directory afterwards."""
    from ftl.memory import MemoryStore
    from ftl.store import Store

    clock = _Clock()
    now = clock.moment
    with tempfile.TemporaryDirectory(prefix="ftl-bench-") as tmp, Store(Path(tmp) / "ftl.db", clock=clock) as store:
        memory = MemoryStore(store)
        for entry in entries:
            clock.moment = now - timedelta(days=entry["age_days"])
            memory.add({k: v for k, v in entry.items() if k != "age_days"}, validate=False)
        clock.moment = now
        yield memory


#: Words the synthetic triggers are drawn from, so no two are near-duplicates (memory merges
#: triggers more than 85 % alike, which would shrink the store being measured).
_WORDS = ("parser", "invoice", "session", "token", "cache", "schema", "router", "ledger", "upload",
          "report", "queue", "export", "config", "account", "search", "payment", "profile", "worker",
          "render", "import", "socket", "batch", "filter", "metric", "backup", "locale", "policy",
          "ticket", "header", "cursor", "digest", "sample", "bundle", "signal", "widget", "vector")


def _phrase(rng: random.Random, words: int) -> str:
    return " ".join(rng.sample(_WORDS, words))


def synthetic_entries(failures: int, patterns: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``failures`` + ``patterns`` memory entries: a sample trigger's error kind followed by
    random words, random cost / saved (tokens) and age (0-90 days), reproducible for a ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(failures):
        kind = SAMPLE_TRIGGERS[i % len(SAMPLE_TRIGGERS)].split(":")[0]
        out.append({"name": f"failure-{i:04d}", "type": "failure", "age_days": rng.randint(0, 90),
                    "trigger": f"{kind}: {_phrase(rng, 6)} {rng.randrange(10 ** 6)}",
                    "fix": f"apply fix {i}", "cost": rng.randint(100, 50_000), "source": [f"ws-{i}"]})
    for i in range(patterns):
        out.append({"name": f"pattern-{i:04d}", "type": "pattern", "age_days": rng.randint(0, 90),
                    "trigger": f"{_phrase(rng, 6)} {rng.randrange(10 ** 6)}",
                    "insight": f"technique {i} kept the change small", "saved": rng.randint(500, 20_000),
                    "source": [f"ws-{i}"]})
    return out


def _ms_per_call(call: Callable[[], Any], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - start) / iterations * 1000


def retrieval(sizes: tuple[int, ...] = RETRIEVAL_SIZES,
              iterations: int = RETRIEVAL_ITERATIONS) -> list[BenchmarkResult]:
    """ms per `MemoryStore.context` call (5 failures, 3 patterns) for each memory size, without
    an objective (ranked by value) and with one (bm25 relevance); the second's baseline is the
    first, so its ``improvement`` is minus the relevance overhead in %."""
    results = []
    for size in sizes:
        with _scratch(synthetic_entries(size, size // 2)) as memory:
            plain = _ms_per_call(lambda: memory.context(max_failures=5, max_patterns=3, track_access=False),
                                 iterations)
            ranked = _ms_per_call(lambda: memory.context(objective=RETRIEVAL_OBJECTIVE, max_failures=5,
                                                         max_patterns=3, track_access=False), iterations)
        results.append(BenchmarkResult(f"retrieval_no_semantic_{size}", "retrieval_time", round(plain, 3), "ms"))
        results.append(BenchmarkResult(f"retrieval_semantic_{size}", "retrieval_time", round(ranked, 3), "ms",
                                       baseline=plain))
    return results


def matching() -> list[BenchmarkResult]:
    """Accuracy (%) of bm25 relevance on `MATCH_PAIRS` at the 0.5 threshold, and the mean / max
    hybrid score (`scoring.hybrid_score`) of every sample trigger for every sample objective."""
    entries = [{"name": f"sample-{i:02d}", "type": "failure", "age_days": 0, "trigger": text,
                "fix": "see the sample", "cost": 1000 + 500 * i} for i, text in enumerate(SAMPLE_TRIGGERS)]
    with _scratch(entries) as memory:
        correct = 0
        for query, index, should_match in MATCH_PAIRS:
            scores = {e["name"]: e["score"] for e in memory.query(query, threshold=0.0)}
            correct += (scores.get(f"sample-{index:02d}", 0.0) >= MATCH_THRESHOLD) == should_match
        now = _now()
        hybrid = []
        for objective in SAMPLE_OBJECTIVES:
            relevance = {e["name"]: e["score"] for e in memory.query(objective, threshold=0.0)}
            for entry in entries:
                hybrid.append(scoring.hybrid_score(relevance.get(entry["name"], 0.0), entry["cost"], 0, 0,
                                                   now.isoformat(), now))
    accuracy = correct / len(MATCH_PAIRS) * 100
    return [BenchmarkResult("semantic_matching_accuracy", "accuracy", round(accuracy, 1), "%", baseline=100.0),
            BenchmarkResult("hybrid_score_mean", "hybrid_score", round(statistics.fmean(hybrid), 3), "score"),
            BenchmarkResult("hybrid_score_max", "hybrid_score", round(max(hybrid), 3), "score")]


def pruning(failures: int = 500, patterns: int = 200, keep_failures: int = 100,
            keep_patterns: int = 50) -> list[BenchmarkResult]:
    """ms for one `MemoryStore.prune` of ``failures`` + ``patterns`` entries down to ``keep_*``
    (importance floor 0.1), and the number of entries it removed per type."""
    with _scratch(synthetic_entries(failures, patterns)) as memory:
        start = time.perf_counter()
        pruned = memory.prune(max_failures=keep_failures, max_patterns=keep_patterns, min_importance=0.1)
        elapsed = (time.perf_counter() - start) * 1000
    return [BenchmarkResult("prune_time", "prune_time", round(elapsed, 2), "ms"),
            BenchmarkResult("pruned_failures", "entries_removed", pruned["pruned_failures"], "entries"),
            BenchmarkResult("pruned_patterns", "entries_removed", pruned["pruned_patterns"], "entries")]


BENCHMARKS: dict[str, Callable[[], list[BenchmarkResult]]] = {
    "retrieval": retrieval, "semantic": matching, "pruning": pruning}


def new_run_id() -> str:
    """An 8-character run id (FTL's)."""
    return uuid.uuid4().hex[:8]


class RunLog:
    """The benchmark run records of a repository: ``<repo>/.ftl/benchmarks.jsonl``, one line per
    metric ``{id, run_id, metric, value, metadata, created_at}`` (FTL's benchmark table).

    Args:
        repo: the repository directory.
    """

    def __init__(self, repo: Path) -> None:
        self.path = Path(repo) / RECORDS

    def _rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with jsonlines.open(self.path) as reader:
            return [row for row in reader.iter(type=dict, skip_invalid=True)]

    def record(self, run_id: str, results: list[BenchmarkResult]) -> None:
        """Append one line per result (value, unit in metadata)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = len(self._rows())
        with jsonlines.open(self.path, mode="a") as writer:
            for offset, result in enumerate(results, start=1):
                writer.write({"id": start + offset, "run_id": run_id, "metric": result.name,
                              "value": result.value, "metadata": {"unit": result.unit},
                              "created_at": result.timestamp})

    def run(self, run_id: str) -> list[dict[str, Any]]:
        """The metrics of ``run_id`` in recording order ([] when unknown)."""
        return [row for row in self._rows() if row.get("run_id") == run_id]

    def runs(self, limit: int = 10) -> list[dict[str, Any]]:
        """``[{run_id, metrics: n, created_at: first metric's}]``, newest first, at most ``limit``."""
        runs: dict[str, dict[str, Any]] = {}
        for row in self._rows():
            entry = runs.setdefault(row["run_id"], {"run_id": row["run_id"], "metrics": 0,
                                                    "created_at": row["created_at"]})
            entry["metrics"] += 1
            entry["created_at"] = min(entry["created_at"], row["created_at"])
        return sorted(runs.values(), key=lambda r: r["created_at"], reverse=True)[:limit]

    def compare(self, run_a: str, run_b: str) -> dict[str, Any]:
        """``{run_a, run_b, metrics: {name: {run_a, run_b, diff_percent}}}``; ``diff_percent`` =
        (b - a) / a x 100 rounded to 2 places, None when a value is missing or a is 0."""
        a = {row["metric"]: row["value"] for row in self.run(run_a)}
        b = {row["metric"]: row["value"] for row in self.run(run_b)}
        metrics = {}
        for name in sorted(a.keys() | b.keys()):
            diff = (round((b[name] - a[name]) / a[name] * 100, 2)
                    if name in a and name in b and a[name] else None)
            metrics[name] = {"run_a": a.get(name), "run_b": b.get(name), "diff_percent": diff}
        return {"run_a": run_a, "run_b": run_b, "metrics": metrics}


def run_all(log: RunLog) -> dict[str, Any]:
    """Every benchmark under one new run id, recorded in ``log``. Returns ``{run_id, retrieval,
    semantic, pruning: [result dicts], metadata: {timestamp, embeddings_available: false}}``."""
    run_id = new_run_id()
    out: dict[str, Any] = {"run_id": run_id}
    for section, bench in BENCHMARKS.items():
        results = bench()
        log.record(run_id, results)
        out[section] = [asdict(r) for r in results]
    out["metadata"] = {"timestamp": _now().isoformat(), "embeddings_available": False}
    return out


def report(run_id: str, metrics: list[dict[str, Any]]) -> str:
    """A plain-text report of one recorded run (sections: retrieval, matching, pruning)."""
    sections = {"RETRIEVAL PERFORMANCE": "retrieval", "RELEVANCE MATCHING QUALITY": ("semantic", "hybrid"),
                "PRUNING PERFORMANCE": ("prune", "pruned")}
    rule, thin = "=" * 60, "-" * 40
    lines = [rule, "FTL MEMORY BENCHMARK REPORT", rule, f"Run ID: {run_id}",
             f"Generated: {metrics[0]['created_at'] if metrics else _now().isoformat()}",
             "Relevance: SQLite FTS5 bm25 (no embeddings)", ""]
    for title, prefix in sections.items():
        lines += [thin, title, thin]
        for row in metrics:
            if row["metric"].startswith(prefix):
                lines.append(f"  {row['metric']}: {row['value']} {row.get('metadata', {}).get('unit', '')}".rstrip())
        lines.append("")
    return "\n".join(lines)
