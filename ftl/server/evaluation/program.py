"""The selection program: the phase and domain rules parsed once, grounded per request.

Facts enter as symbols, never as program text: through the backend, or (plain client facts,
the common case) handed to the grounder in one list per predicate by a context function
(`_FactFeed`), which saves the Python call per fact the backend costs (issue 11 item 5). The
gas limit counts derived atoms after grounding (spec 05 §3.3). For explanations the rules are
instrumented (`instrument`) and the answer's derivations come from `ftl.server.evaluation.explain`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import eq, is_, itemgetter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import clingo
import clingo.ast
from clingo.ast import ASTType, Sign

from ftl.server.evaluation.explain import Explanation
from ftl.server.evaluation.symbols import (DEFAULT_HIDDEN_PREDICATES, HIDDEN_TOOL, PHASE_ORDER,
                                           RESERVED, WHY, fact_symbol, to_symbol)

log = logging.getLogger("ftl.server.evaluation")

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
PHASE_RULES: tuple[Path, ...] = tuple(sorted(RULES_DIR.glob("phase*.lp")))
_SYMBOL_CACHE_SIZE = 200_000  # cached fact symbols per program (about 40 MB at most)
_OUTPUT_SIGNATURES = (("final", 2), ("final_phase", 2), ("final_skill", 2), ("final_resource", 3),
                      ("excluded_report", 3))
_OUTPUT = frozenset(name for name, _ in _OUTPUT_SIGNATURES)
_FEED = RESERVED + "facts"  # the context function that hands plain client facts to the grounder
_FEEDABLE = re.compile(r"[a-z][a-z0-9_]*")  # predicate names a feed rule may be written for


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


class Program:
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

    def _client_symbols(self, facts: Sequence[tuple[str, Sequence[Any], Any]], eval_time_ms: int
                        ) -> tuple[list[clingo.Symbol], list[tuple[str, tuple[Any, ...]]] | None]:
        """The symbols of ``facts`` (``[(pred, args, t)]``), in order, and their cache keys
        (None when a fact is temporal or not plain: keys would not tell its symbol apart).

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
            why = Explanation(model, client, self.hidden_predicates)
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


def run_safely(program: Program, request: Mapping[str, Any]) -> dict[str, Any]:
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
