"""JSON-RPC 2.0 error objects for MCP clients, rendered from the error registry.

Wire shape (ThoughtGate REQ-CORE-004, errors-and-gates reference §1.7)::

    {"code": int, "message": str,
     "data": {"correlation_id", "error_type", "gate"?, "tool"?, "details"?, "retry_after"?}}

* ``code`` is the registry row's ``jsonrpc_code``: the standard -32700/-32600/-32601/-32602/
  -32603 for protocol faults, ThoughtGate's numbers for the gate kinds, -32060.. for ftl's own
  kinds; never one of the MCP SDK's reserved codes (`SDK_RESERVED_CODES`).
* ``correlation_id`` and ``error_type`` (the registry kind) are always present; the optional
  fields are omitted when empty. ``gate`` only for gate kinds; ``tool`` only when a tool call
  is the subject, never for system-level categories (internal, unavailable, rate_limit) unless
  a gate refused; ``details`` only the row's safe keys, minus those already lifted into the
  top level; ``retry_after`` (s, rounded up, ThoughtGate's unit) only for kinds whose hint
  comes from the server (rate limits, a server that is not ready).
* Everything is sanitised (`ftl.sanitize`): messages capped at 1 KiB on a character boundary,
  invalid UTF-8 replaced, secrets scrubbed, absolute paths cut, and a message carrying a
  traceback, SQL or policy text replaced by the row's template.
* An exception that is not an `FtlError` becomes ``internal_error`` (its traceback goes to the
  log under the correlation id, never to the client), and an error raised while building an
  error object yields `bare_internal_error` (ThoughtGate EC-ERR-001).

This module knows nothing of the MCP SDK: `ftl.surfaces.mcp_server` turns these dicts into ``MCPError``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import threading
import uuid
from typing import Any, Mapping

from ftl.errors import REGISTRY, FtlError
from ftl.telemetry.logs import log_error
from ftl.sanitize import looks_internal, sanitize_text, sanitize_value

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: The JSON-RPC 2.0 standard codes and the registry kind each one means on its own.
STANDARD_KINDS: Mapping[int, str] = {
    PARSE_ERROR: "parse_error", INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "method_not_found", INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal_error",
}
#: Codes the MCP SDK (mcp 2.x, ``mcp_types``) defines for itself; ftl must never send them
#: (reference §3.3: a client re-sends a call on -32020, so reusing it could run a step twice).
SDK_RESERVED_CODES = frozenset({-32000, -32001, -32020, -32021, -32022, -32042})
#: response-v2 categories of system-level faults: their errors never name a tool (§1.7).
SYSTEM_CATEGORIES = frozenset({"internal", "unavailable", "rate_limit"})
BARE_MESSAGE = "Internal error"
MAX_DETAIL_ITEMS = 50
_LIFTED = frozenset({"tool", "gate", "correlation_id", "retry_after_ms"})
_CORRELATION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")

log = logging.getLogger("ftl.surfaces.jsonrpc")


class CorrelationIds:
    """Correlation ids ``<run_id>-<n>``: unique per process run, ordered, reproducible when the
    run id is given (reference §5 rule 2: a missing id is generated from run id + seq).

    Args:
        run_id: fixed prefix (default: 12 random hex digits, once per instance).
    """

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            return f"{self.run_id}-{next(self._counter)}"


def accept_correlation_id(value: Any) -> str | None:
    """A caller-supplied correlation id if it is a short plain token (1-64 of
    ``[A-Za-z0-9._:-]``), else None, so the caller cannot inject text into logs or replies."""
    if isinstance(value, str) and _CORRELATION_RE.match(value):
        return value
    return None


def _bounded(value: Any, depth: int = 0) -> Any:
    """Cap lists at `MAX_DETAIL_ITEMS` and nesting at 8 levels, so details stay small."""
    if depth > 8:
        return "…"
    if isinstance(value, Mapping):
        return {k: _bounded(v, depth + 1) for k, v in list(value.items())[:MAX_DETAIL_ITEMS]}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        kept = [_bounded(v, depth + 1) for v in items[:MAX_DETAIL_ITEMS]]
        if len(items) > MAX_DETAIL_ITEMS:
            kept.append(f"… {len(items) - MAX_DETAIL_ITEMS} more")
        return kept
    return value


def message_for(error: FtlError, correlation_id: str) -> str:
    """The client-facing message of ``error`` (sanitised; internals fall back to the template).

    ``internal_error`` always names the given correlation id, so message and ``data`` agree.
    """
    if error.error_type == "internal_error":
        text = error.kind.message.format(correlation_id=correlation_id)
    else:
        text = str(error.message or "")
        if looks_internal(text):
            text = error.template_message()
    return sanitize_text(text) or error.error_type


def error_data(error: FtlError, correlation_id: str, *, tool: str | None = None) -> dict[str, Any]:
    """``error.data`` for ``error`` by the population rules of the module docstring."""
    row = error.kind
    data: dict[str, Any] = {"correlation_id": correlation_id, "error_type": row.error_type}
    if row.gate is not None:
        data["gate"] = row.gate
    subject = tool if tool is not None else error.details.get("tool")
    if isinstance(subject, str) and subject and (row.gate is not None
                                                 or row.v2_error_type not in SYSTEM_CATEGORIES):
        data["tool"] = sanitize_text(subject, 256)
    details = {k: v for k, v in error.safe_details().items() if k not in _LIFTED}
    if details:
        data["details"] = sanitize_value(_bounded(details))
    if row.retry_after_source == "server":
        hint = error.retry_after_ms if error.retry_after_ms is not None else error.details.get("retry_after_ms")
        if isinstance(hint, (int, float)) and not isinstance(hint, bool) and hint >= 0:
            data["retry_after"] = math.ceil(hint / 1000)
    return data


def bare_internal_error(correlation_id: Any = None) -> dict[str, Any]:
    """The last-resort error object: -32603 with only the correlation id and error type."""
    cid = accept_correlation_id(correlation_id) or uuid.uuid4().hex[:12]
    return {"code": INTERNAL_ERROR, "message": BARE_MESSAGE,
            "data": {"correlation_id": cid, "error_type": "internal_error"}}


def classify(exc: BaseException, correlation_id: str) -> FtlError:
    """``exc`` itself when it is an `FtlError`; anything else is ``internal_error`` (fail closed)."""
    if isinstance(exc, FtlError):
        return exc
    return FtlError("internal_error", {"correlation_id": correlation_id,
                                       "exception": type(exc).__name__})


def error_object(exc: BaseException, correlation_id: str | None = None, *, tool: str | None = None,
                 logger: logging.Logger | None = None, surface: str = "jsonrpc") -> dict[str, Any]:
    """The JSON-RPC ``error`` member for ``exc``; logs it (full details) under the correlation id.

    Args:
        exc: what went wrong (an `FtlError` or any exception).
        correlation_id: the request's id; generated when missing (ThoughtGate EC-ERR-004).
        tool: the tool the request named, if any.
        logger: where the record goes (default ``ftl.surfaces.jsonrpc``).
        surface: a label for the log line.
    Returns:
        ``{"code", "message", "data"}``; plain JSON. Never raises: a failure while building it
        gives `bare_internal_error` (EC-ERR-001), logged at ERROR.
    """
    cid = accept_correlation_id(correlation_id) or uuid.uuid4().hex[:12]
    try:
        error = classify(exc, cid)
        log_error(error, correlation_id=cid, tool=tool, logger=logger or log,
                  exc_info=None if isinstance(exc, FtlError) else exc, surface=surface)
        obj = {"code": error.kind.jsonrpc_code, "message": message_for(error, cid),
               "data": error_data(error, cid, tool=tool)}
        json.dumps(obj, allow_nan=False)  # must be sendable as it is
        return obj
    except Exception:  # noqa: BLE001 - the error path itself failed: answer bare
        try:
            (logger or log).error("building the error object failed", exc_info=True,
                                  extra={"correlation_id": cid, "error_type": "internal_error"})
        except Exception:  # noqa: BLE001 - logging must not stop the reply either
            pass
        return bare_internal_error(cid)


def kind_for_code(code: int, error_type: Any = None) -> str:
    """The registry kind a received JSON-RPC error stands for: ``data.error_type`` when it names
    a kind whose code matches, else the standard meaning of ``code``, else ``internal_error``."""
    if isinstance(error_type, str) and error_type in REGISTRY and REGISTRY[error_type].jsonrpc_code == code:
        return error_type
    return STANDARD_KINDS.get(code, "internal_error")
