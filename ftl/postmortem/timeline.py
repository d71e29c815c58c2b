"""The story a log tells, as records: state stays, task attempts, failures, runs, violations.

`Replay` holds them (spooled to disk by `ftl.postmortem.spool`, so memory stays flat) and gives
the JSON view (`Replay.to_json`, streamed by `write_json`). The checker
(`ftl.postmortem.check`) fills it; the renderers (`ftl.postmortem.text`, `ftl.postmortem.html`)
read it. Nothing here reads a file or judges an event.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from itertools import islice
from operator import attrgetter
from typing import Any, Iterator

from ftl.events import ms_between
from ftl.postmortem.spool import Records, Spool, TaskTable

WARNINGS_LISTED = 20  # items of one kind named in the warnings
NO_ROOTS: list[str] = []  # shared by every unblocked task; never mutated
NODES_KEPT = 256  # distinct nodes counted in `Replay.nodes`; a log naming more is cut there


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
    """One attempt at a task, ``TASK_START`` to ``TASK_END`` (``status`` None: cut by a crash).

    ``worker`` (e.g. ``"w1"``, ``"pid 1234"``) and ``node`` (a Ray node id's first 12 hex
    characters, or ``"driver"``; issue 14) say where it ran: ``TASK_START``'s value, or
    ``TASK_END``'s when the start did not give one; ``node`` is None in logs written before
    issue 14.
    """

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
    node: str | None = None

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
    blocked_by: list[str] = field(default_factory=lambda: NO_ROOTS)  # replaced, never mutated
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
    """What a log says happened. Built by `ftl.postmortem.replay.replay`; render with
    `ftl.postmortem.text.text_lines`, `to_json` (+ `write_json`) or
    `ftl.postmortem.html.render_html`.

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
        # Attempts per node (at most NODES_KEPT nodes; `node_sort_key` orders them for people).
        self.nodes: dict[str, int] = {}
        self.nodes_cut = False  # a node past NODES_KEPT was seen (and not counted)
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
        return ms_between(self.first_ts, self.last_ts)

    @property
    def multi_node(self) -> bool:
        """Whether the attempts ran on more than one node (then the renderings name them)."""
        return len(self.nodes) > 1

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
        # Each list is named up to WARNINGS_LISTED times (the JSON lists every item): a log of
        # garbage must not make a note per line.
        notes += [f"{item['file']}: line {item['line']} is not a JSON object; it was skipped"
                  for item in islice(self.invalid_lines, WARNINGS_LISTED)]
        if len(self.invalid_lines) > WARNINGS_LISTED:
            notes.append(f"{len(self.invalid_lines) - WARNINGS_LISTED:,} more lines are not JSON "
                         "objects and were skipped (invalid_lines in --format json lists them)")
        notes += [f"seq {item['seq']}: the writer cut a torn tail of {item['truncated_bytes']} bytes "
                  "before appending" for item in islice(self.repaired, WARNINGS_LISTED)]
        if len(self.repaired) > WARNINGS_LISTED:
            notes.append(f"{len(self.repaired) - WARNINGS_LISTED:,} more torn tails were cut "
                         "(repaired in --format json lists them)")
        if self.other_campaigns:
            more = " and more" if len(self.other_campaigns) >= WARNINGS_LISTED else ""
            notes.append(f"events of other campaigns were read: {', '.join(self.other_campaigns)}{more}")
        if self.nodes_cut:
            notes.append(f"the log names more than {NODES_KEPT} nodes; attempts per node are "
                         f"counted for the first {NODES_KEPT}")
        if self.runs and self.runs[-1].outcome == "cancelled":
            notes.append("the last run was cancelled (Ctrl-C); `ftl campaign resume` continues it")
        if self.runs and self.runs[-1].outcome == "stopped":
            notes.append("the last run stopped on an error outside any state (see .ftl/ftl.log); "
                         "`ftl campaign resume` continues it")
        return notes

    def to_json(self, *, lazy: bool = False) -> dict[str, Any]:
        """JSON-ready dict: the keys of `Replay` with records as dicts; ``tasks`` is the list of
        attempts (each with its ``worker`` and ``node``), ``task_status`` the final word per
        task and ``nodes`` the attempts per node (``{}`` for a log that names no node).

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
            "crash_boundaries": self.crash_boundaries, "nodes": dict(self.nodes),
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
    Keys sorted; values JSON cannot hold are written as ``str(value)``, and so are NaN and the
    infinities (``"nan"``, ``"inf"``), which JSON has no number for."""
    encoder = json.JSONEncoder(indent=indent, sort_keys=True, default=str, allow_nan=False)
    payload = json_finite(payload)
    write = handle.write
    for chunk in encoder.iterencode(payload):
        write(chunk)
    write("\n")


def json_finite(value: Any) -> Any:
    """``value`` with every NaN or infinity float made its text (``"nan"``, ``"inf"``), so that
    it encodes as standard JSON (`write_json`, the MCP surface); a `JsonArray` stays on demand."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, JsonArray):  # still on demand: each item made finite as it is read
        return JsonArray(lambda array=value: (json_finite(item) for item in array._items()), len(value))
    if isinstance(value, dict):
        return {key: json_finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_finite(item) for item in value]
    return value


def node_sort_key(node: str) -> tuple[bool, bool, str]:
    """How nodes are listed: the driver first, then by id, an unknown node (``"?"``) last."""
    return (node == "?", node != "driver", node)
