"""Limits shared by every agent builder of a run: one rate gate and one spend counter (issue 12).

A 429, an overloaded API or a plan's usage limit is a property of the account, not of the task
that met it. So when any builder meets one, `RateGate.close` holds every *new* agent start until
the limit lifts (its retry-after or reset time); agents already running go on. The builder that
met the limit retries once through the recovery protocol (its attempt is the transient retry),
and that retry, like every sibling's start, waits at `RateGate.wait` first. Siblings never fail
because of another task's limit.

`SpendLimit` adds up the agents' ``total_cost_usd``; once the campaign's ``max_cost_usd`` is
reached no new agent task starts (running ones finish).

The clock and the wait are injected (style.md: tests take milliseconds). Thread-safe: the
scheduler's workers share one `AgentLimits` (``Run.agent_limits``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

__all__ = ["RateGate", "SpendLimit", "AgentLimits", "DEFAULT_PAUSE_S", "DEFAULT_USAGE_PAUSE_S"]

#: How long the gate stays closed when a rate limit (a 429, an overloaded API) names no time (s).
DEFAULT_PAUSE_S = 60.0
#: The same for a plan's usage limit: such windows last hours, and every start before the
#: reset meets the limit again and uses up its task's one retry (s).
DEFAULT_USAGE_PAUSE_S = 1800.0
_WAIT_SLICE_S = 1.0  # re-check the gate at least this often while waiting (it may be extended)

Emit = Callable[..., Any]


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class RateGate:
    """Open, or closed until a moment; every agent start waits while it is closed.

    Args:
        clock: the current time (aware UTC datetime).
        wait: ``wait(cancel, seconds)`` blocks up to ``seconds`` or until ``cancel`` is set;
            default ``cancel.wait``.
    """

    def __init__(self, clock: Callable[[], datetime] = _utc_now,
                 wait: Callable[[threading.Event, float], Any] | None = None) -> None:
        self._clock = clock
        self._wait = wait or (lambda cancel, seconds: cancel.wait(seconds))
        self._lock = threading.Lock()
        self._reopens_at: datetime | None = None

    @property
    def reopens_at(self) -> datetime | None:
        """When the gate opens (UTC), or None when it is open."""
        with self._lock:
            return self._reopens_at

    def close(self, reopens_at: datetime | None, *, emit: Emit, state: str | None = None,
              task_seq: str | None = None, limit_kind: str | None = None,
              reason: str | None = None) -> datetime:
        """Close the gate until ``reopens_at`` (None: `DEFAULT_PAUSE_S` from now, or
        `DEFAULT_USAGE_PAUSE_S` for ``limit_kind="usage_limit"``); a gate already closed until
        later stays so. Emits ``RATE_GATE`` closed=True when the gate closes or its reopening
        moves later, under the gate's lock, so the log's order of closes is the gate's.

        Returns:
            the moment the gate now opens (UTC).
        """
        now = self._clock()
        pause_s = DEFAULT_USAGE_PAUSE_S if limit_kind == "usage_limit" else DEFAULT_PAUSE_S
        until = reopens_at or now + timedelta(seconds=pause_s)
        with self._lock:
            if self._reopens_at is not None and self._reopens_at >= until:
                return self._reopens_at
            self._reopens_at = until
            emit("RATE_GATE", state=state, closed=True, reopens_at=_iso(until), task_seq=task_seq,
                 limit_kind=limit_kind, reason=(reason or "")[:300] or None)
        return until

    def wait(self, cancel: threading.Event, *, emit: Emit, state: str | None = None,
             then: Callable[[], Any] | None = None) -> int:
        """Block while the gate is closed; the first waiter to see it open again emits
        ``RATE_GATE`` closed=False. Returns early when ``cancel`` is set.

        Args:
            then: called once the gate is open, under the gate's lock (so no `close` can come
                between the check and it): the agent start's announcement (``TOOL_CALL``), so
                the log never shows a start after a close that did not wait for the opening.
                Not called when ``cancel`` ended the wait.

        Returns:
            the time waited, ms (0 when the gate was open).
        """
        started = time.monotonic()
        while not cancel.is_set():
            with self._lock:
                until = self._reopens_at
                if until is not None and (until - self._clock()).total_seconds() <= 0:
                    self._reopens_at = until = None
                    emit("RATE_GATE", state=state, closed=False, reopens_at=None)
                if until is None:
                    if then is not None:
                        then()
                    break
                left_s = (until - self._clock()).total_seconds()
            self._wait(cancel, min(max(left_s, 0.0), _WAIT_SLICE_S))
        return int((time.monotonic() - started) * 1000)


class SpendLimit:
    """The agents' spend of a run, in USD, against an optional limit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total_usd = 0.0
        self._seeded = False

    def seed_once(self, earlier_usd: Callable[[], float]) -> None:
        """Add what earlier runs of the campaign spent (a resume), once per run: ``earlier_usd``
        is called under the lock, at the first agent start, before this run has spent anything
        on builds."""
        with self._lock:
            if not self._seeded:
                self._seeded = True
                self._total_usd += max(0.0, float(earlier_usd()))

    def add(self, cost_usd: float | None) -> float:
        """Add one agent run's ``total_cost_usd``; returns the new total (USD)."""
        with self._lock:
            if isinstance(cost_usd, (int, float)) and cost_usd > 0:
                self._total_usd += float(cost_usd)
            return self._total_usd

    @property
    def total_usd(self) -> float:
        with self._lock:
            return self._total_usd

    def reached(self, limit_usd: float | None) -> bool:
        """True when a limit is set and the spend is at or over it."""
        return limit_usd is not None and self.total_usd >= limit_usd


@dataclass
class AgentLimits:
    """What all agent builders of one run share: the rate gate and the spend."""

    gate: RateGate = field(default_factory=RateGate)
    spend: SpendLimit = field(default_factory=SpendLimit)
