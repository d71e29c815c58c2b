"""The value rules of a plan's fields (seqs, depends, slugs, paths, verify), without pydantic.

One definition serves two readers: the pydantic validators of `ftl.models` call these functions,
and the lean registration path `ftl.plan_rows` calls them directly, so a 10,000-task plan can be
checked without loading pydantic (issue 11 item 4). Every function raises ``ValueError`` with the
message users see (pydantic prefixes it with ``Value error, ``, which `ftl.validation` strips).

Rule sources: FTL's planner contract (``shared/reference/ftl-behaviour.md`` §5.1), tightened
where FTL only asked: seqs are numbers, slugs are kebab-case, delta paths carry no globs.
This module imports nothing of ftl's.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: A kebab-case slug. ``SLUG_RE`` is anchored with ``\Z``, so ``match`` and ``fullmatch`` agree
#: (``$`` also matched before a final newline: "add-login\n" passed, then named a workspace no
#: reference could find). ``SLUG_PATTERN`` is the unanchored body, for column checks.
SLUG_PATTERN = r"[a-z0-9]+(?:-[a-z0-9]+)*"
SLUG_RE = re.compile(rf"^{SLUG_PATTERN}\Z")
GLOB_CHARS = frozenset("*?[")
#: The canonical seqs: the strings `normalize_seq` returns unchanged (three digits, or four to six
#: without a leading zero). Checking a whole plan's seqs with it is one C loop.
CANONICAL_SEQ_RE = re.compile(r"[0-9]{3}|[1-9][0-9]{3,5}")
_ASCII_DIGITS_RE = re.compile(r"[0-9]+")


def normalize_seq(value: Any) -> str:
    """Return the canonical three-digit form of a task seq (``7``, ``"7"``, ``"007"`` -> ``"007"``).

    Raises:
        ValueError: the value is not a non-negative integer or a string of ASCII digits 0-9
            (surrounding whitespace allowed; ``str.isdigit`` would also take digits of other
            scripts, such as "١", and superscripts, which ``int`` refuses).
    """
    if type(value) is str and CANONICAL_SEQ_RE.fullmatch(value):
        return value  # already canonical, as most seqs of a written plan (10,000 tasks: 20,000 seqs)
    if isinstance(value, bool):
        raise ValueError("seq must be a number like \"001\", not a boolean")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _ASCII_DIGITS_RE.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise ValueError(f"seq must be ASCII digits (0-9) like \"001\", got {value!r}")
    if number < 0 or number > 999_999:
        raise ValueError(f"seq must be between 0 and 999999, got {number}")
    return f"{number:03d}"


def normalize_depends(value: Any) -> list[str]:
    """FTL depends ("none" | seq | [seq, ...]) as a sorted list of canonical seqs.

    Raises:
        ValueError: an element is not a seq (a comma-joined string like "001,002" is one
            invalid seq, as in FTL, so it is reported rather than guessed).
    """
    if value is None or value == "none" or value == "":
        return []
    items = value if isinstance(value, list) else [value]
    seqs = {normalize_seq(item) for item in items if item not in ("none", "", None)}
    return sorted(seqs, key=int)


def check_slug(value: str) -> str:
    """A task slug: kebab-case (a-z, 0-9 and single hyphens). Raises: ValueError."""
    if not SLUG_RE.fullmatch(value):
        raise ValueError(f"slug must be kebab-case (a-z, 0-9, '-'), got {value!r}")
    return value


def check_campaign_slug(value: str | None) -> str | None:
    """A plan's campaign slug: None or kebab-case. Raises: ValueError."""
    if value is not None and not SLUG_RE.fullmatch(value):
        raise ValueError(f"campaign must be a kebab-case slug, got {value!r}")
    return value


def check_paths(value: list[str]) -> list[str]:
    """Delta / creates paths: concrete (no glob characters ``*?[``), non-empty, relative, and
    without ``..`` parts. Raises: ValueError naming the first bad path."""
    for path in value:
        if not path or GLOB_CHARS & set(path):
            raise ValueError(f"paths must be concrete files without globs, got {path!r}")
        if path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"paths must stay inside the repository, got {path!r}")
    return value


def check_verify(value: str) -> str:
    """A verify command: not blank. Raises: ValueError."""
    if not value.strip():
        raise ValueError("verify must be a non-empty shell command")
    return value


def check_no_self_dependency(seq: str, depends: list[str]) -> None:
    """A task may not depend on itself. Raises: ValueError."""
    if seq in depends:
        raise ValueError(f"task {seq} depends on itself")


#: How many levels of objects and arrays an extra field (a key of a plan or a task beyond the
#: model's fields, kept and passed through as FTL did) may nest. The task specs are stored as
#: JSON, and neither pydantic nor orjson writes a value nested much past 250 levels: deeper
#: extras were accepted, then failed as an internal error when the plan was saved. No plan needs
#: a tenth of this.
MAX_EXTRA_DEPTH = 64
#: Key of the pydantic validation context that marks a plan as new input (`ftl.validation`
#: passes it): only new input is held to `MAX_EXTRA_DEPTH`, so a plan saved before the limit
#: existed still loads.
NEW_INPUT = "new_input"


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests objects and arrays more than ``limit`` levels deep
    (``"x"``: 0 levels, ``{"a": ["x"]}``: 2). Iterative, and stops at the first branch past the
    limit, so any depth is safe to ask about."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def non_finite_locations(value: Any) -> list[tuple[Any, ...]]:
    """Where parsed JSON ``value`` holds a number that is not finite (NaN or an infinity): each
    location as the keys and indexes leading to it (``("tasks", 0, "timeout_s")``), in document
    order; [] when there is none.

    JSON has no such numbers, yet Python's ``json.loads`` reads ``1e400`` as ``inf`` (and the
    non-standard ``NaN``/``Infinity`` literals); a plan holding one was saved with ``null`` in
    its place, so what the store kept was not what was sent (RFC 8259 §6: numbers that do not
    fit an IEEE 754 double are not interoperable). Iterative, so any nesting depth is safe.
    """
    found: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                found.append(where)
        elif isinstance(item, dict):
            stack.extend((child, (*where, key)) for key, child in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, (*where, index)) for index, child in reversed(list(enumerate(item))))
    return found


def check_extra_depth(extras: dict[str, Any]) -> None:
    """Refuse an extra field nested deeper than `MAX_EXTRA_DEPTH`.

    Raises:
        ValueError: naming the first such field and how to fix it.
    """
    for name, value in extras.items():
        if nests_deeper_than(value, MAX_EXTRA_DEPTH):
            raise ValueError(f"extra field {name!r} nests objects and arrays deeper than "
                             f"{MAX_EXTRA_DEPTH} levels; flatten it, or keep such data in a file "
                             "and give its path")

