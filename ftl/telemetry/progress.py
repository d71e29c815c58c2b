"""Progress views fed by the event log: a live task table on a terminal, plain lines otherwise.

Both are listeners (`EventLog.subscribe`); they only read events, so a broken view can never
change what a campaign does.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

_PLAIN_EVENTS = {"STATE_ENTRY", "TASK_START", "TASK_END", "TOOL_FAILURE", "RETRY",
                 "RECOVERY_ATTEMPT", "CASCADE_STATUS", "CASCADE_PROPAGATE", "CASCADE_REPLAN",
                 "PARTIAL_FAILURE", "RETURN", "RUN_END", "ERROR_ROUTE", "LOG_REPAIRED",
                 "RUN_START", "TASK_INTEGRATED", "MERGE_CONFLICT", "ORPHANS_WAITING",
                 "RATE_GATE"}


def _clock(iso: Any) -> str:
    """``HH:MM`` (local time) of an RFC 3339 timestamp, or ``?``."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).astimezone().strftime("%H:%M")
    except ValueError:
        return "?"


def describe(event: dict[str, Any]) -> str | None:
    """One human line for an event, or None for events not worth a line."""
    name = event.get("event")
    if name not in _PLAIN_EVENTS:
        return None
    state = event.get("state") or "-"
    if name == "RUN_START":
        line = f"isolation: {event.get('isolation') or 'shared'}"
        return line + (f" (notice: {event['notice']})" if event.get("notice") else "")
    if name == "ORPHANS_WAITING":
        until = str(event.get("until") or "")[11:19]
        return (f"[{state}] waiting for {event.get('count')} command(s) the interrupted run left "
                f"running (until {until} UTC at the latest; --kill-leftovers stops them at once)")
    if name == "TASK_INTEGRATED":
        how = "fast-forward" if event.get("fast_forward") else "merge"
        return f"[{state}] task {event.get('task_seq')} integrated ({how}) at {str(event.get('head'))[:12]}"
    if name == "MERGE_CONFLICT":
        return (f"[{state}] task {event.get('task_seq')} conflicts with task(s) "
                f"{', '.join(event.get('other_seqs') or []) or '?'} in "
                f"{', '.join((event.get('paths') or [])[:3])}")
    if name == "RATE_GATE":
        if not event.get("closed"):
            return f"[{state}] agents resumed: rate gate open"
        return (f"[{state}] agents paused until {_clock(event.get('reopens_at'))}: "
                f"{event.get('limit_kind') or 'limit'} met by task {event.get('task_seq') or '?'}")
    if name == "STATE_ENTRY":
        extra = f" ({event['error_type']})" if event.get("error_type") else ""
        return f"[{state}] enter{extra}"
    if name == "TASK_START":
        return f"[{state}] task {event.get('task_seq')} started on {event.get('worker')} (attempt {event.get('attempt')})"
    if name == "TASK_END":
        extra = f" ({event['error_type']})" if event.get("error_type") else ""
        if isinstance(event.get("total_cost_usd"), (int, float)):
            extra += f" ${event['total_cost_usd']:.4f}"
        return f"[{state}] task {event.get('task_seq')} {event.get('status')}{extra}"
    if name == "TOOL_FAILURE":
        task = f" task {event['task_seq']}" if event.get("task_seq") else ""
        return f"[{state}] failure{task}: {event.get('tool')} {event.get('error_type')}"
    if name == "RETRY":
        return f"[{state}] retry {event.get('tool')} attempt {event.get('attempt')} in {event.get('wait_ms')} ms"
    if name == "RECOVERY_ATTEMPT":
        return f"[{state}] recovery {event.get('strategy')} success={event.get('success')}"
    if name == "CASCADE_STATUS":
        return f"[{state}] cascade {event.get('cascade_state')}, {len(event.get('unreachable') or [])} unreachable"
    if name == "CASCADE_PROPAGATE":
        return f"[{state}] propagate blocks to {len(event.get('propagated') or [])} task(s)"
    if name == "RUN_END":
        return f"run ended: {event.get('outcome')} (exit {event.get('exit_code')})"
    return f"[{state}] {name.lower()} " + ", ".join(
        f"{k}={v}" for k, v in event.items()
        if k not in ("ts", "seq", "campaign_id", "event", "state", "summary"))


