"""The executor interface the scheduler talks to: submit, wait for the next finished, cancel,
heartbeat, close.

An executor runs *task calls*: ``execute(seq, worker) -> TaskOutcome`` functions handed over by
the scheduler, which keeps the DAG, the ready set and the lanes. What a call does inside (run
commands here, or ship them to a cluster) is the executor's and the call's business; the
scheduler sees only finished outcomes, in finishing order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:  # the scheduler imports this module; no import back at run time
    from ftl.engine.scheduler import TaskOutcome

__all__ = ["Executor", "Finished", "Health", "Execute"]

Execute = Callable[[str, str], "TaskOutcome"]


@dataclass(frozen=True)
class Finished:
    """One task call that returned: its seq, the lane (worker name) it ran on, its outcome."""

    seq: str
    worker: str
    outcome: "TaskOutcome"


@dataclass(frozen=True)
class Health:
    """An executor's heartbeat.

    Attributes:
        kind: ``local`` or ``ray``.
        alive: False once the backend is unusable (a cluster that went away).
        nodes: the nodes that can run tasks: ``{"node": id (12 hex chars, or "driver"),
            "address": ip, "cpus": float}`` dicts.
        running: task calls handed in and not yet finished.
        detail: a one-line human description (address, versions).
    """

    kind: str
    alive: bool = True
    nodes: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0
    detail: str = ""


@runtime_checkable
class Executor(Protocol):
    """Runs task calls for the scheduler.

    Contract:
        * `start` is called once, before any `submit`, with the most calls that will ever run
          at once (``slots``) and the function every call runs.
        * `submit` never blocks on the call's work and never raises for it: whatever the call
          does, its `Finished` comes out of `next_finished` exactly once.
        * `close` returns only when every call ever submitted has finished (its `Finished` is
          queued); after it, `next_finished(0)` drains them.
        * `cancel` asks running calls to stop soon (the scheduler's cancel token does the
          same for calls that look at it); it never loses a `Finished`.
    """

    kind: str

    def start(self, slots: int, execute: Execute) -> None: ...

    def submit(self, seq: str, worker: str) -> None: ...

    def next_finished(self, timeout_s: float | None) -> Finished | None:
        """The next finished call, waiting up to ``timeout_s`` (s; None: no limit); None when
        none finished in that time."""
        ...

    def cancel(self) -> None: ...

    def heartbeat(self) -> Health: ...

    def close(self) -> None: ...
