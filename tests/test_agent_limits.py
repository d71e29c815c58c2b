"""The agents' shared rate gate and spend limit, with an injected clock (no real waiting)."""

from __future__ import annotations

import threading
from pathlib import Path
from datetime import datetime, timedelta, timezone

import pytest

from ftl.executors.agent_limits import DEFAULT_PAUSE_S, DEFAULT_USAGE_PAUSE_S, RateGate, SpendLimit

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)


class FakeTime:
    def __init__(self) -> None:
        self.now = T0
        self.waits: list[float] = []

    def clock(self) -> datetime:
        return self.now

    def wait(self, cancel: threading.Event, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += timedelta(seconds=seconds)


def _gate() -> tuple[RateGate, FakeTime, list[dict]]:
    time = FakeTime()
    events: list[dict] = []
    return RateGate(clock=time.clock, wait=time.wait), time, events


def _emit(events: list[dict]):
    return lambda name, **fields: events.append({"event": name, **fields})


def test_an_open_gate_does_not_wait() -> None:
    gate, time, events = _gate()
    assert gate.wait(threading.Event(), emit=_emit(events)) >= 0
    assert time.waits == [] and events == [] and gate.reopens_at is None


def test_a_closed_gate_holds_every_start_until_it_reopens_and_says_so_once() -> None:
    gate, time, events = _gate()
    gate.close(T0 + timedelta(seconds=2.5), emit=_emit(events), task_seq="003",
               limit_kind="usage_limit", reason="usage limit")
    assert events == [{"event": "RATE_GATE", "state": None, "closed": True,
                       "reopens_at": "2026-11-24T12:00:02.500000Z", "task_seq": "003",
                       "limit_kind": "usage_limit", "reason": "usage limit"}]
    gate.wait(threading.Event(), emit=_emit(events))
    assert time.waits == [1.0, 1.0, 0.5] and time.now == T0 + timedelta(seconds=2.5)
    gate.wait(threading.Event(), emit=_emit(events))  # a second waiter: open, no second event
    assert [e["closed"] for e in events] == [True, False] and gate.reopens_at is None


def test_a_later_limit_extends_the_gate_an_earlier_one_does_not() -> None:
    gate, _, events = _gate()
    gate.close(T0 + timedelta(seconds=10), emit=_emit(events))
    assert gate.close(T0 + timedelta(seconds=5), emit=_emit(events)) == T0 + timedelta(seconds=10)
    gate.close(T0 + timedelta(seconds=30), emit=_emit(events))
    assert [e["reopens_at"] for e in events] == ["2026-11-24T12:00:10Z", "2026-11-24T12:00:30Z"]


def test_a_limit_without_a_time_pauses_for_the_default() -> None:
    gate, _, events = _gate()
    assert gate.close(None, emit=_emit(events)) == T0 + timedelta(seconds=DEFAULT_PAUSE_S)
    # A plan's usage limit lasts hours: a minute's pause would send every sibling into it.
    usage = gate.close(None, emit=_emit(events), limit_kind="usage_limit")
    assert usage == T0 + timedelta(seconds=DEFAULT_USAGE_PAUSE_S) and DEFAULT_USAGE_PAUSE_S >= 1800


def test_a_cancel_ends_the_wait() -> None:
    gate, time, events = _gate()
    gate.close(T0 + timedelta(hours=5), emit=_emit(events))
    cancel = threading.Event()
    cancel.set()
    gate.wait(cancel, emit=_emit(events))
    assert time.waits == [] and gate.reopens_at is not None


def test_spend_adds_up_and_reaches_the_limit() -> None:
    spend = SpendLimit()
    assert not spend.reached(None) and not spend.reached(0.5)
    spend.add(0.3)
    spend.add(None)
    spend.add(-1)
    assert spend.total_usd == 0.3 and not spend.reached(0.5)
    spend.add(0.2)
    assert spend.reached(0.5) and not spend.reached(None)


def test_a_resume_seeds_the_spend_of_earlier_runs_once() -> None:
    spend = SpendLimit()
    spend.seed_once(lambda: 0.75)
    spend.seed_once(lambda: 100.0)  # only the first counts
    spend.add(0.25)
    assert spend.total_usd == 1.0 and spend.reached(1.0)


def test_a_start_that_waited_at_the_gate_checks_the_spend_again_when_it_opens(tmp_path: Path) -> None:
    # Agents that ran while this start waited took the spend to the limit: it must not start.
    from types import SimpleNamespace

    from ftl.errors import FtlError
    from ftl.executors.agent_limits import AgentLimits
    from ftl.states.build import _ClaudeTries

    limits, events, invoked = AgentLimits(), [], []

    def call(intent, facts, tool, args, *, state, seq, cancel, admit):
        limits.spend.add(5.0)  # the siblings' cost, paid while this start waited
        announced: list[bool] = []
        admit(lambda: announced.append(True))
        if not announced:
            raise FtlError("cancelled", {"what": f"{tool} for task {seq}"})
        invoked.append(seq)
        return {"status": "complete"}

    run = SimpleNamespace(agent_limits=limits, config=SimpleNamespace(max_cost_usd=4.0),
                          store=SimpleNamespace(workspaces=lambda cid: []), campaign_id="c",
                          log=SimpleNamespace(emit=_emit(events), path=tmp_path / "none.jsonl"),
                          machine_state="EXECUTE", tools=SimpleNamespace(call=call))
    try:
        _ClaudeTries(run, "003", threading.Event()).build([], {"budget": 1}, [])
    except FtlError as error:
        assert error.error_type == "budget_exhausted" and "max_cost_usd" in error.message
    else:
        raise AssertionError("the start went ahead past the spend limit")
    assert invoked == []


def test_a_resume_counts_the_earlier_runs_planner_spend_against_the_limit(tmp_path: Path) -> None:
    # The first run's Claude planner cost 0.6 (no workspace row holds it); the limit is 0.5.
    from types import SimpleNamespace

    from ftl import events as ev
    from ftl.errors import FtlError
    from ftl.executors.agent_limits import AgentLimits
    from ftl.states.build import _ClaudeTries

    path = tmp_path / "c.jsonl"
    with ev.EventLog(path, "c") as log:
        log.emit("RUN_START")
        log.emit("PLAN_DECISION", decision="PROCEED", tool="claude_planner", total_cost_usd=0.6)
        log.emit("RUN_START")
    invoked: list[str] = []
    run = SimpleNamespace(agent_limits=AgentLimits(), config=SimpleNamespace(max_cost_usd=0.5),
                          store=SimpleNamespace(workspaces=lambda cid: []), campaign_id="c",
                          log=SimpleNamespace(emit=_emit([]), path=path), machine_state="EXECUTE",
                          tools=SimpleNamespace(call=lambda *a, **k: invoked.append("built")))
    with pytest.raises(FtlError) as refused:
        _ClaudeTries(run, "001", threading.Event()).build([], {"budget": 1}, [])
    assert refused.value.error_type == "budget_exhausted" and invoked == []
    assert run.agent_limits.spend.total_usd == pytest.approx(0.6)
