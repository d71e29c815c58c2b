"""MangleCP facts: checking client facts, time values, and the client's state-delta update.

- `validate_facts` checks the facts a client sends against the server's facts profile and turns
  them into positional `NormalFact` tuples (MangleCP spec 03 §3-5; layer 1 of spec 08 §2.1), with
  fast paths for plain facts (issue 11 item 5); `facts_error` is the error for its violations
  (spec 09 §4.1). The server runs it on every request, the client before sending (conformance C-4).
- `parse_time` / `format_time`: wire time values (spec 03 §4).
- `apply_state_delta` / `matches_pattern`: a client's working set after an invocation's
  ``state_delta`` (spec 07 §4; conformance C-9).

The wire models it checks against (`FactsProfile`, `PredicateSchema`) and `ProtocolError` come
from `ftl.manglecp.messages`; this module sits above it.
"""

from __future__ import annotations

import difflib
import json
import re
from datetime import datetime, timezone
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from ftl.manglecp.messages import PRED_MAX_LEN, PRED_RE, FactsProfile, PredicateSchema, ProtocolError

RESERVED_PREFIX = "_manglecp_"
INT53_MAX = 2**53 - 1
FACT_ISSUES = ("invalid_facts", "unknown_predicate", "arity_mismatch", "type_mismatch",
               "reserved_predicate")


# ---------------------------------------------------------------------------------------------
# Time values (spec 03 §4)

UNBOUNDED = "_"
NOW = "now"


def parse_time(value: Any, formats: Iterable[str] = ("rfc3339", "epoch_ms")) -> int | str:
    """A wire time value as epoch milliseconds, or the markers ``"now"`` / ``"_"``.

    Accepts RFC 3339 strings (``rfc3339``), integer epoch ms (``epoch_ms``), ``"now"`` and ``"_"``
    always (reference §11 item 21).

    Raises:
        ValueError: any other value, or a format the server does not advertise.
    """
    formats = set(formats)
    if value in (NOW, UNBOUNDED):
        return value
    if isinstance(value, bool):
        raise ValueError("a time is an RFC 3339 string or epoch milliseconds, not a boolean")
    if isinstance(value, int):
        if "epoch_ms" not in formats:
            raise ValueError("epoch milliseconds are not accepted by this server")
        return value
    if isinstance(value, str) and "rfc3339" in formats and "T" in value.upper():
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an RFC 3339 time") from None
        if parsed.tzinfo is None:
            raise ValueError(f"{value!r} has no UTC offset (RFC 3339 requires one)")
        return int(parsed.timestamp() * 1000)
    raise ValueError(f"{value!r} is not a time value (RFC 3339 string, epoch ms, 'now' or '_')")


