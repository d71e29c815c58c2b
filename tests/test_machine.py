"""Tests for ftl.engine.machine: every declared transition is reachable by firing triggers, illegal
moves raise invalid_state, ``fail`` reaches ERROR from every non-final state, and the diagram
and the tracked variables are derived from the one definition (design.md §4)."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import pytest

from ftl.errors import FtlError
from ftl.engine.machine import FINAL_STATES, TRANSITIONS, CampaignMachine, Flow, State, Tracked, mermaid

GUARDS = ("clarifications_left", "plan_accepted", "replan_merged", "replan_from_error_allowed")


class Model:
    """The smallest model the machine accepts: switchable guards and a recording callback."""

    def __init__(self, **guards: bool) -> None:
        self.guards = {name: guards.get(name, True) for name in GUARDS}
        self.seen: list[tuple[str, str, str, str]] = []
        self.fail_callback: BaseException | None = None

    def clarifications_left(self, _event: Any) -> bool:
        return self.guards["clarifications_left"]

    def plan_accepted(self, _event: Any) -> bool:
        return self.guards["plan_accepted"]

    def replan_merged(self, _event: Any) -> bool:
        return self.guards["replan_merged"]

    def replan_from_error_allowed(self, _event: Any) -> bool:
        return self.guards["replan_from_error_allowed"]

    def on_transition(self, event: Any) -> None:
        # machine_state is read here to prove the callback runs before the state changes.
        self.seen.append((self.machine_state, event.transition.source, event.transition.dest,
                          event.event.name))
        if self.fail_callback is not None:
            raise self.fail_callback


def _edges(flow: Flow, *, with_fail: bool) -> list[tuple[str, str, str]]:
    """(source, trigger, dest) for every row of the flow, one per source."""
    edges = []
    for row in TRANSITIONS[flow]:
        if row["trigger"] == "fail" and not with_fail:
            continue
        sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
        edges.extend((source, row["trigger"], row["dest"]) for source in sources)
    return edges


def _paths(flow: Flow) -> dict[str, list[str]]:
    """Shortest trigger path from INIT to each state reachable in ``flow`` (BFS on the table)."""
    paths: dict[str, list[str]] = {"INIT": []}
    queue = deque(["INIT"])
    edges = _edges(flow, with_fail=True)
    while queue:
        state = queue.popleft()
        for source, trigger, dest in edges:
            if source == state and dest not in paths:
                paths[dest] = paths[state] + [trigger]
                queue.append(dest)
    return paths


def _machine_at(flow: Flow, state: str) -> tuple[CampaignMachine, Model]:
    """A machine driven from INIT to ``state`` by firing real triggers."""
    model = Model()
    machine = CampaignMachine(model, flow)
    for trigger in _paths(flow)[state]:
        machine.fire(trigger)
    assert machine.state.value == state
    return machine, model


REACHABLE = {
    Flow.CAMPAIGN: {s.value for s in State} - {"BUILD"},
    Flow.TASK: {s.value for s in State} - {"REGISTER", "EXECUTE", "CASCADE"},
}
CASES = [(flow, source, trigger, dest) for flow in Flow
         for source, trigger, dest in _edges(flow, with_fail=False)]


def test_reachable_states_per_flow() -> None:
    for flow in Flow:
        assert set(_paths(flow)) == REACHABLE[flow]


@pytest.mark.parametrize("flow,source,trigger,dest", CASES,
                         ids=[f"{c[0].value}-{c[1]}-{c[2]}" for c in CASES])
def test_every_transition_is_reachable_by_firing(flow: Flow, source: str, trigger: str,
                                                 dest: str) -> None:
    machine, model = _machine_at(flow, source)
    assert machine.fire(trigger) is State(dest)
    assert model.seen[-1] == (source, source, dest, trigger)


@pytest.mark.parametrize("flow", list(Flow))
def test_the_happy_path_runs_init_to_complete(flow: Flow) -> None:
    middle = ["register", "execute", "cascade"] if flow is Flow.CAMPAIGN else ["build"]
    model = Model()
    machine = CampaignMachine(model, flow)
    for trigger in ["explore", "plan", "clarify", *middle, "observe", "complete"]:
        machine.fire(trigger)
    assert machine.state is State.COMPLETE
    assert machine.state in FINAL_STATES
    assert machine.allowed_triggers() == []


@pytest.mark.parametrize("flow", list(Flow))
@pytest.mark.parametrize("state", [s for s in State if s not in (State.COMPLETE, State.ERROR)])
def test_fail_works_from_every_non_final_state(flow: Flow, state: State) -> None:
    model = Model()
    machine = CampaignMachine(model, flow, initial=state)  # as on resume
    assert machine.state is state
    assert machine.fire("fail") is State.ERROR
    assert model.seen == [(state.value, state.value, "ERROR", "fail")]


@pytest.mark.parametrize("flow", list(Flow))
@pytest.mark.parametrize("state", [State.COMPLETE, State.ERROR])
def test_fail_is_refused_from_complete_and_error(flow: Flow, state: State) -> None:
    model = Model()
    machine = CampaignMachine(model, flow, initial=state)
    with pytest.raises(FtlError) as raised:
        machine.fire("fail")
    assert raised.value.error_type == "invalid_state"
    assert raised.value.details["trigger"] == "fail"
    assert raised.value.details["state"] == state.value
    assert machine.state is state and model.seen == []


@pytest.mark.parametrize("flow", list(Flow))
def test_fail_fires_from_every_reachable_non_final_state(flow: Flow) -> None:
    for state in sorted(REACHABLE[flow] - {"COMPLETE", "ERROR"}):
        machine, _model = _machine_at(flow, state)
        assert machine.fire("fail") is State.ERROR


@pytest.mark.parametrize("flow,state,trigger", [
    (Flow.CAMPAIGN, "INIT", "complete"),
    (Flow.CAMPAIGN, "INIT", "plan"),
    (Flow.CAMPAIGN, "EXPLORE", "register"),
    (Flow.CAMPAIGN, "EXECUTE", "observe"),
    (Flow.CAMPAIGN, "COMPLETE", "explore"),
    (Flow.CAMPAIGN, "PLAN", "build"),
    (Flow.CAMPAIGN, "PLAN", "no_such_trigger"),
    (Flow.TASK, "BUILD", "complete"),
    (Flow.TASK, "ERROR", "complete"),
])
def test_illegal_triggers_raise_invalid_state(flow: Flow, state: str, trigger: str) -> None:
    model = Model()
    machine = CampaignMachine(model, flow, initial=State(state))
    with pytest.raises(FtlError) as raised:
        machine.fire(trigger)
    error = raised.value
    assert error.error_type == "invalid_state" and not error.transient
    assert error.safe_details() == {"trigger": trigger, "state": state}
    assert error.message == f"Trigger {trigger} is not allowed in state {state}."
    assert machine.state.value == state and model.seen == []


@pytest.mark.parametrize("flow,state,trigger,guard", [
    (Flow.CAMPAIGN, "PLAN", "clarify", "clarifications_left"),
    (Flow.CAMPAIGN, "PLAN", "register", "plan_accepted"),
    (Flow.TASK, "PLAN", "build", "plan_accepted"),
    (Flow.CAMPAIGN, "CASCADE", "execute", "replan_merged"),
    (Flow.CAMPAIGN, "ERROR", "plan", "replan_from_error_allowed"),
    (Flow.TASK, "ERROR", "plan", "replan_from_error_allowed"),
])
def test_refused_guard_raises_invalid_state(flow: Flow, state: str, trigger: str, guard: str) -> None:
    model = Model(**{guard: False})
    machine = CampaignMachine(model, flow, initial=State(state))
    with pytest.raises(FtlError) as raised:
        machine.fire(trigger)
    assert raised.value.error_type == "invalid_state"
    assert raised.value.details["reason"] == "guard refused"
    assert machine.state.value == state and model.seen == []  # no event for a refused move
    model.guards[guard] = True
    machine.fire(trigger)  # the same trigger passes once the guard allows it


def test_task_flow_has_no_register_execute_or_cascade() -> None:
    triggers = {row["trigger"] for row in TRANSITIONS[Flow.TASK]}
    assert not triggers & {"register", "execute", "cascade"}
    assert "build" in triggers
    for trigger in ("register", "execute", "cascade"):
        model = Model()
        machine = CampaignMachine(model, Flow.TASK, initial=State.PLAN)
        with pytest.raises(FtlError):
            machine.fire(trigger)
        machine = CampaignMachine(Model(), Flow.TASK, initial=State.ERROR)
        with pytest.raises(FtlError):
            machine.fire(trigger)


def test_campaign_flow_has_no_build_trigger() -> None:
    assert "build" not in {row["trigger"] for row in TRANSITIONS[Flow.CAMPAIGN]}


def test_on_transition_runs_before_the_state_changes() -> None:
    model = Model()
    machine = CampaignMachine(model, Flow.CAMPAIGN)
    machine.fire("explore")
    machine.fire("plan")
    assert model.seen == [("INIT", "INIT", "EXPLORE", "explore"), ("EXPLORE", "EXPLORE", "PLAN", "plan")]


def test_a_failing_on_transition_leaves_the_state_unchanged() -> None:
    model = Model()
    machine = CampaignMachine(model, Flow.CAMPAIGN)
    model.fail_callback = RuntimeError("log disk full")
    with pytest.raises(RuntimeError, match="disk full"):
        machine.fire("explore")
    assert machine.state is State.INIT  # the event could not be written, so nothing moved
    model.fail_callback = None
    assert machine.fire("explore") is State.EXPLORE


def test_allowed_triggers() -> None:
    machine = CampaignMachine(Model(), Flow.CAMPAIGN)
    assert machine.allowed_triggers() == ["explore", "fail"]
    machine = CampaignMachine(Model(), Flow.CAMPAIGN, initial=State.ERROR)
    assert machine.allowed_triggers() == ["cascade", "observe", "plan"]
    machine = CampaignMachine(Model(), Flow.TASK, initial=State.ERROR)
    assert machine.allowed_triggers() == ["observe", "plan"]


@pytest.mark.parametrize("flow", list(Flow))
def test_mermaid_shows_every_state_and_edge_of_the_flow(flow: Flow) -> None:
    text = mermaid(flow)
    assert text.startswith("stateDiagram-v2\n") and text.endswith("\n")
    for state in REACHABLE[flow]:
        assert state in text
    for row in TRANSITIONS[flow]:
        if row["trigger"] == "fail":
            continue
        guard = f" [{row['conditions']}]" if row.get("conditions") else ""
        assert f"{row['source']} --> {row['dest']}: {row['trigger']}{guard}" in text
    assert "[*] --> INIT" in text and "COMPLETE --> [*]" in text
    assert "fail from any state but COMPLETE" in text


def test_mermaid_of_the_task_flow_omits_campaign_only_states() -> None:
    text = mermaid(Flow.TASK)
    for state in ("REGISTER", "EXECUTE", "CASCADE"):
        assert state not in text


def test_tracked_round_trips_through_json() -> None:
    tracked = Tracked(clarify_count=2, iteration_count=7, prior_ready_count=3,
                      prior_ready=["001", "004"], stuck_count=1, replan_count=1, error_count=2)
    again = Tracked.from_json(json.loads(json.dumps(tracked.to_json())))
    assert again == tracked
    assert again.prior_ready is not tracked.prior_ready


def test_tracked_ignores_unknown_keys_and_defaults_missing_ones() -> None:
    data = {"iteration_count": 4, "from_a_newer_version": True, "prior_ready": ["002"]}
    tracked = Tracked.from_json(data)
    assert tracked == Tracked(iteration_count=4, prior_ready=["002"])
    assert Tracked.from_json(None) == Tracked()
    assert Tracked.from_json({}) == Tracked()
    assert Tracked().prior_ready_count == -1


def test_tracked_defaults_are_not_shared() -> None:
    first, second = Tracked(), Tracked()
    first.prior_ready.append("001")
    assert second.prior_ready == []
