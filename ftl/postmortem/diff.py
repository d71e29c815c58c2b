"""The decision diff: where two runs of the same plan first decided differently, lane by lane.

Reads both runs' logs with `ftl.postmortem.read.stream` (no checker: only the decisions matter)
and sorts their decisions by lane in a temporary `ftl.postmortem.spool.Spool`.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ftl import events as ev
from ftl.postmortem.read import stream
from ftl.postmortem.spool import Spool


# Fields that make up each event's decision; everything else (ts, seq, durations, workers, nodes, op
# ids, pids, macro ids, messages with paths) is ignored when two runs are compared.
DECISION_FIELDS: dict[str, tuple[str, ...]] = {
    ev.STATE_ENTRY: ("state", "error_type"),
    ev.PHASE_TRANSITION: ("from", "trigger", "to"),
    ev.TOOL_CALL: ("state", "intent", "tool"),
    ev.TOOL_FAILURE: ("state", "tool", "attempt", "error_type"),
    ev.FAILURE_CLASSIFIED: ("error_type", "klass", "decision"),
    ev.RETRY: ("tool", "attempt", "error_type"),
    ev.RECOVERY_ATTEMPT: ("strategy", "success", "error_type"),
    ev.READY_TASKS: ("seqs",),
    ev.TASK_START: (),
    ev.TASK_END: ("status", "error_type"),
    ev.EXPLORER_RESULT: ("mode", "status"),
    ev.PARTIAL_FAILURE: ("missing",),
    ev.PLAN_DECISION: ("decision", "tool"),
    ev.PLAN_VALIDATION_FAILED: (),
    ev.PLAN_REGISTERED: ("seqs",),
    ev.CASCADE_STATUS: ("cascade_state", "unreachable"),
    ev.CASCADE_ANALYSIS: ("recommendation", "roots"),
    ev.CASCADE_REPLAN: ("affected",),
    ev.CASCADE_MERGE_FAILED: ("error_type",),
    ev.CASCADE_PROPAGATE: ("propagated",),
    ev.OBSERVATION: ("skipped",),
    ev.ERROR_ROUTE: ("error_type", "route"),
    ev.RETURN: ("reason", "route"),
    ev.RUN_END: ("outcome", "exit_code"),
}


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision of a run: its lane, its event and the fields that define it."""

    lane: str
    event: str
    fields: tuple[tuple[str, str], ...]
    seq: int | None

    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (self.event, self.fields)

    def describe(self) -> str:
        body = ", ".join(f"{k}={v}" for k, v in self.fields)
        return f"{self.event}({body})"


def _lane(e: dict[str, Any]) -> str:
    """Which ordered lane a decision belongs to: parallel work (tasks, explorer modes) has its
    own lane, so a different interleaving of the same decisions is not a difference."""
    task = e.get("task_seq")
    if task is not None:
        return f"task {task}"
    tool = e.get("tool")
    if isinstance(tool, str) and tool.startswith("explore_"):
        return f"explorer {tool[len('explore_'):]}"
    if e.get("event") in (ev.EXPLORER_RESULT, ev.RECOVERY_ATTEMPT) and e.get("mode"):
        return f"explorer {e['mode']}"
    return "run"


def _field_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def decisions(paths: Iterable[Path]) -> Iterator[Decision]:
    """Stream the decisions of a story (`DECISION_FIELDS`); RUN_START, RESUME and a resumed
    run's re-entry of its state are not decisions and are skipped."""
    for e in stream(paths):
        name = e.get("event")
        wanted = DECISION_FIELDS.get(name) if isinstance(name, str) else None
        if wanted is None or (name == ev.STATE_ENTRY and e.get("resumed")):
            continue
        fields = tuple((k, _field_text(e.get(k))) for k in wanted)
        seq = e.get("seq") if isinstance(e.get("seq"), int) else None
        yield Decision(_lane(e), str(name), fields, seq)


@dataclass
class LaneDiff:
    """Where one lane's decisions first differ: ``index`` into the lane, each side's decision
    there (None when that side's lane ended), and a few decisions before it for context."""

    lane: str
    index: int
    a: Decision | None
    b: Decision | None
    context: list[Decision]

    def to_json(self) -> dict[str, Any]:
        def one(d: Decision | None) -> dict[str, Any] | None:
            return None if d is None else {"seq": d.seq, "event": d.event, "fields": dict(d.fields)}
        return {"lane": self.lane, "index": self.index, "a": one(self.a), "b": one(self.b),
                "context": [one(d) for d in self.context]}


@dataclass
class DecisionDiff:
    """Result of `diff_decisions`: per-lane first differences, run lane first."""

    a_count: int
    b_count: int
    lanes: list[LaneDiff]

    @property
    def same(self) -> bool:
        return not self.lanes

    def first(self) -> LaneDiff | None:
        """The difference that comes first in run A's log (by seq)."""
        def order(diff: LaneDiff) -> int:
            side = diff.a or diff.b
            return side.seq if side is not None and side.seq is not None else 1 << 62
        return min(self.lanes, key=order) if self.lanes else None

    def to_json(self) -> dict[str, Any]:
        first = self.first()
        return {"same": self.same, "decisions": {"a": self.a_count, "b": self.b_count},
                "first": first.to_json() if first else None,
                "lanes": [d.to_json() for d in self.lanes]}