def format_time(epoch_ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 UTC string with millisecond precision."""
    stamp = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------------------------------
# Fact validation (spec 03, spec 09 §4.1) - shared by the server (layer 1) and the client.


class NormalFact(NamedTuple):
    """A validated fact in positional form: an immutable ``(pred, args, t)`` tuple.

    A named tuple, not a dataclass: one is built per client fact of every request, and a frozen
    dataclass costs about twice as much to build (issue 11 item 5).

    Attributes:
        pred: predicate name.
        args: argument values (``int64`` wrappers already turned into ints).
        t: ``(start, end)`` for temporal facts, each epoch ms, ``"now"`` or ``"_"``; else None.
    """

    pred: str
    args: tuple[Any, ...]
    t: tuple[int | str, int | str] | None = None

    def key(self) -> str:
        """Identity for deduplication (spec 03 §5: provenance is not part of it).

        The repr of the normalised values: canonical (objects arrive with sorted keys), much
        cheaper than JSON, never dependent on the process (no hash()).
        """
        return repr((self.pred, self.args, self.t))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_value(value: Any, path: str) -> tuple[Any, str | None]:
    """Normalise one argument value; return (value, problem or None)."""
    if value is None:
        return None, f"{path} is null; null is a wildcard and is not allowed in asserted facts"
    if isinstance(value, bool) or isinstance(value, str):
        return value, None
    if isinstance(value, int):
        if abs(value) > INT53_MAX:
            return value, (f"{path} is outside +-(2^53-1); send it as "
                           '{"_type": "int64", "value": "<decimal>"}')
        return value, None
    if isinstance(value, float):
        return value, None
    if isinstance(value, dict) and value.get("_type") == "int64":
        text = value.get("value")
        if not (isinstance(text, str) and re.fullmatch(r"-?\d{1,19}", text)):
            return value, f"{path} int64 wrapper needs a decimal string 'value'"
        number = int(text)
        if not -(2**63) <= number < 2**63:
            return value, f"{path} int64 value out of range"
        return number, None
    if isinstance(value, list):
        items = []
        for i, item in enumerate(value):
            item, problem = _check_value(item, f"{path}[{i}]")
            if problem:
                return value, problem
            items.append(item)
        return items, None
    if isinstance(value, dict):
        if "_var" in value:
            return value, f"{path} is a variable; variables are not allowed in asserted facts"
        out = {}
        for k in sorted(value):
            item, problem = _check_value(value[k], f"{path}.{k}")
            if problem:
                return value, problem
            out[k] = item
        return out, None
    return value, f"{path} has an unsupported value"


_TYPE_OK = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "any": lambda v: True,
}


def validate_facts(facts: Sequence[Any], profile: FactsProfile | None, *,
                   reserved_ok: bool = False) -> tuple[list[NormalFact], list[dict[str, Any]]]:
    """Check client facts one by one and convert them to positional form (layer 1, spec 08 §2.1).

    Checks: object shape, predicate syntax (``^[a-z][a-z0-9_]*$``, <= 128 chars), the reserved
    ``_manglecp_`` prefix, declared predicate (when the profile declares any) with a
    ``difflib`` suggestion, ``direction`` (clients may send only ``input``/``both``), arity,
    ``arg_types``, ``named_args`` against ``arg_names``, null/variables, ``t`` for temporal
    predicates only, time values in the advertised ``time_formats``.

    Returns:
        (normalised facts, deduplicated in order, violations sorted by ``fact_index``). Each
        violation: ``fact_index``, ``predicate``, ``issue`` (one of `FACT_ISSUES`), ``message``
        and, where they apply, ``expected_arity``/``actual_arity``, ``expected_type``/
        ``actual_type``, ``argument_index``, ``suggestion``.
    """
    declared, fast = _profile_maps(profile, reserved_ok)
    formats = profile.time_formats if profile is not None else ["rfc3339", "epoch_ms"]
    violations: list[dict[str, Any]] = []
    out: list[NormalFact] = []
    seen: set[Any] = set()
    index = 0
    batch = _validate_batch(facts, fast) if fast else None
    if batch is not None:
        return batch, []

    def bad(issue: str, message: str, pred: Any = None, **extra: Any) -> None:
        entry = {"fact_index": index, "predicate": pred if isinstance(pred, str) else "",
                 "issue": issue, "message": message}
        entry.update({k: v for k, v in extra.items() if v is not None})
        violations.append(entry)

    for index, item in enumerate(facts):
        # Fast path (issue 11 item 5): a plain {"pred", "args"} fact of a declared input
        # predicate whose arguments are strings or 53-bit integers of the declared types passes
        # every check below; the fact itself is its identity because str and int never compare
        # equal (bools, floats and nested values take the full path). The type check is inlined
        # and the tuple built directly: this loop runs once per fact.
        if type(item) is dict and len(item) == 2:
            pred, args = item.get("pred"), item.get("args")
            shape = fast.get(pred) if type(pred) is str else None
            if shape is not None and type(args) is list and len(args) == len(shape):
                for value, kind in zip(args, shape):
                    if type(value) is not kind or (kind is int and not -INT53_MAX <= value <= INT53_MAX):
                        break
                else:
                    normal = _new_tuple(NormalFact, (pred, tuple(args), None))
                    if normal not in seen:
                        seen.add(normal)
                        out.append(normal)
                    continue
        if not isinstance(item, dict) and not isinstance(item, Mapping):
            bad("invalid_facts", f"fact {index} is a JSON {_json_type(item)}, not an object")
            continue
        pred = item.get("pred")
        if not isinstance(pred, str):
            bad("invalid_facts", f"fact {index} needs a string 'pred'")
            continue
        if pred.startswith(RESERVED_PREFIX) and not reserved_ok:
            bad("reserved_predicate", f"predicate names may not start with {RESERVED_PREFIX!r}", pred)
            continue
        if not PRED_RE.match(pred) or len(pred) > PRED_MAX_LEN:
            bad("invalid_facts", f"predicate {pred[:40]!r} must match ^[a-z][a-z0-9_]*$ and have at "
                f"most {PRED_MAX_LEN} characters", pred)
            continue
        schema = declared.get(pred)
        if declared and schema is None:
            close = difflib.get_close_matches(pred, sorted(declared), n=1)
            bad("unknown_predicate", f"predicate {pred!r} is not declared in the facts profile", pred,
                suggestion=close[0] if close else None)
            continue
        if schema is not None and schema.direction == "output":
            bad("invalid_facts", f"predicate {pred!r} is derived by the server; clients may not send it",
                pred)
            continue
        has_args, has_named = "args" in item and item["args"] is not None, (
            "named_args" in item and item["named_args"] is not None)
        if has_args == has_named:
            bad("invalid_facts", "a fact carries exactly one of 'args' or 'named_args'", pred)
            continue
        if has_named:
            named = item["named_args"]
            names = schema.arg_names if schema is not None else None
            if not isinstance(named, Mapping) or not names:
                bad("invalid_facts", f"predicate {pred!r} has no declared arg_names; use 'args'", pred)
                continue
            unknown = sorted(set(named) - set(names))
            missing = [n for n in names if n not in named]
            if unknown or missing:
                bad("invalid_facts", f"named_args must be exactly {names}; unknown {unknown}, "
                    f"missing {missing}", pred)
                continue
            args = [named[n] for n in names]
        else:
            args = item["args"]
            if not isinstance(args, list):
                bad("invalid_facts", "'args' must be an array", pred)
                continue
        if schema is not None and len(args) != schema.arity:
            bad("arity_mismatch", f"predicate {pred!r} takes {schema.arity} argument(s), got {len(args)}",
                pred, expected_arity=schema.arity, actual_arity=len(args))
            continue
        values: list[Any] = []
        failed = False
        for position, value in enumerate(args):
            value, problem = _check_value(value, f"argument {position}")
            if problem:
                bad("invalid_facts", problem, pred, argument_index=position)
                failed = True
                break
            wanted = (schema.arg_types[position] if schema is not None and schema.arg_types
                      and position < len(schema.arg_types) else "any")
            if not _TYPE_OK[wanted](value):
                bad("type_mismatch", f"argument {position} of {pred!r} must be a {wanted}", pred,
                    argument_index=position, expected_type=wanted, actual_type=_json_type(value))
                failed = True
                break
            values.append(value)
        if failed:
            continue
        interval = None
        t = item.get("t")
        if t is not None:
            if schema is not None and not schema.temporal:
                bad("invalid_facts", f"predicate {pred!r} is not temporal; drop 't'", pred)
                continue
            try:
                interval = _interval(t, formats)
            except ValueError as exc:
                bad("invalid_facts", f"bad temporal annotation: {exc}", pred)
                continue
        normal = NormalFact(pred, tuple(values), interval)
        identity = normal if interval is None and all(
            type(v) is str or type(v) is int for v in normal.args) else normal.key()
        if identity not in seen:
            seen.add(identity)
            out.append(normal)
    violations.sort(key=lambda v: v["fact_index"])
    return out, violations


_new_tuple = tuple.__new__  # builds a NormalFact without its Python-level __new__


def _validate_batch(facts: Sequence[Any], fast: Mapping[str, tuple[type, ...]]) -> list[NormalFact] | None:
    """`validate_facts` for a batch in which every fact takes the fast path (a plain
    ``{"pred", "args"}`` of a predicate in ``fast`` whose arguments have exactly its types, ints
    within 53 bits), checked with whole-list operations that run in C rather than one Python
    step per fact (issue 11 item 5: batch validation). Returns the deduplicated facts in order,
    or None when any fact needs the per-fact checks (which then report the violations)."""
    try:
        if set(map(type, facts)) != {dict} or set(map(len, facts)) != {2}:
            return None
        preds = list(map(itemgetter("pred"), facts))
        args = list(map(itemgetter("args"), facts))
        if set(map(type, args)) != {list}:
            return None
        arities = set(zip(preds, map(len, args)))
        if any(len(fast.get(pred, ())) != arity for pred, arity in arities):
            return None  # an unknown predicate or a wrong arity (arity 0 has no fast shape)
        if set(map(type, chain.from_iterable(args))) != {str} or any(
                int in fast[pred] for pred, _ in arities):
            # Not all strings: each (pred, (type of each argument)) must be a fast shape.
            kinds = set(zip(preds, map(tuple, map(map, repeat(type), args))))
            if any(fast[pred] != shape for pred, shape in kinds) or any(
                    type(v) is int and not -INT53_MAX <= v <= INT53_MAX for v in chain.from_iterable(args)):
                return None
    except (KeyError, TypeError):  # a key missing, an unhashable pred
        return None
    # dict.fromkeys keeps the first of equal facts, in order; str and int never compare equal,
    # so equal tuples are the same fact.
    return list(dict.fromkeys(map(_new_tuple, repeat(NormalFact), zip(preds, map(tuple, args), repeat(None)))))


_SHAPES: dict[tuple[int, bool], tuple[Any, dict[str, PredicateSchema], dict[str, tuple[type, ...]]]] = {}


def _profile_maps(profile: FactsProfile | None, reserved_ok: bool
                  ) -> tuple[dict[str, PredicateSchema], dict[str, tuple[type, ...]]]:
    """``(declared predicates by name, their `_fast_shapes`)`` of ``profile``, computed once per
    profile object (a server validates every request and every delta fact against the same
    one). The entry holds the profile, so its id stays its own."""
    if profile is None or not profile.predicates:
        return {}, _fast_shapes({}, reserved_ok)
    key = (id(profile), reserved_ok)
    entry = _SHAPES.get(key)
    if entry is None or entry[0] is not profile:
        if len(_SHAPES) >= 64:
            _SHAPES.clear()
        declared = {p.predicate: p for p in profile.predicates}
        entry = _SHAPES[key] = (profile, declared, _fast_shapes(declared, reserved_ok))
    return entry[1], entry[2]


def _fast_shapes(declared: Mapping[str, PredicateSchema], reserved_ok: bool) -> dict[str, tuple[type, ...]]:
    """Predicate -> the Python type of each argument, for the declared non-temporal predicates
    a client may send whose arguments are all ``string`` or ``number`` (numbers as ints on the
    fast path) and whose name passes the syntax checks; the other predicates take the full path."""
    shapes: dict[str, tuple[type, ...]] = {}
    for name, schema in declared.items():
        if (schema.direction == "output" or schema.temporal or not PRED_RE.match(name)
                or len(name) > PRED_MAX_LEN or (name.startswith(RESERVED_PREFIX) and not reserved_ok)):
            continue
        types = list(schema.arg_types or [])
        if len(types) != schema.arity or any(t not in ("string", "number") for t in types):
            continue
        shapes[name] = tuple(str if t == "string" else int for t in types)
    return shapes


def _interval(t: Any, formats: Iterable[str]) -> tuple[int | str, int | str]:
    if not isinstance(t, Mapping):
        raise ValueError("'t' must be an object")
    if "at" in t:
        if set(t) - {"at"}:
            raise ValueError("a point annotation has only 'at'")
        at = parse_time(t["at"], formats)
        if at == UNBOUNDED:
            raise ValueError("'at' cannot be unbounded")
        return at, at
    if set(t) != {"start", "end"}:
        raise ValueError("an interval annotation has 'start' and 'end'")
    start, end = parse_time(t["start"], formats), parse_time(t["end"], formats)
    if isinstance(start, int) and isinstance(end, int) and start > end:
        raise ValueError("interval start is after its end")
    return start, end


def facts_error(violations: list[dict[str, Any]], id: str | None = None) -> ProtocolError:
    """The error for a batch of fact violations (spec 09 §4.1; reference §11 item 17).

    One issue kind across the batch gives that code (``reserved_predicate`` alone stays
    non-recoverable); a mixed batch gives ``invalid_facts``.
    """
    issues = {v["issue"] for v in violations}
    code = issues.pop() if len(issues) == 1 else "invalid_facts"
    return ProtocolError(code, f"{len(violations)} fact(s) failed validation.",
                         {"count": len(violations), "violations": violations}, id=id)


# ---------------------------------------------------------------------------------------------
# State delta, client side (spec 07 §4; conformance C-9)


def _delta_key(fact: Mapping[str, Any]) -> str:
    return json.dumps([fact.get("pred"), fact.get("args"), fact.get("t")], sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)


def matches_pattern(pattern: Mapping[str, Any], fact: Mapping[str, Any]) -> bool:
    """Whether a retract ``pattern`` matches ``fact``: same predicate and arity, and every
    non-null pattern argument equal to the fact's (``null`` is a wildcard; spec 07 §4)."""
    pattern_args, fact_args = pattern.get("args") or [], fact.get("args") or []
    return (pattern.get("pred") == fact.get("pred") and len(pattern_args) == len(fact_args)
            and all(p is None or p == a for p, a in zip(pattern_args, fact_args)))


def apply_state_delta(facts: Sequence[Mapping[str, Any]], delta: Mapping[str, Any] | None
                      ) -> list[dict[str, Any]]:
    """A client's working set after an invocation's ``state_delta`` (spec 07 §4; reference §6.4).

    Every retract is applied before any assert, as one step. Asserted facts re-enter as
    ``session`` facts (conformance C-9) without the server's ``source``: provenance is not part
    of a fact's identity, and a fact the client sends is the client's. Facts are deduplicated on
    (pred, args, t). Pure: the input is not changed.

    Args:
        facts: the working set, wire facts (``{"pred", "args", "t"?, ...}``).
        delta: ``{"assert": [...], "retract": [...]}`` (either may be missing), or None.
    Returns:
        the new working set, in order: kept facts, then new asserts.
    """
    delta = delta or {}
    retracts = [r for r in delta.get("retract") or [] if isinstance(r, Mapping)]
    kept = [dict(f) for f in facts if not any(matches_pattern(r, f) for r in retracts)]
    seen = {_delta_key(f) for f in kept}
    for item in delta.get("assert") or []:
        if not isinstance(item, Mapping):
            continue
        fact = {"pred": item.get("pred"), "args": list(item.get("args") or [])}
        if item.get("t") is not None:
            fact["t"] = item["t"]
        fact["category"] = "session"
        key = _delta_key(fact)
        if key not in seen:
            seen.add(key)
            kept.append(fact)
    return kept
