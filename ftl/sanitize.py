"""Scrub secrets and bound the size of text that leaves ftl (event log lines, responses).

Patterns cover the usual carriers of credentials: bearer/basic authorization headers, URLs with
a user:password part, ``key=value`` pairs whose key names a secret, and well-known token shapes
(GitHub, Slack, AWS, OpenAI/Anthropic-style ``sk-`` keys). Rule source: ThoughtGate's
sanitising requirements and response-v2 trust boundaries (errors-and-gates reference §1.7, §2.6).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"
MESSAGE_LIMIT_BYTES = 1024

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(authorization\s*[:=]\s*)(bearer|basic|token)\s+[^\s\"',;]+"), rf"\1\2 {REDACTED}"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]{8,}=*"), rf"\1 {REDACTED}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/:@]+:[^\s/@]+@"), rf"\1{REDACTED}@"),
    (re.compile(r"(?i)\b([A-Za-z0-9_.\-]*(?:password|passwd|pwd|secret|token|api[_-]?key|"
                r"access[_-]?key|private[_-]?key|client[_-]?secret)[A-Za-z0-9_.\-]*)"
                r"(\s*[:=]\s*|\"\s*:\s*\")([^\s\"',;&]+)"), rf"\1\2{REDACTED}"),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{16,}\b"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}\b"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), REDACTED),
    (re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}\b"), REDACTED),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"), REDACTED),
)


def scrub(text: str) -> str:
    """Return ``text`` with every recognised secret replaced by ``[REDACTED]``."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def truncate_utf8(text: str, limit_bytes: int = MESSAGE_LIMIT_BYTES, marker: str = "…") -> str:
    """Cut ``text`` to at most ``limit_bytes`` UTF-8 bytes on a character boundary.

    The marker is counted inside the limit, so the result never exceeds it.
    """
    encoded = text.encode("utf-8")
    if len(encoded) <= limit_bytes:
        return text
    marker_bytes = len(marker.encode("utf-8"))
    if limit_bytes < marker_bytes:
        return encoded[:max(0, limit_bytes)].decode("utf-8", errors="ignore")
    return encoded[:limit_bytes - marker_bytes].decode("utf-8", errors="ignore") + marker


def scrub_value(value: Any) -> Any:
    """Scrub every string inside a JSON-like value (dicts, lists, scalars); keys are kept."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {key: scrub_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_value(item) for item in value]
    return value