def diff_decisions(a_paths: Iterable[Path], b_paths: Iterable[Path], *, context: int = 3) -> DecisionDiff:
    """Compare the decisions of two runs of the same plan (`decisions`), lane by lane.

    Decisions are compared in order within a lane (the run lane: states, transitions,
    campaign-level tools and cascade; one lane per task and per explorer mode), ignoring
    timestamps, durations, worker names and op ids. Both runs' decisions go to a temporary
    on-disk table (`ftl.postmortem.spool.Spool`) indexed by lane; the two lane-ordered streams are then
    walked side by side, so memory holds ``context`` decisions, not the runs.

    Returns:
        `DecisionDiff` with the first difference of every lane that differs (empty: same),
        lanes in order with the run lane first.

    Raises:
        OSError: a log cannot be read. sqlite3.Error: the temporary directory is unwritable.
    """
    spool = Spool()
    try:
        db = spool.db
        counts = []
        for side, paths in enumerate((a_paths, b_paths)):
            table = spool.table(f"side{side}")
            # lane_order puts the run lane first; lane as UTF-8 bytes sorts like the str.
            # seq as JSON text: a log's seq may be any number, SQLite integers stop at 2**63.
            db.execute(f"CREATE TABLE {table} (lane_order INTEGER, lane BLOB, pos INTEGER, seq TEXT, "
                       "decision TEXT)")
            insert = f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?)"
            rows: list[tuple[Any, ...]] = []
            count = 0
            for d in decisions(paths):
                rows.append((0 if d.lane == "run" else 1, d.lane.encode("utf-8", "surrogatepass"), count,
                             json.dumps(d.seq), json.dumps([d.event, d.fields])))
                count += 1
                if len(rows) >= 4096:
                    spool.write(insert, rows)
                    rows = []
            if rows:
                spool.write(insert, rows)
            db.execute(f"CREATE INDEX {table}_lanes ON {table} (lane_order, lane, pos)")
            counts.append(count)
        lanes = list(_first_differences(
            *(db.execute(f"SELECT lane_order, lane, seq, decision FROM side{side} "
                         "ORDER BY lane_order, lane, pos") for side in (0, 1)), context=context))
    finally:
        spool.close()
    return DecisionDiff(counts[0], counts[1], lanes)


def _first_differences(a_rows: Iterator[tuple[Any, ...]], b_rows: Iterator[tuple[Any, ...]], *,
                       context: int) -> Iterator[LaneDiff]:
    """Walk two streams of ``(lane_order, lane, seq, decision)`` rows sorted by lane (then by
    position in the run) side by side; yield each lane's first difference."""
    def decode(row: tuple[Any, ...] | None, lane: str) -> Decision | None:
        if row is None:
            return None
        event, fields = json.loads(row[3])
        return Decision(lane, event, tuple((k, v) for k, v in fields), json.loads(row[2]))

    x, y = next(a_rows, None), next(b_rows, None)
    while x is not None or y is not None:
        key = min(row[:2] for row in (x, y) if row is not None)
        lane = key[1].decode("utf-8", "surrogatepass")
        index, recent, found = 0, deque(maxlen=context), False
        while (x is not None and x[:2] == key) or (y is not None and y[:2] == key):
            mine = x if x is not None and x[:2] == key else None
            theirs = y if y is not None and y[:2] == key else None
            if not found:
                if mine is None or theirs is None or mine[3] != theirs[3]:
                    yield LaneDiff(lane, index, decode(mine, lane), decode(theirs, lane),
                                   [decode(row, lane) for row in recent])
                    found = True
                else:
                    recent.append(mine)  # decoded only if a difference follows
            if mine is not None:
                x = next(a_rows, None)
            if theirs is not None:
                y = next(b_rows, None)
            index += 1


def render_diff_text(diff: DecisionDiff, a_name: str = "A", b_name: str = "B") -> str:
    """The decision diff for a terminal: the first difference, then each differing lane."""
    if diff.same:
        return (f"same decisions: {diff.a_count} in {a_name}, {diff.b_count} in {b_name} "
                "(timestamps, durations, workers and op ids ignored)\n")
    lines = [f"decisions differ ({diff.a_count} in {a_name}, {diff.b_count} in {b_name}); "
             f"{len(diff.lanes)} lane(s) differ"]
    first = diff.first()
    for d in [first] + [x for x in diff.lanes if x is not first]:
        marker = "first difference" if d is first else "also"
        lines.append(f"{marker}: lane '{d.lane}', decision #{d.index + 1}")
        for c in d.context:
            lines.append(f"    = seq {c.seq}: {c.describe()}")
        lines.append(f"    {a_name}: " + (f"seq {d.a.seq}: {d.a.describe()}" if d.a else "(no more decisions)"))
        lines.append(f"    {b_name}: " + (f"seq {d.b.seq}: {d.b.describe()}" if d.b else "(no more decisions)"))
    return "\n".join(lines) + "\n"