class PlainProgress:
    """Writes one line per significant event to ``stream`` (stderr by default)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        line = describe(event)
        if line:
            with self._lock:
                print(line, file=self.stream, flush=True)


class RichProgress:
    """A live table of tasks (rich) with the current state and the last notable event.

    Events only update counters and a few rows under a lock (O(1) per event, whatever the
    number of tasks), so the scheduler's threads that emit them are never held up by drawing;
    the table is built by rich's `Live` on its own refresh (``get_renderable``,
    ``refresh_per_second`` times a second). It shows at most ``max_rows`` tasks (all of them,
    by seq, when there are that few; else the running ones, then the latest to end) and says
    how many are hidden and in which status.

    Args:
        console: where to draw (default: a stderr `rich.console.Console`).
        max_rows: tasks shown at most.
        refresh_per_second: redraws per second.
    """

    MAX_ROWS = 40
    _COLOURS = {"running": "yellow", "complete": "green", "blocked": "red", "cancelled": "magenta"}
    _COUNT_ORDER = ("running", "pending", "complete", "blocked", "cancelled")

    def __init__(self, console: Any = None, *, max_rows: int = MAX_ROWS,
                 refresh_per_second: float = 4) -> None:
        from collections import Counter, deque

        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.max_rows = max_rows
        self.tasks: dict[str, dict[str, Any]] = {}
        self.counts: Counter[str] = Counter()  # tasks by status
        self.running: set[str] = set()
        self.ended: deque[str] = deque(maxlen=max_rows)  # seqs, latest end last
        self.state = "-"
        self.last = ""
        self.paused_until: str | None = None  # "HH:MM" while the agents' rate gate is closed
        self._lock = threading.Lock()
        self.live = Live(console=self.console, refresh_per_second=refresh_per_second,
                         transient=False, get_renderable=self._render)

    def __enter__(self) -> "RichProgress":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def _set(self, seq: str, **fields: Any) -> None:
        """Update task ``seq``'s row, keeping the status counts (lock held)."""
        row = self.tasks.get(seq)
        if row is None:
            row = self.tasks[seq] = {"status": "pending"}
            self.counts["pending"] += 1
        before = row.get("status", "pending")
        row.update(fields)
        after = row.get("status", "pending")
        if after != before:
            self.counts[before] -= 1
            self.counts[after] += 1
        if after == "running":
            self.running.add(seq)
        else:
            self.running.discard(seq)
        if after in ("complete", "blocked", "cancelled") and after != before:
            if seq in self.ended:
                self.ended.remove(seq)
            self.ended.append(seq)

    def _rows(self) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """The rows to draw and how many tasks are hidden (lock held)."""
        if len(self.tasks) <= self.max_rows:
            return sorted(self.tasks.items(), key=lambda item: _seq_key(item[0])), 0
        chosen = sorted(self.running, key=_seq_key)[:self.max_rows]
        for seq in reversed(self.ended):
            if len(chosen) >= self.max_rows:
                break
            if seq not in chosen:
                chosen.append(seq)
        return [(seq, dict(self.tasks[seq])) for seq in chosen], len(self.tasks) - len(chosen)

    def _render(self) -> Any:
        from rich.table import Table

        with self._lock:
            rows, hidden = self._rows()
            order = {status: i for i, status in enumerate(self._COUNT_ORDER)}
            counts = {status: n for status, n in sorted(
                self.counts.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
                if n > 0}
            title = f"ftl — {self.state}" + (f" — paused until {self.paused_until}"
                                              if self.paused_until else "")
            last = self.last
        caption = last
        if hidden:
            summary = ", ".join(f"{n} {status}" for status, n in counts.items())
            caption = f"{hidden} more task(s) not shown ({summary})" + (f"\n{last}" if last else "")
        table = Table(title=title, caption=caption or None, expand=False)
        for column in ("task", "status", "worker", "attempt"):
            table.add_column(column)
        for seq, row in rows:
            status = row.get("status", "pending")
            table.add_row(seq, f"[{self._COLOURS.get(status, 'white')}]{status}[/]",
                          str(row.get("worker") or ""), str(row.get("attempt") or ""))
        return table

    def __call__(self, event: dict[str, Any]) -> None:
        line = describe(event)
        with self._lock:
            name = event.get("event")
            if name == "STATE_ENTRY":
                self.state = event.get("state") or "-"
            elif name == "PLAN_REGISTERED":
                for seq in event.get("seqs") or []:
                    if seq not in self.tasks:
                        self._set(seq)
            elif name == "TASK_START":
                self._set(event["task_seq"], status="running", worker=event.get("worker"),
                          attempt=event.get("attempt"))
            elif name == "TASK_END":
                self._set(event["task_seq"], status=event.get("status") or "ended")
            elif name == "RATE_GATE":
                self.paused_until = _clock(event.get("reopens_at")) if event.get("closed") else None
            elif name == "CASCADE_PROPAGATE":
                for item in event.get("propagated") or []:
                    self._set(item["seq"], status="blocked")
            if line and name not in ("STATE_ENTRY", "TASK_START", "TASK_END"):
                self.last = line


def _seq_key(seq: str) -> tuple[int, str]:
    """Order of task seqs: numeric ones by number, others after them by text."""
    return (int(seq), "") if seq.isdigit() else (1 << 62, seq)
