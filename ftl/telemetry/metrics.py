"""Prometheus counters for ftl's errors, gate decisions, retries and tasks.

Seven counters on ftl's own `CollectorRegistry` (never the global one), without ``*_created``
series so two dumps of the same run compare byte for byte (reference §3.2, §5 rule 5):

* ``ftl_errors_total{code, gate, category}``: ``code`` is the registry kind (``verify_failed``),
  ``gate`` the gate that refused (``none`` otherwise), ``category`` the response-v2 category
  (``validation``, ``internal``, ...).
* ``ftl_gate_decisions_total{gate, outcome}``: one per gate step (`count_gate`), counted by the
  gate module where it runs, and by a campaign from its ``GATE_DECISION`` events.
* ``ftl_gate_denials_total{gate, reason}``: one per refusal (ThoughtGate F-004.3); ``reason`` is
  the refusal's registry kind (``governance_denied``, ``policy_denied``, ``approval_timeout``,
  ...), never a rule or policy id.
* ``ftl_retries_total{kind, outcome}``: ``kind`` is the error kind retried or recovered from
  (``none`` when the event names none); ``outcome`` is ``retried`` (a ``RETRY`` event),
  ``recovered`` or ``unrecovered`` (a ``RECOVERY_ATTEMPT`` and its ``success``).
* ``ftl_tasks_total{status}``: finished task attempts by status (``TASK_END``).
* ``ftl_agent_cost_usd_total``: agent spend in USD, and ``ftl_agent_tokens_total{kind}``:
  tokens by usage kind (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``), both from the ``TASK_END`` of agent builds (issue 12).

Counted once per process: a campaign's in-process tool server builds its gate with counting off
(`ftl.server.app.connect`), so its decisions are counted only from the campaign's events; a
server in another process (stdio, HTTP) counts in that process.

Label values come from closed sets (the registry, the gates) or pass a cardinality limiter:
beyond `MAX_LABEL_VALUES` distinct values a label records ``__other__`` (ThoughtGate's
cardinality rule, §1.8). `EventMetrics` derives the counters from the event log
(`ftl.events.EventLog.subscribe`); `render` serves ``/metrics``; `write_textfile` writes the
node-exporter textfile format atomically.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path
from typing import Any, Callable

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter,
                               disable_created_metrics, generate_latest, write_to_textfile)

from ftl.errors import GATE_ORDER, REGISTRY, kind

disable_created_metrics()  # *_created gauges hold wall-clock values: they break replays

MAX_LABEL_VALUES = 32
OTHER = "__other__"
NONE = "none"
_LABEL_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")  # whole value: `fullmatch`, never `$`


class _Limiter:
    """At most ``limit`` distinct values per label; later newcomers become ``__other__``, as
    does a value that is not wholly ``[a-z][a-z0-9_]{0,47}`` (after lowercasing): no trailing
    newline makes a series of its own."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str, value: Any) -> str:
        text = str(value).lower() if value is not None else NONE
        if not _LABEL_RE.fullmatch(text):
            return OTHER
        with self._lock:
            seen = self._seen.setdefault(label, set())
            if text in seen:
                return text
            if len(seen) >= self.limit:
                return OTHER
            seen.add(text)
            return text


