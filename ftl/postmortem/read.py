"""Reading an event log tolerantly: one good line at a time, the bad ones noted, never raised.

The first step of the postmortem's one-way flow (read → check → timeline → text/JSON/HTML).
`read_log` is the hot path of a multi-GB replay; nothing here knows what an event means.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol

import orjson

MAX_DEPTH = 500  # nesting a line may have: deeper is refused, as the encoders would fail on it


class Findings(Protocol):
    """Where reading notes what it read and skipped (`ftl.postmortem.timeline.Replay` is one):
    ``files`` the file names in order, ``torn_tails`` a file name per torn last line,
    ``invalid_lines`` (a list or a spooled `Records`) a ``{file, line}`` per unreadable line."""

    files: list[str]
    torn_tails: list[str]
    invalid_lines: Any


def stream(paths: Iterable[Path], findings: Findings | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events of ``paths`` in order, one dict per good line.

    Tolerant like `ftl.events.read_events` (a torn last line of a file goes to
    ``findings.torn_tails``, a bad line elsewhere to ``findings.invalid_lines`` as ``{file, line}``),
    but without its look-ahead: only a file's last line can lack its newline, so whether a bad
    line is torn is known from the line itself. One line in memory at a time.
    """
    for path in paths:
        name = Path(path).name
        if findings is not None:
            findings.files.append(name)
        yield from read_log(path, name, findings)


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
    """Whether ``line`` nests arrays and objects deeper than `MAX_DEPTH` (brackets inside
    strings do not count). Called only for lines with that many brackets: rare."""
    depth = deepest = 0
    for char in _STRING.sub(b"", line):
        if char in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif char in (0x5D, 0x7D):
            depth -= 1
    return deepest > MAX_DEPTH


def read_log(path: Path, name: str, findings: Findings | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events of one file (`stream` for several), noting skipped lines under ``name``.

    Raises:
        OSError: the file cannot be opened or read.
    """
    # Binary lines split on b"\n" only (JSON escapes every other control character). orjson is
    # the hot path of a multi-GB replay (about 3x json.loads); whatever it refuses goes through
    # json.loads. One difference remains: an integer past 64 bits reads as a float.
    loads, error, deep = _loads, _ParseError, 2 * MAX_DEPTH
    with open(path, "rb") as handle:
        number = 0
        for line in handle:
            number += 1
            try:
                event = loads(line)
            except error:
                event = _fallback(line)
            if len(line) > deep and line.count(b"[") + line.count(b"{") > MAX_DEPTH and _too_deep(line):
                event = None  # orjson takes 1,023 levels; the encoders that write reports fail first
            if type(event) is dict:
                yield event
                continue
            if not line.decode("utf-8", errors="replace").strip():
                continue
            if findings is not None:
                if line.endswith(b"\n"):
                    findings.invalid_lines.append({"file": name, "line": number})
                else:
                    findings.torn_tails.append(name)
