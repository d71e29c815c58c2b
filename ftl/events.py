"""The campaign event log: one JSON object per line in ``.ftl/events/<campaign_id>.jsonl``.

Every state entry, transition, tool call, failure, classification, retry and recovery attempt
is written *before* the action it announces is taken, flushed per line, with secrets scrubbed
(design.md §6). A crash (kill -9) loses at most a partial last line; the writer cuts such a torn
tail back to the last newline before appending (the jsonlines pitfall: appending after a torn
line glues the next record onto it), and the reader reports it instead of failing.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from ftl.sanitize import scrub_value

# Event names (FTL's where FTL had one; §2.6 of the behaviour reference).
RUN_START = "RUN_START"
RUN_END = "RUN_END"
RESUME = "RESUME"
LOG_REPAIRED = "LOG_REPAIRED"
STATE_ENTRY = "STATE_ENTRY"
PHASE_TRANSITION = "PHASE_TRANSITION"
TOOL_CALL = "TOOL_CALL"
TOOL_FAILURE = "TOOL_FAILURE"
FAILURE_CLASSIFIED = "FAILURE_CLASSIFIED"
RETRY = "RETRY"
RECOVERY_ATTEMPT = "RECOVERY_ATTEMPT"
READY_TASKS = "READY_TASKS"
TASK_START = "TASK_START"
TASK_END = "TASK_END"
TASK_PLACED = "TASK_PLACED"          # a cluster started a task's attempt on a node (issue 14)
TASK_COMMIT = "TASK_COMMIT"          # a verified task's result committed in its worktree
TASK_INTEGRATED = "TASK_INTEGRATED"  # that commit integrated into the campaign's branch
MERGE_CONFLICT = "MERGE_CONFLICT"    # that commit conflicts with the integration head
ORPHANS_WAITING = "ORPHANS_WAITING"  # a resume waits for commands a crashed run left running
EXPLORER_RESULT = "EXPLORER_RESULT"
PARTIAL_FAILURE = "PARTIAL_FAILURE"
PLAN_DECISION = "PLAN_DECISION"
PLAN_VALIDATION_FAILED = "PLAN_VALIDATION_FAILED"
PLAN_REGISTERED = "PLAN_REGISTERED"
CASCADE_STATUS = "CASCADE_STATUS"
CASCADE_ANALYSIS = "CASCADE_ANALYSIS"
CASCADE_REPLAN = "CASCADE_REPLAN"
CASCADE_MERGE_FAILED = "CASCADE_MERGE_FAILED"
CASCADE_PROPAGATE = "CASCADE_PROPAGATE"
OBSERVATION = "OBSERVATION"
ERROR_ROUTE = "ERROR_ROUTE"
RETURN = "RETURN"
#: A tool call's gate decision as the tool server reported it: ``tool``, ``outcome``
#: (``forward``, ``allow``, ``approved``, ``approved_on_timeout``; ``deny`` or ``timeout`` for a
#: refusal), ``gates`` ``{gate: step result}``, and for a refusal ``denied_by`` and ``reason``
#: (the refusal's error kind).
GATE_DECISION = "GATE_DECISION"
#: The shared rate gate of agent builders closed (a rate or usage limit: no new agent starts
#: until ``reopens_at``) or opened again (issue 12).
RATE_GATE = "RATE_GATE"

# Events that are actions: replay checks that each lies inside a state (design.md §6).
ACTION_EVENTS = frozenset({
    TOOL_CALL, TOOL_FAILURE, FAILURE_CLASSIFIED, RETRY, RECOVERY_ATTEMPT, READY_TASKS,
    TASK_START, TASK_END, TASK_PLACED, TASK_COMMIT, TASK_INTEGRATED, MERGE_CONFLICT,
    ORPHANS_WAITING, EXPLORER_RESULT, PARTIAL_FAILURE, PLAN_DECISION,
    PLAN_VALIDATION_FAILED, PLAN_REGISTERED, CASCADE_STATUS, CASCADE_ANALYSIS, CASCADE_REPLAN,
    CASCADE_MERGE_FAILED, CASCADE_PROPAGATE, OBSERVATION, ERROR_ROUTE, RETURN, GATE_DECISION,
    RATE_GATE,
})

_RESERVED = frozenset({"ts", "seq", "campaign_id", "event"})
_DUMPS = lambda obj: json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)  # noqa: E731


def _jsonl_writer(file: Any) -> Any:
    """A jsonlines writer of one event per line on ``file``, flushed after each line. jsonlines
    (and attrs under it, about 10 ms) loads here, with the first log a process opens: the
    embedded server imports this module for its helpers and never writes a log."""
    import jsonlines

    return jsonlines.Writer(file, flush=True, dumps=_DUMPS)


def utc_now() -> str:
    """RFC 3339 UTC timestamp with millisecond precision, e.g. ``2026-11-21T04:15:03.120Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_at(epoch_s: float) -> str:
    """``epoch_s`` (seconds since the epoch) as an RFC 3339 UTC timestamp with milliseconds."""
    return (datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"))


def parse_ts(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (`utc_now`'s, or the store's) as an aware datetime; None when
    ``value`` is not one (a time without its offset is not: it could be any zone's)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def ms_between(start: Any, end: Any) -> int | None:
    """Milliseconds from the RFC 3339 timestamp ``start`` to ``end`` (None when either is not one)."""
    a, b = parse_ts(start), parse_ts(end)
    if a is None or b is None:
        return None
    return int(round((b - a).total_seconds() * 1000))


def repair_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline) off ``path``; return the bytes removed.

    Returns 0 when the file is absent, empty or already ends with a newline.
    """
    if not path.exists():
        return 0
    with open(path, "rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        tail_start = _last_line_start(handle, size)
        handle.seek(tail_start)
        if _is_record(handle.read(size - tail_start)):
            # jsonlines writes the record and its newline separately: a kill between the two
            # leaves a whole record, which is kept and terminated rather than cut.
            handle.seek(size)
            handle.write(b"\n")
            handle.flush()
            os.fsync(handle.fileno())
            return 0
        keep = tail_start
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
        return size - keep


def _last_line_start(handle: Any, size: int) -> int:
    position, block = size, 4096
    while position > 0:
        start = max(0, position - block)
        handle.seek(start)
        index = handle.read(position - start).rfind(b"\n")
        if index >= 0:
            return start + index + 1
        position = start
    return 0


def _is_record(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, RecursionError):  # RecursionError: a line nested past Python's limit
        return False


@dataclass
class ReadReport:
    """What a tolerant read found besides the events."""

    lines: int = 0
    torn_tail: bool = False
    invalid_lines: list[int] = field(default_factory=list)


def read_events(path: Path, report: ReadReport | None = None) -> Iterator[dict[str, Any]]:
    """Stream the events of a log, one dict per good line, in file order.

    A torn last line sets ``report.torn_tail``; an invalid line elsewhere is skipped and its
    1-based number added to ``report.invalid_lines`` (a corrupted middle is a finding for the
    postmortem, not a reason to lose the rest). Memory stays flat: one line at a time.
    """
    report = report if report is not None else ReadReport()
    with open(path, "rb") as handle:
        previous: bytes | None = None
        number = 0
        for raw in handle:
            if previous is not None:
                event = _parse(previous, number, report, last=False)
                if event is not None:
                    yield event
            previous = raw
            number += 1
        if previous is not None:
            event = _parse(previous, number, report, last=True)
            if event is not None:
                yield event
    report.lines = number


def _parse(raw: bytes, number: int, report: ReadReport, *, last: bool) -> dict[str, Any] | None:
    if not raw.strip():
        return None
    try:
        event = json.loads(raw)  # a whole record without its newline (crash between the two) is kept
        if not isinstance(event, dict):
            raise ValueError("not an object")
        return event
    except (ValueError, RecursionError):
        if last and not raw.endswith(b"\n"):
            report.torn_tail = True
        else:
            report.invalid_lines.append(number)
        return None


_TASK_MARKERS = (b'"event":"RUN_START"', b'"event":"RUN_END"', b'"event":"TASK_START"',
                 b'"event":"TASK_END"')


def unended_task_starts(path: Path) -> dict[str, dict[str, Any]]:
    """The ``TASK_START`` events of the log's last run that no ``TASK_END`` follows, by task
    seq: the attempts a crash cut. ``{}`` when the file is absent, or when the last run wrote
    its ``RUN_END`` (a run that ended, a Ctrl-C included, settled its attempts itself).

    Only the lines of those three events are parsed (the writer's compact, key-sorted JSON names
    them verbatim; inside a string value the quotes would be escaped), so a long log costs a
    byte search per line; an unreadable line is skipped as in `read_events`.
    """
    found: dict[str, dict[str, Any]] = {}
    for event in _scan(path, _TASK_MARKERS):
        kind, seq = event.get("event"), event.get("task_seq")
        if kind in (RUN_START, RUN_END):
            found.clear()
        elif kind == TASK_START and seq is not None:
            found[str(seq)] = event
        elif kind == TASK_END and seq is not None:
            found.pop(str(seq), None)
    return found


def _scan(path: Path, markers: tuple[bytes, ...]) -> Iterator[dict[str, Any]]:
    """The events of the log at ``path`` (none when it is absent) whose line holds one of
    ``markers``: only those lines are parsed, a byte search each for the rest; an unreadable
    line is skipped as in `read_events`."""
    if not path.exists():
        return
    with open(path, "rb") as handle:
        for raw in handle:
            if not any(marker in raw for marker in markers):
                continue
            try:
                event = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict):
                yield event


_SPEND_MARKERS = (b'"event":"RUN_START"', b'"event":"PLAN_DECISION"', b'"event":"TOOL_FAILURE"')
#: Planner tools whose runs are paid agent runs (their cost is in no workspace row).
PLANNER_TOOLS = frozenset({"claude_planner", "agent_planner"})


def earlier_planner_spend_usd(path: Path) -> float:
    """What the planners of the campaign's earlier runs cost (USD): the ``total_cost_usd`` of
    every ``PLAN_DECISION`` and the ``details.agent_cost.total_cost_usd`` of every planner
    ``TOOL_FAILURE`` (a paid run that gave no answer) before the log's last ``RUN_START`` (the
    current run's spend is counted as it happens). Builds are not here: their cost is on their
    workspace rows. 0.0 when the file is absent. Scans like `unended_task_starts`.
    """
    earlier = current = 0.0
    for event in _scan(path, _SPEND_MARKERS):
        kind = event.get("event")
        if kind == RUN_START:
            earlier, current = earlier + current, 0.0
            continue
        cost: Any = event.get("total_cost_usd")
        if kind == TOOL_FAILURE:
            details = event.get("details")
            paid = details.get("agent_cost") if isinstance(details, dict) else None
            cost = (paid.get("total_cost_usd") if isinstance(paid, dict)
                    and event.get("tool") in PLANNER_TOOLS else None)
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 < cost < float("inf"):
            current += float(cost)
    return earlier


class EventLog:
    """Append-only, thread-safe writer of one campaign's events.

    Args:
        path: the JSONL file; parent directories are created.
        campaign_id: written into every event.
        fsync: also ``os.fsync`` after every line (survives power loss, not only kill -9).

    Opening an existing log repairs a torn tail (emitting ``LOG_REPAIRED``) and continues its
    ``seq`` numbering, so a resumed run and the crashed one form one ordered story.
    """

    def __init__(self, path: Path, campaign_id: str, *, fsync: bool = False) -> None:
        self.path = path
        self.campaign_id = campaign_id
        self._fsync = fsync
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self.state: str | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        removed = repair_tail(path)
        self._seq = self._last_seq(path)
        self._file = open(path, "a", encoding="utf-8")
        self._writer = _jsonl_writer(self._file)
        if removed:
            self.emit(LOG_REPAIRED, truncated_bytes=removed)

    @staticmethod
    def _last_seq(path: Path) -> int:
        last = 0
        if path.exists():
            for event in read_events(path):
                seq = event.get("seq")
                if isinstance(seq, int) and seq > last:
                    last = seq
        return last

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(event)`` after each event is written (progress views, metrics)."""
        self._listeners.append(listener)

    def emit(self, event: str, *, state: str | None = None, **fields: Any) -> dict[str, Any]:
        """Write one event and return it. ``state`` defaults to the log's current state.

        Raises:
            ValueError: a field would overwrite an envelope key (ts, seq, campaign_id, event);
                a task's number travels as ``task_seq``.
        """
        clash = _RESERVED & fields.keys()
        if clash:
            raise ValueError(f"event fields {sorted(clash)} are reserved")
        with self._lock:
            self._seq += 1
            record = {
                "ts": utc_now(), "seq": self._seq, "campaign_id": self.campaign_id,
                "event": event, "state": state if state is not None else self.state,
                **scrub_value(fields),
            }
            start = os.fstat(self._file.fileno()).st_size  # the only writer: the line's offset
            try:
                self._writer.write(record)
                if self._fsync:
                    os.fsync(self._file.fileno())
            except BaseException:
                self._seq -= 1
                self._drop_partial_line(start)
                raise
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a broken progress view must never stop a campaign
                pass
        return record

    def _drop_partial_line(self, start: int) -> None:
        """After a failed write (disk full, a file size limit): cut the file back to ``start``,
        where the failed line began, and reopen it, so the next event starts a line of its own
        instead of being glued to half of this one and lost with it (the log is write-ahead).
        The old file object's unwritten bytes (the rest of the failed line) go to /dev/null, not
        after a later line. What cannot be cut now is cut when the log is next opened."""
        old = self._file
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, old.fileno())
            finally:
                os.close(null)
            old.close()
        except (OSError, ValueError):
            pass
        try:
            os.truncate(self.path, start)
        except OSError:
            pass
        self._file = open(self.path, "a", encoding="utf-8")
        self._writer = _jsonl_writer(self._file)

    def close(self) -> None:
        with self._lock:
            self._writer.close()
            self._file.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def events_dir(repo: Path) -> Path:
    return repo / ".ftl" / "events"


def log_path(repo: Path, campaign_id: str) -> Path:
    return events_dir(repo) / f"{campaign_id}.jsonl"


def iter_many(paths: Iterable[Path], report: ReadReport | None = None) -> Iterator[dict[str, Any]]:
    """Stream several logs of one campaign as one sequence (a crashed run, then its resume)."""
    for path in paths:
        yield from read_events(path, report)


class _Fields(BaseModel):
    """The base of the event-field models below. They describe events for the schema files and
    for replay; no event is validated while it is written, so their validators are built at
    first use (pydantic's ``defer_build``): building the six cost 5-8 ms of every import of this
    module, the embedded server's boot included (issue 11 item 2)."""

    model_config = ConfigDict(defer_build=True)


class TaskPlacedFields(_Fields):
    """``TASK_PLACED``: a Ray cluster started one attempt of a task on a node (issue 14).

    ``TASK_START`` comes first (``executor: "ray"``, no node: Ray picks it); ``TASK_END``
    repeats ``node`` and ``node_worker``. Tasks run on the driver say ``node: "driver"`` in
    ``TASK_START`` and ``TASK_END`` and have no ``TASK_PLACED``.
    """

    task_seq: str
    attempt: int = Field(ge=1)
    try_number: int = Field(ge=1, description="The recovery protocol's try (1, then retries).")
    node: str = Field(description="The Ray node id's first 12 hex digits.")
    node_worker: str = Field(description="The worker process there, e.g. 'pid 4242 on host-2'.")
    worker: str = Field(description="The driver's lane that drives the task (w1, w2, ...).")


class TaskCommitFields(_Fields):
    """``TASK_COMMIT``: a verified task's result committed in its worktree."""

    task_seq: str
    attempt: int = Field(ge=1)
    commit: str = Field(description="The task commit (40 hex digits).")
    base: str = Field(description="The integration head the task started from.")
    file_count: int = Field(ge=0, description="Paths changed against the base.")
    files: list[str] = Field(description="The first 50 of them.")


class TaskIntegratedFields(_Fields):
    """``TASK_INTEGRATED``: that commit integrated into ``ftl/<campaign_id>/integration``."""

    task_seq: str
    commit: str
    head: str = Field(description="The integration head afterwards (the commit itself when "
                                  "fast-forwarded, else the merge commit).")
    previous: str = Field(description="The integration head before.")
    fast_forward: bool


class MergeConflictFields(_Fields):
    """``MERGE_CONFLICT``: that commit conflicts with the integration head (paths, never
    contents)."""

    task_seq: str
    commit: str
    base: str
    other_seqs: list[str] = Field(description="Integrated tasks whose commits touched the paths.")
    paths: list[str] = Field(description="Conflicting paths (at most 20).")
    round: int = Field(ge=1, le=2, description="1: re-run on the new head follows; 2: blocked.")


class RateGateFields(_Fields):
    """``RATE_GATE``: the agents' shared rate gate closed or opened (issue 12)."""

    closed: bool = Field(description="True: no new agent starts until reopens_at; False: open.")
    reopens_at: str | None = Field(description="When it opens (RFC 3339 UTC); None once open.")
    task_seq: str | None = Field(None, description="The task whose agent hit the limit.")
    limit_kind: str | None = Field(None, description="rate_limit | usage_limit.")
    reason: str | None = Field(None, description="The limit's message (at most 300 chars).")


#: Events whose own fields have a schema (``schemas/event.schema.json``, ``$defs``).
EVENT_FIELDS: dict[str, type[BaseModel]] = {
    TASK_PLACED: TaskPlacedFields,
    TASK_COMMIT: TaskCommitFields, TASK_INTEGRATED: TaskIntegratedFields,
    MERGE_CONFLICT: MergeConflictFields, RATE_GATE: RateGateFields,
}


def add_event_fields(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the `EVENT_FIELDS` schemas to ``EventRecord``'s schema (``$defs`` and one
    ``if event == NAME then`` rule each); used by `ftl.schemas`. Returns ``schema``."""
    defs = schema.setdefault("$defs", {})
    rules = []
    for name, model in EVENT_FIELDS.items():
        defs[model.__name__] = model.model_json_schema()
        rules.append({"if": {"properties": {"event": {"const": name}}, "required": ["event"]},
                      "then": {"$ref": f"#/$defs/{model.__name__}"}})
    schema["allOf"] = rules
    return schema


class EventRecord(BaseModel):
    """The common shape of every event line (design.md §6); each event adds its own fields
    (those of `EVENT_FIELDS` have their own schema).

    This model is the source of ``schemas/event.schema.json``; the writer does not construct it
    per line (that would cost a validation per event on the hot path).
    """

    model_config = ConfigDict(extra="allow", defer_build=True)

    ts: str = Field(description="RFC 3339 UTC timestamp with milliseconds, e.g. 2026-11-21T04:15:03.120Z.")
    seq: int = Field(ge=1, description="Strictly increasing per log, continued across resumes.")
    campaign_id: str
    event: str = Field(description="STATE_ENTRY, PHASE_TRANSITION, TOOL_FAILURE, RETRY, "
                                   "GATE_DECISION, ...")
    state: str | None = Field(description="The machine state the event belongs to (null before INIT).")