class Metrics:
    """ftl's counters on one registry.

    Args:
        registry: where to register (default: a new `CollectorRegistry`; tests make their own
            `Metrics()` so counts never leak between tests).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._limit = _Limiter()
        self.errors = Counter("ftl_errors_total", "Errors by registry kind, gate and "
                              "response-v2 category.", ["code", "gate", "category"],
                              registry=self.registry)
        self.gate_decisions = Counter("ftl_gate_decisions_total", "Gate steps by gate and outcome.",
                                      ["gate", "outcome"], registry=self.registry)
        self.gate_denials = Counter("ftl_gate_denials_total", "Gate refusals by gate and reason "
                                    "(the refusal's error kind).", ["gate", "reason"],
                                    registry=self.registry)
        self.retries = Counter("ftl_retries_total", "Retries and in-state recoveries by error kind "
                               "and outcome.", ["kind", "outcome"], registry=self.registry)
        self.tasks = Counter("ftl_tasks_total", "Finished task attempts by status.", ["status"],
                             registry=self.registry)
        self.agent_cost = Counter("ftl_agent_cost_usd", "Agent builder spend, USD.",
                                  registry=self.registry)
        self.agent_tokens = Counter("ftl_agent_tokens", "Agent builder tokens by usage kind.",
                                    ["kind"], registry=self.registry)

    def count_error(self, error_type: str, *, gate: str | None = None) -> None:
        """One error of registry kind ``error_type`` (unknown names count as ``internal_error``,
        as `ftl.errors.kind` fails closed); ``gate`` defaults to the row's gate."""
        row = kind(error_type)
        gate_label = gate if gate in GATE_ORDER else (row.gate or NONE)
        self.errors.labels(code=row.error_type, gate=gate_label, category=row.v2_error_type).inc()

    def count_gate(self, gate: str, outcome: str) -> None:
        """One step of ``gate`` (one of `ftl.errors.GATE_ORDER`) that ended in ``outcome``
        (``pass``, ``forward``, ``allow``, ``deny``, ``approved``, ...).

        Raises:
            ValueError: ``gate`` is not one of the four gates.
        """
        if gate not in GATE_ORDER:
            raise ValueError(f"unknown gate {gate!r}; expected one of {', '.join(GATE_ORDER)}")
        self.gate_decisions.labels(gate=gate, outcome=self._limit("outcome", outcome)).inc()

    def count_gate_denial(self, gate: str, reason: str) -> None:
        """One refusal by ``gate`` (one of `ftl.errors.GATE_ORDER`) of registry kind ``reason``
        (unknown kinds count as ``internal_error``, as `ftl.errors.kind` fails closed).

        Raises:
            ValueError: ``gate`` is not one of the four gates.
        """
        if gate not in GATE_ORDER:
            raise ValueError(f"unknown gate {gate!r}; expected one of {', '.join(GATE_ORDER)}")
        self.gate_denials.labels(gate=gate, reason=kind(reason).error_type).inc()

    def count_retry(self, error_type: str | None, outcome: str) -> None:
        """One retry or recovery attempt for ``error_type`` (None: ``none``) with ``outcome``."""
        if not error_type:
            label = NONE
        else:  # unknown names fail closed like ftl.errors.kind
            label = error_type if isinstance(error_type, str) and error_type in REGISTRY else "internal_error"
        self.retries.labels(kind=label, outcome=self._limit("retry_outcome", outcome)).inc()

    def count_task(self, status: str | None) -> None:
        """One finished task attempt with ``status`` (``complete``, ``blocked``, ``pending``...)."""
        self.tasks.labels(status=self._limit("status", status)).inc()

    def count_agent(self, cost_usd: Any, usage: Any) -> None:
        """One agent build's ``total_cost_usd`` (USD) and ``usage`` ``{kind: tokens}``;
        a cost counts only when it is a finite number > 0 (an infinite one would make the
        counter +Inf for good), tokens only when a positive int; other values are ignored."""
        if isinstance(cost_usd, (int, float)) and not isinstance(cost_usd, bool) \
                and math.isfinite(cost_usd) and cost_usd > 0:
            self.agent_cost.inc(cost_usd)
        for token_kind, count in (usage.items() if isinstance(usage, dict) else ()):
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                self.agent_tokens.labels(kind=self._limit("token_kind", token_kind)).inc(count)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every counter and its content type, for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def write_textfile(self, path: Path | str) -> Path:
        """Write the exposition to ``path`` atomically (temp file + rename; parent dirs created),
        the node-exporter textfile collector's format. Returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(target), self.registry)
        return target


class EventMetrics:
    """An `ftl.events.EventLog` listener that derives the counters from events.

    ``TOOL_FAILURE`` -> ``ftl_errors_total``; ``RETRY`` and ``RECOVERY_ATTEMPT`` ->
    ``ftl_retries_total``; ``TASK_END`` -> ``ftl_tasks_total``; ``GATE_DECISION`` ->
    ``ftl_gate_decisions_total`` (each ``gates`` step) and, for a refusal,
    ``ftl_gate_denials_total`` (``denied_by``, ``reason``). Other events are ignored.
    Chain another listener (a progress view) with ``then``; it runs after the counting, and
    a failing count never stops it.

    Args:
        metrics: where to count (default: the process-wide `METRICS`).
        then: a listener called with every event afterwards.
    """

    def __init__(self, metrics: Metrics | None = None,
                 then: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.metrics = metrics if metrics is not None else METRICS
        self.then = then

    def __call__(self, event: dict[str, Any]) -> None:
        try:
            self.count(event)
        finally:
            if self.then is not None:
                self.then(event)

    def count(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "TOOL_FAILURE":
            self.metrics.count_error(str(event.get("error_type") or "internal_error"))
        elif name == "RETRY":
            self.metrics.count_retry(event.get("error_type"), "retried")
        elif name == "RECOVERY_ATTEMPT":
            self.metrics.count_retry(event.get("error_type"),
                                     "recovered" if event.get("success") else "unrecovered")
        elif name == "TASK_END":
            self.metrics.count_task(event.get("status"))
            if "total_cost_usd" in event or "usage" in event:
                self.metrics.count_agent(event.get("total_cost_usd"), event.get("usage"))
        elif name == "GATE_DECISION":
            steps = event.get("gates") if isinstance(event.get("gates"), dict) else {}
            for gate, outcome in steps.items():
                if gate in GATE_ORDER:
                    self.metrics.count_gate(gate, str(outcome))
            if event.get("denied_by") in GATE_ORDER:
                self.metrics.count_gate_denial(event["denied_by"], str(event.get("reason")))


#: The process-wide counters (what `ftl serve --http` exposes and `--metrics-file` writes).
METRICS = Metrics()


def count_error(error_type: str, *, gate: str | None = None) -> None:
    """`Metrics.count_error` on `METRICS`."""
    METRICS.count_error(error_type, gate=gate)


def count_gate(gate: str, outcome: str) -> None:
    """`Metrics.count_gate` on `METRICS` (for ``ftl.gate``)."""
    METRICS.count_gate(gate, outcome)


def count_gate_denial(gate: str, reason: str) -> None:
    """`Metrics.count_gate_denial` on `METRICS` (for ``ftl.gate``)."""
    METRICS.count_gate_denial(gate, reason)


def render() -> tuple[bytes, str]:
    """`Metrics.render` of `METRICS`: ``(body, content type)``."""
    return METRICS.render()


def write_textfile(path: Path | str) -> Path:
    """`Metrics.write_textfile` of `METRICS`."""
    return METRICS.write_textfile(path)
