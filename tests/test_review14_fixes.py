"""Fixes from review 14 of the state machine, error routing and the campaign tools.

Each test drives the real code (the embedded MangleCP server in process, a real store, real
shell commands) and fails without its fix; the failure a stand-in client injects is the one a
real server sends (an ``FtlError`` the MangleCP client maps from an error envelope).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftl.config import Config
from ftl.errors import FtlError
from ftl.events import read_events
from ftl.postmortem.replay import replay
from ftl.engine.runner import Runner, connect_in_process


class FailingEvaluations:
    """The in-process MangleCP client, except that evaluations of ``intent`` raise the given
    errors first (one per evaluation, in order), as a server that is not ready would, and
    invocations of the ``hanging`` macro-tools wait for their cancel (a tool past its deadline)."""

    def __init__(self, inner: Any, intent: str | None, errors: list[FtlError],
                 hanging: frozenset[str] = frozenset()) -> None:
        self.inner, self.intent, self.errors, self.hanging = inner, intent, list(errors), hanging
        self.names: dict[str, str] = {}

    def evaluate(self, intent: str, facts: Any, **kwargs: Any) -> Any:
        if intent == self.intent and self.errors:
            raise self.errors.pop(0)
        response = self.inner.evaluate(intent, facts, **kwargs)
        for tool in response.macro_tools or []:
            self.names[tool.macro_id] = tool.name
        return response

    def invoke(self, macro_id: str, args: dict[str, Any], **kwargs: Any) -> Any:
        if self.names.get(macro_id) in self.hanging:
            kwargs["cancel"].wait(30)
            raise FtlError("cancelled", {"what": self.names[macro_id]})
        return self.inner.invoke(macro_id, args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _plan(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"objective": "review drill", "tasks": list(tasks)}


def _task(seq: str, run: str = "true", **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "slug": f"task-{seq}", "creates": [f"out/{seq}"], "run": run,
            "verify": "true", "budget": 1, **extra}


def _runner(repo: Path, intent: str | None = None, errors: list[FtlError] | None = None,
            waits: list[float] | None = None, hanging: frozenset[str] = frozenset(),
            **config: Any) -> Runner:
    settings = {"jobs": 1, "explorer_timeout_s": 30, "retry_backoff_min_s": 0.01, **config}

    def factory(cfg: Config, path: Path) -> Any:
        return FailingEvaluations(connect_in_process(cfg, path), intent, errors or [], hanging)

    return Runner(repo, Config(**settings), client_factory=factory,
                  sleep=None if waits is None else waits.append)


def _events(result: Any) -> list[dict[str, Any]]:
    events = list(read_events(result.log_path))
    assert replay([result.log_path]).violations == []
    return events


# --- item 1: the tool selection of EXPLORE and PLAN is retried; an empty timeout does not plan

def test_explorer_selection_not_ready_is_retried_after_its_retry_after(tmp_path: Path) -> None:
    waits: list[float] = []
    not_ready = FtlError("server_not_ready", {"status": "starting"}, retry_after_ms=1500)
    with _runner(tmp_path, "explore_codebase", [not_ready], waits) as runner:
        result = runner.start("review drill", plan_input=_plan(_task("001")))
    events = _events(result)
    assert result.exit_code == 0
    classified = [e for e in events if e["event"] == "FAILURE_CLASSIFIED"]
    assert [(e["tool"], e["error_type"], e["decision"]) for e in classified] == [
        ("select:explore_codebase", "server_not_ready", "retry")]
    assert [e["wait_ms"] for e in events if e["event"] == "RETRY"] == [1500]
    assert waits == [1.5]  # the server's retry-after, not the 10 ms backoff
    assert not any(e["event"] == "STATE_ENTRY" and e["state"] == "ERROR" for e in events)


def test_plan_selection_timeout_is_retried(tmp_path: Path) -> None:
    timeout = FtlError("timeout", {"what": "evaluation", "timeout_s": 5})
    with _runner(tmp_path, "plan_campaign", [timeout], []) as runner:
        result = runner.start("review drill", plan_input=_plan(_task("001")))
    events = _events(result)
    assert result.exit_code == 0
    assert [(e["state"], e["tool"], e["decision"]) for e in events
            if e["event"] == "FAILURE_CLASSIFIED"] == [("PLAN", "select:plan_campaign", "retry")]


def test_exploration_timeout_with_nothing_explored_returns_instead_of_planning(tmp_path: Path) -> None:
    timeouts = [FtlError("timeout", {"what": "evaluation", "timeout_s": 5}) for _ in range(2)]
    with _runner(tmp_path, "explore_codebase", timeouts, []) as runner:
        result = runner.start("review drill", plan_input=_plan(_task("001")))
    events = _events(result)
    assert result.exit_code == 4
    assert [e["decision"] for e in events if e["event"] == "FAILURE_CLASSIFIED"] == [
        "retry", "escalate"]
    assert [(e["error_type"], e["route"]) for e in events if e["event"] == "ERROR_ROUTE"] == [
        ("timeout", "summary")]
    assert not any(e["event"] == "STATE_ENTRY" and e["state"] == "PLAN" for e in events)
    assert not any(e["event"] == "TASK_START" for e in events)


# --- item 8: a resumed ERROR keeps the state it came from

def test_resumed_error_remembers_its_origin(tmp_path: Path, monkeypatch) -> None:
    """A timeout from CASCADE (its analysis could not be selected) is interrupted in ERROR and
    resumed: it still returns the summary instead of re-planning the registered campaign."""
    from ftl.engine.machine import State
    from ftl.states import HANDLERS

    real_error = HANDLERS[State.ERROR]

    def interrupted(run: Any) -> Any:
        raise KeyboardInterrupt  # Ctrl-C as ERROR starts: the machine is saved in ERROR

    timeouts = [FtlError("timeout", {"what": "evaluation", "timeout_s": 5}) for _ in range(2)]
    plan = _plan(_task("001", "exit 1"), _task("002", depends="001"), _task("003", depends="001"))
    monkeypatch.setitem(HANDLERS, State.ERROR, interrupted)
    with _runner(tmp_path, "analyze_cascade", timeouts, []) as runner:
        first = runner.start("review drill", plan_input=plan)
    assert first.outcome == "cancelled"
    monkeypatch.setitem(HANDLERS, State.ERROR, real_error)
    with _runner(tmp_path) as runner:
        campaign = runner.store.get_campaign(first.campaign_id)
        assert campaign["machine_state"] == "ERROR"
        assert campaign["error"]["error_type"] == "timeout"
        assert campaign["error"]["origin"] == "CASCADE"
        result = runner.resume()
    events = _events(result)
    assert result.exit_code == 4
    assert [(e["error_type"], e["route"]) for e in events if e["event"] == "ERROR_ROUTE"] == [
        ("timeout", "summary")]
    resumed = events[max(i for i, e in enumerate(events) if e["event"] == "RESUME"):]
    assert not any(e["event"] == "STATE_ENTRY" and e["state"] == "PLAN" for e in resumed)


def test_resumed_exploration_timeout_still_plans_with_its_partial_data(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """Three explorers answer, the fourth outlives EXPLORE's deadline and the quorum is all
    four: ``timeout`` with partial data. Interrupted in ERROR and resumed, it still goes to
    PLAN (the stored origin is EXPLORE), and the campaign completes."""
    from ftl.engine.machine import State
    from ftl.states import HANDLERS

    real_error = HANDLERS[State.ERROR]

    def interrupted(run: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setitem(HANDLERS, State.ERROR, interrupted)
    with _runner(tmp_path, hanging=frozenset({"explore_delta"}), explorer_timeout_s=0.5,
                 explorer_quorum=4) as runner:
        first = runner.start("review drill", plan_input=_plan(_task("001")))
    assert first.outcome == "cancelled"
    monkeypatch.setitem(HANDLERS, State.ERROR, real_error)
    with _runner(tmp_path) as runner:
        campaign = runner.store.get_campaign(first.campaign_id)
        assert (campaign["machine_state"], campaign["error"]["error_type"],
                campaign["error"]["origin"]) == ("ERROR", "timeout", "EXPLORE")
        result = runner.resume()
    events = _events(result)
    assert result.exit_code == 0
    assert [(e["error_type"], e["route"]) for e in events if e["event"] == "ERROR_ROUTE"] == [
        ("timeout", "plan")]


# --- item 4 (CASCADE's side): a stale package lock file is not a root worth re-opening

def test_a_stale_lockfile_block_is_not_a_transient_root() -> None:
    from ftl.server.tools.cascade import looks_transient

    assert not looks_transient("error Your lockfile needs to be updated, but yarn was run with "
                               "`--frozen-lockfile`.")
    assert looks_transient("lock contention on .git/index.lock")


# --- item 3: CASCADE re-plans with Claude Code when planner = "claude"

STAND_IN = Path(__file__).resolve().parents[1] / "examples" / "claude-builder" / "stand_in_claude.py"


def test_cascade_replans_with_the_claude_planner(tmp_path: Path, monkeypatch) -> None:
    import json
    import sys

    monkeypatch.setenv("FTL_STAND_IN_LOG", str(tmp_path / "argv"))
    repo = tmp_path / "repo"
    repo.mkdir()
    plan = _plan(_task("001", "exit 1"), _task("002", depends="001"), _task("003", depends="001"))
    with _runner(repo, planner="claude", builder="claude",
                 claude={"command": [sys.executable, str(STAND_IN)]}) as runner:
        result = runner.start("review drill", plan_input=plan)
    events = _events(result)
    assert result.exit_code == 0  # the re-planned 001 (Claude builds it) and 002, 003 complete
    analysis = next(e for e in events if e["event"] == "CASCADE_ANALYSIS")
    assert analysis["recommendation"] == "replan"
    assert any(e["event"] == "CASCADE_REPLAN" for e in events)
    calls = [(e["state"], e["tool"], e["intent"]) for e in events if e["event"] == "TOOL_CALL"
             and e["tool"].endswith("_planner")]
    assert calls == [("CASCADE", "claude_planner", "replan_campaign")]
    # the re-plan's decision and cost are logged as PLAN's are (a resume seeds the spend from them)
    decision = next(e for e in events if e["event"] == "PLAN_DECISION" and e["state"] == "CASCADE")
    assert decision["decision"] == "PROCEED" and decision["tool"] == "claude_planner"
    assert decision["total_cost_usd"] > 0
    runs = [json.loads(line) for line in (tmp_path / "argv" / "argv.jsonl").read_text().splitlines()]
    assert [r["slug"] for r in runs] == ["planner", "planned"]


# --- item 2: OBSERVE keeps unrelated failures apart, each with its own error text

def test_observe_records_each_failure_with_its_own_error(tmp_path: Path) -> None:
    from ftl.memory import MemoryStore
    from ftl.store import Store

    plan = _plan(_task("001", verify="echo 'E   AssertionError: total 41 != 42'; exit 1"),
                 _task("002", verify="python3 -c 'import redis_missing_module'"),
                 _task("003", verify="echo 'curl: (22) The requested URL returned error: 404'; exit 1"))
    with _runner(tmp_path, flaky_verify_retries=0) as runner:
        result = runner.start("review drill", plan_input=plan)
    events = _events(result)
    assert result.exit_code == 3
    observation = next(e for e in events if e["event"] == "OBSERVATION")
    assert observation["skipped"] is False
    with Store.for_repo(tmp_path) as store:
        failures = {m["name"]: m for m in MemoryStore(store).entries("failure", limit=50)}
    assert {name: entry["trigger"] for name, entry in failures.items()} == {
        "task-001--verify-failed-assertionerror-total": "AssertionError: total 41 != 42",
        "task-002--dependency-missing-modulenotfounderror-no-module-named":
            "ModuleNotFoundError: No module named 'redis_missing_module'",
        "task-003--verify-failed-curl-the-requested-url":
            "curl: (22) The requested URL returned error: 404",
    }
    assert all(entry["occurrences"] == 1 for entry in failures.values())


def test_record_merges_only_the_same_name_and_type(tmp_path: Path) -> None:
    from ftl.memory import MemoryStore
    from ftl.store import Store

    with Store.for_repo(tmp_path) as store:
        memory = MemoryStore(store)
        memory.record({"name": "a--verify", "type": "failure", "source": ["s1"],
                       "trigger": "verify_failed: Task 001's verify command failed (exit 1)."})
        other = memory.record({"name": "b--verify", "type": "failure", "source": ["s2"],
                               "trigger": "verify_failed: Task 002's verify command failed (exit 1)."})
        again = memory.record({"name": "a--verify", "type": "failure", "source": ["s3"],
                               "trigger": "anything"})
    assert (other["name"], other["source"], other["occurrences"]) == ("b--verify", ["s2"], 1)
    assert (again["name"], again["source"], again["occurrences"]) == ("a--verify", ["s1", "s3"], 2)


# --- item 9: related() lists each entry once, never the start

def _linked_memory(tmp_path: Path, names: list[str], links: list[tuple[str, str, str]]):
    from ftl.memory import MemoryStore
    from ftl.store import Store

    store = Store.for_repo(tmp_path)
    memory = MemoryStore(store)
    for name in names:
        memory.record({"name": name, "type": "failure", "trigger": f"{name} broke", "fix": "x"})
    for source, target, rel_type in links:
        assert memory.add_relationship(source, target, "failure", rel_type) == "added"
    return store, memory


def test_related_lists_each_entry_once_with_its_heaviest_path(tmp_path: Path) -> None:
    store, memory = _linked_memory(tmp_path, ["alpha", "beta", "gamma"],
                                   [("alpha", "beta", "solves"), ("beta", "gamma", "causes")])
    with store:
        for hops in (2, 3):
            found = [(h["entry"]["name"], h["hops"], h["weight"], h["via"])
                     for h in memory.related("alpha", max_hops=hops)]
            assert found == [("beta", 1, 1.5, "solves"), ("gamma", 2, 1.5, "causes")]


def test_related_takes_the_heaviest_of_several_paths(tmp_path: Path) -> None:
    # alpha -co_occurs-> delta (0.8) and alpha -solves-> beta -solves-> delta (2.25)
    store, memory = _linked_memory(tmp_path, ["alpha", "beta", "delta", "omega"],
                                   [("alpha", "delta", "co_occurs"), ("alpha", "beta", "solves"),
                                    ("beta", "delta", "solves"), ("delta", "omega", "causes")])
    with store:
        found = {h["entry"]["name"]: (h["hops"], h["weight"], h["via"])
                 for h in memory.related("alpha", max_hops=2)}
        assert found == {"beta": (1, 1.5, "solves"), "delta": (2, 2.25, "solves"),
                         "omega": (2, 0.8, "causes")}  # via the one-hop delta: within 2 hops
        assert len(memory.related("alpha", max_hops=2)) == 3


def test_related_on_a_dense_memory_stays_small(tmp_path: Path) -> None:
    names = [f"f{i:02d}" for i in range(25)]
    links = [(a, b, "co_occurs") for i, a in enumerate(names) for b in names[i + 1:]]
    store, memory = _linked_memory(tmp_path, names, links)
    with store:
        found = memory.related("f00", max_hops=6, min_weight_product=0.0)
    assert sorted(h["entry"]["name"] for h in found) == names[1:]
    assert {(h["hops"], h["weight"]) for h in found} == {(1, 0.8)}


# --- items 5-7: the explorers on odd trees and READMEs

def _explore(tool: Any, repo: Path, objective: str = "") -> dict[str, Any]:
    from ftl.server.tools.context import ToolContext
    from ftl.server.tools.explorers import ExploreArgs

    return tool(ExploreArgs(objective=objective, timeout_s=30), ToolContext(repo=repo))


def test_pattern_explorer_survives_a_file_too_deep_to_parse(tmp_path: Path) -> None:
    from ftl.server.tools.explorers import explore_pattern

    (tmp_path / "generated.py").write_text("x = " + "1+" * 60_000 + "1\n")  # ~120 KB
    (tmp_path / "app.py").write_text('def run(n: int) -> int:\n    """Run."""\n    return n\n')
    result = _explore(explore_pattern, tmp_path)
    assert result["status"] == "ok" and result["python_files"] == 2
    assert result["style"]["type_hint_ratio"] == 1.0  # app.py counted, generated.py left out


def test_explorers_do_not_follow_links_out_of_the_repository(tmp_path: Path) -> None:
    from ftl.server.tools.explorers import explore_delta, explore_pattern, explore_structure

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "creds.py").write_text("def load_secret_token():\n    return 'hunter2'\n")
    (outside / "requirements.txt").write_text("django\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "token_store.py").write_text("def save_token():\n    pass\n")
    (repo / "creds.py").symlink_to(outside / "creds.py")
    (repo / "requirements.txt").symlink_to(outside / "requirements.txt")
    (repo / "inner.py").symlink_to(repo / "token_store.py")  # a link inside is the repo's own
    delta = _explore(explore_delta, repo, "secret token")
    paths = {c["path"]: c for c in delta["candidates"]}
    assert "creds.py" not in paths and "inner.py" in paths
    assert all(f["name"] != "load_secret_token" for c in delta["candidates"] for f in c["functions"])
    structure = _explore(explore_structure, repo)
    assert structure["file_count"] == 2  # token_store.py, inner.py
    assert structure["config_files"] == []
    pattern = _explore(explore_pattern, repo)
    assert pattern["framework"] is None  # the linked requirements.txt is not read


def test_config_files_are_read_capped_and_only_when_regular(tmp_path: Path) -> None:
    import os

    from ftl.server.tools.explorers import READ_LIMIT_BYTES, declared_packages, explore_pattern

    (tmp_path / "requirements.txt").write_text("flask\n" + "#" * READ_LIMIT_BYTES)  # too big
    os.mkfifo(tmp_path / "requirements-dev.txt")  # reading it would wait for a writer forever
    (tmp_path / "setup.cfg").symlink_to("/dev/zero")  # would read until memory runs out
    (tmp_path / "requirements-test.txt").write_text("pytest\n")
    assert declared_packages(tmp_path) == {"pytest"}
    assert _explore(explore_pattern, tmp_path)["status"] == "ok"


def test_prose_in_the_idioms_section_does_not_switch_to_forbidden() -> None:
    from ftl.server.tools.explorers import parse_readme_idioms

    text = ("# App\n\n## Framework Idioms\n\nBuilders must always follow these; never skip them.\n\n"
            "- Views return FT components\n- Routes use @rt\n\n**Avoid:**\n\n- Raw HTML strings\n"
            "\nSome closing words that never mention a list.\n- Jinja templates\n")
    found = parse_readme_idioms(text)
    assert found["required"] == ["Views return FT components", "Routes use @rt"]
    assert found["forbidden"] == ["Raw HTML strings", "Jinja templates"]


# --- item 10: the live view draws on its own refresh, at most max_rows tasks

def test_rich_progress_builds_no_table_per_event_and_caps_its_rows() -> None:
    import io

    from rich.console import Console

    from ftl.telemetry.progress import RichProgress

    out = io.StringIO()
    view = RichProgress(Console(file=out, width=100, force_terminal=False), max_rows=5)
    drawn: list[int] = []
    render = view._render
    view._render = lambda: drawn.append(1) or render()  # what Live's refresh would call
    seqs = [f"{n:04d}" for n in range(1, 5001)]
    view({"event": "PLAN_REGISTERED", "seqs": seqs})
    for seq in seqs[:3000]:
        view({"event": "TASK_START", "task_seq": seq, "worker": "w1", "attempt": 1})
        view({"event": "TASK_END", "task_seq": seq, "status": "complete"})
    view({"event": "TASK_START", "task_seq": "4000", "worker": "w2", "attempt": 1})
    view({"event": "TASK_END", "task_seq": "0007", "status": "blocked"})
    assert drawn == []  # 6,000 events, no table built: drawing is Live's, not the emitters'
    Console(file=out, width=100, force_terminal=False).print(view._render())
    text = out.getvalue()
    shown = [line.split("│")[1].strip() for line in text.splitlines()
             if line.count("│") >= 4 and line.split("│")[1].strip().isdigit()]
    assert shown == ["4000", "0007", "3000", "2999", "2998"]  # running, then latest to end
    assert ("4995 more task(s) not shown (1 running, 1999 pending, 2999 complete, 1 blocked)"
            in " ".join(text.split()))
    assert view.counts == {"complete": 2999, "blocked": 1, "pending": 1999, "running": 1}


def test_a_go_ahead_with_a_malformed_plan_tells_the_next_round_why(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".ftl/\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "i"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    fake = Path(__file__).resolve().parent / "tools" / "fake_agent.py"
    config = Config(explorer_timeout_s=30, max_clarifications=1,
                    planner_command=[sys.executable, str(fake), "plan-malformed"])
    result = Runner(repo, config, client_factory=connect_in_process).start("write a.py")
    assert result.exit_code == 4
    events = list(read_events(result.log_path))
    invalid = [e for e in events if e["event"] == "PLAN_VALIDATION_FAILED"]
    assert invalid and any("tasks" in v["path"] for v in invalid[0]["errors"])
    exhausted = next(e for e in events if e["event"] == "TOOL_FAILURE" and e["error_type"] == "clarify_exhausted")
    assert any(q.startswith("The plan was invalid") for q in exhausted["details"]["questions"])
    assert replay([result.log_path]).violations == []


def test_related_finds_the_heaviest_simple_path_to_each_entry_on_random_memories(tmp_path: Path) -> None:
    """Against an exhaustive walk of every simple path (seeded random graphs, up to 4 hops): an
    earlier, heavier arrival must not hide a path that needed a node the earlier one used."""
    import random

    from ftl.memory import scoring

    types = sorted(scoring.RELATIONSHIP_WEIGHTS)
    for seed in range(25):
        rng = random.Random(seed)
        names = [f"n{i}" for i in range(6)]
        links = {(a, b, rng.choice(types)) for a in names for b in names if a != b and rng.random() < 0.3}
        store, memory = _linked_memory(tmp_path / str(seed), names, [])
        with store:
            for source, target, rel_type in sorted(links):
                memory.add_relationship(source, target, "failure", rel_type)
            ids = {name: row_id for row_id, name in store.memory_names("failure").items()}
            edges: dict[int, list[tuple[int, str]]] = {}
            for from_id, to_id, rel_type in store.memory_edges():
                edges.setdefault(from_id, []).append((to_id, rel_type))
            best: dict[int, tuple[float, int]] = {}

            def walk(node: int, weight: float, hops: int, path: frozenset) -> None:
                if hops >= 4:
                    return
                for target, rel_type in edges.get(node, []):
                    product = weight * scoring.RELATIONSHIP_WEIGHTS.get(rel_type, 0.8)
                    if target in path or product < scoring.MIN_WEIGHT_PRODUCT:
                        continue
                    if (product, -(hops + 1)) > best.get(target, (-1.0, 0)):
                        best[target] = (product, -(hops + 1))
                    walk(target, product, hops + 1, path | {target})

            walk(ids["n0"], 1.0, 0, frozenset({ids["n0"]}))
            found = {h["entry"]["name"]: (h["weight"], h["hops"]) for h in memory.related("n0", max_hops=4)}
            by_id = {row_id: name for name, row_id in ids.items()}
            assert found == {by_id[t]: (round(w, 3), -h) for t, (w, h) in best.items()}, seed
