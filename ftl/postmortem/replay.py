"""Postmortem: rebuild a campaign's run from its event log alone and check the protocol.

`replay(paths)` streams one or more logs of a campaign in order (ftl's resume appends to the
same file, so one file may hold several runs; a crashed run's log and its resume's log may also
be given as two files). A new ``RUN_START`` after a run that wrote no ``RUN_END`` is a crash
boundary. Memory is flat: each line is parsed, folded into the result and dropped; each record
of the story (a task attempt, a failure, a state stay...) goes to an on-disk spool
(`ftl.postmortem.spool`) as soon as no later event can change it, and the renderers (`text_lines`,
`write_json`) read it back record by record. In memory stay the work in flight (running
attempts, open failures and operations) and a bounded cache of per-task records.

Invariants checked, each violation reported with the ``seq`` of the event that broke it
(design.md §6 and §5; rule names in `RULES`):

- ``seq_increasing``: ``seq`` strictly increases across every file of the story;
- ``emit_before_retry``: a ``RETRY`` or an op's ``RECOVERY_ATTEMPT`` follows a ``TOOL_FAILURE``
  of that operation (a retry only after one classified ``retry``);
- ``classify_before_act``: every ``TOOL_FAILURE`` is classified (``FAILURE_CLASSIFIED`` naming
  its ``failure_seq``) before a retry, a recovery, a task end or a move to ERROR acts on it, and
  never left unclassified;
- ``retry_limit``: at most ``transient_retries`` retries (1) per operation for a transient
  failure, ``flaky_verify_retries`` (2) for a flaky verify, none for a structural one (limits
  from the ``RUN_START`` config when it has them);
- ``action_in_state``: every action event lies between a ``STATE_ENTRY`` and the next
  ``PHASE_TRANSITION`` and names that state;
- ``error_state``: ERROR is entered through the ``fail`` trigger as a state with an
  ``error_type``;
- ``error_route``: ERROR writes ``ERROR_ROUTE`` with that type's registry route (or one of the
  handler's documented overrides) and then takes that route;
- ``state_transitions``: every ``PHASE_TRANSITION`` is one of the machine's transitions
  (`ftl.machine.TRANSITIONS` for the run's flow) and the next ``STATE_ENTRY`` is its target;
- ``task_transitions``: a task starts only when pending with its dependencies complete (when
  ``PLAN_REGISTERED`` lists them), never twice without an end (unless a crash intervened),
  never again after completing, and restarts after a block only after a successful re-plan;
- ``ends_properly``: the story ends with ``RUN_END`` after COMPLETE, or after a ``RETURN`` with
  a summary (a cancelled run is reported, not a violation).
"""

from __future__ import annotations

import gc
import json
import re
import sys
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from itertools import islice
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from ftl import events as ev
from ftl.errors import REGISTRY, Route, kind
from ftl.postmortem.spool import Records, Spool, TaskTable, task_sort_key

RULES: dict[str, str] = {
    "seq_increasing": "seq strictly increases across the story",
    "emit_before_retry": "TOOL_FAILURE precedes any retry or recovery of that failure",
    "classify_before_act": "every failure is classified before an action is taken on it",
    "retry_limit": "at most one retry of a transient failure (two for a flaky verify), none of a "
                   "structural one",
    "action_in_state": "no action outside a state",
    "error_state": "ERROR is entered through 'fail' as a state with an error_type",
    "error_route": "ERROR is handled by its error_type's route",
    "state_transitions": "every state change is a transition of the machine",
    "task_transitions": "task starts and ends follow the task lifecycle",
    "ends_properly": "the run ends in COMPLETE or a RETURN with a summary",
    "integration": "a task's result is integrated at most once, and only the commit made after "
                   "its verify passed",
}

# ERROR handler overrides of the registry route (states/error.py): too many ERROR entries or a
# PLAN route from outside EXPLORE -> summary; a CASCADE route in the TASK flow -> observe.
_MAX_ERROR_ENTRIES = 5
_ROUTE_TARGETS = {Route.PLAN.value: "PLAN", Route.CASCADE.value: "CASCADE",
                  Route.OBSERVE.value: "OBSERVE"}
_ENDED_TASK = frozenset({"complete", "blocked", "cancelled", "pending"})
_MESSAGE_LIMIT = 300  # characters of a failure message kept (the log keeps the whole text)
_WARNINGS_LISTED = 20  # items of one kind named in the warnings
_MAX_DEPTH = 500  # nesting a line may have: deeper is refused, as the encoders would fail on it
_NO_ROOTS: list[str] = []  # shared by every unblocked task; never mutated
_intern = sys.intern  # worker, status and error_type repeat on every attempt: keep one copy


@dataclass(slots=True)
class Violation:
    """One broken invariant: the event's ``seq`` (None when the log as a whole is at fault)."""

    seq: int | None
    rule: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "rule": self.rule, "message": self.message}


@dataclass(slots=True)
class StateSpan:
    """One stay in a state: from its ``STATE_ENTRY`` to the next entry, a crash or ``RUN_END``."""

    state: str
    seq: int | None
    start: str | None
    run: int
    resumed: bool = False
    error_type: str | None = None
    end: str | None = None
    duration_ms: int | None = None
    trigger: str | None = None  # what left it; None when the run ended or crashed in it
    to: str | None = None
    interrupted: bool = False


@dataclass(slots=True)
class Failure:
    """A ``TOOL_FAILURE`` with its classification and what happened to it next.

    ``outcome``: ``retried``, ``recovered:<strategy>`` (``failed:<strategy>`` when the recovery
    did not work), ``error`` (the run went to ERROR), ``interrupted`` (a crash came first) or
    None (the protocol moved on, e.g. an escalation handled by the caller).
    """

    seq: int | None
    ts: str | None
    state: str | None
    tool: str | None
    task_seq: str | None
    op_id: str | None
    attempt: int | None
    error_type: str | None
    message: str | None
    run: int
    klass: str | None = None
    decision: str | None = None
    classified_seq: int | None = None
    outcome: str | None = None
    outcome_seq: int | None = None


@dataclass(slots=True)
class TaskAttempt:
    """One attempt at a task, ``TASK_START`` to ``TASK_END`` (``status`` None: cut by a crash)."""

    seq: str
    worker: str | None
    attempt: int | None
    start: str | None
    start_seq: int | None
    run: int
    end: str | None = None
    end_seq: int | None = None
    status: str | None = None
    error_type: str | None = None
    duration_ms: int | None = None
    failures: list[int] | None = None  # seqs of this attempt's TOOL_FAILUREs (None: none)
    retries: int = 0
    recoveries: list[str] | None = None  # strategies of this attempt's RECOVERY_ATTEMPTs
    commit: str | None = None  # the task commit integrated (worktree isolation)
    cost_usd: float | None = None  # an agent build's total_cost_usd (Claude builder)
    num_turns: int | None = None
    tokens: int | None = None  # input + output + cache read/write tokens

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["failures"], data["recoveries"] = self.failures or [], self.recoveries or []
        return data


