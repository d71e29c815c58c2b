"""Claude Code's ``--output-format stream-json`` event stream, read line by line; pure.

``claude -p --output-format stream-json --verbose`` prints one JSON object per line (Claude Code
CLI reference, "headless mode"; Agent SDK message types):

* ``{"type": "system", "subtype": "init", "session_id", "model", ...}`` first;
* ``{"type": "assistant" | "user", "message": {...}, "session_id"}`` per turn; an assistant
  message whose text starts ``API Error: 429`` (or names ``rate_limit_error`` /
  ``overloaded_error``) is the CLI giving up on the API;
* ``{"type": "system", "subtype": "api_retry", "error_status", "retry_delay_ms", ...}`` when
  the CLI retries the API itself (newer CLIs);
* ``{"type": "result", "subtype": "success" | "error_max_turns" | "error_during_execution",
  "is_error", "result", "session_id", "num_turns", "duration_ms", "duration_api_ms",
  "total_cost_usd", "usage": {"input_tokens", "output_tokens", "cache_read_input_tokens",
  "cache_creation_input_tokens"}}`` last.

`StreamReader.feed` takes each line; unknown event types and lines that are not a JSON object
are counted (``unknown_events``, ``malformed_lines``), never fatal. `StreamReader.summary` gives
what ftl keeps of a run (`StreamSummary`). `limit_from_text` finds a rate limit or usage limit
in an error text, with the moment it lifts (a ``retry-after``, an epoch after ``|``, or a
``resets 3pm (Europe/Paris)`` clock time). No I/O, no clock: ``now`` is passed in.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ftl.errors import retry_after_ms

__all__ = ["StreamReader", "StreamSummary", "Limit", "limit_from_text", "not_logged_in",
           "TOKEN_KINDS", "KNOWN_EVENT_TYPES"]

#: Token counters kept per task, named as in the ``usage`` object (``ftl_agent_tokens_total{kind}``).
TOKEN_KINDS: tuple[str, ...] = ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                "cache_creation_input_tokens")
KNOWN_EVENT_TYPES = frozenset({"system", "assistant", "user", "result", "stream_event"})
DENIALS_KEPT = 20  # permission denials kept per run (`StreamSummary.permission_denials`)

_RATE = re.compile(r"(?i)(\b429\b|rate[_ ]limit|too many requests|overloaded|\b529\b)")
_USAGE = re.compile(r"(?i)(usage limit|limit reached|hit your (?:[\w-]+ )?limit|out of (extra )?usage"
                    r"|\b(?:session|weekly|daily|\d+-hour) limit\b)")
_EPOCH = re.compile(r"\|\s*(\d{10})\b")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
# "resets 3pm", "resets at 15:30 (Europe/Paris)", "resets Sep 15 at 7pm", "resets Jul 31, 2am".
_RESETS = re.compile(
    r"(?i)resets?\s+(?:at\s+|on\s+)?"
    r"(?:(?P<month>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+(?P<day>\d{1,2})"
    r"(?:st|nd|rd|th)?(?:\s*,\s*|\s+at\s+|\s+))?"
    r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<meridiem>am|pm)?\b(?:\s*\((?P<zone>[\w/+-]+)\))?")
# A login prompt, not a mention of /login (a limit message offers "/login to switch accounts").
_LOGIN = re.compile(r"(?i)(not logged in|please run /login|invalid api key|"
                    r"authentication_error|oauth token (has )?expired|credit balance is too low)")


@dataclass(frozen=True)
class Limit:
    """A rate limit or a usage limit seen in the stream.

    Attributes:
        kind: ``"rate_limit"`` (429 / overloaded: wait ``retry_after_ms``) or ``"usage_limit"``
            (the plan's quota: wait until ``reopens_at``).
        reopens_at: when starting agents makes sense again (UTC), or None when unknown.
        retry_after_ms: the same as a delay from ``now``, in ms, or None when unknown.
        message: the text it was read from (at most 300 characters).
    """

    kind: str
    reopens_at: datetime | None
    retry_after_ms: int | None
    message: str


def not_logged_in(text: str) -> bool:
    """True when ``text`` is the CLI's report that it has no usable credentials."""
    return bool(_LOGIN.search(text or ""))


def limit_from_text(text: str, now: datetime) -> Limit | None:
    """The rate or usage limit ``text`` reports, or None when it reports none.

    Args:
        text: an error message of the CLI or the API.
        now: the current time (aware, UTC), to turn a delay into a moment and back.

    Rules, in order: an epoch after ``|`` (``Claude AI usage limit reached|1767225600``);
    ``retry-after N`` (s, or ms when the name or unit says so); ``resets 3pm`` /
    ``resets 15:30 (Europe/Paris)`` / ``resets Sep 15 at 7pm`` (the next such moment, in the
    named zone, else in this machine's local zone: the CLI prints local time).
    """
    text = text or ""
    usage = bool(_USAGE.search(text))
    if not usage and not _RATE.search(text):
        return None
    reopens: datetime | None = None
    epoch = _EPOCH.search(text)
    retry = retry_after_ms(text)
    resets = _RESETS.search(text)
    if epoch:
        reopens = datetime.fromtimestamp(int(epoch.group(1)), timezone.utc)
    elif retry is not None:
        reopens = now + timedelta(milliseconds=retry)
    elif resets:
        month = resets.group("month")
        reopens = _next_clock_time(now, int(resets.group("hour")), int(resets.group("minute") or 0),
                                   (resets.group("meridiem") or "").lower(), resets.group("zone"),
                                   date=(_MONTHS.index(month.lower()[:3]) + 1, int(resets.group("day")))
                                   if month else None)
    delay = None if reopens is None else max(0, int((reopens - now).total_seconds() * 1000))
    return Limit("usage_limit" if usage else "rate_limit", reopens, delay, text.strip()[:300])


def _next_clock_time(now: datetime, hour: int, minute: int, meridiem: str,
                     zone: str | None, date: tuple[int, int] | None = None) -> datetime | None:
    """The next moment after ``now`` at that clock time (on ``date`` = (month, day) when given),
    in ``zone``, or in this machine's local zone when no zone or an unknown one is named."""
    if meridiem:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if meridiem == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    try:
        tz = ZoneInfo(zone) if zone else _local_zone()
    except (ZoneInfoNotFoundError, ValueError):
        tz = _local_zone()
    local = now.astimezone(tz)
    if date is None:
        candidate = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if candidate <= local:
            candidate += timedelta(days=1)
        return candidate.astimezone(timezone.utc)
    for year in (local.year, local.year + 1):  # this year's date, or next year's once passed
        try:
            candidate = local.replace(year=year, month=date[0], day=date[1], hour=hour,
                                      minute=minute, second=0, microsecond=0)
        except ValueError:  # Feb 30 and the like
            return None
        if candidate > local:
            return candidate.astimezone(timezone.utc)
    return None


def _local_zone() -> Any:
    """This machine's local time zone (the CLI prints a reset time without a zone in it)."""
    return datetime.now().astimezone().tzinfo or timezone.utc


@dataclass
class StreamSummary:
    """What ftl keeps of one ``claude -p`` run.

    Attributes:
        session_id: the Claude session (``--resume`` continues it), or None before ``init``.
        result_seen: a ``result`` event arrived (the run ended on its own terms).
        subtype: the result's subtype (``success``, ``error_max_turns``, ...), or None.
        is_error: the result's ``is_error``.
        result_text: the result's ``result`` text (the agent's last message).
        total_cost_usd: cost of the run in USD (0.0 when not reported).
        num_turns: turns used.
        duration_api_ms: time spent waiting for the API, in ms.
        usage: token counts by `TOKEN_KINDS`.
        events: JSON objects read; malformed_lines / unknown_events: lines skipped.
        errors: error texts seen (API errors in assistant messages, api_retry events, an
            error result), newest last, at most 20.
        permission_denials: tool calls Claude Code's permission settings refused, from the
            result's ``permission_denials`` and ``system/permission_denied`` events, each
            ``{"tool", "input"}`` (the call's input as JSON, scrubbed of secrets and absolute
            paths, then cut to 200 bytes), at most `DENIALS_KEPT`, in the order seen.
        denials_seen: how many denials there were in all (more than the list may hold).

    A run that ends without a result (killed, timed out) reports no cost; its ``usage`` and
    ``num_turns`` then count the assistant messages seen (each API reply once, by message id),
    so a stopped run's tokens are not lost.
    """

    session_id: str | None = None
    result_seen: bool = False
    subtype: str | None = None
    is_error: bool = False
    result_text: str = ""
    total_cost_usd: float = 0.0
    num_turns: int = 0
    duration_api_ms: int = 0
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_KINDS, 0))
    events: int = 0
    malformed_lines: int = 0
    unknown_events: int = 0
    errors: list[str] = field(default_factory=list)
    permission_denials: list[dict[str, str]] = field(default_factory=list)
    denials_seen: int = 0

    def cost_fields(self) -> dict[str, Any]:
        """The cost and usage fields ftl records per task (TASK_END, the workspace result)."""
        return {"total_cost_usd": round(self.total_cost_usd, 6), "num_turns": self.num_turns,
                "duration_api_ms": self.duration_api_ms, "usage": dict(self.usage),
                "session_id": self.session_id}


