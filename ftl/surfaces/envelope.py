"""The response-v2 envelope printed by every CLI command and lib/ script.

Shape (foundry-mcp response-v2, errors-and-gates reference §2.1-2.4)::

    {"success": bool, "data": {...}, "error": str | None,
     "meta": {"version": "response-v2", "request_id": "req_...", "warnings": [str],
              "warning_details": [{"code", "severity", "message", "context"}]}}

``success: true`` always has ``error: null``; ``success: false`` always has a non-empty error
string and ``data`` carrying ``error_code``, ``error_type``, ``details`` and ``remediation``.
Partial success (some tasks blocked, some explorers missing) is ``success: true`` plus a
``PARTIAL_FAILURE`` warning. Errors render from the registry row only.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from ftl.errors import FtlError

# ftl.sanitize (and its tempfile/shutil imports) loads only when an envelope carries warnings or
# an error: a plain success envelope is built without it (fast start, issue 11 item 1).

VERSION = "response-v2"

# Warning codes and their severities (response-v2 warning registry, reference §2.3).
WARNINGS: dict[str, str] = {
    "CONTENT_TRUNCATED": "info",
    "LIMITS_DEFAULTED": "info",
    "STATE_MIGRATION_RECOVERED": "info",
    "FALLBACK_USED": "info",
    "PARTIAL_FAILURE": "warning",
    "LOG_TAIL_REPAIRED": "warning",
    "STALE_CACHE": "warning",
}


class Warning(NamedTuple):
    """One response-v2 warning: ``code`` (a `WARNINGS` key), a message and its context."""

    code: str
    message: str
    context: dict[str, Any] | None = None

    def render(self) -> dict[str, Any]:
        from ftl.sanitize import scrub_value
        return {"code": self.code, "severity": WARNINGS.get(self.code, "warning"),
                "message": scrub_value(self.message), "context": scrub_value(self.context or {})}


def new_request_id() -> str:
    """``req_`` + 16 random hex digits."""
    return f"req_{os.urandom(8).hex()}"


def _meta(request_id: str | None, warnings: list[Warning]) -> dict[str, Any]:
    meta: dict[str, Any] = {"version": VERSION, "request_id": request_id or new_request_id(),
                            "warnings": [], "warning_details": []}
    if warnings:
        from ftl.sanitize import scrub_value
        meta["warnings"] = [scrub_value(w.message) for w in warnings]
        meta["warning_details"] = [w.render() for w in warnings]
    return meta


def success(data: Any = None, *, warnings: list[Warning] | None = None,
            request_id: str | None = None) -> dict[str, Any]:
    """A successful envelope; ``data`` defaults to ``{}`` (never at the root)."""
    return {"success": True, "data": {} if data is None else data, "error": None,
            "meta": _meta(request_id, warnings or [])}


def failure(error: FtlError, *, request_id: str | None = None,
            warnings: list[Warning] | None = None) -> dict[str, Any]:
    """A failure envelope rendered from ``error``'s registry row.

    Only the row's safe details go out, each string sanitised (`ftl.sanitize.sanitize_value`:
    secrets scrubbed, absolute paths cut, 1 KiB cap, internals redacted). An explicit message
    that carries internals (a traceback, SQL, policy text) is replaced by the row's template.
    """
    from ftl.sanitize import looks_internal, sanitize_text, sanitize_value

    row = error.kind
    data = {
        "error_code": row.v2_error_code,
        "error_type": row.v2_error_type,
        "ftl_error_type": row.error_type,
        "details": sanitize_value(error.safe_details()),
        "remediation": row.remediation,
    }
    if error.retry_after_ms is not None:
        data["retry_after_ms"] = error.retry_after_ms
    text = str(error.message or "")
    if looks_internal(text):
        text = error.template_message()
    message = sanitize_text(text) or row.error_type
    return {"success": False, "data": data, "error": message,
            "meta": _meta(request_id, warnings or [])}


def internal_failure(correlation_id: str | None = None) -> dict[str, Any]:
    """The bare envelope for an unclassified exception: fail closed, reveal nothing."""
    correlation_id = correlation_id or os.urandom(6).hex()
    return failure(FtlError("internal_error", {"correlation_id": correlation_id}))


_SCHEMA_NAMES = frozenset({"ResponseV2", "Meta", "WarningDetail"})


def __getattr__(name: str) -> Any:
    """``ResponseV2``, ``Meta`` and ``WarningDetail`` (the pydantic schema models) load on first
    use from `ftl.surfaces.envelope_model`: building an envelope never needs pydantic, so light commands
    start fast (issue 11 item 1)."""
    if name in _SCHEMA_NAMES:
        from ftl.surfaces import envelope_model
        return getattr(envelope_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
