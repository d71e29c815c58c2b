"""EXPLORE's aggregation: a result that breaks its schema is explored once more
(``RECOVERY_ATTEMPT`` retry_aggregation), then the campaign goes to ERROR as
``aggregation_failed`` (issue 15 item 2). Provoked through real explorer results of ftl's
embedded server, altered on their way back to the runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from ftl.config import Config
from ftl.events import read_events
from ftl.postmortem.replay import replay
from ftl.engine.runner import Runner, connect_in_process
from ftl.states.explore import aggregate, check_result
from ftl.errors import FtlError

PLAN = {"objective": "write a marker", "tasks": [
    {"seq": "001", "slug": "marker", "delta": [], "creates": ["marker.txt"],
     "run": "echo done > marker.txt", "verify": "test -s marker.txt", "budget": 1}]}


class AlteringClient:
    """The real in-process MangleCP client; ``alter`` rewrites explorer results it returns.

    ``alter(tool, result, call_number) -> result`` sees every explorer result (``call_number``
    counts that tool's invocations from 1).
    """

    def __init__(self, inner: Any, alter: Callable[[str, dict, int], Any]) -> None:
        self.inner, self.alter = inner, alter
        self.names: dict[str, str] = {}
        self.calls: dict[str, int] = {}

    def evaluate(self, intent, facts, **kwargs):
        response = self.inner.evaluate(intent, facts, **kwargs)
        for tool in response.macro_tools:
            self.names[tool.macro_id] = tool.name
        return response

    def invoke(self, macro_id, args, **kwargs):
        response = self.inner.invoke(macro_id, args, **kwargs)
        name = self.names.get(macro_id, "")
        if name.startswith("explore_"):
            self.calls[name] = self.calls.get(name, 0) + 1
            response.result = self.alter(name, dict(response.result), self.calls[name])
        return response

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close:
            close()


def run_with(tmp_path: Path, alter: Callable[[str, dict, int], Any]) -> tuple[Any, AlteringClient]:
    holder: dict[str, AlteringClient] = {}

    def factory(config: Config, repo: Path) -> AlteringClient:
        holder["client"] = AlteringClient(connect_in_process(config, repo), alter)
        return holder["client"]

    config = Config(jobs=1, explorer_timeout_s=30, retry_backoff_min_s=0.01)
    result = Runner(tmp_path, config, client_factory=factory).start("write a marker", plan_input=PLAN)
    return result, holder["client"]


def without_directories(tool: str, result: dict, number: int) -> dict:
    if tool == "explore_structure":
        result.pop("directories", None)
    return result


def test_a_result_that_keeps_breaking_its_schema_is_aggregation_failed(tmp_path: Path) -> None:
    result, client = run_with(tmp_path, without_directories)
    assert result.exit_code == 4
    assert result.summary["error"]["error_type"] == "aggregation_failed"
    assert result.summary["route"] == "summary"
    assert client.calls["explore_structure"] == 2  # the first run and the one retry
    assert all(client.calls[name] == 1 for name in client.calls if name != "explore_structure")
    events = list(read_events(result.log_path))
    failures = [(e["tool"], e["error_type"]) for e in events if e["event"] == "TOOL_FAILURE"]
    assert failures == [("aggregate_exploration", "aggregation_failed"),
                        ("state:explore", "aggregation_failed")]
    [recovery] = [e for e in events if e["event"] == "RECOVERY_ATTEMPT"
                  and e["strategy"] == "retry_aggregation"]
    assert recovery["success"] is False and recovery["modes"] == ["structure"]
    assert [e["route"] for e in events if e["event"] == "ERROR_ROUTE"] == ["summary"]
    assert not any(e["event"] == "STATE_ENTRY" and e["state"] == "PLAN" for e in events)
    assert replay([result.log_path]).violations == []


def test_a_result_fixed_by_the_retry_lets_the_campaign_go_on(tmp_path: Path) -> None:
    def once(tool: str, result: dict, number: int) -> dict:
        if tool == "explore_delta" and number == 1:
            result["mode"] = "structure"  # would overwrite structure's section in the merge
        return result

    result, client = run_with(tmp_path, once)
    assert result.exit_code == 0, result.summary
    assert client.calls["explore_delta"] == 2
    events = list(read_events(result.log_path))
    [recovery] = [e for e in events if e["event"] == "RECOVERY_ATTEMPT"
                  and e["strategy"] == "retry_aggregation"]
    assert recovery["success"] is True and recovery["modes"] == ["delta"]
    assert (tmp_path / "marker.txt").read_text() == "done\n"
    assert replay([result.log_path]).violations == []


@pytest.mark.parametrize("mode,result,path", [
    ("structure", {"mode": "structure", "status": "ok"}, "$.directories"),
    ("delta", {"mode": "delta", "status": "partial", "candidates": "a.py"}, "$.candidates"),
    ("pattern", {"mode": "pattern", "status": "fine"}, "$.status"),
    ("memory", {"status": "ok"}, "$.mode"),
    ("memory", {"mode": "delta", "status": "ok", "candidates": []}, "$.mode"),
    ("pattern", ["not", "an", "object"], "$"),
])
def test_check_result_names_what_breaks_the_schema(mode: str, result: Any, path: str) -> None:
    problems = check_result(mode, result)
    assert problems and problems[0]["path"] == path and problems[0]["mode"] == mode
    with pytest.raises(FtlError) as info:
        aggregate({mode: result}, "o")
    assert info.value.error_type == "aggregation_failed"
    assert info.value.details["modes"] == [mode]


def test_error_results_and_complete_results_aggregate() -> None:
    results = {"structure": {"mode": "structure", "status": "ok", "directories": {"src": True}},
               "memory": {"mode": "memory", "status": "error", "error": "no store"}}
    assert all(check_result(mode, r) == [] for mode, r in results.items())
    exploration = aggregate(results, "o")
    assert exploration["_meta"]["modes_completed"] == ["structure"]
    assert exploration["delta"]["status"] == "error"
