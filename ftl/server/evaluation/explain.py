"""Explanations of one model (proof hints, spec 09 §5; rule coverage, spec 09 §6).

An instrumented program (`ftl.server.evaluation.program.instrument`) derives, for every rule
``H :- B``, ``_manglecp_why(H, RuleNo, (B1, ..., Bn))`` from the same body. The derivation tree
of each selected tool, the client facts it rests on, the facts no rule used and which rules
fired all come from those atoms. Only predicate names leave here, never rule text, and names on
the ``hidden_predicates`` deny-list are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import clingo

from ftl.server.evaluation.symbols import RESERVED, WHY

if TYPE_CHECKING:  # annotations only: the program imports this module
    from ftl.server.evaluation.program import RuleInfo


class Explanation:
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
