"""Postmortem: rebuild a campaign's run from its event log alone and check the protocol.

`replay(paths)` streams one or more logs of a campaign in order (ftl's resume appends to the
same file, so one file may hold several runs; a crashed run's log and its resume's log may also
be given as two files). A new ``RUN_START`` after a run that wrote no ``RUN_END`` is a crash
boundary. Memory is flat: each line is parsed, folded into the result and dropped; each record
of the story (a task attempt, a failure, a state stay...) goes to an on-disk spool
(`ftl.postmortem.spool`) as soon as no later event can change it, and the renderers read it
back record by record.

This module is the room's front door; the work is done, one way, by
``read`` (a log's lines, tolerantly) → ``check`` (the invariants, `RULES`) → ``timeline``
(the records and `Replay`, its JSON view) → ``text`` / ``html`` (the renderings); ``diff``
compares the decisions of two runs. The names callers use are importable from here.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Iterable

from ftl.postmortem.check import RULES, Checker
from ftl.postmortem.diff import (
    DECISION_FIELDS, Decision, DecisionDiff, LaneDiff, decisions, diff_decisions, render_diff_text,
)
from ftl.postmortem.read import read_log, stream
from ftl.postmortem.text import format_ms, render_text, text_lines
from ftl.postmortem.timeline import (
    Failure, JsonArray, Replay, RunSegment, StateSpan, TaskAttempt, TaskInfo, Violation, write_json,
)

__all__ = ["DECISION_FIELDS", "RULES", "Decision", "DecisionDiff", "Failure", "JsonArray",
           "LaneDiff", "Replay", "RunSegment", "StateSpan", "TaskAttempt", "TaskInfo", "Violation",
           "decisions", "diff_decisions", "format_ms", "render_diff_text", "render_text", "replay",
           "stream", "text_lines", "write_json"]


def replay(paths: Iterable[Path]) -> Replay:
    """Rebuild the run from ``paths`` (read in the order given) and check every invariant.

    Args:
        paths: one or more JSONL logs of one campaign, oldest first.

    Returns:
        The `Replay`; ``violations`` lists every broken rule with its seq. A torn last line is a
        warning (``torn_tails``), never an error. Close it (or use it as a context manager) to
        delete its on-disk records.

    Raises:
        OSError: a file cannot be read (the CLI checks existence first).
    """
    result = Replay()
    checker = Checker(result)
    feed = checker.feed
    # The story is hundreds of thousands of small long-lived objects and no reference cycles:
    # the cyclic collector would rescan all of them again and again (quadratic on big logs).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path in paths:
            name = Path(path).name
            result.files.append(name)
            checker.file = name
            for event in read_log(path, name, result):
                feed(event)
        checker.finish()
    finally:
        checker.handlers.clear()  # bound methods: a cycle that would keep the spool open until a GC
        if collecting:
            gc.enable()
    return result
