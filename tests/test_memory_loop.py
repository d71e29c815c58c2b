"""Memory across campaigns, end to end and in parts: a failure OBSERVE records in one campaign is
injected into the next campaign's builder workspace on the same repository, and the builder's
``utilized`` feedback moves that entry's importance (FTL's learning loop). Plus the memory
room's rules: quality gate, merge, bm25 relevance, feedback, prune, relationships."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.config import Config
from ftl.memory import MemoryStore, scoring
from ftl.engine.runner import Runner
from ftl.store import Store

AGENT = '''
import json, sys
from pathlib import Path
ws = json.loads(sys.stdin.read())
for path in ws["delta"]:
    Path(path).write_text("# built\\n")
seen = [{"name": f["name"], "type": "failure"} for f in ws["prior_knowledge"].get("failures", [])]
print(json.dumps({"status": "complete", "delivered": "wrote " + ", ".join(ws["delta"]), "utilized": seen}))
'''


def _repo(path: Path) -> Path:
    path.mkdir()
    (path / ".gitignore").write_text(".ftl/\nwidget.py\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=path, check=True)
    return path


def test_a_second_campaign_receives_the_first_ones_failure_and_its_feedback_counts(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    config = Config(jobs=1, explorer_timeout_s=30, retry_backoff_min_s=0.01,
                    agent_command=[sys.executable, str(agent)])
    first = Runner(repo, config).start("build the widget", plan_input={
        "objective": "build the widget", "tasks": [
            {"seq": "001", "slug": "widget", "run": "true", "verify": "exit 3", "budget": 2},
            # OBSERVE is skipped when one root cause blocks everything: let one task succeed.
            {"seq": "002", "slug": "readme", "run": "true", "verify": "true"}]})
    assert first.exit_code == 3, first.summary  # finished with the task blocked
    with Store.for_repo(repo) as store:
        failures = MemoryStore(store).entries("failure")
        assert len(failures) == 1 and failures[0]["cost"] == 2000
        name, before = failures[0]["name"], failures[0]["importance"]
        assert before > 0 and failures[0]["times_helped"] == 0

    second = Runner(repo, config).start("build the widget again", plan_input={
        "objective": "build the widget again", "tasks": [
            {"seq": "001", "slug": "widget", "delta": ["widget.py"], "verify": "test -f widget.py",
             "builder": "agent"}]})
    assert second.exit_code == 0, second.summary
    with Store.for_repo(repo) as store:
        campaign = store.latest_campaign()
        workspace = store.workspaces(campaign["campaign_id"])[0]
        injected = workspace["spec"]["prior_knowledge"]["failures"]
        assert [f["name"] for f in injected] == [name]
        assert injected[0]["trigger"] == failures[0]["trigger"]
        entry = MemoryStore(store).get(name)
        assert entry["times_helped"] == 1 and entry["times_failed"] == 0
        assert entry["importance"] != before
        assert entry["importance"] == pytest.approx(
            scoring.feedback_importance(2000, 1, 0, entry["access_count"]))


# --------------------------------------------------------------------------- the memory room


@pytest.fixture
def memory(tmp_path: Path):
    moment = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    with Store(tmp_path / "ftl.db", clock=lambda: moment[0]) as store:
        yield MemoryStore(store), moment


def failure(name: str, trigger: str, cost: int = 1000, **extra) -> dict:
    return {"name": name, "type": "failure", "trigger": trigger, "fix": f"fix for {name}", "cost": cost, **extra}


def test_quality_gate_and_merge_follow_ftl(memory) -> None:
    mem, _ = memory
    assert mem.add(failure("short", "too short")) == "rejected:trigger_too_short:9"
    assert mem.add(failure("cheap", "a long enough trigger", cost=50)) == "rejected:cost_too_low:50"
    assert mem.add(failure("generic", "  Exception  ")) == "rejected:trigger_too_short:13"
    assert mem.add(failure("net", "ConnectionError: host unreachable", source=["001-a"])) == "added"
    assert mem.add(failure("net2", "ConnectionError: host unreachable!", cost=4000, source=["002-b"])) == "merged:net"
    entry = mem.get("net")
    assert entry["source"] == ["001-a", "002-b"] and entry["cost"] == 4000 and entry["occurrences"] == 2
    pattern = {"name": "p", "type": "pattern", "trigger": "retry the HTTP call", "insight": "use tenacity with backoff"}
    assert mem.add(pattern) == "added" and mem.add({**pattern, "name": "q"}) == "duplicate:p"


def test_relevance_ranks_by_bm25_and_feedback_moves_importance(memory) -> None:
    mem, _ = memory
    mem.add(failure("jwt", "JWT token expired during the login test", cost=2000))
    mem.add(failure("css", "grid layout broke on small screens", cost=8000))
    found = mem.context(objective="login token refresh", max_failures=5, track_access=False)
    assert [f["name"] for f in found["failures"]] == ["jwt"]  # css is more costly but irrelevant
    assert found["failures"][0]["_relevance"] == pytest.approx(2 / 3, abs=1e-3)
    before = mem.get("jwt")["importance"]
    assert mem.feedback_batch([{"name": "jwt", "type": "failure"}],
                              [{"name": "jwt", "type": "failure"}, {"name": "css", "type": "failure"}],
                              once_key="c/001-a/1") == {"helped": 1, "not_helped": 1}
    assert mem.feedback_batch([{"name": "jwt", "type": "failure"}], [{"name": "jwt", "type": "failure"}],
                              once_key="c/001-a/1") == {"helped": 0, "not_helped": 0}
    assert mem.get("jwt")["importance"] > before > 0
    assert mem.get("css")["times_failed"] == 1
    by_value = mem.context(max_failures=1, track_access=True)["failures"]
    assert [f["name"] for f in by_value] == ["css"] and mem.get("css")["access_count"] == 1


def test_prune_drops_decayed_entries_and_their_edges(memory) -> None:
    mem, moment = memory
    mem.add(failure("old", "an old failure nobody saw again", cost=200))
    moment[0] += timedelta(days=300)
    mem.add(failure("new", "a recent failure worth keeping", cost=200))
    assert mem.add_relationship("old", "new", rel_type="causes") == "added"
    assert mem.related("new")[0]["via"] == "caused_by"
    result = mem.prune()
    assert result == {"pruned_failures": 1, "pruned_patterns": 0, "remaining_failures": 1,
                      "remaining_patterns": 0, "orphaned_edges_removed": 2}
    assert mem.get("old") is None and mem.related("new") == []


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=120))
def test_any_objective_text_is_a_safe_fts_query(text: str) -> None:
    expression = scoring.fts_query(text)
    assert expression is None or all(part.startswith('"') and part.endswith('"')
                                     for part in expression.split(" OR "))


def test_any_objective_text_ranks_without_error(memory) -> None:
    mem, _ = memory
    mem.add(failure("q", "quoted \"text\" AND OR NOT near(1) * ^ - :", cost=500))
    for text in ['"', "AND", "a OR", "near(", "*", "名前 の エラー", "x" * 500, ""]:
        mem.context(objective=text or None, track_access=False)
        mem.query(text)