@dataclass(slots=True)
class TaskInfo:
    """A task's final word in the log."""

    seq: str
    slug: str | None = None
    depends: list[str] | None = None
    status: str = "pending"
    attempts: int = 0
    blocked_by: list[str] = field(default_factory=lambda: _NO_ROOTS)  # replaced, never mutated
    error_type: str | None = None
    reason: str | None = None
    commit: str | None = None  # its verified result (TASK_COMMIT, or reused after a crash)
    integrated: int | None = None  # its place in the integration order (1-based)


@dataclass(slots=True)
class RunSegment:
    """One process's part of the story: a ``RUN_START`` to its ``RUN_END`` (or a crash)."""

    index: int
    start_seq: int | None
    start: str | None
    resume: bool
    file: str
    pid: int | None = None
    end_seq: int | None = None
    end: str | None = None
    last_seq: int | None = None
    last_ts: str | None = None
    outcome: str | None = None
    exit_code: int | None = None
    interrupted_state: str | None = None
    interrupted_tasks: list[str] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.outcome is None


def _codec(cls: type) -> tuple[Any, Any]:
    """(encode, decode) of a slotted record dataclass as a tuple of its fields, for `Records`."""
    return attrgetter(*(f.name for f in fields(cls))), (lambda values: cls(*values))


class Replay:
    """What a log says happened. Built by `replay`; render with `text_lines`/`render_text`,
    `to_json` or `ftl.postmortem.html.render_html`.

    The story's records (``states``, ``attempts``, ``failures``, ``retries``, ``recoveries``,
    ``cascade``, ``violations``, ``invalid_lines``: `ftl.postmortem.spool.Records`; ``tasks``: a
    `ftl.postmortem.spool.TaskTable` by task seq) live in a temporary on-disk database, so memory stays
    flat however long the log; they iterate in the order the story began them (an attempt at its
    ``TASK_START``, a failure at its ``TOOL_FAILURE``). `close` deletes the database (so does
    garbage collection).
    """

    def __init__(self) -> None:
        self.campaign_id: str | None = None
        self.objective: str | None = None
        self.flow: str | None = None
        self.files: list[str] = []
        self.events = 0
        self.first_ts: str | None = None
        self.last_ts: str | None = None
        self.runs: list[RunSegment] = []
        self.outcome: str | None = None
        self.exit_code: int | None = None
        self.summary: dict[str, Any] | None = None
        self.agent_cost_usd = 0.0  # sum of the attempts' cost_usd (TASK_END total_cost_usd)
        self.agent_tokens = 0
        self.torn_tails: list[str] = []
        self.other_campaigns: list[str] = []
        self._spool = spool = Spool()
        self.states: Records[StateSpan] = Records(spool, "states", *_codec(StateSpan))
        self.attempts: Records[TaskAttempt] = Records(spool, "attempts", *_codec(TaskAttempt))
        self.failures: Records[Failure] = Records(spool, "failures", *_codec(Failure))
        self.violations: Records[Violation] = Records(spool, "violations", *_codec(Violation))
        self.retries: Records[dict[str, Any]] = Records(spool, "retries")
        self.recoveries: Records[dict[str, Any]] = Records(spool, "recoveries")
        self.cascade: Records[dict[str, Any]] = Records(spool, "cascade")
        self.invalid_lines: Records[dict[str, Any]] = Records(spool, "invalid_lines")
        self.repaired: Records[dict[str, Any]] = Records(spool, "repaired")
        self.integrations: Records[dict[str, Any]] = Records(spool, "integrations")
        encode, decode = _codec(TaskInfo)
        self.tasks: TaskTable[TaskInfo] = TaskTable(
            spool, "tasks", encode, decode,
            blocked_by=lambda info: info.blocked_by if info.status == "blocked" else None)

    def close(self) -> None:
        """Delete the on-disk records; the `Replay` is unusable afterwards."""
        self._spool.close()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def torn_tail(self) -> bool:
        return bool(self.torn_tails)

    @property
    def crash_boundaries(self) -> list[int]:
        """``seq`` of each ``RUN_START`` that resumed a crashed run."""
        return [nxt.start_seq for prev, nxt in zip(self.runs, self.runs[1:]) if prev.crashed]

    @property
    def duration_ms(self) -> int | None:
        return _ms_between(self.first_ts, self.last_ts)

    def failure(self, seq: int) -> Failure | None:
        """The failure logged at ``seq`` (a scan: for tests and small reports)."""
        for failure in self.failures:
            if failure.seq == seq:
                return failure
        return None

    def blocks(self) -> list[dict[str, Any]]:
        """The cascade tree as a list (`iter_blocks`)."""
        return list(self.iter_blocks())

    def iter_blocks(self) -> Iterator[dict[str, Any]]:
        """The cascade tree: one entry per blocked root, ``{root, slug, error_type, reason,
        blocked: [seq...]}`` (tasks made unreachable by that root, in seq order), roots in seq
        order; ``error_type``/``reason`` are set for a root that failed itself. Streams from the
        task table, one root at a time."""
        for root, blocked in self.tasks.cascade():
            info = self.tasks.peek(root)
            failed = info is not None and info.status == "blocked" and not info.blocked_by
            yield {"root": root, "slug": info.slug if info is not None else None,
                   "error_type": info.error_type if failed else None,
                   "reason": info.reason if failed else None, "blocked": blocked}

    def warnings(self) -> list[str]:
        """Findings about the log itself (not protocol violations)."""
        notes = [f"{name}: the last line was torn (a crash mid-write); it was skipped"
                 for name in self.torn_tails]
        # Each list is named up to _WARNINGS_LISTED times (the JSON lists every item): a log of
        # garbage must not make a note per line.
        notes += [f"{item['file']}: line {item['line']} is not a JSON object; it was skipped"
                  for item in islice(self.invalid_lines, _WARNINGS_LISTED)]
        if len(self.invalid_lines) > _WARNINGS_LISTED:
            notes.append(f"{len(self.invalid_lines) - _WARNINGS_LISTED:,} more lines are not JSON "
                         "objects and were skipped (invalid_lines in --format json lists them)")
        notes += [f"seq {item['seq']}: the writer cut a torn tail of {item['truncated_bytes']} bytes "
                  "before appending" for item in islice(self.repaired, _WARNINGS_LISTED)]
        if len(self.repaired) > _WARNINGS_LISTED:
            notes.append(f"{len(self.repaired) - _WARNINGS_LISTED:,} more torn tails were cut "
                         "(repaired in --format json lists them)")
        if self.other_campaigns:
            more = " and more" if len(self.other_campaigns) >= _WARNINGS_LISTED else ""
            notes.append(f"events of other campaigns were read: {', '.join(self.other_campaigns)}{more}")
        if self.runs and self.runs[-1].outcome == "cancelled":
            notes.append("the last run was cancelled (Ctrl-C); `ftl campaign resume` continues it")
        if self.runs and self.runs[-1].outcome == "stopped":
            notes.append("the last run stopped on an error outside any state (see .ftl/ftl.log); "
                         "`ftl campaign resume` continues it")
        return notes

    def to_json(self, *, lazy: bool = False) -> dict[str, Any]:
        """JSON-ready dict: the keys of `Replay` with records as dicts; ``tasks`` is the list of
        attempts and ``task_status`` the final word per task.

        Args:
            lazy: the long lists (attempts, tasks, failures, retries, recoveries, cascade,
                states, violations) are `JsonArray`s read from the spool while they are written:
                for `write_json`, which streams; ``json.dumps`` would see them empty.
        """
        def many(records: Any, convert: Any, length: int) -> list[Any]:
            # ``records``: a re-iterable (`Records`) or a callable giving a fresh iterator.
            walk = records if callable(records) else (lambda: records)
            if lazy:
                return JsonArray(lambda: map(convert, walk()), length)
            return [convert(item) for item in walk()]

        same = _identity
        return {
            "campaign_id": self.campaign_id, "objective": self.objective, "flow": self.flow,
            "files": self.files, "events": self.events, "outcome": self.outcome,
            "exit_code": self.exit_code, "summary": self.summary,
            "agent_cost_usd": round(self.agent_cost_usd, 6), "agent_tokens": self.agent_tokens,
            "first_ts": self.first_ts, "last_ts": self.last_ts, "duration_ms": self.duration_ms,
            "runs": [{**asdict(r), "crashed": r.crashed} for r in self.runs],
            "crash_boundaries": self.crash_boundaries,
            "states": many(self.states, asdict, len(self.states)),
            "tasks": many(self.attempts, TaskAttempt.to_json, len(self.attempts)),
            "task_status": many(self.tasks.values, asdict, len(self.tasks)),
            "failures": many(self.failures, asdict, len(self.failures)),
            "retries": many(self.retries, same, len(self.retries)),
            "recoveries": many(self.recoveries, same, len(self.recoveries)),
            "integrations": many(self.integrations, same, len(self.integrations)),
            "cascade": many(self.cascade, same, len(self.cascade)),
            "blocks": JsonArray(self.iter_blocks, sum(1 for _ in self.tasks.cascade()))
                      if lazy else self.blocks(),
            "repaired": many(self.repaired, same, len(self.repaired)),
            "torn_tail": self.torn_tail, "torn_tails": self.torn_tails,
            "invalid_lines": many(self.invalid_lines, same, len(self.invalid_lines)),
            "warnings": self.warnings(),
            "violations": many(self.violations, Violation.to_json, len(self.violations)),
        }

    def ordered_tasks(self) -> list[TaskInfo]:
        """Every task's final word, in task order."""
        return list(self.tasks.values())