def _number(value: Any) -> float | None:
    """A finite, non-negative number, else None (a cost of 1e999 must not stick the spend cap)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf:
        return float(value)
    return None


def _text_of(message: Any) -> str:
    """The text blocks of an assistant message (``message.content[].text``), joined."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(str(block.get("text")) for block in content
                     if isinstance(block, dict) and block.get("type") == "text"
                     and isinstance(block.get("text"), str))


class StreamReader:
    """Folds stream-json lines into a `StreamSummary`; never raises on input."""

    def __init__(self) -> None:
        self.summary = StreamSummary()
        self._replies: dict[str, dict[str, int]] = {}  # assistant message id -> its usage
        self._denied: set[str] = set()  # tool_use_ids already counted

    def feed(self, line: bytes | str) -> dict[str, Any] | None:
        """Read one line; return the event object, or None for a blank or malformed line."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.strip()
        if not line:
            return None
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            self.summary.malformed_lines += 1
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.summary.malformed_lines += 1
            return None
        self.summary.events += 1
        kind = event["type"]
        if kind not in KNOWN_EVENT_TYPES:
            self.summary.unknown_events += 1
            return event
        session = event.get("session_id")
        if isinstance(session, str) and session and self.summary.session_id is None:
            self.summary.session_id = session
        if kind == "assistant":
            text = _text_of(event.get("message"))
            if text.startswith("API Error") or (event.get("error") and text):
                self._error(text)
            self._reply_usage(event.get("message"))
        elif kind == "system" and event.get("subtype") == "permission_denied":
            self._denial(event.get("tool_name"), event.get("tool_use_id"), event.get("tool_input"))
        elif kind == "system" and event.get("subtype") == "api_retry":
            status, delay = event.get("error_status"), _number(event.get("retry_delay_ms"))
            detail = f"API Error: {status} {event.get('error') or ''}".strip()
            self._error(detail + (f" retry-after-ms {int(delay)}" if delay is not None else ""))
        elif kind == "result":
            self._result(event)
        return event

    def _error(self, text: str) -> None:
        self.summary.errors = [*self.summary.errors, text[:1000]][-20:]

    def _reply_usage(self, message: Any) -> None:
        """Count an assistant message's tokens until a result gives the run's own totals (a
        reply streamed in parts repeats its id; its latest usage stands)."""
        if self.summary.result_seen or not isinstance(message, dict):
            return
        reply, usage = message.get("id"), message.get("usage")
        if not isinstance(reply, str) or not isinstance(usage, dict):
            return
        self._replies[reply] = {name: int(count) for name in TOKEN_KINDS
                                if (count := _number(usage.get(name))) is not None}
        self.summary.num_turns = len(self._replies)
        self.summary.usage = {name: sum(seen.get(name, 0) for seen in self._replies.values())
                              for name in TOKEN_KINDS}

    def _denial(self, tool: Any, tool_use_id: Any, tool_input: Any) -> None:
        if isinstance(tool_use_id, str) and tool_use_id:
            if tool_use_id in self._denied:
                return
            self._denied.add(tool_use_id)
        summary = self.summary
        summary.denials_seen += 1
        if len(summary.permission_denials) >= DENIALS_KEPT:
            return
        from ftl.sanitize import sanitize_text, truncate_utf8

        try:
            shown = json.dumps(tool_input, sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):
            shown = ""
        # scrubbed whole, then cut: a secret cut first (a PEM block's end) would no longer match
        summary.permission_denials.append({"tool": str(tool)[:100] if tool else "?",
                                           "input": truncate_utf8(sanitize_text(shown), 200)})

    def _result(self, event: dict[str, Any]) -> None:
        summary = self.summary
        summary.result_seen = True
        summary.subtype = event.get("subtype") if isinstance(event.get("subtype"), str) else None
        summary.is_error = event.get("is_error") is True
        text = event.get("result")
        summary.result_text = text if isinstance(text, str) else ""
        if isinstance(event.get("session_id"), str) and event["session_id"]:
            summary.session_id = event["session_id"]
        cost = _number(event.get("total_cost_usd"))
        summary.total_cost_usd = cost if cost is not None else summary.total_cost_usd
        turns = _number(event.get("num_turns"))
        summary.num_turns = int(turns) if turns is not None else summary.num_turns
        api_ms = _number(event.get("duration_api_ms"))
        summary.duration_api_ms = int(api_ms) if api_ms is not None else summary.duration_api_ms
        usage = event.get("usage")
        if isinstance(usage, dict):
            for name in TOKEN_KINDS:
                count = _number(usage.get(name))
                if count is not None:
                    summary.usage[name] = int(count)
        denials = event.get("permission_denials")
        if isinstance(denials, list):
            for denial in denials:
                if isinstance(denial, dict):
                    self._denial(denial.get("tool_name"), denial.get("tool_use_id"),
                                 denial.get("tool_input"))
        status = event.get("api_error_status")
        if summary.is_error and (summary.result_text or status):
            prefix = f"API Error: {status} " if isinstance(status, int) else ""
            self._error(prefix + summary.result_text)
