"""Facts as clingo symbols (MangleCP reference §10.2) and the names the pipeline reserves.

A JSON value becomes a clingo term (`to_symbol`); a fact becomes one symbol, a temporal fact's
interval turned into seconds relative to the evaluation time (`fact_symbol`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import clingo

INT32_MIN, INT32_MAX = -(2**31) + 1, 2**31 - 1  # sentinels for unbounded interval ends
PHASE_ORDER = {"skeleton": 0, "flesh": 1, "dependency": 2}
RESERVED = "_manglecp_"
WHY = RESERVED + "why"
HIDDEN_TOOL = RESERVED + "hidden"  # tools a gate hides: injected per request, excluded in phase 2
# Server-tier predicates the pipeline reads: only server facts and domain rules may provide them,
# never a client (reference §7.1: a client fact must not override trust levels 2 and 3).
PIPELINE_PREDICATES = frozenset({"mandatory_for_intent", "relevant_to_intent", "prohibited",
                                 "requires_capability", "server_has_capability", "tool", "tool_requires",
                                 "conflicts_with", "prefers", "needs_skill", "context_resource"})
# Policy predicates never named in proof hints or rule coverage (reference §7.4).
DEFAULT_HIDDEN_PREDICATES = frozenset({"prohibited", "requires_capability", "server_has_capability",
                                       "configured"})


def to_symbol(value: Any) -> clingo.Symbol:
    """A JSON value as a clingo term.

    Strings -> ``String``; booleans -> ``true``/``false``; integers in 32 bits -> ``Number``,
    others -> ``big("<decimal>")``; floats -> ``float("<repr>")``; arrays -> ``list(...)``;
    objects -> ``map(kv(K, V), ...)`` with keys sorted.
    """
    if isinstance(value, bool):
        return clingo.Function("true" if value else "false")
    if isinstance(value, str):
        return clingo.String(value)
    if isinstance(value, int):
        if INT32_MIN - 1 <= value <= INT32_MAX:
            return clingo.Number(value)
        return clingo.Function("big", [clingo.String(str(value))])
    if isinstance(value, float):
        return clingo.Function("float", [clingo.String(repr(value))])
    if isinstance(value, list):
        return clingo.Function("list", [to_symbol(v) for v in value])
    if isinstance(value, Mapping):
        return clingo.Function("map", [clingo.Function("kv", [clingo.String(str(k)), to_symbol(value[k])])
                                       for k in sorted(value)])
    raise TypeError(f"cannot encode {type(value).__name__} as a fact argument")


def _relative_s(point: int | str, eval_time_ms: int, unbounded: int) -> int:
    if point == "_":
        return unbounded
    if point == "now":
        return 0
    seconds = (int(point) - eval_time_ms) // 1000
    return max(INT32_MIN + 1, min(INT32_MAX - 1, seconds))


def fact_symbol(pred: str, args: Sequence[Any], t: tuple[Any, Any] | None, eval_time_ms: int) -> clingo.Symbol:
    """A fact as a symbol; a temporal fact ``p(a)@[s,e]`` becomes ``p(a, S, E)`` with S and E in
    seconds relative to the evaluation time (``now`` = 0; reference §10.2)."""
    terms = [to_symbol(a) for a in args]
    if t is not None:
        terms += [clingo.Number(_relative_s(t[0], eval_time_ms, INT32_MIN)),
                  clingo.Number(_relative_s(t[1], eval_time_ms, INT32_MAX))]
    return clingo.Function(pred, terms)
