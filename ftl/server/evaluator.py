"""Clingo-backed intent evaluation for the embedded server: the six-phase selection pipeline.

Rules live in ``ftl/server/rules/*.lp``: ``phase1_skeleton`` .. ``phase6_output`` are the
stratified rewrite of the MangleCP six-phase pipeline (spec 01 §4.1, spec 10 §4.5; reference
§10.3), and a domain file maps facts to ``mandatory_for_intent/2``, ``relevant_to_intent/3``,
``prohibited/2``, ``requires_capability/2``, ``tool_requires/2``, ``conflicts_with/2``,
``prefers/2``, ``needs_skill/2`` and ``context_resource/3``. Facts (server base facts and client
facts) enter as clingo symbols, never as program text (reference §10.2), into a fresh
``clingo.Control`` per request: through the backend, or (plain client facts, the common case)
handed to the grounder in one list per predicate by a context function (`_FactFeed`), which
saves the Python call per fact that the backend costs (issue 11 item 5).

Limits (spec 05 §3.3): the gas limit counts derived atoms after grounding
(``derivation_limit_exceeded`` with ``details.budget``); the time limit runs each evaluation in
a killable worker process (``evaluation_timeout``); a worker that exceeds its memory cap counts as
a gas overrun. A program that grounding alone cannot decide (not stratified for this input) is
``evaluation_failed``; one model is never picked among several.

Explanations (proof hints, spec 09 §5; rule coverage, spec 09 §6): when a request asks for them,
it runs on an instrumented copy of the rules in which every rule ``H :- B`` also derives
``_manglecp_why(H, RuleNo, (B1, ..., Bn))`` from the same body (B1..Bn: its positive atoms). The
derivation tree of each selected tool, the client facts it rests on, the facts no rule used and
which rules fired all come from those atoms. The reserved ``_manglecp_`` prefix keeps them apart
from anything a client can send; they never count as gas. Only predicate names leave the
evaluator, never rule text, and names on the ``hidden_predicates`` deny-list are left out.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import eq, is_, itemgetter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import clingo
import clingo.ast
from clingo.ast import ASTType, Sign

from ftl.manglecp.messages import ProtocolError
from ftl.manglecp.definitions import EvaluationInput, EvaluationResult, Selection

log = logging.getLogger("ftl.server.evaluator")

RULES_DIR = Path(__file__).with_name("rules")
PHASE_RULES: tuple[Path, ...] = tuple(sorted(RULES_DIR.glob("phase*.lp")))
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
_POLL_S = 0.02
_SYMBOL_CACHE_SIZE = 200_000  # cached fact symbols per program (about 40 MB at most)
_OUTPUT_SIGNATURES = (("final", 2), ("final_phase", 2), ("final_skill", 2), ("final_resource", 3),
                      ("excluded_report", 3))
_OUTPUT = frozenset(name for name, _ in _OUTPUT_SIGNATURES)
_FEED = RESERVED + "facts"  # the context function that hands plain client facts to the grounder
_FEEDABLE = re.compile(r"[a-z][a-z0-9_]*")  # predicate names a feed rule may be written for


# ---------------------------------------------------------------------------------------------
# Encoding JSON values as clingo symbols (reference §10.2)


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


# ---------------------------------------------------------------------------------------------
# Instrumentation for explanations


@dataclass(frozen=True)
class RuleInfo:
    """What rule coverage may say about one rule: names only, never its text.

    Attributes:
        name: ``<head predicate>#<n>`` (n-th rule with that head, in load order).
        head: head predicate name.
        positive, negative: predicate names of the positive / negated body atoms.
        intents: intent names the body requires through ``intent("<name>")``.
        hidden: the rule involves a deny-listed or reserved predicate (counted, never detailed).
    """

    name: str
    head: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    intents: frozenset[str]
    hidden: bool


class _Anonymous(clingo.ast.Transformer):
    """Names the anonymous variables of one positive atom, so it can appear in a rule head."""

    def __init__(self, start: int) -> None:
        self.count = start

    def visit_Variable(self, node: Any) -> Any:
        if node.name != "_":
            return node
        self.count += 1
        return clingo.ast.Variable(node.location, f"ManglecpAnon{self.count}")


def _intent_constants(atom: Any) -> set[str]:
    symbol = atom.symbol
    if symbol.ast_type != ASTType.Function or symbol.name != "intent" or len(symbol.arguments) != 1:
        return set()
    arg = symbol.arguments[0]
    if arg.ast_type == ASTType.SymbolicTerm and arg.symbol.type == clingo.SymbolType.String:
        return {arg.symbol.string}
    return set()


def _atom_name(atom: Any) -> str | None:
    symbol = atom.symbol
    return symbol.name if symbol.ast_type == ASTType.Function else None


def instrument(statements: Sequence[Any], hidden_predicates: Iterable[str] = ()
               ) -> tuple[list[Any], list[RuleInfo]]:
    """Add a ``_manglecp_why(Head, RuleNo, (PositiveBodyAtoms...))`` rule beside every normal
    rule with a body (facts and non-atomic heads are left alone).

    Returns:
        (statements plus their instrumented copies, one `RuleInfo` per instrumented rule, in
        RuleNo order).
    """
    hidden = set(hidden_predicates)
    out: list[Any] = []
    infos: list[RuleInfo] = []
    per_head: dict[str, int] = {}
    for statement in statements:
        out.append(statement)
        if statement.ast_type != ASTType.Rule or not statement.body:
            continue
        head = statement.head
        if (head.ast_type != ASTType.Literal or head.sign != Sign.NoSign
                or head.atom.ast_type != ASTType.SymbolicAtom or _atom_name(head.atom) is None):
            continue
        body, support, positive, negative, intents = [], [], [], [], set()
        anonymous = 0
        for literal in statement.body:
            if literal.ast_type == ASTType.Literal and literal.atom.ast_type == ASTType.SymbolicAtom:
                name = _atom_name(literal.atom)
                if literal.sign == Sign.NoSign:
                    renamer = _Anonymous(anonymous)
                    literal = renamer(literal)
                    anonymous = renamer.count
                    support.append(literal.atom.symbol)
                    if name:
                        positive.append(name)
                    intents |= _intent_constants(literal.atom)
                elif name:
                    negative.append(name)
            body.append(literal)
        head_name = _atom_name(head.atom) or ""
        per_head[head_name] = per_head.get(head_name, 0) + 1
        number = len(infos)
        names = {head_name, *positive, *negative}
        infos.append(RuleInfo(f"{head_name}#{per_head[head_name]}", head_name, tuple(positive),
                              tuple(negative), frozenset(intents),
                              bool(hidden & names) or any(n.startswith(RESERVED) for n in names)))
        location = statement.location
        why = clingo.ast.Function(location, WHY, [
            head.atom.symbol, clingo.ast.SymbolicTerm(location, clingo.Number(number)),
            clingo.ast.Function(location, "", support, 0)], 0)
        out.append(clingo.ast.Rule(location, clingo.ast.Literal(location, Sign.NoSign,
                                                                clingo.ast.SymbolicAtom(why)), body))
    return out, infos


# ---------------------------------------------------------------------------------------------
# The program: parsed once, grounded per request


class _FactFeed:
    """Grounding context: ``@_manglecp_facts(Name, Arity)`` is the list of the request's client
    fact symbols of that signature. Each signature gets one rule
    ``p(V1..Vn) :- p(V1..Vn) = @_manglecp_facts("p", n).``, so gringo adds the facts from one
    list, in C++; they are the same atoms the backend would add (clingo API: external functions
    returning a sequence of symbols)."""

    def __init__(self, groups: Mapping[tuple[str, int], list[clingo.Symbol]]) -> None:
        self.groups = groups

    def _manglecp_facts(self, name: clingo.Symbol, arity: clingo.Symbol) -> list[clingo.Symbol]:
        return self.groups.get((name.string, arity.number), [])


class _Program:
    """Rule text parsed once plus the server base facts; `run` evaluates one request."""

    def __init__(self, rule_texts: Sequence[str], server_facts: Sequence[tuple[str, list[Any]]],
                 hidden_predicates: Iterable[str] = DEFAULT_HIDDEN_PREDICATES) -> None:
        self.statements: list[Any] = []
        for text in rule_texts:
            clingo.ast.parse_string(text, self.statements.append)
        self.hidden_predicates = frozenset(hidden_predicates)
        self._instrumented: tuple[list[Any], list[RuleInfo]] | None = None
        self._symbols: dict[tuple[str, tuple[Any, ...]], clingo.Symbol] = {}
        self.server_facts = [fact_symbol(pred, args, None, 0) for pred, args in server_facts]
        self._static: dict[bool, frozenset[clingo.Symbol]] = {}
        self.static(False)  # fails fast when the rules do not load
        # What the counting path (`_run_counted`) needs: the output predicates shown, and the
        # names that decide whether a request's facts can coincide with other atoms.
        self.shown: list[Any] = list(self.statements)
        clingo.ast.parse_string(" ".join(f"#show {name}/{arity}." for name, arity in _OUTPUT_SIGNATURES),
                                self.shown.append)
        self._server_fact_count = len(set(self.server_facts))
        self._static_only = self.static(False) - set(self.server_facts)
        self._taken_names = ({"intent", "intent_param", HIDDEN_TOOL} | {s.name for s in self.server_facts}
                             | {s.name for s in self._static_only})
        self._feed_rules: dict[tuple[str, int], list[Any]] = {}
        self._reserved_heads = any(
            statement.ast_type == ASTType.Rule and statement.head.ast_type == ASTType.Literal
            and statement.head.atom.ast_type == ASTType.SymbolicAtom
            and (_atom_name(statement.head.atom) or "").startswith(RESERVED)
            for statement in self.statements)

    @property
    def explained(self) -> list[Any]:
        """The statements plus their ``_manglecp_why`` copies (`instrument`), built on the first
        request that asks for explanations: most never do, and instrumenting costs more than
        parsing (server boot, issue 11 item 2)."""
        if self._instrumented is None:
            self._instrumented = instrument(self.statements, self.hidden_predicates)
        return self._instrumented[0]

    @property
    def rules(self) -> list[RuleInfo]:
        """One `RuleInfo` per instrumented rule, in RuleNo order (see `explained`)."""
        self.explained
        assert self._instrumented is not None
        return self._instrumented[1]

    def _client_symbols(self, facts: Sequence[tuple[str, Sequence[Any], Any]],
                        eval_time_ms: int) -> list[clingo.Symbol]:
        """The symbols of ``facts`` (``[(pred, args, t)]``), in order.

        A fact without ``t`` whose arguments are strings and integers maps to the same symbol
        in every request, so its symbol is kept (``_SYMBOL_CACHE_SIZE`` at most, then the cache
        starts over): clients send the same facts again and again (the runner's campaign and
        task facts), and building a symbol through clingo's API costs more than adding it to the
        program (issue 11 item 5). The key keeps types apart (str and int never compare equal;
        bools and floats are never cached). Temporal facts depend on the evaluation time.
        """
        cache = self._symbols
        out = []
        keys: list[tuple[str, tuple[Any, ...]]] | None = []
        for pred, args, t in facts:
            if t is not None or not all(type(a) is str or type(a) is int for a in args):
                keys = None  # a temporal or bool/float/nested fact: keys do not tell symbols apart
                out.append(fact_symbol(pred, args, t, eval_time_ms))
                continue
            key = (pred, tuple(args))
            symbol = cache.get(key)
            if symbol is None:
                symbol = fact_symbol(pred, args, t, eval_time_ms)
                if len(cache) >= _SYMBOL_CACHE_SIZE:
                    cache.clear()
                cache[key] = symbol
            if keys is not None:
                keys.append(key)
            out.append(symbol)
        return out, keys

    def _plain_groups(self, facts: Sequence[tuple[str, Sequence[Any], Any]]
                      ) -> tuple[dict[tuple[str, int], list[clingo.Symbol]], int] | None:
        """The symbols of ``facts`` grouped by (predicate, arity), and how many distinct facts
        there are; None when a fact is not plain (temporal, or an argument other than a string
        or an integer) or its predicate cannot be fed (`_FactFeed`). Symbols come from the
        cache of `_client_symbols`. Whole-list operations (they run in C) rather than a Python
        step per fact: at 10,000 facts this costs less than the grounding (issue 11 item 5)."""
        try:
            if set(map(itemgetter(2), facts)) != {None}:
                return None if facts else ({}, 0)
            preds = list(map(itemgetter(0), facts))
            args = list(map(tuple, map(itemgetter(1), facts)))
            # bools and floats would share keys with ints (True == 1 == 1.0): never plain
            if set(map(type, preds)) != {str} or not set(map(type, chain.from_iterable(args))) <= {str, int}:
                return None
            keys = list(zip(preds, args))
            symbols = list(map(self._symbols.get, keys))
        except (TypeError, ValueError):  # not (pred, args, t) triples of hashable values
            return None
        cache = self._symbols
        if any(map(is_, symbols, repeat(None))):  # `is`, not ==: a symbol's == is a Python call
            if len(cache) + len(keys) > _SYMBOL_CACHE_SIZE:
                cache.clear()
            for index, symbol in enumerate(symbols):
                if symbol is None:
                    key = keys[index]
                    symbol = cache.get(key)  # an earlier duplicate may have built it
                    if symbol is None:
                        symbol = cache[key] = fact_symbol(key[0], key[1], None, 0)
                    symbols[index] = symbol
        # Equal keys share one cached symbol object (a duplicate finds the first one's), so
        # distinct facts = distinct objects: ids hash faster than the keys.
        distinct = len(set(map(id, symbols)))
        groups: dict[tuple[str, int], list[clingo.Symbol]] = {}
        lengths = list(map(len, args))
        signatures = set(zip(preds, lengths))
        if any(not _FEEDABLE.fullmatch(pred) for pred, _ in signatures):
            return None
        if len({pred for pred, _ in signatures}) == len(signatures):
            # One pass per predicate (a handful), each in C; a sort would cost more.
            for pred, arity in signatures:
                groups[(pred, arity)] = list(compress(symbols, map(eq, preds, repeat(pred))))
        else:  # a predicate at several arities (undeclared predicates): rare
            for pred, arity, symbol in zip(preds, lengths, symbols):
                groups.setdefault((pred, arity), []).append(symbol)
        return groups, distinct

    def _feed(self, pred: str, arity: int) -> list[Any]:
        """The parsed feed rule of ``pred/arity`` (see `_FactFeed`); ``pred`` matches `_FEEDABLE`."""
        rules = self._feed_rules.get((pred, arity))
        if rules is None:
            terms = ",".join(f"V{i}" for i in range(arity))
            rules = []
            clingo.ast.parse_string(f'{pred}({terms}) :- {pred}({terms}) = @{_FEED}("{pred}", {arity}).',
                                    rules.append)
            self._feed_rules[(pred, arity)] = rules
        return rules

    def _run_counted(self, request: Mapping[str, Any], injected: list[clingo.Symbol],
                     groups: Mapping[tuple[str, int], list[clingo.Symbol]], distinct_facts: int,
                     hidden: list[str]) -> dict[str, Any]:
        """`run` without explanations, when the client facts are plain (no time, strings and
        integers only) and share no predicate with the other injected atoms or the static
        closure: the client facts are fed to the grounder per predicate (`_FactFeed`), the
        derived atoms are counted, not looked up one by one, and only the output predicates
        are read from the model (``#show``). Derived = atoms of the model - distinct injected
        atoms - static atoms present (the same number `run`'s loop finds, without a clingo call
        per atom: 3x less time at 10,000 facts, issue 11 item 5)."""
        injected_count = len(injected) + distinct_facts + len(hidden) + self._server_fact_count
        injected = list(injected)
        statements = list(self.shown)
        for (pred, arity), symbols in groups.items():
            if arity:
                statements += self._feed(pred, arity)
            else:
                injected += symbols  # constants: nothing to save, the backend takes them
        injected += [clingo.Function(HIDDEN_TOOL, [clingo.String(name)]) for name in hidden]
        injected.extend(self.server_facts)
        control = self._ground(injected, False, statements, _FactFeed(groups))
        control.configuration.solve.models = 2  # type: ignore[union-attr]
        seen: list[tuple[int, list[clingo.Symbol], int]] = []

        def on_model(model: clingo.Model) -> None:
            static_present = sum(1 for atom in self._static_only if model.contains(atom))
            seen.append((len(model.symbols(atoms=True)), model.symbols(shown=True), static_present))

        control.solve(on_model=on_model)
        if len(seen) != 1:
            return _no_unique_model(seen)
        atoms, shown, static_present = seen[0]
        derived = atoms - injected_count - static_present
        return self._answer(request, shown, derived, injected_count + len(self._static_only))

    def static(self, explain: bool) -> frozenset[clingo.Symbol]:
        """The closure of the rules over the server facts alone: server base, not a request's work."""
        if explain not in self._static:
            models = self._models(self._ground(self.server_facts, explain))
            if len(models) != 1:
                raise RuntimeError("the rules have no unique model over the server facts alone")
            self._static[explain] = frozenset(models[0])
        return self._static[explain]

    def _ground(self, symbols: Iterable[clingo.Symbol], explain: bool,
                statements: Sequence[Any] | None = None, context: Any = None) -> clingo.Control:
        control = clingo.Control(["--warn=none"])
        with clingo.ast.ProgramBuilder(control) as builder:
            for statement in (statements if statements is not None
                              else self.explained if explain else self.statements):
                builder.add(statement)
        with control.backend() as backend:
            for symbol in symbols:
                backend.add_rule([backend.add_atom(symbol)])
        control.ground([("base", [])], context=context)
        return control

    @staticmethod
    def _models(control: clingo.Control) -> list[list[clingo.Symbol]]:
        """Up to two models. A stratified program has exactly one (grounding decides it; the
        solve call only confirms it); two mean negation through recursion, none a contradiction."""
        control.configuration.solve.models = 2  # type: ignore[union-attr]
        models: list[list[clingo.Symbol]] = []
        control.solve(on_model=lambda model: models.append(model.symbols(atoms=True)))
        return models

    def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Evaluate ``request`` (plain data, picklable). Returns ``{"ok": {...}}`` or ``{"error": {...}}``.

        ``request``: intent, params, facts ``[(pred, args, t)]``, eval_time_ms,
        max_facts_created, and optionally hidden (tool names), explain, coverage (bools).
        """
        eval_time_ms = request["eval_time_ms"]
        explain = bool(request.get("explain") or request.get("coverage"))
        injected = [clingo.Function("intent", [clingo.String(request["intent"])])]
        for key in sorted(request["params"]):
            value = request["params"][key]
            if isinstance(value, (str, int, float, bool)):
                injected.append(clingo.Function("intent_param", [clingo.String(key), to_symbol(value)]))
        client: dict[clingo.Symbol, int] = {}
        hidden = sorted(set(request.get("hidden", ())))
        if not explain and not self._reserved_heads:
            grouped = self._plain_groups(request["facts"])
            if grouped is not None and not {pred for pred, _ in grouped[0]} & self._taken_names:
                return self._run_counted(request, injected, grouped[0], grouped[1], hidden)
        symbols, _ = self._client_symbols(request["facts"], eval_time_ms)
        if explain:
            for index, symbol in enumerate(symbols):
                client.setdefault(symbol, index)
        injected += symbols
        injected += [clingo.Function(HIDDEN_TOOL, [clingo.String(name)]) for name in hidden]
        injected.extend(self.server_facts)
        injected_set = set(injected)
        static = self.static(explain)
        models = self._models(self._ground(injected, explain))
        if len(models) != 1:
            return _no_unique_model(models)
        model = models[0]
        derived = 0
        outputs = []
        for symbol in model:
            name = symbol.name
            if name.startswith(RESERVED):
                continue
            if symbol not in injected_set and symbol not in static:
                derived += 1
            if name in _OUTPUT:
                outputs.append(symbol)
        answer = self._answer(request, outputs, derived, len(injected_set) + len(static - injected_set))
        if explain and "ok" in answer:
            ok = answer["ok"]
            final = {tool: score for tool, score, *_ in ok["selections"]}
            why = _Explanation(model, client, self.hidden_predicates)
            if request.get("explain"):
                ok["explain"] = {"derivations": {tool: why.derivation(clingo.Function(
                                     "final", [clingo.String(tool), clingo.Number(final[tool])]))
                                                 for tool in sorted(final)},
                                 "unmatched": why.unmatched()}
            ok["rules_fired"] = why.activations
            if request.get("coverage"):
                ok["coverage"] = why.coverage(self.rules, request["intent"])
        return answer

    @staticmethod
    def _answer(request: Mapping[str, Any], outputs: Iterable[clingo.Symbol], derived: int,
                facts_evaluated: int) -> dict[str, Any]:
        """``{"ok": {selections, excluded, facts_evaluated, facts_derived}}`` from the output
        atoms of the model, or the ``derivation_limit_exceeded`` error."""
        limit = request["max_facts_created"]
        if derived > limit:
            return {"error": {"code": "derivation_limit_exceeded",
                              "message": f"Evaluation derived {derived} facts; the limit is {limit}.",
                              "details": {"budget": {"limit": limit, "consumed": derived,
                                                     "unit": "derived_facts"},
                                          "partial_results_available": False,
                                          "suggestion": "Send fewer facts or raise max_facts_created "
                                                        "up to the server's max_derived_facts."}}}
        final: dict[str, int] = {}
        phases: dict[str, set[str]] = {}
        skills: dict[str, set[str]] = {}
        resources: dict[str, dict[str, int]] = {}
        excluded: set[tuple[str, str, str]] = set()
        for symbol in outputs:
            name = symbol.name
            args = symbol.arguments
            if name == "final" and len(args) == 2:
                final[_text(args[0])] = args[1].number
            elif name == "final_phase" and len(args) == 2:
                phases.setdefault(_text(args[0]), set()).add(_text(args[1]))
            elif name == "final_skill" and len(args) == 2:
                skills.setdefault(_text(args[0]), set()).add(_text(args[1]))
            elif name == "final_resource" and len(args) == 3 and args[2].type == clingo.SymbolType.Number:
                by_uri = resources.setdefault(_text(args[0]), {})
                uri = _text(args[1])
                by_uri[uri] = max(by_uri.get(uri, 0), max(0, min(100, args[2].number)))
            elif name == "excluded_report" and len(args) == 3:
                excluded.add((_text(args[0]), _text(args[1]), _text(args[2])))
        selections = []
        for tool in sorted(final):
            phase = min(phases.get(tool, {"flesh"}), key=lambda p: PHASE_ORDER.get(p, 9))
            selections.append((tool, final[tool], phase, sorted(skills.get(tool, ())),
                               sorted(resources.get(tool, {}).items(), key=lambda r: (-r[1], r[0]))))
        return {"ok": {"selections": selections, "excluded": sorted(excluded),
                       "facts_evaluated": facts_evaluated, "facts_derived": derived}}


def _no_unique_model(models: Sequence[Any]) -> dict[str, Any]:
    return {"error": {"code": "evaluation_failed",
                      "message": "The selection rules have no unique result for these facts "
                                 "(not stratified, or contradictory).",
                      "details": {"models": "none" if not models else "several"}}}


def _text(symbol: clingo.Symbol) -> str:
    return symbol.string if symbol.type == clingo.SymbolType.String else str(symbol)


class _Explanation:
    """Derivation trees read from the ``_manglecp_why`` atoms of one model.

    Each derived atom gets a rank (1 + the highest rank among the supports of its cheapest
    derivation; atoms with no derivation are leaves of rank 0), so the chosen derivation of every
    atom is well-founded even under positive recursion; ties go to the lower rule number.
    """

    def __init__(self, model: Sequence[clingo.Symbol], client: Mapping[clingo.Symbol, int],
                 hidden: frozenset[str]) -> None:
        self.client = client
        self.hidden = hidden
        self.derivations: dict[clingo.Symbol, list[tuple[int, tuple[clingo.Symbol, ...]]]] = {}
        self.fired: set[int] = set()
        self.present: set[str] = set()
        used: set[clingo.Symbol] = set()
        for symbol in model:
            if symbol.name != WHY:
                if not symbol.name.startswith(RESERVED):
                    self.present.add(symbol.name)
                continue
            head, number, support = symbol.arguments
            body = tuple(support.arguments)
            self.derivations.setdefault(head, []).append((number.number, body))
            self.fired.add(number.number)
            used.update(body)
        self.activations = sum(len(v) for v in self.derivations.values())
        self.used_client = {client[s] for s in used if s in client}
        for options in self.derivations.values():
            options.sort(key=lambda d: (d[0], str(d[1])))
        self.rank = self._ranks()

    def _rank_of(self, symbol: clingo.Symbol, rank: Mapping[clingo.Symbol, int]) -> int:
        if symbol not in self.derivations:
            return 0  # a leaf: injected or a fact of the rule files
        return rank.get(symbol, len(self.derivations) + 2)

    def _cost(self, body: Sequence[clingo.Symbol], rank: Mapping[clingo.Symbol, int]) -> int:
        return 1 + max((self._rank_of(s, rank) for s in body), default=0)

    def _ranks(self) -> dict[clingo.Symbol, int]:
        rank: dict[clingo.Symbol, int] = {}
        changed = True
        while changed:  # Bellman-Ford style: at most (longest derivation) rounds
            changed = False
            for head, options in self.derivations.items():
                best = min(self._cost(body, rank) for _, body in options)
                if best < self._rank_of(head, rank):
                    rank[head] = best
                    changed = True
        return rank

    def derivation(self, root: clingo.Symbol) -> dict[str, Any]:
        """``{"support": [client fact indexes], "chain": [predicate names, leaves first]}``
        for the well-founded derivation tree of ``root``."""
        support: set[int] = set()
        names: dict[str, int] = {}
        seen: set[clingo.Symbol] = set()
        stack = [root]
        while stack:
            atom = stack.pop()
            if atom in seen:
                continue
            seen.add(atom)
            rank = self._rank_of(atom, self.rank)
            if not atom.name.startswith(RESERVED) and atom.name not in self.hidden:
                names[atom.name] = min(names.get(atom.name, rank), rank)
            options = self.derivations.get(atom)
            if not options:
                if atom in self.client:
                    support.add(self.client[atom])
                continue
            _, body = min(options, key=lambda d: (self._cost(d[1], self.rank), d[0]))
            stack.extend(body)
        chain = [name for name, _ in sorted(names.items(), key=lambda item: (item[1], item[0]))]
        return {"support": sorted(support), "chain": chain}

    def unmatched(self) -> list[int]:
        """Indexes of client facts no fired rule used as a positive premise."""
        return sorted(set(self.client.values()) - self.used_client)

    def coverage(self, rules: Sequence[RuleInfo], intent: str) -> dict[str, Any]:
        """Rule coverage (spec 09 §6): fired + dormant + inapplicable == total.

        A rule is ``inapplicable`` when its body names another intent; a dormant rule is
        ``dead`` when none of its positive premises has an atom, else ``partially_alive``.
        Rules touching deny-listed predicates are counted but not detailed.
        """
        fired = dormant = inapplicable = 0
        details = []
        for number, rule in enumerate(rules):
            if number in self.fired:
                fired += 1
                continue
            if rule.intents and intent not in rule.intents:
                inapplicable += 1
                continue
            dormant += 1
            if rule.hidden:
                continue
            missing = sorted({p for p in rule.positive if p not in self.present})
            status = "dead" if rule.positive and len(missing) == len(set(rule.positive)) else "partially_alive"
            details.append({"rule": rule.name, "missing_predicates": missing, "status": status})
        return {"total_rules": len(rules), "rules_fired": fired, "rules_dormant": dormant,
                "rules_inapplicable": inapplicable, "dormant_details": details}


# ---------------------------------------------------------------------------------------------
# Worker processes (killable on timeout)


def _worker_main(read_fd: int, write_fd: int) -> None:
    """Worker loop (``python -m ftl.server.evaluator READ_FD WRITE_FD``): the first message holds
    the rules, the server facts and the memory cap; then one answer per request until EOF."""
    from multiprocessing.connection import Connection
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        setup = conn_in.recv()
    except (EOFError, OSError):
        return
    if setup.get("memory_limit_bytes"):
        try:
            import resource
            limit = setup["memory_limit_bytes"]
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    try:
        program = _Program(setup["rule_texts"], setup["server_facts"], setup["hidden_predicates"])
    except Exception as exc:  # reported to the parent, which logs it
        conn_out.send({"fatal": f"{type(exc).__name__}: {exc}"})
        return
    conn_out.send({"ready": True})
    while True:
        try:
            request = conn_in.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        conn_out.send(_safe_run(program, request))


def _safe_run(program: _Program, request: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return program.run(request)
    except MemoryError:
        return {"memory": True}
    except RuntimeError as exc:
        if "bad_alloc" in str(exc) or "memory" in str(exc).lower():
            return {"memory": True}
        log.exception("evaluation failed")
        return {"error": {"code": "evaluation_failed", "message": "The selection rules failed to evaluate."}}
    except Exception:
        log.exception("evaluation failed")
        return {"error": {"code": "evaluation_failed", "message": "The selection rules failed to evaluate."}}


@dataclass
class _Worker:
    process: subprocess.Popen
    send_conn: Any
    recv_conn: Any

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for conn in (self.send_conn, self.recv_conn):
            try:
                conn.close()
            except OSError:
                pass


class ClingoEvaluator:
    """The embedded server's `Evaluator` (see `ftl.manglecp.definitions.Evaluator`).

    Args:
        domain_rules: domain rule files (e.g. ``rules/ftl_domain.lp``), loaded after the phases.
        server_facts: server base facts ``[(pred, [args...])]`` (catalog and configuration).
        phase_rules: the pipeline files (default: ``rules/phase*.lp``).
        isolation: ``"process"`` (default): evaluations run in worker processes that are
            killed on timeout, cancel or memory overrun. ``"thread"``: in-process, for tests and
            tools; a timeout abandons the evaluation thread (clingo grounding cannot be
            interrupted), so use it only with trusted, terminating rules.
        workers: maximum concurrent worker processes.
        memory_limit_bytes: address-space cap per worker (RLIMIT_AS), or None.
        hidden_predicates: policy predicates never named in proof hints or rule coverage.
    Raises:
        ProtocolError(evaluation_failed): the rules do not parse or ground (at construction for
            ``thread``, at the first evaluation for ``process``).
    """

    def __init__(self, domain_rules: Sequence[Path], server_facts: Sequence[tuple[str, Sequence[Any]]] = (),
                 *, phase_rules: Sequence[Path] = PHASE_RULES, isolation: str = "process",
                 workers: int = 2, memory_limit_bytes: int | None = 2 * 1024**3,
                 hidden_predicates: Iterable[str] = DEFAULT_HIDDEN_PREDICATES) -> None:
        if isolation not in ("process", "thread"):
            raise ValueError("isolation must be 'process' or 'thread'")
        self.rule_texts = [Path(p).read_text(encoding="utf-8") for p in (*phase_rules, *domain_rules)]
        self.server_facts = [(pred, list(args)) for pred, args in server_facts]
        self.isolation = isolation
        self.workers = max(1, workers)
        self.memory_limit_bytes = memory_limit_bytes
        self.hidden_predicates = sorted(set(hidden_predicates))
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        self._program: _Program | None = None
        # Thread isolation shares one parsed program (clingo AST objects and the static closure
        # cache); concurrent use of them from several threads crashed a child process (SIGSEGV)
        # once in CI, so evaluations in this mode run one at a time.
        self._thread_eval_lock = threading.Lock()
        if isolation == "thread":
            try:
                self._program = _Program(self.rule_texts, self.server_facts, self.hidden_predicates)
            except RuntimeError as exc:
                raise ProtocolError("evaluation_failed", "The selection rules do not load.",
                                    {"problem": str(exc)[:200]}) from None

    # -- public --------------------------------------------------------------------------------

    def warm(self) -> None:
        """Start one worker now (process isolation), so the first request does not wait for it."""
        if self.isolation == "process":
            self._release(self._acquire())

    def evaluate(self, request: EvaluationInput) -> EvaluationResult:
        """Run the pipeline for ``request``; see the class doc for the errors raised."""
        # NormalFacts are (pred, args, t) tuples already; a worker process gets plain tuples
        # (cheaper to pickle than named ones).
        facts: Sequence[tuple[str, Sequence[Any], Any]] = (
            request.facts if self.isolation == "thread" else [tuple(f) for f in request.facts])
        plain = {"intent": request.intent, "params": dict(request.params), "facts": facts,
                 "eval_time_ms": request.eval_time_ms,
                 "max_facts_created": request.max_facts_created,
                 "hidden": sorted(request.hidden_tools), "explain": request.explain,
                 "coverage": request.rule_coverage}
        timeout_s = None if request.max_compute_ms is None else request.max_compute_ms / 1000
        if self.isolation == "thread":
            answer = self._run_thread(plain, timeout_s, request.cancel, request.max_compute_ms)
        else:
            answer = self._run_process(plain, timeout_s, request.cancel, request.max_compute_ms)
        if "memory" in answer:
            raise ProtocolError("derivation_limit_exceeded",
                                "Evaluation ran out of memory before finishing.",
                                {"budget": {"limit": request.max_facts_created,
                                            "consumed": request.max_facts_created,
                                            "unit": "derived_facts"},
                                 "partial_results_available": False})
        if "error" in answer:
            error = answer["error"]
            raise ProtocolError(error["code"], error["message"], error.get("details"))
        ok = answer["ok"]
        facts = request.facts
        explained = ok.get("explain") or {}
        derivations = explained.get("derivations", {})
        selections = []
        for tool, score, phase, skills, resources in ok["selections"]:
            why = derivations.get(tool, {})
            selections.append(Selection(
                tool, score, phase, tuple(why.get("chain", ())), tuple(skills),
                tuple((uri, priority) for uri, priority in resources),
                tuple(facts[i] for i in why.get("support", ()))))
        return EvaluationResult(
            selections=tuple(selections), excluded=tuple(tuple(e) for e in ok["excluded"]),
            facts_evaluated=ok["facts_evaluated"], facts_derived=ok["facts_derived"],
            unmatched=tuple(facts[i] for i in explained.get("unmatched", ())),
            rules_fired=ok.get("rules_fired"), rule_coverage=ok.get("coverage"))

    def close(self) -> None:
        """Stop every worker process."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            try:
                worker.send_conn.send(None)
            except OSError:
                pass
            worker.kill()

    # -- thread isolation ----------------------------------------------------------------------

    def _run_thread(self, plain: dict, timeout_s: float | None, cancel: threading.Event | None,
                    limit_ms: int | None) -> dict[str, Any]:
        assert self._program is not None
        box: dict[str, Any] = {}
        def evaluate() -> None:
            with self._thread_eval_lock:
                box.update(_safe_run(self._program, plain))

        thread = threading.Thread(target=evaluate, name="ftl-eval", daemon=True)
        started = time.monotonic()
        thread.start()
        while thread.is_alive():
            thread.join(_POLL_S)
            if cancel is not None and cancel.is_set():
                raise ProtocolError("cancelled", "The evaluation was cancelled.")
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise _timeout(limit_ms, started)
        return box

    # -- process isolation ---------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        # A plain subprocess (not multiprocessing): no re-import of the caller's __main__, and
        # its stdout is closed so it can never write into a stdio transport.
        from multiprocessing.connection import Connection

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "ftl.server.evaluator", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, close_fds=True, env=_worker_env())
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        worker = _Worker(process, Connection(to_child_w, readable=False),
                         Connection(from_child_r, writable=False))
        try:
            worker.send_conn.send({"rule_texts": self.rule_texts, "server_facts": self.server_facts,
                                   "memory_limit_bytes": self.memory_limit_bytes,
                                   "hidden_predicates": self.hidden_predicates})
            hello = worker.recv_conn.recv() if worker.recv_conn.poll(60) else {"fatal": "no answer"}
        except (EOFError, OSError):
            hello = {"fatal": "worker exited while starting"}
        if "fatal" in hello:
            worker.kill()
            log.error("evaluation worker failed to start: %s", hello["fatal"])
            raise ProtocolError("evaluation_failed", "The selection rules do not load.")
        return worker

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise ProtocolError("server_not_ready", "The evaluator is shut down.",
                                        {"status": "draining"})
                if self._idle:
                    return self._idle.pop()
                if self._count < self.workers:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return self._spawn()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None or self._closed:
                self._count -= 1
                if worker is not None:
                    worker.kill()
            else:
                self._idle.append(worker)
            self._cond.notify()

    def _run_process(self, plain: dict, timeout_s: float | None, cancel: threading.Event | None,
                     limit_ms: int | None) -> dict[str, Any]:
        worker = self._acquire()
        started = time.monotonic()
        try:
            worker.send_conn.send(plain)
            while not worker.recv_conn.poll(_POLL_S):
                if cancel is not None and cancel.is_set():
                    raise ProtocolError("cancelled", "The evaluation was cancelled.")
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    raise _timeout(limit_ms, started)
                if worker.process.poll() is not None:
                    raise EOFError("worker exited")
            answer = worker.recv_conn.recv()
        except ProtocolError:
            worker.kill()
            self._release(None)
            raise
        except (EOFError, OSError):
            worker.kill()
            self._release(None)
            return {"memory": True}  # the worker died mid-request: treated as a resource overrun
        self._release(worker)
        return answer


def _worker_env() -> dict[str, str]:
    """The worker's environment: ours, with ftl's source root first on PYTHONPATH (so a
    source checkout works without installation)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _timeout(limit_ms: int | None, started: float) -> ProtocolError:
    consumed = int((time.monotonic() - started) * 1000)
    return ProtocolError("evaluation_timeout",
                         f"Evaluation did not finish within {limit_ms} ms.",
                         {"budget": {"limit": limit_ms, "consumed": consumed, "unit": "ms"},
                          "partial_results_available": False,
                          "suggestion": "Send fewer facts or raise max_compute_ms up to the server limit."})


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
