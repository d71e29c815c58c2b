"""Observer: failure and success patterns extracted from a real store, written to memory once."""

from __future__ import annotations

import pytest

from ftl.errors import FtlError
from ftl.memory import MemoryStore
from ftl.server.tools.observer import (ObserveArgs, extract_failures, failure_name, observer,
                                       score_pattern)

from .conftest import attempt, make_campaign

VERIFY_FAIL = "verify_failed: Task 003's verify command failed (exit 1).\nE   AssertionError: 41 != 42"


@pytest.fixture
def observed(tmp_path):
    store, cid = make_campaign(tmp_path, [
        {"seq": 1, "slug": "spec"},                                          # clean, one file: 2
        {"seq": 2, "slug": "impl", "delta": ["a.py", "b.py"], "depends": 1},  # clean, multi: 3
        {"seq": 3, "slug": "fix", "depends": 1},                             # blocked, then fixed
        {"seq": 4, "slug": "net"},                                           # blocked root
        {"seq": 5, "slug": "after-net", "depends": 4},                       # propagated block
        {"seq": 6, "slug": "gone"},                                          # blocked, cancelled
    ])
    attempt(store, cid, "001", "complete", delivered="wrote the spec")
    attempt(store, cid, "002", "complete", delivered="implemented a and b")
    attempt(store, cid, "003", "blocked", reason=VERIFY_FAIL)
    attempt(store, cid, "003", "complete", delivered="off-by-one fixed in fix.py\nmore detail")
    attempt(store, cid, "004", "blocked", reason="timeout: build did not finish within 60 s.")
    store.transition_task(cid, "005", "blocked", blocked_by=["004"], reason="unreachable: blocked by 004")
    attempt(store, cid, "006", "blocked", reason="cancelled: The operation was cancelled.")
    yield store, cid
    store.close()


def test_observer_extracts_failures_and_patterns(tmp_path, ctx_for, observed):
    store, cid = observed
    result = observer(ObserveArgs(campaign_id=cid), ctx_for(tmp_path))
    assert result["workspaces"] == {"complete": 3, "blocked": 3}
    failures = {f["name"]: f for f in result["failures_extracted"]}
    assert set(failures) == {"fix--verify-failed-assertionerror",
                             "net--timeout-build-did-not-finish-within"}
    assert all(f["result"] == "added" for f in failures.values())
    patterns = {p["name"]: p for p in result["patterns_extracted"]}
    assert patterns == {
        "impl--clean": {"name": "impl--clean", "score": 3, "result": "added",
                        "breakdown": {"clean_first_try": 2, "multi_file": 1}},
        "fix--fixed-after-block": {"name": "fix--fixed-after-block", "score": 3, "result": "added",
                                   "breakdown": {"blocked_then_fixed": 3}}}

    memory = {m["name"]: m for m in MemoryStore(store).entries(limit=100)}
    fixed = memory["fix--verify-failed-assertionerror"]
    assert fixed["trigger"] == "AssertionError: 41 != 42"  # the output's error, not the headline
    assert fixed["fix"] == "off-by-one fixed in fix.py"
    assert fixed["source"] == [f"{cid}/003-fix/1"] and fixed["campaign_id"] == cid
    assert memory["net--timeout-build-did-not-finish-within"]["fix"] == ""
    insight = memory["fix--fixed-after-block"]["insight"]
    assert insight.startswith("off-by-one fixed in fix.py (after: verify_failed")
    assert memory["impl--clean"]["trigger"] == "impl: a.py, b.py"


def test_observer_twice_does_not_count_the_same_attempts_again(tmp_path, ctx_for, observed):
    store, cid = observed
    observer(ObserveArgs(campaign_id=cid), ctx_for(tmp_path))
    again = observer(ObserveArgs(campaign_id=cid), ctx_for(tmp_path))
    assert {f["result"] for f in again["failures_extracted"] + again["patterns_extracted"]} == {"unchanged"}
    assert {m["occurrences"] for m in MemoryStore(store).entries(limit=100)} == {1}


def test_same_failure_in_another_campaign_merges(tmp_path, ctx_for, observed):
    store, cid = observed
    observer(ObserveArgs(campaign_id=cid), ctx_for(tmp_path))
    store.finish_campaign(cid, "complete", {})
    store2, cid2 = make_campaign(tmp_path, [{"seq": 1, "slug": "net"}])
    attempt(store2, cid2, "001", "blocked", reason="timeout: build did not finish within 120 s.")
    result = observer(ObserveArgs(campaign_id=cid2), ctx_for(tmp_path))
    assert result["failures_extracted"] == [{"name": "net--timeout-build-did-not-finish-within",
                                             "trigger": "timeout: build did not finish within 120 s.",
                                             "result": "merged:net--timeout-build-did-not-finish-within"}]
    entry = next(m for m in MemoryStore(store2).entries("failure") if m["name"].startswith("net--"))
    assert entry["occurrences"] == 2 and entry["source"] == [f"{cid}/004-net/1", f"{cid2}/001-net/1"]
    store2.close()


def test_observer_errors_for_unknown_campaign_or_missing_store(tmp_path, ctx_for, observed):
    with pytest.raises(FtlError) as unknown:
        observer(ObserveArgs(campaign_id="c-nope"), ctx_for(tmp_path))
    assert unknown.value.error_type == "not_found"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FtlError):
        observer(ObserveArgs(campaign_id="c-x"), ctx_for(empty))
    assert not (empty / ".ftl").exists()


def test_failure_name_normalises_numbers_and_punctuation():
    assert failure_name("add-login", "timeout: step 3 took 61.5 s") == "add-login--timeout-step-took"
    assert failure_name("add-login", "\n\n") == "add-login--blocked"


def test_task_blocked_before_any_workspace_still_counts():
    tasks = [{"seq": "001", "slug": "a", "status": "blocked", "blocked_by": [],
              "block_reason": "workspace_invalid: delta file missing"}]
    [entry] = extract_failures(tasks, [], "c-1")
    assert entry["name"] == "a--workspace-invalid-delta-file-missing" and entry["source"] == ["c-1/001-a"]


def test_score_pattern_rules():
    one_file = {"spec": {"delta": ["a.py"]}, "attempts": 1}
    assert score_pattern(one_file, [{"status": "complete"}]) == (2, {"clean_first_try": 2})
    retried = {"spec": {"delta": ["a.py"], "creates": ["b.py"]}, "attempts": 2}
    assert score_pattern(retried, [{"status": "blocked"}, {"status": "complete"}]) == (
        4, {"blocked_then_fixed": 3, "multi_file": 1})
    # A second attempt with no blocked workspace (e.g. a resume after a crash) is not "clean".
    assert score_pattern({"spec": {"delta": ["a.py"]}, "attempts": 2}, []) == (0, {})


def test_a_failure_trigger_from_command_output_carries_no_secret_and_no_absolute_path() -> None:
    from ftl.server.tools.observer import failure_trigger

    reason = ("verify_failed: Task 003's verify command failed (exit 1).\n"
              "E   requests.exceptions.HTTPError: 401 for url https://api.x.com/?api_key=ghp_"
              + "a" * 36 + "\n")
    trigger = failure_trigger(reason)
    assert trigger.startswith("requests.exceptions.HTTPError: 401") and "ghp_" + "a" * 36 not in trigger
    path = failure_trigger("task_failed: run failed\nFileNotFoundError: '/home/alice/work/data.csv'\n")
    assert path.startswith("FileNotFoundError") and "/home/alice" not in path
