"""Cascade analysis: blocked roots, what they make unreachable, impact and recommendations."""

from __future__ import annotations

import pytest

from ftl.errors import FtlError
from ftl.server.tools.cascade import (CascadeArgs, analyze_tasks, cascade_analysis, looks_transient,
                                      task_durations)

from .conftest import attempt, make_campaign


def row(seq, status="pending", depends=(), reason=None, budget=5, started=None, finished=None,
        timeout_s=None):
    return {"seq": seq, "slug": f"t{seq}", "status": status, "depends": list(depends),
            "block_reason": reason, "started_at": started, "finished_at": finished,
            "spec": {"budget": budget, "timeout_s": timeout_s}}


def test_store_campaign_with_a_structural_and_a_transient_root(tmp_path, ctx_for):
    store, cid = make_campaign(tmp_path, [
        {"seq": 1, "slug": "schema"},
        {"seq": 2, "slug": "api", "depends": 1},
        {"seq": 3, "slug": "ui", "depends": 2},
        {"seq": 4, "slug": "fetch"},
        {"seq": 5, "slug": "cache", "depends": 4},
        {"seq": 6, "slug": "docs"},
    ])
    attempt(store, cid, "001", "blocked", reason="verify_failed: Task 001's verify command failed (exit 1).")
    attempt(store, cid, "004", "blocked", reason="rate_limited: Too many requests.")
    attempt(store, cid, "006", "complete", delivered="docs")
    store.close()

    result = cascade_analysis(CascadeArgs(campaign_id=cid), ctx_for(tmp_path))
    assert result["state"] == "stuck" and result["unreachable_count"] == 3
    schema, fetch = result["roots"]
    assert (schema["seq"], schema["unreachable"], schema["transient"], schema["recommendation"]) == (
        "001", ["002", "003"], False, "replan")
    assert (fetch["seq"], fetch["unreachable"], fetch["transient"], fetch["recommendation"]) == (
        "004", ["005"], True, "retry")
    assert schema["reason"].startswith("verify_failed")
    assert schema["impact"]["tasks_lost"] == 3 and schema["impact"]["on_critical_path"] is True
    assert result["recommendation"] == "replan"
    assert result["critical_path"]["path"] == ["001", "002", "003"]
    assert "006" not in result["estimated_durations"]


def test_propagated_blocks_are_not_roots_and_are_listed_as_already_blocked():
    tasks = [row("001", "blocked", reason="verify_failed: boom"),
             row("002", "blocked", ["001"], reason="unreachable: blocked by 001"),
             row("003", "pending", ["002"])]
    result = analyze_tasks(tasks)
    [root] = result["roots"]
    assert root["seq"] == "001" and root["already_blocked"] == ["002"] and root["unreachable"] == ["003"]
    assert root["recommendation"] == "propagate" and result["recommendation"] == "propagate"


def test_threshold_decides_between_replan_and_propagate():
    tasks = [row("001", "blocked", reason="task_failed: exit 2"), row("002", depends=["001"]),
             row("003", depends=["001"])]
    assert analyze_tasks(tasks, replan_threshold=2)["recommendation"] == "replan"
    assert analyze_tasks(tasks, replan_threshold=3)["recommendation"] == "propagate"


def test_only_transient_roots_recommend_retry_even_with_many_unreachable():
    tasks = [row("001", "blocked", reason="Connection refused while installing deps"),
             row("002", depends=["001"]), row("003", depends=["002"]), row("004", depends=["002"])]
    result = analyze_tasks(tasks)
    assert result["roots"][0]["recommendation"] == "retry" and result["recommendation"] == "retry"


def test_no_blocked_task_means_no_roots():
    result = analyze_tasks([row("001", "complete"), row("002", depends=["001"])])
    assert (result["state"], result["roots"], result["recommendation"]) == ("in_progress", [], "none")


@pytest.mark.parametrize("reason, transient", [
    ("timeout: build did not finish within 60 s.", True),
    ("rate_limited: Too many requests.", True),
    ("lock_contention: A resource was locked by another process.", True),
    ("sqlite3.OperationalError: database is locked", True),
    ("Network unreachable; temporarily unavailable", True),
    ("verify_failed: Task 1's verify command failed (exit 1).\ntest_timeout_handling FAILED", False),
    ("budget_exhausted: Task 001 used up its budget.", False),
    ("approval_timeout: No approval for shell_builder arrived in time (approval gate).", False),
    ("task_failed: Task 001's builder failed (exit 7).", False),
    ("task_failed: pip said: connection reset by peer", True),
    ("delta insufficient - requires b.py", False),
    ("blocked by 001", False),
    (None, False),
])
def test_looks_transient(reason, transient):
    assert looks_transient(reason) is transient


def test_durations_recorded_for_complete_tasks_else_estimated():
    tasks = [row("001", "complete", started="2026-01-01T00:00:00.000Z", finished="2026-01-01T00:01:30.000Z"),
             row("002", "blocked", started="2026-01-01T00:00:00.000Z", finished="2026-01-01T00:00:05.000Z"),
             row("003", budget=7), row("004", timeout_s=42.0)]
    durations, estimated = task_durations(tasks, seconds_per_budget=10)
    assert durations == {"001": 90.0, "002": 50.0, "003": 70.0, "004": 42.0}
    assert estimated == ["002", "003", "004"]


def test_unknown_campaign_and_missing_store(tmp_path, ctx_for):
    with pytest.raises(FtlError) as missing:
        cascade_analysis(CascadeArgs(campaign_id="c-x"), ctx_for(tmp_path))
    assert missing.value.error_type == "not_found" and not (tmp_path / ".ftl").exists()
    make_campaign(tmp_path, [{"seq": 1, "slug": "a"}])[0].close()
    with pytest.raises(FtlError) as unknown:
        cascade_analysis(CascadeArgs(campaign_id="c-nope"), ctx_for(tmp_path))
    assert unknown.value.error_type == "not_found"


# --- issue 15 item 5: the recommendation knows what the runner can do

def stuck_two_behind(reason="verify_failed: boom", attempts=1):
    root = row("001", "blocked", reason=reason)
    root["attempts"] = attempts
    return [root, row("002", depends=["001"]), row("003", depends=["001"])]


def test_no_planner_means_propagate_not_replan():
    result = analyze_tasks(stuck_two_behind(), planner_available=False)
    assert result["recommendation"] == "propagate"
    assert result["roots"][0]["recommendation"] == "propagate"
    assert result["planner_available"] is False


def test_a_planner_without_replans_left_is_stuck():
    assert analyze_tasks(stuck_two_behind(), replans_left=1)["recommendation"] == "replan"
    result = analyze_tasks(stuck_two_behind(), replans_left=0)
    assert result["recommendation"] == "stuck"
    assert result["roots"][0]["recommendation"] == "propagate"


def test_a_transient_root_is_retried_once_then_treated_as_structural():
    first = analyze_tasks(stuck_two_behind("network_error: A network call failed.", attempts=1))
    assert first["recommendation"] == "retry"
    assert first["roots"][0]["retryable"] is True and first["roots"][0]["transient"] is True
    again = analyze_tasks(stuck_two_behind("network_error: A network call failed.", attempts=2),
                          planner_available=False)
    assert again["roots"][0]["transient"] is True and again["roots"][0]["retryable"] is False
    assert again["recommendation"] == "propagate"
