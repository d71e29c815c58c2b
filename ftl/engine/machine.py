"""The campaign state machine, declared once with `transitions`.

This module holds the states, the triggers, the guards' names and the tracked variables; the
behaviour of each state lives in ``states/<state>.py`` (installed as ``ftl.states``). The runner
fires one trigger at a time, after a state's handler has returned, so nothing is ever queued
behind an ERROR: a failure moves the machine to ERROR before anything else can move it (the
`transitions` pitfall with ``queued=True``, where an exception handler's trigger runs after the
events already queued). Illegal triggers raise `FtlError("invalid_state")`, never pass silently:
``ignore_invalid_triggers`` and ``auto_transitions`` are off.

Flows (FTL SKILL, with the gaps of the behaviour reference §2.5 closed):
    CAMPAIGN: INIT -> EXPLORE -> PLAN -> REGISTER -> EXECUTE -> CASCADE -> OBSERVE -> COMPLETE
    TASK:     INIT -> EXPLORE -> PLAN -> BUILD -> OBSERVE -> COMPLETE
    any non-final state -> ERROR; ERROR -> PLAN | CASCADE | OBSERVE per the error's route, or
    the run RETURNs from ERROR with a summary.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from transitions import Machine, MachineError

from ftl.errors import FtlError


class State(str, enum.Enum):
    INIT = "INIT"
    EXPLORE = "EXPLORE"
    PLAN = "PLAN"
    REGISTER = "REGISTER"
    EXECUTE = "EXECUTE"
    BUILD = "BUILD"
    CASCADE = "CASCADE"
    OBSERVE = "OBSERVE"
    COMPLETE = "COMPLETE"
    ERROR = "ERROR"


class Flow(str, enum.Enum):
    CAMPAIGN = "campaign"
    TASK = "task"


FINAL_STATES = frozenset({State.COMPLETE})

_COMMON: list[dict[str, Any]] = [
    {"trigger": "explore", "source": "INIT", "dest": "EXPLORE"},
    {"trigger": "plan", "source": "EXPLORE", "dest": "PLAN"},
    {"trigger": "clarify", "source": "PLAN", "dest": "PLAN", "conditions": "clarifications_left"},
    {"trigger": "plan", "source": "ERROR", "dest": "PLAN", "conditions": "replan_from_error_allowed"},
    {"trigger": "observe", "source": "ERROR", "dest": "OBSERVE"},
    {"trigger": "complete", "source": "OBSERVE", "dest": "COMPLETE"},
    {"trigger": "fail", "source": [s.value for s in State if s not in (State.COMPLETE, State.ERROR)],
     "dest": "ERROR"},
]

TRANSITIONS: dict[Flow, list[dict[str, Any]]] = {
    Flow.CAMPAIGN: _COMMON + [
        {"trigger": "register", "source": "PLAN", "dest": "REGISTER", "conditions": "plan_accepted"},
        {"trigger": "execute", "source": "REGISTER", "dest": "EXECUTE"},
        {"trigger": "cascade", "source": "EXECUTE", "dest": "CASCADE"},
        {"trigger": "execute", "source": "CASCADE", "dest": "EXECUTE", "conditions": "replan_merged"},
        {"trigger": "observe", "source": "CASCADE", "dest": "OBSERVE"},
        {"trigger": "cascade", "source": "ERROR", "dest": "CASCADE"},
    ],
    Flow.TASK: _COMMON + [
        {"trigger": "build", "source": "PLAN", "dest": "BUILD", "conditions": "plan_accepted"},
        {"trigger": "observe", "source": "BUILD", "dest": "OBSERVE"},
    ],
}


@dataclass
class Tracked:
    """Variables that persist across state re-entries and crashes (FTL TRACK; stored as JSON).

    Locals of a state live in the handler and reset on every entry (FTL GOTO semantics).
    """

    clarify_count: int = 0
    iteration_count: int = 0
    prior_ready_count: int = -1
    prior_ready: list[str] = field(default_factory=list)
    stuck_count: int = 0
    replan_count: int = 0
    error_count: int = 0
    # The error whose route went to OBSERVE ({error_type, message}): the run then ends in
    # COMPLETE, which must not call that a success (states/complete.py).
    observed_error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "Tracked":
        known = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


class CampaignMachine:
    """A `transitions.Machine` bound to a model that provides the guards.

    The model must define the guard methods named in `TRANSITIONS` (each takes the EventData
    and returns bool) and ``on_transition(event_data)``, which the machine calls before every
    transition (the runner writes PHASE_TRANSITION there: event before action).

    Args:
        model: the run context (guards + callbacks).
        flow: CAMPAIGN or TASK.
        initial: the state to start in (INIT, or the stored state on resume).
    """

    def __init__(self, model: Any, flow: Flow, initial: State = State.INIT) -> None:
        self.model = model
        self.flow = flow
        self.machine = Machine(
            model=model, states=[s.value for s in State], transitions=TRANSITIONS[flow],
            initial=initial.value, send_event=True, queued=False, auto_transitions=False,
            ignore_invalid_triggers=False, before_state_change="on_transition",
            model_attribute="machine_state")

    @property
    def state(self) -> State:
        return State(self.model.machine_state)

    def fire(self, trigger: str, **kwargs: Any) -> State:
        """Fire ``trigger``; return the new state.

        Raises:
            FtlError(invalid_state): the trigger does not exist in this flow or is not allowed
                from the current state, or its guard refused it.
        """
        current = self.state
        try:
            moved = self.model.trigger(trigger, **kwargs)
        except (MachineError, AttributeError) as exc:
            raise FtlError("invalid_state", {"trigger": trigger, "state": current.value,
                                             "reason": str(exc)}) from None
        if not moved:
            raise FtlError("invalid_state", {"trigger": trigger, "state": current.value,
                                             "reason": "guard refused"})
        return self.state

    def allowed_triggers(self) -> list[str]:
        return sorted(self.machine.get_triggers(self.state.value))


def mermaid(flow: Flow) -> str:
    """The state diagram of ``flow`` as Mermaid ``stateDiagram-v2`` text, from `TRANSITIONS`."""
    lines = ["stateDiagram-v2", "    [*] --> INIT"]
    for row in TRANSITIONS[flow]:
        sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
        guard = f" [{row['conditions']}]" if row.get("conditions") else ""
        if row["trigger"] == "fail":
            lines.append("    note right of ERROR: fail from any state but COMPLETE")
            continue
        for source in sources:
            lines.append(f"    {source} --> {row['dest']}: {row['trigger']}{guard}")
    lines.append("    COMPLETE --> [*]")
    lines.append("    ERROR --> [*]: return")
    return "\n".join(lines) + "\n"
