"""Agent cost and the rate gate on ftl's surfaces: Prometheus counters, the live view, status."""

from __future__ import annotations

from ftl.telemetry.metrics import EventMetrics, Metrics
from ftl.telemetry.progress import describe
from ftl.engine.status import agent_spend


def test_task_end_cost_and_tokens_become_prometheus_counters() -> None:
    metrics = Metrics()
    count = EventMetrics(metrics)
    count({"event": "TASK_END", "status": "complete", "total_cost_usd": 0.25,
           "usage": {"input_tokens": 100, "output_tokens": 40, "cache_read_input_tokens": 0}})
    count({"event": "TASK_END", "status": "blocked", "total_cost_usd": 0.5,
           "usage": {"input_tokens": 7, "output_tokens": -3, "bogus": "x"}})
    count({"event": "TASK_END", "status": "complete"})  # a shell task: no agent cost
    text = metrics.render()[0].decode()
    assert "ftl_agent_cost_usd_total 0.75" in text
    assert 'ftl_agent_tokens_total{kind="input_tokens"} 107.0' in text
    assert 'ftl_agent_tokens_total{kind="output_tokens"} 40.0' in text
    assert "cache_read_input_tokens" not in text and 'ftl_tasks_total{status="complete"} 2.0' in text


def test_the_live_view_says_paused_until_and_resumed() -> None:
    closed = describe({"event": "RATE_GATE", "state": "EXECUTE", "closed": True,
                       "reopens_at": "2026-11-24T15:00:00Z", "limit_kind": "usage_limit",
                       "task_seq": "004"})
    assert closed.startswith("[EXECUTE] agents paused until ") and "task 004" in closed
    assert describe({"event": "RATE_GATE", "state": "EXECUTE", "closed": False}) == \
        "[EXECUTE] agents resumed: rate gate open"
    assert describe({"event": "TASK_END", "state": "EXECUTE", "task_seq": "1", "status": "complete",
                     "total_cost_usd": 0.0125}) == "[EXECUTE] task 1 complete $0.0125"


def test_status_sums_each_tasks_attempts_from_the_stored_build_results() -> None:
    rows = [{"seq": "001", "result": {"build": {"total_cost_usd": 0.1, "num_turns": 3},
                                      "verify": {}}},
            {"seq": "001", "result": {"error_type": "stalled", "build": {"total_cost_usd": 0.05,
                                                                          "num_turns": 2}}},
            {"seq": "002", "result": {"build": {"status": "complete"}}},  # a shell build
            {"seq": "003", "result": {"total_cost_usd": 0.2, "num_turns": 1}},  # built, not verified
            {"seq": "004", "result": None}]
    assert agent_spend(rows) == {"001": {"cost_usd": 0.15, "num_turns": 5},
                                 "003": {"cost_usd": 0.2, "num_turns": 1}}