def _identity(value: Any) -> Any:
    return value


class JsonArray(list):  # type: ignore[type-arg]
    """A JSON array produced on demand: ``items()`` is called each time it is walked.

    The pure-Python encoder of `json` (``JSONEncoder.iterencode``) walks a list with ``len`` and
    ``iter``, which this overrides, so a spooled list is encoded record by record without being
    built; the C one-shot encoder (``json.dumps``) reads the real (empty) list instead.
    """

    def __init__(self, items: Any, length: int) -> None:
        super().__init__()
        self._items, self._length = items, length

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items())

    def __len__(self) -> int:
        return self._length


def write_json(payload: Any, handle: Any, *, indent: int | None = 2) -> None:
    """Write ``payload`` (which may hold `JsonArray`s, e.g. ``Replay.to_json(lazy=True)``) to the
    text ``handle`` as JSON, chunk by chunk: memory holds one record at a time, not the document.
    Keys sorted; values JSON cannot hold are written as ``str(value)``."""
    encoder = json.JSONEncoder(indent=indent, sort_keys=True, default=str)
    write = handle.write
    for chunk in encoder.iterencode(payload):
        write(chunk)
    write("\n")


def _seq_key(seq: str) -> tuple[int, str]:
    return (task_sort_key(seq), str(seq))  # the task table's order


