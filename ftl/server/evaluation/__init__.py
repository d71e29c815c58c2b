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

Modules: `symbols` (facts as clingo terms, reserved names), `program` (the rules, grounding,
the answer), `explain` (derivations and rule coverage), `workers` (`ClingoEvaluator`: worker
processes or a thread, and the limits), `child` (the worker process). Nothing is imported here:
a worker process loads only what it runs.
"""
