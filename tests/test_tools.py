"""ToolClient: selections reused for identical evaluations while their macro-tools are valid."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ftl.config import Config
from ftl.errors import FtlError
from ftl.events import EventLog, read_events
from ftl.engine.tools import ToolClient, fact

WINDOW = {"not_before": "2026-01-01T00:00:00.000Z", "expires_at": "2026-01-01T00:15:00.000Z"}  # 900 s


class FakeClient:
    """Answers every evaluation with one tool per name in ``tools``; ids count evaluations."""

    def __init__(self, tools: tuple[str, ...] = ("run_verify",), validity: dict | None = WINDOW) -> None:
        self.tools, self.validity = tools, validity
        self.evaluated: list[tuple[str, list]] = []
        self.invoked: list[str] = []
        self.fail_next: str | None = None

    def evaluate(self, intent: str, facts: list, **kwargs: Any) -> dict:
        self.evaluated.append((intent, facts))
        number = len(self.evaluated)
        return {"macro_tools": [{"macro_id": f"m-{name}-{number}", "name": name,
                                 **({"validity": self.validity} if self.validity else {})}
                                for name in self.tools]}

    def invoke(self, macro_id: str, args: dict, **kwargs: Any) -> dict:
        self.invoked.append(macro_id)
        if self.fail_next:
            code, self.fail_next = self.fail_next, None
            raise FtlError("tool_not_exposed", {"manglecp_code": code})
        return {"result": {"macro_id": macro_id, **args}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return EventLog(tmp_path / "events.jsonl", "c-test")


FACTS = [fact("campaign_state", "execute"), fact("task", "001", "BUILD")]


def test_identical_evaluations_are_sent_once_while_valid(log: EventLog):
    client, clock = FakeClient(), Clock()
    tools = ToolClient(client, log, clock=clock)
    first = tools.call("verify_task", FACTS, "run_verify", {"n": 1}, seq="001")
    second = tools.call("verify_task", list(FACTS), "run_verify", {"n": 2}, seq="001")
    assert len(client.evaluated) == 1 and tools.evaluations == 1
    assert first["macro_id"] == second["macro_id"] == "m-run_verify-1"
    assert [e["macro_id"] for e in read_events(log.path) if e["event"] == "TOOL_CALL"] == ["m-run_verify-1"] * 2


def test_other_facts_or_intent_are_new_evaluations(log: EventLog):
    client = FakeClient()
    tools = ToolClient(client, log, clock=Clock())
    tools.call("verify_task", FACTS, "run_verify", {})
    tools.call("verify_task", FACTS[:1] + [fact("task", "002", "BUILD")], "run_verify", {})
    tools.call("build_task", FACTS, "run_verify", {})
    assert len(client.evaluated) == 3


def test_reuse_ends_before_the_validity_window(log: EventLog):
    client, clock = FakeClient(), Clock()
    tools = ToolClient(client, log, clock=clock)
    tools.select("verify_task", FACTS)
    clock.now += 900 * 0.9 - 1
    tools.select("verify_task", FACTS)
    assert len(client.evaluated) == 1
    clock.now += 2  # past 90% of the 900 s window
    tools.select("verify_task", FACTS)
    assert len(client.evaluated) == 2


def test_tools_without_a_validity_window_are_not_reused(log: EventLog):
    client = FakeClient(validity=None)
    tools = ToolClient(client, log, clock=Clock())
    tools.select("verify_task", FACTS)
    tools.select("verify_task", FACTS)
    assert len(client.evaluated) == 2


@pytest.mark.parametrize("code", ["macro_not_found", "macro_expired"])
def test_an_evicted_reused_tool_is_selected_again_once(log: EventLog, code: str):
    client = FakeClient()
    tools = ToolClient(client, log, clock=Clock())
    tools.call("verify_task", FACTS, "run_verify", {})
    client.fail_next = code
    result = tools.call("verify_task", FACTS, "run_verify", {})
    assert result["macro_id"] == "m-run_verify-2"
    assert client.invoked == ["m-run_verify-1", "m-run_verify-1", "m-run_verify-2"]


def test_a_fresh_tool_that_is_not_found_is_an_error(log: EventLog):
    client = FakeClient()
    tools = ToolClient(client, log, clock=Clock())
    client.fail_next = "macro_not_found"
    with pytest.raises(FtlError):
        tools.call("verify_task", FACTS, "run_verify", {})
    assert len(client.evaluated) == 1


def test_with_the_embedded_server_in_process(tmp_path: Path, log: EventLog):
    from ftl.server.app import connect

    client = connect(tmp_path, Config(), in_process=True)
    try:
        tools = ToolClient(client, log)
        facts = [fact("campaign_state", "execute"), fact("task", "001", "VERIFY")]
        for _ in range(3):
            result = tools.call("verify_task", facts, "run_verify", {"command": "true", "timeout_s": 30})
            assert result["passed"] is True
        assert tools.evaluations == 1
    finally:
        client.close()


def test_one_selection_serves_every_task_of_a_kind(tmp_path: Path, log: EventLog):
    """Task-free facts (task_kind, run_given, builder_kind): one evaluation per intent for any
    number of tasks, and each invocation's outcome facts still name its own task (issue 11)."""
    from ftl.server.app import connect

    client = connect(tmp_path, Config(), in_process=True)
    try:
        tools = ToolClient(client, log)
        facts = [fact("campaign_state", "execute"), fact("task_kind", "BUILD"), fact("run_given"),
                 fact("builder_kind", "shell")]
        assert sorted(tools.select("build_task", facts)) == ["shell_builder"]
        selected = tools.select("verify_task", facts)
        for seq in ("001", "002", "003"):
            tools.call("verify_task", facts, "run_verify", {"command": "true", "timeout_s": 30, "seq": seq})
        assert tools.evaluations == 2
        response = client.invoke(selected["run_verify"]["macro_id"],
                                 {"command": "false", "timeout_s": 30, "seq": "007"})
        asserted = [(item["pred"], item["args"]) for item in response.state_delta.assert_]
        assert asserted == [("verify_result", ["007", False])]
        assert response.next["suggested_intents"][0]["name"] == "build_task"
        assert [(f["pred"], f["args"]) for f in response.next["continuation_facts"]] == [
            ("task", ["007", "BUILD"])]
    finally:
        client.close()


