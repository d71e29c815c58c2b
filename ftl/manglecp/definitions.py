"""What a MangleCP server is made of, and the seams it is extended through.

The values a server is built from and hands to its parts: the manifest content (`ServerInfo`,
MangleCP spec 04 §3), the limits it advertises and enforces (`ServerLimits`, spec 02 §3.4,
spec 05 §3.3 and §5.2, spec 07 §5.3), the macro-tools it can select and run (`ToolDefinition`,
spec 06 §2-4) with their skills (`Skill`, spec 06 §5), what a tool gets for one invocation
(`InvocationContext`) and may imply beyond its result (`InvocationOutcome`, spec 07 §3-4), the
evaluation an invocation is bound to (`BoundContext`, reference §5.5 and §11 item 23), the
selection engine's interface (`Evaluator` with `EvaluationInput` / `EvaluationResult` /
`Selection`, spec 05 §3) and the clocks (`Clock`, `SystemClock`). `canonical_json` is the one
input of every hash the server computes (determinism, reference §10.4).

Nothing here runs a request: `ftl.manglecp.server.ManglecpServer` does, over these values.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from ftl.manglecp.facts import NormalFact
from ftl.manglecp.messages import MIN_MESSAGE_BYTES, PredicateSchema


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON, the input of every hash (determinism, reference §10.4)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True)
class InvocationContext:
    """What a tool implementation gets from the framework for one invocation.

    Attributes:
        cancel: set when the client cancels (session transports) or the server shuts down.
        progress: ``progress({"message": str, "percent": float | None})``; becomes a ``progress``
            message on session transports, dropped on HTTP.
        correlation_id: id of this invocation in the server-side log.
        identity: the caller's identity (``"anonymous"`` without auth).
    """

    cancel: threading.Event
    progress: Callable[[dict[str, Any]], None]
    correlation_id: str
    identity: str = "anonymous"


@dataclass(frozen=True)
class BoundContext:
    """The evaluation a macro-tool was returned by: what its invocation is bound to (reference
    §5.5, §11 item 23).

    Attributes:
        intent, params: the evaluated intent.
        facts: the validated client facts of that evaluation (``disclosure_upgrade`` left out).
    """

    intent: str
    params: Mapping[str, Any] = field(default_factory=dict)
    facts: tuple[NormalFact, ...] = ()

    def args_of(self, pred: str) -> list[tuple[Any, ...]]:
        """The argument tuples of every bound fact called ``pred``, in order."""
        return [f.args for f in self.facts if f.pred == pred]

    def digest(self) -> str:
        """A deterministic digest of the binding (sorted facts + params); part of the macro id.

        sha256 over the canonical JSON of the params, then each fact's `NormalFact.key` in
        sorted order, one per line (a key is a repr, so it holds no raw newline).
        """
        # tuple.__repr__ is NormalFact.key() at C speed; no JSON around 10,000 keys (issue 11).
        keys = sorted(map(tuple.__repr__, self.facts))
        digest = hashlib.sha256(canonical_json(dict(self.params)).encode("utf-8"))
        digest.update("\n".join(["", *keys]).encode("utf-8"))
        return digest.hexdigest()[:16]


@dataclass(frozen=True)
class InvocationOutcome:
    """What a successful invocation implies beyond its result (spec 07 §3-4).

    Attributes:
        asserts: facts ``{"pred", "args", "t"?, "source"?, "category"?}`` for
            ``state_delta.assert``; the server adds ``category: "session"`` and a ``server``
            source when they are missing, and drops (and logs) facts its profile does not declare.
        retracts: patterns ``{"pred", "args"}`` (``None`` = wildcard) for ``state_delta.retract``.
        suggested_intents: ``{"name", "description", "params"?}`` for ``next.suggested_intents``.
        continuation_facts: facts to send with a suggested intent (``next.continuation_facts``).
        events: extra ``observability.events`` (``{"action", "status", "duration_ms"?, "detail"?}``).
        summary: 1-3 sentences for ``observability.summary`` (default: "<tool> completed in N ms.").
    """

    asserts: tuple[Mapping[str, Any], ...] = ()
    retracts: tuple[Mapping[str, Any], ...] = ()
    suggested_intents: tuple[Mapping[str, Any], ...] = ()
    continuation_facts: tuple[Mapping[str, Any], ...] = ()
    events: tuple[Mapping[str, Any], ...] = ()
    summary: str | None = None


@dataclass(frozen=True)
class Skill:
    """A skill (spec 06 §5): guidance a client needs to use a macro-tool well.

    Attributes:
        skill_id: id the selection rules use (``needs_skill(Tool, SkillId)``).
        name, description: REQUIRED by spec 06; the description goes with a referenced skill.
        content: the full text (sent when the skill goes out inline).
        content_type: media type of ``content``.
        inline: send the content inline (small skills); otherwise only the reference. Under a
            tight token budget inline skills become references first.
    """

    skill_id: str
    name: str
    description: str
    content: str
    content_type: str = "text/markdown"
    inline: bool = True


@dataclass(frozen=True)
class ToolDefinition:
    """A macro-tool the server can select and run.

    Attributes:
        name: macro-tool name (``^[a-z][a-z0-9_]*$``), also its id in the selection rules.
        version: part of the deterministic ``macro_id``.
        description: full description (``full`` disclosure).
        summary: one line (``condensed`` disclosure).
        input_schema: JSON Schema (2020-12) of the invocation ``args``.
        invoke: ``invoke(args, ctx) -> dict``; ``args`` already passed ``input_schema``.
            Raise `FtlError` for a domain failure.
        side_effects: spec 06 §3 vocabulary; ``("none",)`` for a pure tool.
        requires_confirmation: invocations need a server-issued confirmation token.
        reversible, idempotent: safety flags (spec 06 §2).
        output_schema: when set, results are checked against it.
        instructions: optional short ``context_injection.instructions``.
        validity_s: validity window of a returned macro-tool, s (None: the server default
            ``ServerLimits.macro_validity_s``).
        outcome: ``outcome(args, result, bound: BoundContext) -> InvocationOutcome``: the state
            delta and next steps of a successful invocation (None: none).
    """

    name: str
    version: str
    description: str
    summary: str
    input_schema: Mapping[str, Any]
    invoke: Callable[[dict[str, Any], InvocationContext], Mapping[str, Any]]
    side_effects: tuple[str, ...] = ("none",)
    requires_confirmation: bool = False
    reversible: bool = False
    idempotent: bool = False
    output_schema: Mapping[str, Any] | None = None
    instructions: str | None = None
    validity_s: float | None = None
    outcome: Callable[[dict[str, Any], dict[str, Any], BoundContext], InvocationOutcome] | None = None


@dataclass(frozen=True)
class Selection:
    """One tool chosen by the evaluator.

    Attributes:
        tool: a catalog name.
        score: relevance 0-100 (drives adaptive disclosure and ordering).
        phase: ``skeleton``, ``flesh`` or ``dependency`` (``metadata.selection_phase``).
        rules: predicate-level rule chain, leaves first (proof hints; names only).
        skills: ids of the skills the rules proved necessary for it.
        resources: ``(uri, priority 0-100)`` context resources the rules derived for it.
        supporting: the client facts its derivation rests on (proof hints).
    """

    tool: str
    score: int
    phase: str
    rules: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()
    resources: tuple[tuple[str, int], ...] = ()
    supporting: tuple[NormalFact, ...] = ()


@dataclass(frozen=True)
class EvaluationInput:
    """One evaluation: validated facts and the effective limits (min of client and server).

    Attributes:
        intent, params: the requested intent.
        facts: validated client facts (positional form).
        eval_time_ms: evaluation time, epoch ms (``now``).
        max_facts_created: gas, derived facts.
        max_compute_ms: wall-clock limit, ms (None: unlimited).
        max_intervals_per_atom: interval limit (None: unlimited).
        cancel: set to abandon the evaluation (session cancel).
        hidden_tools: tools a gate hides; the rules treat them as absent.
        explain: compute derivations (``Selection.rules``/``supporting``) and unmatched facts.
        rule_coverage: compute ``EvaluationResult.rule_coverage``.
    """

    intent: str
    params: Mapping[str, Any]
    facts: tuple[NormalFact, ...]
    eval_time_ms: int
    max_facts_created: int
    max_compute_ms: int | None = None
    max_intervals_per_atom: int | None = None
    cancel: threading.Event | None = None
    hidden_tools: tuple[str, ...] = ()
    explain: bool = False
    rule_coverage: bool = False


@dataclass(frozen=True)
class EvaluationResult:
    """The evaluator's answer.

    Attributes:
        selections: chosen tools (any order; the server sorts).
        excluded: ``(tool, phase, reason)`` for proof hints.
        facts_evaluated: facts in the store at the start (server + session).
        facts_derived: facts derived by this evaluation.
        phases_completed: pipeline phases run.
        unmatched: client facts no rule used (when explained).
        rules_fired: rule activations (when explained), else None.
        rule_coverage: spec 09 §6 object (when asked), else None.
    """

    selections: tuple[Selection, ...]
    excluded: tuple[tuple[str, str, str], ...] = ()
    facts_evaluated: int = 0
    facts_derived: int = 0
    phases_completed: int = 6
    unmatched: tuple[NormalFact, ...] = ()
    rules_fired: int | None = None
    rule_coverage: Mapping[str, Any] | None = None


class Evaluator(Protocol):
    """Selection engine behind the server (spec 05 §3).

    ``evaluate`` raises `ProtocolError` with ``derivation_limit_exceeded``,
    ``evaluation_timeout``, ``interval_limit_exceeded``, ``evaluation_failed`` or ``cancelled``.
    """

    def evaluate(self, request: EvaluationInput) -> EvaluationResult: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ServerInfo:
    """Manifest content that describes the server (spec 04 §3)."""

    server_name: str
    server_version: str
    domain_id: str
    domain_description: str
    intents: tuple[Mapping[str, Any], ...] = ()
    predicates: tuple[PredicateSchema, ...] = ()
    categories: tuple[str, ...] = ()
    conformance_level: int = 1
    temporal: bool = False
    endpoints: Mapping[str, str] = field(default_factory=lambda: {
        "intent_eval": "/manglecp/evaluate", "macro_invoke": "/manglecp/invoke"})
    time_formats: tuple[str, ...] = ("rfc3339", "epoch_ms")
    extensions: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerLimits:
    """Every limit and tunable of the server, with its unit in the name.

    Advertised in ``manifest.limits``: max_message_bytes (>= 16 MiB), max_facts_per_request,
    max_derived_facts, max_compute_ms, max_intervals_per_atom. The rest are server-side:
    rate limiting (token bucket per identity; ``rate_per_s=None`` disables it); the macro cache:
    ``macro_validity_s`` (the ``validity`` window of returned tools, None: no window), how long
    an entry is kept past its window (or past issue without a window) before eviction
    (``macro_ttl_s``; an invoke then gets ``macro_not_found``, inside it ``macro_expired``) and
    its size; adaptive disclosure thresholds (spec 05 §5.2 defaults 70/40/20); confirmation
    token lifetime; the retry hint for ``server_not_ready``; the period of ``running`` progress
    messages during an invocation (None: none); the caps on state-delta asserts and
    observability events (spec 07 §5.3); and whether rule coverage may be requested (dev mode).
    """

    max_message_bytes: int = MIN_MESSAGE_BYTES
    max_facts_per_request: int = 10_000
    max_derived_facts: int = 100_000
    max_compute_ms: int | None = 30_000
    max_intervals_per_atom: int | None = None
    rate_per_s: float | None = None
    rate_burst: int = 20
    macro_validity_s: float | None = 900.0
    macro_ttl_s: float = 3600.0
    macro_cache_size: int = 4096
    full_threshold: int = 70
    condensed_threshold: int = 40
    minimal_threshold: int = 20
    confirmation_ttl_s: float = 300.0
    not_ready_retry_after_ms: int = 1000
    progress_interval_s: float | None = 5.0
    max_delta_facts: int = 50
    max_observability_events: int = 20
    rule_coverage: bool = False


class Clock(Protocol):
    def time(self) -> float: ...       # wall clock, s since the epoch

    def monotonic(self) -> float: ...  # durations, s


class SystemClock:
    """The real clocks: `time.time` (wall) and `time.monotonic` (durations)."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()
