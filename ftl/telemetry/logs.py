"""Structured JSON logs for ftl's server-side record: one JSON object per line.

Clients see safe fields only; the log gets everything, keyed by ``correlation_id`` (ThoughtGate
REQ-CORE-004, errors-and-gates reference §1.7-1.8). Each line has ``timestamp`` (RFC 3339 UTC),
``level``, ``logger`` and ``message``, plus whichever of ``correlation_id``, ``gate``, ``tool``,
``error_type``, ``campaign_id`` and ``details`` the record carries (pass them with
``extra={...}``), and ``exception`` / ``traceback`` for records logged with ``exc_info``.
Secrets are scrubbed from every line (`ftl.sanitize.scrub`); paths and tracebacks stay, since
this is the operator's record.

Levels follow ThoughtGate: unrecoverable failures ERROR; gate denials WARNING; an approver's
rejection INFO; a caller's own mistake (bad input, unknown name) INFO (see `level_for`).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ftl.errors import FtlError
from ftl.sanitize import scrub, scrub_value

LOGGER_NAME = "ftl"
#: Record attributes copied into the JSON line when present (one name per idea, style.md).
CONTEXT_FIELDS = ("correlation_id", "gate", "tool", "error_type", "campaign_id", "details")
_CLIENT_MISTAKES = frozenset({"validation", "not_found", "authentication", "conflict"})


class JsonFormatter(logging.Formatter):
    """Formats a `logging.LogRecord` as one JSON object (sorted keys, secrets scrubbed)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = scrub_value(value)
        if record.exc_info and record.exc_info[0] is not None:
            line["exception"] = record.exc_info[0].__name__
            line["traceback"] = scrub(self.formatException(record.exc_info))
        return json.dumps(line, sort_keys=True, default=str, ensure_ascii=False)


class _FtlJsonHandler(logging.StreamHandler):
    """Marks the handler `configure` installed, so a second call replaces it."""


def configure(level: int | str = "INFO", path: Path | str | None = None, *,
              stream: TextIO | None = None, logger_name: str = LOGGER_NAME) -> logging.Handler:
    """Send the ``ftl`` loggers' records to stderr (default), ``stream`` or the file ``path``
    as JSON lines, at ``level`` and above.

    Calling it again replaces the handler it installed before (other handlers, such as the
    runner's ``.ftl/ftl.log``, are left alone). Never writes to stdout: the MCP stdio transport
    owns it.

    Args:
        level: a `logging` level or its name (``"DEBUG"``, ``"INFO"``, ...).
        path: append to this file instead (parent directories are created).
        stream: write to this text stream instead of stderr (tests).
    Returns:
        the installed handler.
    Raises:
        ValueError: an unknown level name.
    """
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else int(level)
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logger = logging.getLogger(logger_name)
    for old in [h for h in logger.handlers if isinstance(h, _FtlJsonHandler)]:
        logger.removeHandler(old)
        old.close()
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = _FtlJsonHandler(open(target, "a", encoding="utf-8"))  # noqa: SIM115
    else:
        handler = _FtlJsonHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.setLevel(numeric)
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > numeric:
        logger.setLevel(numeric)
    return handler


def level_for(error: FtlError) -> int:
    """The level an error is logged at (ThoughtGate §1.7): internal failures ERROR, an
    approver's rejection INFO, other gate refusals WARNING, a caller's mistake (validation,
    not_found, authentication, conflict) INFO, anything else (unavailable, rate limits,
    quotas) WARNING."""
    row = error.kind
    if row.v2_error_type == "internal":
        return logging.ERROR
    if row.error_type == "approval_rejected":
        return logging.INFO
    if row.gate is not None:
        return logging.WARNING
    if row.v2_error_type in _CLIENT_MISTAKES:
        return logging.INFO
    return logging.WARNING


def log_error(error: FtlError, *, correlation_id: str, tool: str | None = None,
              logger: logging.Logger | None = None, exc_info: BaseException | None = None,
              surface: str | None = None) -> None:
    """Write one record for ``error`` with its full details (not only the safe ones).

    Args:
        error: the classified error.
        correlation_id: the id the client was given.
        tool: the tool the call named, if any.
        logger: default ``logging.getLogger("ftl")``.
        exc_info: the original exception; its traceback is kept for internal errors.
        surface: where it was rendered (``"jsonrpc"``, ``"tool_result"``, ...), put first in
            the message.
    """
    logger = logger or logging.getLogger(LOGGER_NAME)
    level = level_for(error)
    prefix = f"{surface}: " if surface else ""
    logger.log(level, "%s%s: %s", prefix, error.error_type, error.message,
               exc_info=exc_info if (exc_info is not None and level >= logging.ERROR) else None,
               extra={"correlation_id": correlation_id, "gate": error.kind.gate, "tool": tool,
                      "error_type": error.error_type, "details": error.details or None})
