"""Scrub secrets and bound the size of text that leaves ftl (event log lines, responses).

`scrub` removes credentials (used for the event log, which keeps everything else). Text that
leaves ftl towards a client goes through `sanitize_text` / `sanitize_value` as well: invalid
UTF-8 is replaced, control characters dropped, absolute filesystem paths cut to their last
component, and the result capped at 1 KiB on a character boundary; `looks_internal` spots
tracebacks, SQL and policy text so a surface can fall back to its safe template instead.

Patterns cover the usual carriers of credentials: bearer/basic authorization headers, URLs with
a user:password part, ``key=value`` pairs whose key names a secret, and well-known token shapes
(GitHub, Slack, AWS, OpenAI/Anthropic-style ``sk-`` keys). Rule source: ThoughtGate's
sanitising requirements and response-v2 trust boundaries (errors-and-gates reference §1.7, §2.6).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"
MESSAGE_LIMIT_BYTES = 1024


class _Lazy:
    """A regular expression compiled at its first use: this module loads on the light commands
    (``ftl campaign status``), which mostly never use it (issue 11 item 1)."""

    def __init__(self, pattern: str) -> None:
        self._pattern = pattern
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        if self._compiled is None:
            self._compiled = re.compile(self._pattern)
        return getattr(self._compiled, name)


@functools.cache
def _patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    """The secret patterns, compiled at the first text that needs them (not at import: the
    light commands import this module, and most text never reaches a pattern)."""
    return (
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


# Every pattern above needs one of these in the lower-cased text (its keyword, scheme
# separator or token prefix), so ASCII text with none of them cannot match any: most event
# fields (seqs, states, tool names) are then returned after a few substring checks instead of
# nine regular-expression passes (8 us a string; an event of 15 fields took 140 us). Only for
# ASCII: case-insensitive matching also folds letters such as "ſ" (long s) into "s", which
# lower() keeps, so other text always gets every pattern.
_TRIGGERS = ("authorization", "bearer", "://", "password", "passwd", "pwd", "secret", "token",
             "key", "gh", "github_pat", "xox", "akia", "asia", "sk-")


def scrub(text: str) -> str:
    """Return ``text`` with every recognised secret replaced by ``[REDACTED]``."""
    if not text.isascii():
        return scrub_all(text)
    lowered = text.lower()
    for trigger in _TRIGGERS:
        if trigger in lowered:
            return scrub_all(text)
    return text


def scrub_all(text: str) -> str:
    """`scrub` without the keyword pre-check: every pattern applied to ``text``."""
    for pattern, replacement in _patterns():
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


# --------------------------------------------------------------------------- client-bound text

_CONTROL = _Lazy(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps \t and \n (response-v2 04 §5)
# An absolute POSIX path: a "/" not preceded by a word, URL or path character, then segments.
_ABS_POSIX = _Lazy(r"(?<![\w.~:/\\-])(/[\w.@+~-]+)+/?")
_ABS_WINDOWS = _Lazy(r"(?<![\w])[A-Za-z]:\\(?:[^\\\s\"'<>|:*?]+\\)*[^\\\s\"'<>|:*?]*")
_FILE_URI = _Lazy(r"\bfile://[^\s\"'<>]+")
# First segments of absolute paths that name a filesystem location rather than, say, a JSON
# pointer ("/tasks/0"). Directories this process knows (home, temp, cwd, prefix) are added.
_FS_ROOTS = frozenset({
    "home", "root", "tmp", "var", "usr", "etc", "opt", "srv", "mnt", "media", "private",
    "Users", "Volumes", "proc", "sys", "dev", "run", "nix", "snap", "bin", "sbin", "boot",
    "lib", "lib64", "Library", "System", "Applications", "workspace", "work",
})
PATH_MARKER = "…"


def _known_prefixes() -> tuple[str, ...]:
    import tempfile  # here, not at import: the light commands (status) never cut paths

    found = set()
    for raw in (os.path.expanduser("~"), tempfile.gettempdir(), os.getcwd(), sys.prefix,
                sys.base_prefix, str(Path(__file__).resolve().parent.parent)):
        try:
            resolved = str(Path(raw).resolve())
        except (OSError, RuntimeError):
            continue
        if resolved not in ("/", ""):
            found.update({raw.rstrip("/"), resolved.rstrip("/")})
    return tuple(sorted(found, key=len, reverse=True))


def _is_filesystem_path(path: str) -> bool:
    first = path.lstrip("/").split("/", 1)[0]
    if first in _FS_ROOTS:
        return True
    return any(path == prefix or path.startswith(prefix + "/") for prefix in _known_prefixes())


def _last_component(path: str) -> str:
    name = path.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    return f"{PATH_MARKER}/{name}" if name else PATH_MARKER


def redact_paths(text: str) -> str:
    """Replace absolute filesystem paths by ``…/<last component>`` (``/tmp/x/plan.json`` ->
    ``…/plan.json``); JSON pointers (``/tasks/0``) and URLs are left alone.

    Rule source: response-v2 trust boundaries (no file paths in responses, reference §2.6).
    """
    text = _FILE_URI.sub(PATH_MARKER, text)
    text = _ABS_WINDOWS.sub(lambda m: _last_component(m.group(0)), text)
    return _ABS_POSIX.sub(lambda m: _last_component(m.group(0)) if _is_filesystem_path(m.group(0))
                          else m.group(0), text)


_INTERNAL = (
    _Lazy(r"Traceback \(most recent call last\)"),
    _Lazy(r"File \"[^\"]+\", line \d+"),
    _Lazy(r"\b(?:SELECT\b[^;]*?\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
               r"CREATE\s+(?:TABLE|INDEX|UNIQUE\s+INDEX)|DROP\s+TABLE|ALTER\s+TABLE|PRAGMA\s+\w+)\b"),
    _Lazy(r"\b(?:UNIQUE|NOT NULL|CHECK|FOREIGN KEY|PRIMARY KEY) constraint failed\b"),
    _Lazy(r"\b(?:permit|forbid)\s*\(\s*principal\b"),
)


def looks_internal(text: str) -> bool:
    """True when ``text`` carries internals a client must never see: a Python traceback, SQL
    (statements in upper case, as ftl's store writes them), a SQLite constraint message, or
    Cedar policy text (ThoughtGate §1.7, response-v2 §2.6)."""
    return any(pattern.search(text) for pattern in _INTERNAL)


def decode_text(value: str | bytes | bytearray) -> str:
    """Text from bytes or str with every invalid UTF-8 sequence (and lone surrogate) replaced
    by U+FFFD (ThoughtGate EC-ERR-003)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return value.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")


def sanitize_text(value: str | bytes | bytearray, limit_bytes: int = MESSAGE_LIMIT_BYTES) -> str:
    """Client-bound text: decoded (`decode_text`), control characters but tab and newline
    removed, secrets scrubbed, absolute paths cut (`redact_paths`), capped at ``limit_bytes``
    UTF-8 bytes on a character boundary (ThoughtGate EC-ERR-002/003/006)."""
    text = _CONTROL.sub("", decode_text(value))
    return truncate_utf8(redact_paths(scrub(text)), limit_bytes)


def sanitize_value(value: Any, limit_bytes: int = MESSAGE_LIMIT_BYTES) -> Any:
    """`sanitize_text` on every string inside a JSON-like value (keys kept, key strings
    included); a string that `looks_internal` becomes ``[REDACTED]``."""
    if isinstance(value, (str, bytes, bytearray)):
        text = decode_text(value)
        return REDACTED if looks_internal(text) else sanitize_text(text, limit_bytes)
    if isinstance(value, dict):
        return {sanitize_text(str(key), 256): sanitize_value(item, limit_bytes)
                for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [sanitize_value(item, limit_bytes) for item in value]
    return value