def _parse_ts(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _ms_between(start: Any, end: Any) -> int | None:
    a, b = _parse_ts(start), _parse_ts(end)
    if a is None or b is None:
        return None
    return int(round((b - a).total_seconds() * 1000))


def _s(value: Any) -> str | None:
    """A text field as str (None stays None): a log is untrusted input, types included."""
    return value if isinstance(value, str) or value is None else str(value)


def _t(value: Any) -> str | None:
    """`_s` for names that repeat (tools, states, error types, task seqs, op ids): one copy each."""
    return _intern(value) if type(value) is str else _s(value)


def _i(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ---------------------------------------------------------------------------------- reading

def stream(paths: Iterable[Path], result: Replay | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events of ``paths`` in order, one dict per good line.

    Tolerant like `ftl.events.read_events` (a torn last line of a file goes to
    ``result.torn_tails``, a bad line elsewhere to ``result.invalid_lines`` as ``{file, line}``),
    but without its look-ahead: only a file's last line can lack its newline, so whether a bad
    line is torn is known from the line itself. One line in memory at a time.
    """
    for path in paths:
        name = Path(path).name
        if result is not None:
            result.files.append(name)
        yield from _read(path, name, result)


_loads = orjson.loads
_ParseError = orjson.JSONDecodeError


def _fallback(line: bytes) -> Any:
    """What the standard parser makes of a line orjson refuses (NaN, integers past 64 bits, lone
    surrogates, bytes that are not UTF-8 (read as U+FFFD), trailing Unicode whitespace); None
    when it is not JSON at all."""
    text = line.decode("utf-8", errors="replace")
    try:
        event, end = _raw_decode(text)
        if text[end:].strip():
            return None  # trailing garbage: two records glued together
        return event
    except (ValueError, RecursionError):
        try:
            return json.loads(text)  # leading whitespace
        except (ValueError, RecursionError):
            return None


_raw_decode = json.JSONDecoder().raw_decode
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _too_deep(line: bytes) -> bool:
    """Whether ``line`` nests arrays and objects deeper than `_MAX_DEPTH` (brackets inside
    strings do not count). Called only for lines with that many brackets: rare."""
    depth = deepest = 0
    for char in _STRING.sub(b"", line):
        if char in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif char in (0x5D, 0x7D):
            depth -= 1
    return deepest > _MAX_DEPTH


def _read(path: Path, name: str, result: Replay | None) -> Iterator[dict[str, Any]]:
    # Binary lines split on b"\n" only (JSON escapes every other control character). orjson is
    # the hot path of a multi-GB replay (about 3x json.loads); whatever it refuses goes through
    # json.loads. One difference remains: an integer past 64 bits reads as a float.
    loads, error, deep = _loads, _ParseError, 2 * _MAX_DEPTH
    with open(path, "rb") as handle:
        number = 0
        for line in handle:
            number += 1
            try:
                event = loads(line)
            except error:
                event = _fallback(line)
            if len(line) > deep and line.count(b"[") + line.count(b"{") > _MAX_DEPTH and _too_deep(line):
                event = None  # orjson takes 1,023 levels; the encoders that write reports fail first
            if type(event) is dict:
                yield event
                continue
            if not line.decode("utf-8", errors="replace").strip():
                continue
            if result is not None:
                if line.endswith(b"\n"):
                    result.invalid_lines.append({"file": name, "line": number})
                else:
                    result.torn_tails.append(name)


# ---------------------------------------------------------------------------------- checking

@dataclass(slots=True)
class _Op:
    """Bookkeeping for one recovery-protocol operation (one ``op_id``)."""

    task_seq: str | None
    failure: Failure | None = None
    retries: int = 0


class _Checker:
    """Folds events into a `Replay` and records violations. Per-event work only: no history."""

    def __init__(self, result: Replay) -> None:
        self.r = result
        self.count = 0
        self.first_ts: str | None = None
        self.campaign_id: str | None = None
        self.prev_seq: int | None = None
        self.prev_ts: str | None = None
        self.last_seq = 0
        self.run_index = -1
        self.integration_count = 0  # TASK_INTEGRATED events (and crash-lost ones) so far
        self.segment: RunSegment | None = None
        self.state: str | None = None
        self.span: StateSpan | None = None
        self.in_state = False
        self.expect_entry: str | None = None  # target of the last PHASE_TRANSITION
        self.flow = "campaign"
        self.transitions: set[tuple[str, str, str]] = set()
        self.transient_retries = 1
        self.flaky_retries = 2
        self.unclassified: dict[int, Failure] = {}
        # Failures not yet settled (written to r.failures), by their key there; a failure settles
        # once nothing can change it any more (`_settle_failures`).
        self.open_failures: dict[int, Failure] = {}
        self.state_failures: dict[int, Failure] = {}  # open failures logged in the current state
        self.task_open: dict[str, list[int]] = {}  # keys of each task's open failures
        self.state_failure_count = 0
        self.ops: dict[str, _Op] = {}
        self.running: dict[str, TaskAttempt] = {}
        self.attempt_keys: dict[str, int] = {}  # key in r.attempts of each running attempt
        self.task_failures: dict[str, Failure] = {}  # last failure of each running task
        self.replan_open = False
        self.error: dict[str, Any] | None = None  # ERROR entered, route not yet written
        self.route_target: str | None = None  # state the route promised to go to
        self.error_entries = 0
        self.error_origin: str | None = None
        self.returned = False
        self.ended = False
        self._set_flow("campaign")
        self.handlers = {
            ev.RUN_START: self.on_run_start, ev.RUN_END: self.on_run_end,
            ev.STATE_ENTRY: self.on_state_entry, ev.PHASE_TRANSITION: self.on_phase_transition,
            ev.TOOL_FAILURE: self.on_tool_failure, ev.FAILURE_CLASSIFIED: self.on_failure_classified,
            ev.RETRY: self.on_retry, ev.RECOVERY_ATTEMPT: self.on_recovery_attempt,
            ev.ERROR_ROUTE: self.on_error_route, ev.RETURN: self.on_return,
            ev.TASK_START: self.on_task_start, ev.TASK_END: self.on_task_end,
            ev.PLAN_REGISTERED: self.on_plan_registered,
            ev.CASCADE_STATUS: self.on_cascade_status, ev.CASCADE_ANALYSIS: self.on_cascade_analysis,
            ev.CASCADE_REPLAN: self.on_cascade_replan, ev.CASCADE_PROPAGATE: self.on_cascade_propagate,
            ev.CASCADE_MERGE_FAILED: self.on_cascade_merge_failed,
            ev.LOG_REPAIRED: self.on_log_repaired, ev.RESUME: self.on_resume,
            ev.TASK_COMMIT: self.on_task_commit, ev.TASK_INTEGRATED: self.on_task_integrated,
        }
        self.actions = ev.ACTION_EVENTS
        self._file = ""

    def _set_flow(self, flow: str) -> None:
        from ftl.machine import TRANSITIONS, Flow

        try:
            rows = TRANSITIONS[Flow(flow)]
        except ValueError:
            rows = TRANSITIONS[Flow.CAMPAIGN]
        self.flow = flow
        self.transitions = {
            (source, row["trigger"], row["dest"])
            for row in rows
            for source in (row["source"] if isinstance(row["source"], list) else [row["source"]])
        }

    def violation(self, seq: int | None, rule: str, message: str) -> None:
        self.r.violations.append(Violation(seq, rule, message))

    # --- the hot path ---
    def feed(self, e: dict[str, Any]) -> None:
        self.count += 1
        get = e.get
        seq = get("seq")
        if type(seq) is int and seq > self.last_seq:
            self.last_seq = seq
        else:
            self.violation(seq if type(seq) is int else None, "seq_increasing",
                           f"seq {seq} after {self.last_seq}")
            if type(seq) is not int:
                seq = None
        ts = get("ts")
        if type(ts) is not str:
            ts = _s(ts)
        if self.first_ts is None:
            self.first_ts = ts
        campaign = get("campaign_id")
        if campaign != self.campaign_id:
            self._campaign(campaign)
        name = get("event")
        if type(name) is not str:
            name = _s(name)
        if name in self.actions:
            if not self.in_state:
                self.violation(seq, "action_in_state", f"{name} outside any state")
            elif get("state") != self.state:
                self.violation(seq, "action_in_state",
                               f"{name} names state {e.get('state')}, current {self.state}")
        handler = self.handlers.get(name)
        if handler is not None:
            handler(e, seq, ts)
        self.prev_seq, self.prev_ts = seq, ts

    def _campaign(self, campaign: Any) -> None:
        r = self.r
        if self.campaign_id is None and r.campaign_id is None:
            self.campaign_id = r.campaign_id = _s(campaign)
        else:
            name = "(none)" if campaign is None else str(campaign)
            if name not in r.other_campaigns and len(r.other_campaigns) < _WARNINGS_LISTED:
                r.other_campaigns.append(name)

    def _close_segment(self) -> None:
        if self.segment is not None:
            self.segment.last_seq, self.segment.last_ts = self.prev_seq, self.prev_ts

    # --- runs and states ---
    def on_run_start(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        r = self.r
        previous = self.segment
        self._close_segment()
        if previous is not None and previous.outcome is None:
            # The previous process died: its in-flight work is cut, not wrong.
            previous.interrupted_state = self.state
            previous.interrupted_tasks = sorted(self.running, key=_seq_key)
            # The state lasted until the dead process's last event, not until the resume.
            self._close_span(previous.last_ts, None, None, interrupted=True)
            for failure in self.unclassified.values():
                failure.outcome = failure.outcome or "interrupted"
            for failure in self.state_failures.values():
                failure.outcome = failure.outcome or "interrupted"
            for task in self.running:
                info = r.tasks.get(task)
                if info is not None and info.status == "running":
                    info.status = "interrupted"
        self.run_index += 1
        self.segment = RunSegment(self.run_index, seq, _s(ts), bool(e.get("resume")), self._file,
                                  pid=_i(e.get("pid")), last_seq=seq, last_ts=_s(ts))
        r.runs.append(self.segment)
        r.objective = r.objective or _s(e.get("objective"))
        mode = e.get("mode")
        if isinstance(mode, str) and mode != self.flow:
            self._set_flow(mode)
        r.flow = self.flow
        config = e.get("config")
        if isinstance(config, dict):
            self.transient_retries = _i(config.get("transient_retries")) or self.transient_retries
            self.flaky_retries = _i(config.get("flaky_verify_retries")) or self.flaky_retries
        self._settle_attempts()
        self.task_failures.clear()
        self.unclassified.clear()
        self.ops.clear()
        self._settle_failures(everything=True)
        self.state_failures, self.state_failure_count = {}, 0
        self.state, self.in_state, self.expect_entry = None, False, None
        self.error, self.route_target, self.returned, self.ended = None, None, False, False

    def on_run_end(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        r = self.r
        outcome = _s(e.get("outcome"))
        r.outcome, r.exit_code = outcome, _i(e.get("exit_code"))
        self.ended = True
        if self.segment is not None:
            self.segment.end_seq, self.segment.end = seq, ts
            self.segment.outcome, self.segment.exit_code = outcome or "unknown", r.exit_code
        self._close_span(ts, None, None)
        if outcome in ("cancelled", "stopped"):
            for attempt in self.running.values():
                attempt.status = attempt.status or "cancelled"
            self._settle_attempts()
            return
        if outcome == "returned" and not self.returned:
            self.violation(seq, "ends_properly", "run returned without a RETURN summary")
        if str(outcome or "").startswith("complete") and self.state != "COMPLETE":
            self.violation(seq, "ends_properly", f"run completed in {self.state}, not in COMPLETE")
        for task in sorted(self.running, key=_seq_key):
            self.violation(seq, "task_transitions", f"task {task} still running at the end")
        for failure in self.unclassified.values():
            self.violation(failure.seq, "classify_before_act", "failure never classified")
        self.unclassified.clear()

    def _close_span(self, ts: str | None, trigger: str | None, to: str | None, *,
                    interrupted: bool = False) -> None:
        span = self.span
        if span is None or span.end is not None:
            return
        span.end, span.trigger, span.to = ts, trigger, to
        span.duration_ms = _ms_between(span.start, ts)
        span.interrupted = span.interrupted or interrupted

    def on_state_entry(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        state = _t(e.get("state"))
        resumed = bool(e.get("resumed"))
        if self.expect_entry is not None and state != self.expect_entry:
            self.violation(seq, "state_transitions",
                           f"entered {state} after a transition to {self.expect_entry}")
        elif self.expect_entry is None and self.span is not None and self.span.run == self.run_index \
                and not resumed:
            self.violation(seq, "state_transitions", f"entered {state} without a PHASE_TRANSITION")
        elif self.expect_entry is None and self.span is None and state != "INIT" and not resumed:
            self.violation(seq, "state_transitions", f"the run starts in {state}, not INIT")
        self._close_span(ts, None, None)
        self.expect_entry = None
        if self.route_target is not None and state != self.route_target:
            self.violation(seq, "error_route", f"ERROR routed to {self.route_target} but entered {state}")
        self.route_target = None
        self.state, self.in_state = state, True
        self.state_failures, self.state_failure_count = {}, 0
        if self.span is not None:
            self.r.states.append(self.span)  # closed above: no later event changes it
        self.span = StateSpan(str(state), seq, _s(ts), self.run_index, resumed=resumed,
                              error_type=_t(e.get("error_type")))
        if state == "ERROR":
            self.error_entries += 1
            if not e.get("error_type"):
                self.violation(seq, "error_state", "ERROR entered without an error_type")
            self.error = {"error_type": _t(e.get("error_type")), "seq": seq}

    def on_phase_transition(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        source = str(e.get("from") or "").upper()
        dest = str(e.get("to") or "").upper()
        trigger = str(e.get("trigger") or "")
        if not self.in_state:
            self.violation(seq, "state_transitions", f"transition {trigger} outside any state")
        elif source != self.state:
            self.violation(seq, "state_transitions", f"transition from {source} while in {self.state}")
        if (source, trigger, dest) not in self.transitions:
            self.violation(seq, "state_transitions",
                           f"{source} -{trigger}-> {dest} is not a transition of the {self.flow} flow")
        if dest == "ERROR":
            if trigger != "fail":
                self.violation(seq, "error_state", f"ERROR entered by '{trigger}', not 'fail'")
            if not self.state_failure_count and not any(
                    f.state == self.state for f in self.unclassified.values()):
                self.violation(seq, "error_state", f"{self.state} failed without a TOOL_FAILURE")
            for failure in self.unclassified.values():
                self.violation(seq, "classify_before_act",
                               f"moved to ERROR before failure {failure.seq} was classified")
            for failure in self.state_failures.values():
                if failure.outcome is None:
                    failure.outcome, failure.outcome_seq = "error", seq
            self.error_origin = self.state
        if self.error is not None:
            self.violation(seq, "error_route", "left ERROR without an ERROR_ROUTE")
            self.error = None
        if self.route_target is not None and dest != self.route_target:
            self.violation(seq, "error_route", f"ERROR routed to {self.route_target} but went to {dest}")
            self.route_target = None
        self._close_span(ts, trigger, dest)
        self.in_state = False
        self.expect_entry = dest
        # Operations never outlive their state (the recovery protocol runs inside a handler).
        self.ops.clear()
        self.state_failures, self.state_failure_count = {}, 0
        self._settle_failures()

    # --- failures and the recovery protocol ---
    def on_tool_failure(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        message = _s(e.get("message"))
        if message is not None and len(message) > _MESSAGE_LIMIT:
            message = message[:_MESSAGE_LIMIT] + "..."
        task = _t(e.get("task_seq"))
        failure = Failure(seq, _s(ts), _t(e.get("state")), _t(e.get("tool")), task, _t(e.get("op_id")),
                          _i(e.get("attempt")), _t(e.get("error_type")), message, self.run_index)
        key = self.r.failures.reserve()
        self.open_failures[key] = failure
        if task is not None:
            self.task_open.setdefault(task, []).append(key)
        if seq is not None:
            self.unclassified[seq] = failure
        self.state_failures[key] = failure
        self.state_failure_count += 1
        op = failure.op_id
        if op:
            state = self.ops.get(op)
            if state is None:
                self.ops[op] = _Op(task, failure)
            else:
                state.failure = failure
        if task is not None:
            self.task_failures[task] = failure
            attempt = self.running.get(task)
            if attempt is not None and seq is not None:
                if attempt.failures is None:
                    attempt.failures = [seq]
                else:
                    attempt.failures.append(seq)

    def on_failure_classified(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        failure = self.unclassified.pop(_i(e.get("failure_seq")), None)
        if failure is None:
            self.violation(seq, "classify_before_act",
                           f"classification of failure {e.get('failure_seq')}, which is unknown or "
                           "already classified")
            return
        failure.klass, failure.decision, failure.classified_seq = _t(e.get("klass")), _t(e.get("decision")), seq
        registry = REGISTRY.get(str(failure.error_type))
        if registry is not None and failure.klass and failure.klass != registry.klass.value:
            self.violation(seq, "classify_before_act",
                           f"{failure.error_type} classified {failure.klass}; the registry says "
                           f"{registry.klass.value}")

    def _unclassified_of(self, op: str | None, task: str | None) -> Failure | None:
        for failure in self.unclassified.values():
            if (op is not None and failure.op_id == op) or (
                    op is None and task is not None and failure.task_seq == task):
                return failure
        return None

    def on_retry(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        op, task = _t(e.get("op_id")), _t(e.get("task_seq"))
        self.r.retries.append({"seq": seq, "ts": _s(ts), "op_id": op, "tool": _t(e.get("tool")),
                               "task_seq": task, "attempt": _i(e.get("attempt")),
                               "wait_ms": _i(e.get("wait_ms")), "error_type": _t(e.get("error_type")),
                               "run": self.run_index})
        pending = self._unclassified_of(op, task)
        if pending is not None:
            self.violation(seq, "classify_before_act", f"RETRY before failure {pending.seq} was classified")
        state = self.ops.get(op) if op else None
        failure = state.failure if state is not None else None
        if failure is None or failure.decision != "retry":
            self.violation(seq, "emit_before_retry", f"RETRY of {op} without a failure classified retry")
        if state is None:
            return
        state.retries += 1
        if failure is not None:
            failure.outcome, failure.outcome_seq = "retried", seq
            if failure.klass == "structural":
                self.violation(seq, "retry_limit", f"{failure.error_type} is structural; {op} was retried")
                return
            limit = self.flaky_retries if failure.error_type == "flaky_test" else self.transient_retries
            if state.retries > limit:
                self.violation(seq, "retry_limit", f"{state.retries} retries of {op} (limit {limit})")
        attempt = self.running.get(task) if task is not None else None
        if attempt is not None:
            attempt.retries += 1

    def on_recovery_attempt(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        op, task = _t(e.get("op_id")), _t(e.get("task_seq"))
        strategy, success = _t(e.get("strategy")), e.get("success") is True
        self.r.recoveries.append({"seq": seq, "ts": _s(ts), "strategy": strategy, "success": success,
                                  "error_type": _t(e.get("error_type")), "task_seq": task, "op_id": op,
                                  "state": _t(e.get("state")), "run": self.run_index})
        pending = self._unclassified_of(op, task)
        if pending is not None:
            self.violation(seq, "classify_before_act",
                           f"RECOVERY_ATTEMPT before failure {pending.seq} was classified")
        if strategy == "reuse_commit" and task is not None:  # committed before a crash
            self.r.tasks.evict()
            info = self._task(task)
            info.commit = _s(e.get("commit"))
            if e.get("integrated") is True and info.integrated is None:
                self.integration_count += 1  # its TASK_INTEGRATED was lost with the crash
                info.integrated = self.integration_count
        failure: Failure | None = None
        if op:
            state = self.ops.get(op)
            failure = state.failure if state is not None else None
            if failure is None:
                self.violation(seq, "emit_before_retry", f"recovery of {op} without a TOOL_FAILURE of it")
        elif task is not None:
            failure = self.task_failures.get(task)
        if failure is not None:
            failure.outcome = f"{'recovered' if success else 'failed'}:{strategy}"
            failure.outcome_seq = seq
        attempt = self.running.get(task) if task is not None else None
        if attempt is not None and strategy:
            attempt.recoveries = [*(attempt.recoveries or ()), strategy]
        if strategy in ("replan", "retry_root") and success:
            self.replan_open = True  # the merge may reopen blocked tasks (CASCADE's retry too)

    # --- ERROR ---
    def on_error_route(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        if self.error is None:
            self.violation(seq, "error_route", "ERROR_ROUTE outside ERROR")
            return
        error_type = self.error["error_type"] or "internal_error"
        expected = kind(error_type).route.value
        route = _s(e.get("route"))
        allowed = {expected}
        if self.error_entries > _MAX_ERROR_ENTRIES:
            allowed.add(Route.SUMMARY.value)
        if expected == Route.PLAN.value and self.error_origin not in ("EXPLORE", None):
            allowed.add(Route.SUMMARY.value)
        if expected == Route.CASCADE.value and self.flow == "task":
            allowed.add(Route.OBSERVE.value)
        if route not in allowed:
            self.violation(seq, "error_route", f"{error_type} routed to {route}, registry says {expected}")
        if self.error["error_type"] and e.get("error_type") not in (None, self.error["error_type"]):
            self.violation(seq, "error_route", f"ERROR_ROUTE names {e.get('error_type')}, ERROR was "
                                               f"entered with {self.error['error_type']}")
        self.route_target = _ROUTE_TARGETS.get(str(route))
        self.error = None

    def on_return(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.returned = True
        summary = e.get("summary")
        self.r.summary = summary if isinstance(summary, dict) else None
        if not summary:
            self.violation(seq, "ends_properly", "RETURN without a summary")
        if self.route_target is not None:
            self.violation(seq, "error_route", f"RETURN after a route to {self.route_target}")
            self.route_target = None

    # --- tasks ---
    def _task(self, seq: str) -> TaskInfo:
        info = self.r.tasks.get(seq)
        if info is None:
            info = self.r.tasks.add(seq, TaskInfo(seq))
        return info

    def on_plan_registered(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        depends = e.get("depends") if isinstance(e.get("depends"), dict) else {}
        slugs = e.get("slugs") if isinstance(e.get("slugs"), dict) else {}
        for task in [str(t) for t in _list(e.get("seqs")) if isinstance(t, (str, int))] or list(depends):
            self.r.tasks.evict()  # between records: no TaskInfo is held across this call
            info = self._task(task)
            if task in depends:
                info.depends = [str(d) for d in _list(depends[task])]
            info.slug = _s(slugs.get(task, info.slug))

    def on_task_start(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        tasks = self.r.tasks
        tasks.evict()  # before any TaskInfo is looked up: none is held across this call
        info = self._task(str(e.get("task_seq") or ""))
        task = info.seq  # one str object per task, shared by its attempts
        if info.slug is None:
            workspace = str(e.get("workspace_id") or "")
            info.slug = workspace[len(task) + 1:] if workspace.startswith(task + "-") else None
        if task in self.running:
            self.violation(seq, "task_transitions", f"task {task} started twice")
            self._settle_attempts(task)  # the first start's attempt stays cut
        elif info.status == "complete":
            self.violation(seq, "task_transitions", f"task {task} started again after completing")
        elif info.status == "blocked" and not self.replan_open:
            self.violation(seq, "task_transitions", f"task {task} started while blocked, without a re-plan")
        if info.depends:
            open_deps = []
            for dep in info.depends:
                dep_info = tasks.get(dep)
                if dep_info is None or dep_info.status == "complete":
                    continue
                if dep_info.status == "interrupted":
                    dep_info.status = "complete"  # the store let its dependent start
                else:
                    open_deps.append(dep)
            if open_deps:
                self.violation(seq, "task_transitions",
                               f"task {task} started before {', '.join(open_deps)} completed")
        worker = e.get("worker")
        attempt = TaskAttempt(task, _intern(worker) if type(worker) is str else _s(worker),
                              _i(e.get("attempt")), ts, seq, self.run_index)
        self.running[task] = attempt
        self.attempt_keys[task] = self.r.attempts.reserve()
        info.status, info.attempts = "running", info.attempts + 1
        if info.blocked_by:
            info.blocked_by = _NO_ROOTS
        info.error_type = info.reason = None

    def on_task_end(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        task = str(e.get("task_seq") or "")
        attempt = self.running.pop(task, None)
        if attempt is None:
            self.violation(seq, "task_transitions", f"task {task} ended without a start")
            return
        status = e.get("status")
        status = _intern(status) if type(status) is str else _s(status)
        if status not in _ENDED_TASK:
            self.violation(seq, "task_transitions", f"task {task} ended with unknown status {status}")
        pending = self._unclassified_of(None, task) if self.unclassified else None
        if pending is not None:
            self.violation(seq, "classify_before_act",
                           f"task {task} ended before failure {pending.seq} was classified")
        attempt.end, attempt.end_seq, attempt.status = ts, seq, status
        error_type = e.get("error_type")
        attempt.error_type = _intern(error_type) if type(error_type) is str else _s(error_type)
        attempt.duration_ms = _i(e.get("duration_ms"))
        attempt.commit = _s(e.get("commit"))
        cost, usage = e.get("total_cost_usd"), e.get("usage")
        if type(cost) in (int, float) and cost >= 0:
            attempt.cost_usd = float(cost)
            self.r.agent_cost_usd += float(cost)
        attempt.num_turns = _i(e.get("num_turns"))
        if isinstance(usage, dict):
            attempt.tokens = sum(v for v in usage.values() if type(v) is int and v > 0)
            self.r.agent_tokens += attempt.tokens
        if attempt.duration_ms is None:
            attempt.duration_ms = _ms_between(attempt.start, ts)
        info = self.r.tasks[attempt.seq]
        info.status = "pending" if status == "cancelled" else str(status)
        if status == "blocked":
            info.error_type = attempt.error_type
            failure = self.task_failures.get(task)
            info.reason = failure.message if failure is not None else None
        if self.task_failures:
            self.task_failures.pop(task, None)
        if self.ops:
            for op in [op for op, state in self.ops.items() if state.task_seq == task]:
                del self.ops[op]
        self.r.attempts.add(attempt, self.attempt_keys.pop(task))
        self._settle_failures(task)

    # --- worktree results ---
    def on_task_commit(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.tasks.evict()
        self._task(str(e.get("task_seq") or "")).commit = _s(e.get("commit"))

    def on_task_integrated(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.tasks.evict()
        info = self._task(str(e.get("task_seq") or ""))
        commit = _s(e.get("commit"))
        if info.integrated is not None:
            self.violation(seq, "integration", f"task {info.seq} integrated twice")
        elif commit is None or commit != info.commit:
            self.violation(seq, "integration",
                           f"task {info.seq} integrated commit {str(commit)[:12]}, not the one "
                           "committed after its verify passed")
        self.integration_count += 1
        info.integrated = self.integration_count
        self.r.integrations.add({"seq": seq, "ts": _s(ts), "order": self.integration_count,
                                 "task_seq": info.seq, "commit": commit, "head": _s(e.get("head")),
                                 "fast_forward": e.get("fast_forward") is True,
                                 "run": self.run_index})

    # --- cascade ---
    def on_cascade_status(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_STATUS, "cascade_state": _s(e.get("cascade_state")),
                               "unreachable": _list(e.get("unreachable"))})

    def on_cascade_analysis(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_ANALYSIS,
                               "recommendation": _s(e.get("recommendation")), "roots": _list(e.get("roots"))})

    def on_cascade_replan(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_REPLAN, "affected": e.get("affected")})

    def on_cascade_merge_failed(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_MERGE_FAILED,
                               "error_type": e.get("error_type"), "error": e.get("error")})

    def on_cascade_propagate(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        propagated = _list(e.get("propagated"))
        self.r.cascade.append({"seq": seq, "event": ev.CASCADE_PROPAGATE, "propagated": propagated})
        for item in propagated:
            if not isinstance(item, dict):
                continue
            self.r.tasks.evict()  # between records: no TaskInfo is held across this call
            info = self._task(str(item.get("seq")))
            if info.status == "complete":
                self.violation(seq, "task_transitions", f"complete task {info.seq} propagated as blocked")
                continue
            info.status = "blocked"
            info.blocked_by = [str(root) for root in _list(item.get("blocked_by"))]

    def on_resume(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        # Tasks the crash cut that the store still had running go back to pending; the others
        # had their outcome committed but not logged (a kill between the commit and TASK_END).
        for task in _list(e.get("reset_tasks")):
            info = self.r.tasks.get(str(task))
            if info is not None and info.status == "interrupted":
                info.status = "pending"

    def on_log_repaired(self, e: dict[str, Any], seq: int | None, ts: str | None) -> None:
        self.r.repaired.append({"seq": seq, "truncated_bytes": e.get("truncated_bytes")})

    # --- settling: records nothing can change any more leave memory for the spool ---
    def _settle_attempts(self, task: str | None = None) -> None:
        """Write out the running attempt of ``task`` (default: every one) as it stands."""
        attempts, keys = self.r.attempts, self.attempt_keys
        for name in [task] if task is not None else list(self.running):
            attempts.add(self.running.pop(name), keys.pop(name))

    def _settle_failures(self, task: str | None = None, *, everything: bool = False) -> None:
        """Write out the open failures (of ``task`` only, when given) that no later event can
        change: classified, and held by no operation, task or classification of the recovery
        protocol. At a task's end only those with an outcome go (an ERROR of the state may still
        claim the others); ``everything`` at a run's end or crash."""
        if task is not None:
            keys = self.task_open.pop(task, None)
            if not keys:
                return
        else:
            keys = list(self.open_failures)
        add, open_failures = self.r.failures.add, self.open_failures
        kept: list[int] = []
        for key in keys:
            failure = open_failures.get(key)
            if failure is None:
                continue
            if not everything and (self._held(failure) or (task is not None and failure.outcome is None)):
                kept.append(key)
                continue
            add(failure, key)
            del open_failures[key]
            self.state_failures.pop(key, None)
            if task is None and failure.task_seq is not None:
                self._unindex(failure.task_seq, key)
        if task is not None and kept:
            self.task_open[task] = kept

    def _held(self, failure: Failure) -> bool:
        """Whether the recovery protocol can still change ``failure`` (O(1) look-ups)."""
        if failure.task_seq is not None and self.task_failures.get(failure.task_seq) is failure:
            return True
        op = self.ops.get(failure.op_id) if failure.op_id else None
        if op is not None and op.failure is failure:
            return True
        return failure.seq is not None and self.unclassified.get(failure.seq) is failure

    def _unindex(self, task: str, key: int) -> None:
        keys = self.task_open.get(task)
        if keys is not None:
            try:
                keys.remove(key)
            except ValueError:
                return
            if not keys:
                del self.task_open[task]

    def finish(self) -> None:
        r = self.r
        r.events, r.first_ts, r.last_ts = self.count, self.first_ts, self.prev_ts
        self._close_segment()
        if self.segment is None:
            self.violation(None, "ends_properly", "the log holds no RUN_START")
        elif not self.ended:
            for failure in self.unclassified.values():
                failure.outcome = failure.outcome or "interrupted"
            self.violation(None, "ends_properly", "the log ends without RUN_END (crashed, not resumed)")
            self.segment.interrupted_state = self.state
            self.segment.interrupted_tasks = sorted(self.running, key=_seq_key)
            if self.span is not None and self.span.end is None:
                self.span.interrupted = True
                self.span.duration_ms = _ms_between(self.span.start, r.last_ts)
        elif r.outcome not in ("complete", "complete_with_blocked", "returned", "cancelled", "stopped"):
            self.violation(None, "ends_properly", f"unknown outcome {r.outcome}")
        if self.span is not None:
            r.states.append(self.span)
            self.span = None
        self._settle_attempts()
        self._settle_failures(everything=True)


def replay(paths: Iterable[Path]) -> Replay:
    """Rebuild the run from ``paths`` (read in the order given) and check every invariant.

    Args:
        paths: one or more JSONL logs of one campaign, oldest first.

    Returns:
        The `Replay`; ``violations`` lists every broken rule with its seq. A torn last line is a
        warning (``torn_tails``), never an error.

    Raises:
        OSError: a file cannot be read (the CLI checks existence first).
    """
    result = Replay()
    checker = _Checker(result)
    feed = checker.feed
    # The story is hundreds of thousands of small long-lived objects and no reference cycles:
    # the cyclic collector would rescan all of them again and again (quadratic on big logs).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path in paths:
            name = Path(path).name
            result.files.append(name)
            checker._file = name
            for event in _read(path, name, result):
                feed(event)
        checker.finish()
    finally:
        checker.handlers.clear()  # bound methods: a cycle that would keep the spool open until a GC
        if collecting:
            gc.enable()
    return result


# ---------------------------------------------------------------------------------- text

def format_ms(ms: float | None, digits: int = 1) -> str:
    """A duration for people: ``-``, ``"950 ms"``, ``"1.2 s"`` (``digits`` decimals), ``"3.5 min"``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 120_000:
        return f"{ms / 1000:.{digits}f} s"
    return f"{ms / 60000:.1f} min"


def render_text(result: Replay) -> str:
    """`text_lines` as one string (for small logs and tests; the CLI streams the lines)."""
    return "".join(text_lines(result))


def text_lines(result: Replay) -> Iterator[str]:
    """A plain-text postmortem for terminals and notes, one ``\n``-terminated line at a time:
    outcome, warnings, runs and crash boundaries, states with durations, every task attempt
    with its failures, the failures with their classification and fate, the cascade roots, and
    the violations. Lines are made as the spooled records are read: memory stays flat."""
    for line in _text_body(result):
        yield line + "\n"


def _text_body(r: Replay) -> Iterator[str]:
    yield (f"campaign {r.campaign_id}: {r.events} events, "
           f"outcome {r.outcome or 'none (the log stops mid-run)'} (exit {r.exit_code}), "
           f"{format_ms(r.duration_ms)}")
    if r.objective:
        yield f"objective: {r.objective}"
    for note in r.warnings():
        yield f"warning: {note}"
    if len(r.runs) > 1:
        yield "runs:"
        for run in r.runs:
            yield (f"  run {run.index} ({'resume' if run.resume else 'start'}) seq {run.start_seq}-"
                   f"{run.end_seq or run.last_seq}: {run.outcome or 'CRASHED'}")
    for prev, nxt in zip(r.runs, r.runs[1:]):
        if prev.crashed:
            tasks = ", ".join(prev.interrupted_tasks) or "none"
            yield (f"crash boundary before seq {nxt.start_seq} (the run was resumed): last event "
                   f"seq {prev.last_seq} in {prev.interrupted_state or '-'}, tasks in flight: {tasks}")
    yield "states:"
    for s in r.states:
        extra = f" error_type={s.error_type}" if s.error_type else ""
        leave = f" -> {s.to} ({s.trigger})" if s.trigger else (" (cut by crash)" if s.interrupted else "")
        yield (f"  seq {s.seq!s:>5} {s.state:<9} {format_ms(s.duration_ms):>9}{leave}{extra}"
               + (" [resumed]" if s.resumed else ""))
    if r.attempts:
        yield "tasks:"
        for a in r.attempts:
            line = f"  {a.seq} attempt {a.attempt} on {a.worker}: {a.status or 'interrupted'} " \
                   f"({format_ms(a.duration_ms)})"
            if a.error_type:
                line += f" {a.error_type}"
            if a.retries:
                line += f", {a.retries} retr{'y' if a.retries == 1 else 'ies'}"
            if a.failures:
                line += f", failures at seq {', '.join(map(str, a.failures))}"
            if a.commit:
                line += f", commit {a.commit[:12]}"
            if a.cost_usd is not None:
                line += f", ${a.cost_usd:.4f}" + (f" ({a.num_turns} turns)" if a.num_turns else "")
            yield line
        if r.agent_cost_usd or r.agent_tokens:
            yield f"agent cost: ${r.agent_cost_usd:.4f} total, {r.agent_tokens} tokens"
    if r.integrations:
        yield "integration (in order):"
        for item in r.integrations:
            how = "fast-forward" if item["fast_forward"] else f"merge -> {str(item['head'])[:12]}"
            yield (f"  #{item['order']} seq {item['seq']} task {item['task_seq']} commit "
                   f"{str(item['commit'])[:12]} ({how})")
    if r.failures:
        yield "failures:"
        for f in r.failures:
            where = f"task {f.task_seq} " if f.task_seq else ""
            yield (f"  seq {f.seq} {f.state} {where}{f.tool} attempt {f.attempt}: {f.error_type} "
                   f"[{f.klass or 'unclassified'}] -> {f.decision or '-'}"
                   + (f", {f.outcome}" if f.outcome else ""))
    if r.retries:
        yield "retries:"
        for retry in r.retries:
            yield (f"  seq {retry['seq']} {retry['tool']} attempt {retry['attempt']} after "
                   f"{retry['wait_ms']} ms ({retry['error_type']})")
    if r.recoveries:
        yield "recoveries:"
        for rec in r.recoveries:
            task = f" task {rec['task_seq']}" if rec.get("task_seq") else ""
            yield f"  seq {rec['seq']} {rec['strategy']}{task} success={rec['success']}"
    for index, block in enumerate(r.iter_blocks()):
        if not index:
            yield "cascade:"
        cause = f"{block['error_type']}: {block['reason']}" if block["error_type"] else "blocked"
        cause = cause.splitlines()[0] if cause else cause
        yield f"  root {block['root']} ({cause})"
        if block["blocked"]:
            yield f"    blocks {', '.join(block['blocked'])}"
    if r.violations:
        yield f"violations ({len(r.violations)}):"
        for v in r.violations:
            yield f"  seq {v.seq}: [{v.rule}] {v.message}"
    else:
        yield "invariants: all hold"


# ---------------------------------------------------------------------------------- decision diff

# Fields that make up each event's decision; everything else (ts, seq, durations, workers, op
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
        wanted = DECISION_FIELDS.get(name)
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