def test_a_gate_decision_is_logged_when_the_allowed_tool_then_fails(tmp_path: Path, log: EventLog):
    from ftl.server.app import connect

    gates = {"governance": {"rules": [{"match": {"tool": "run_verify"}, "action": "forward"}]}}
    client = connect(tmp_path, Config(gates=gates), in_process=True)
    try:
        tools = ToolClient(client, log)
        facts = [fact("campaign_state", "execute"), fact("task", "001", "VERIFY")]
        with pytest.raises(FtlError) as failed:  # past the gates, refused by the tool itself
            tools.call("verify_task", facts, "run_verify",
                       {"command": "true", "timeout_s": 30, "workdir": "../elsewhere"}, seq="001")
        assert failed.value.error_type == "workspace_invalid"
        tools.call("verify_task", facts, "run_verify", {"command": "true", "timeout_s": 30}, seq="002")
    finally:
        client.close()
    decisions = [e for e in read_events(log.path) if e["event"] == "GATE_DECISION"]
    assert [(e["task_seq"], e["outcome"], e["gates"].get("governance")) for e in decisions] == [
        ("001", "forward", "forward"), ("002", "forward", "forward")]


class GatedClient(FakeClient):
    """Evaluations block until ``release`` is set; ``fail_first`` makes the first one raise."""

    def __init__(self, fail_first: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entered, self.release = threading.Event(), threading.Event()
        self.fail_first = fail_first

    def evaluate(self, intent: str, facts: list, **kwargs: Any) -> dict:
        first = not self.evaluated
        self.entered.set()
        assert self.release.wait(10)
        answer = super().evaluate(intent, facts, **kwargs)
        if first and self.fail_first:
            raise FtlError("network_error", {"what": "the evaluation"})
        return answer


def _concurrent_selects(tools: ToolClient, client: GatedClient, count: int) -> list[Any]:
    answers: list[Any] = [None] * count

    def ask(number: int) -> None:
        try:
            answers[number] = tools.select("verify_task", FACTS)
        except FtlError as error:
            answers[number] = error

    threads = [threading.Thread(target=ask, args=(number,)) for number in range(count)]
    threads[0].start()
    assert client.entered.wait(10)  # the first one is evaluating
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.05)  # the others reach the in-flight evaluation and wait on it
    client.release.set()
    for thread in threads:
        thread.join(10)
    return answers


@pytest.mark.parametrize("validity", [WINDOW, None])
def test_concurrent_identical_selections_share_one_evaluation(log: EventLog, validity: Any):
    client = GatedClient(validity=validity)
    tools = ToolClient(client, log, clock=Clock())
    answers = _concurrent_selects(tools, client, 3)
    assert len(client.evaluated) == 1 and tools.evaluations == 1
    assert all(answer == answers[0] and "run_verify" in answer for answer in answers)


def test_a_failed_shared_evaluation_lets_each_waiter_evaluate_on_its_own(log: EventLog):
    client = GatedClient(fail_first=True)
    tools = ToolClient(client, log, clock=Clock())
    answers = _concurrent_selects(tools, client, 3)
    assert isinstance(answers[0], FtlError) and answers[0].error_type == "network_error"
    assert all(isinstance(answer, dict) for answer in answers[1:])
    assert len(client.evaluated) == 2  # one waiter evaluated again; the other reused its answer
