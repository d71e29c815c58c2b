"""Transport-independent MangleCP server framework: validation, limits, auth, rendering, invocation.

A `ManglecpServer` takes one message (bytes, text or dict) and returns the messages to send back.
It runs the layer-1 checks (MangleCP spec 08 §2.1) in the order size -> envelope -> version ->
type -> auth -> status -> rate limit -> payload -> facts, hands valid intents to an `Evaluator`
(the selection engine, e.g. clingo rules), renders the selected macro-tools with disclosure levels,
skills, context resources and validity windows (spec 05 §5, spec 06), caches them with the
evaluation they are bound to, and runs invocations with expiry, schema validation, an optional
gate, confirmation tokens, periodic progress and cancellation, answering with the result, a
state delta and suggested next intents (spec 07). Transports (stdio, HTTP, in-process) only move
bytes; they all call `ManglecpServer.handle`.

Gate hook: an optional duck-typed ``gate`` object with ``visible(tool_name) -> bool`` (tools it
hides are absent: never selected, ``macro_not_found`` on invoke) and ``check(call)`` (called on
every invocation after schema validation and before anything runs; it raises an `FtlError` of a
gate kind, rendered from that kind's registry row). When ``check`` returns an object with
``public() -> dict``, the invoke response carries that dict as the extension ``x-gate_decision``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping, Protocol

from pydantic_core import to_jsonable_python

from ftl.errors import FtlError
from ftl.manglecp.progress import ProgressTicker
from ftl.manglecp.messages import (
    CLIENT_TYPES, INT53_MAX, MIN_MESSAGE_BYTES, PRED_RE, PROTOCOL_VERSION, SUPPORTED_VERSIONS, Cancel,
    FactsProfile, IntentRequest, InvokeRequest, Manifest, NormalFact, PredicateSchema, ProtocolError,
    Authenticate, envelope, facts_error, format_time, http_status, make_error, parse_message,
    parse_payload, parse_time, to_ftl_error, validate_facts)

log = logging.getLogger("ftl.manglecp.server")

STATUSES = ("ready", "booting", "degraded", "draining")
LEVELS = ("full", "condensed", "minimal")


# ---------------------------------------------------------------------------------------------
# What a server is made of


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


# ---------------------------------------------------------------------------------------------
# Auth and sessions (spec 08 §3)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    Attributes:
        identity: stable name (scopes the macro cache and the rate limit).
        permissions: intent names it may use; ``"*"`` means all.
        trust_level: ``"automated"`` allows confirmation bypass for ``auto_confirm_effects``.
        auto_confirm_effects: side effects confirmed without a token (only when automated).
    """

    identity: str
    permissions: frozenset[str] = frozenset({"*"})
    trust_level: str | None = None
    auto_confirm_effects: frozenset[str] = frozenset()

    def permits(self, intent: str) -> bool:
        return "*" in self.permissions or intent in self.permissions

    def auto_confirms(self, side_effects: Iterable[str]) -> bool:
        return self.trust_level == "automated" and set(side_effects) <= self.auto_confirm_effects


ANONYMOUS = Principal("anonymous")


class BearerAuth:
    """Bearer-token authentication (spec 08 §3.2): token -> `Principal`.

    Tokens are compared with `hmac.compare_digest`; they are never logged or echoed.
    """

    schemes = ("bearer",)

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        self._tokens = [(token.encode("utf-8"), principal) for token, principal in tokens.items()]

    def verify(self, token: str) -> Principal | None:
        """The principal for ``token``, or None when no configured token matches."""
        given = token.encode("utf-8")
        found = None
        for known, principal in self._tokens:  # no early exit: same work for every token
            if hmac.compare_digest(given, known):
                found = principal
        return found


class Session:
    """One client connection (stdio, WebSocket, in-process) or one HTTP request.

    Attributes:
        key: scope of the macro cache; defaults to the principal's identity.
        credentials: bearer token from an HTTP ``Authorization`` header (None on sessions,
            which authenticate with an ``authenticate`` message).
        principal: set by ``authenticate`` on session transports.
    """

    def __init__(self, key: str | None = None, credentials: str | None = None) -> None:
        self.key = key
        self.credentials = credentials
        self.principal: Principal | None = None
        self._running: dict[str, threading.Event] = {}
        self._given: dict[str, threading.Event] = {}  # the caller's own cancel events (in process)
        self._lock = threading.Lock()

    def give_cancel(self, request_id: str, event: threading.Event | None) -> None:
        """In process only: ``event`` (the caller's) is the cancel flag of request
        ``request_id``'s invocation, so a cancel needs no message and no relay thread. None
        forgets it (after the request). `cancel_all` never sets a caller's event."""
        with self._lock:
            if event is None:
                self._given.pop(request_id, None)
            else:
                self._given[request_id] = event

    def claim_cancel_flag(self, request_id: str) -> threading.Event:
        """The cancel flag for a new invocation: the caller's (`give_cancel`), else a new one."""
        with self._lock:
            return self._given.pop(request_id, None) or threading.Event()

    def track_running(self, request_id: str, event: threading.Event) -> None:
        """Record ``event`` as the cancel flag of the running request ``request_id`` (so
        `cancel` and `cancel_all` reach it) until `untrack_running`."""
        with self._lock:
            self._running[request_id] = event

    def untrack_running(self, request_id: str) -> None:
        """Forget request ``request_id`` once it finished (no-op when it is not tracked)."""
        with self._lock:
            self._running.pop(request_id, None)

    def cancel(self, request_id: str) -> bool:
        """Signal the running request ``request_id``; False when it is not running."""
        with self._lock:
            event = self._running.get(request_id)
        if event is None:
            return False
        event.set()
        return True

    def cancel_all(self) -> None:
        """Signal every running request (transport closed, e.g. stdin EOF)."""
        with self._lock:
            given = {id(event) for event in self._given.values()}
            events = [event for event in self._running.values() if id(event) not in given]
        for event in events:
            event.set()

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)


class TokenBucket:
    """Rate limiter: ``rate_per_s`` tokens per second, at most ``burst`` stored.

    `take` returns None when a token was available, else the wait in ms until one is.
    """

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate_per_s, burst
        self.tokens, self.stamp = float(burst), now

    def take(self, now: float) -> int | None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - self.tokens) / self.rate * 1000))


class ConfirmationTokens:
    """Server-issued confirmation tokens (reference §7.3 / §11 item 24).

    A token is ``base64url(json{m, i, a, t, n}) + "." + hex(hmac_sha256(secret, body))``: bound to
    the macro id (m), the identity (i) and a digest of the exact args (a), issued at t (ms),
    single use (nonce n), valid ``ttl_s``.
    """

    def __init__(self, secret: bytes, ttl_s: float, clock: Clock) -> None:
        self._secret, self._ttl_s, self._clock = secret, ttl_s, clock
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _digest(args: Mapping[str, Any]) -> str:
        return hashlib.sha256(canonical_json(args).encode("utf-8")).hexdigest()[:32]

    def issue(self, macro_id: str, identity: str, args: Mapping[str, Any]) -> str:
        body = canonical_json({"m": macro_id, "i": identity, "a": self._digest(args),
                               "t": int(self._clock.time() * 1000), "n": uuid.uuid4().hex})
        encoded = base64.urlsafe_b64encode(body.encode("utf-8")).decode("ascii").rstrip("=")
        return encoded + "." + hmac.new(self._secret, encoded.encode("ascii"), "sha256").hexdigest()

    def redeem(self, token: str, macro_id: str, identity: str, args: Mapping[str, Any]) -> str | None:
        """Consume ``token``; return None when valid, else the reason it is not."""
        encoded, _, mac = token.partition(".")
        expected = hmac.new(self._secret, encoded.encode("ascii", "replace"), "sha256").hexdigest()
        if not mac or not hmac.compare_digest(mac.encode("ascii", "replace"), expected.encode("ascii")):
            return "the token was not issued by this server"
        try:
            body = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except ValueError:
            return "the token is unreadable"
        if body.get("m") != macro_id or body.get("i") != identity:
            return "the token was issued for another macro-tool or caller"
        if body.get("a") != self._digest(args):
            return "the token was issued for different args"
        now = self._clock.time()
        if now * 1000 - body.get("t", 0) > self._ttl_s * 1000:
            return "the token has expired"
        with self._lock:
            for nonce, until in list(self._used.items()):
                if until < now:
                    del self._used[nonce]
            if body.get("n") in self._used:
                return "the token was already used"
            self._used[body.get("n")] = now + self._ttl_s
        return None


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON, the input of every hash (determinism, reference §10.4)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def macro_id_for(tool: ToolDefinition, intent: str, binding: str = "") -> str:
    """Deterministic macro id: ``"m-" + sha256(canonical [name, version, intent, binding])[:16]``.

    ``binding`` is `BoundContext.digest` (sorted facts and params), so two evaluations with
    different facts never share an id, while the same tool, version, intent and facts give the
    same id in every process (no salted `hash()`; reference §10.4, §11 item 23).
    """
    digest = hashlib.sha256(canonical_json([tool.name, tool.version, intent, binding]).encode("utf-8"))
    return "m-" + digest.hexdigest()[:16]


def estimate_tokens(rendered: Mapping[str, Any]) -> int:
    """Token estimate of a rendered tool: ceil(canonical JSON length / 4) (reference §11 item 14)."""
    return math.ceil(len(canonical_json(rendered)) / 4)


@dataclass
class RenderChoice:
    """How one selected tool is rendered; the token-budget fitter edits these.

    Attributes:
        selection, tool, macro_id: what is rendered.
        level: ``full`` | ``condensed`` | ``minimal``.
        inline_skills: inline skills go out with their content (else as references).
        resources: the context resources still sent, highest priority first.
        validity: the ``validity`` object (full level only), or None.
    """

    selection: Selection
    tool: ToolDefinition
    macro_id: str
    level: str
    inline_skills: bool = True
    resources: tuple[tuple[str, int], ...] = ()
    validity: Mapping[str, Any] | None = None


def render_tool(choice: RenderChoice, skills: Mapping[str, Skill] | None = None) -> dict[str, Any]:
    """A MacroTool dict (spec 06 §4 field whitelist: minimal never carries a description or
    metadata; only full carries schemas, safety, context injection and validity).

    Skills: inline ones as ``{"skill_id", "inline": true, "content"}``, referenced ones as
    ``{"skill_id", "inline": false, "description"}``; ids missing from ``skills`` are skipped.
    """
    tool, selection, level = choice.tool, choice.selection, choice.level
    out: dict[str, Any] = {"macro_id": choice.macro_id, "name": tool.name, "disclosure_level": level}
    if level == "minimal":
        return out
    metadata = {"selection_phase": selection.phase, "score": selection.score}
    if level == "condensed":
        out["description"] = tool.summary.splitlines()[0] if tool.summary else tool.name
        out["metadata"] = metadata
        return out
    out["description"] = tool.description
    out["input_schema"] = dict(tool.input_schema)
    if tool.output_schema is not None:
        out["output_schema"] = dict(tool.output_schema)
    out["safety"] = {"requires_user_confirmation": tool.requires_confirmation,
                     "side_effects": list(tool.side_effects) or ["none"],
                     "reversible": tool.reversible, "idempotent": tool.idempotent}
    injection: dict[str, Any] = {}
    if tool.instructions:
        injection["instructions"] = tool.instructions
    refs = []
    for skill_id in selection.skills:
        skill = (skills or {}).get(skill_id)
        if skill is None:
            continue
        if skill.inline and choice.inline_skills:
            refs.append({"skill_id": skill.skill_id, "inline": True, "content": skill.content})
        else:
            refs.append({"skill_id": skill.skill_id, "inline": False, "description": skill.description})
    if refs:
        injection["skills"] = refs
    if choice.resources:
        injection["context_resources"] = [{"uri": uri, "priority": priority}
                                          for uri, priority in choice.resources]
    if injection:
        out["context_injection"] = injection
    if choice.validity:
        out["validity"] = dict(choice.validity)
    out["metadata"] = metadata
    return out


def wire_fact(fact: NormalFact) -> dict[str, Any]:
    """A validated fact back in wire form (ints beyond 2^53 as ``int64`` wrappers, spec 03 §3.2)."""
    def value(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, list, dict)):
            return v
        if isinstance(v, int):
            return v if abs(v) <= INT53_MAX else {"_type": "int64", "value": str(v)}
        if isinstance(v, list):
            return [value(x) for x in v]
        return {k: value(x) for k, x in v.items()}

    out: dict[str, Any] = {"pred": fact.pred, "args": [value(a) for a in fact.args]}
    if fact.t is not None:
        start, end = (format_time(p) if isinstance(p, int) else p for p in fact.t)
        point = fact.t[0] == fact.t[1] and fact.t[0] != "_"
        out["t"] = {"at": start} if point else {"start": start, "end": end}
    return out


@dataclass
class _Macro:
    tool: str
    bound: BoundContext
    created_s: float
    expires_s: float | None


# ---------------------------------------------------------------------------------------------
# The server


class ManglecpServer:
    """A MangleCP server over a tool catalog and an evaluator.

    Args:
        manifest_info: static manifest content.
        catalog: tool name -> `ToolDefinition`.
        evaluator: the selection engine.
        limits: `ServerLimits` (advertised and enforced).
        auth: `BearerAuth`, or None for anonymous access (stdio, localhost).
        clock: `Clock` (wall + monotonic); inject a fake one in tests.
        status: initial manifest status (``ready`` or ``booting``...).
        secret: HMAC key for confirmation tokens (random per process by default).
        skills: skill id -> `Skill`, for the ``needs_skill`` ids the rules derive.
        gate: optional gate object (module doc): ``visible(tool_name) -> bool`` and
            ``check(call) -> None`` raising an `FtlError` of a gate kind. Exceptions of any other
            type from the gate fail closed (hidden / ``internal_error``).
        on_error: ``on_error(error_type, gate)`` for every error the server answers (the
            registry kind the client will see, and the refusing gate or None); e.g. a metrics
            counter. Its own failures are logged and ignored.
    Raises:
        ValueError: an unknown status, or ``max_message_bytes`` under 16 MiB.
    """

    def __init__(self, manifest_info: ServerInfo, catalog: Mapping[str, ToolDefinition],
                 evaluator: Evaluator, *, limits: ServerLimits | None = None,
                 auth: BearerAuth | None = None, clock: Clock | None = None,
                 status: str = "ready", secret: bytes | None = None,
                 skills: Mapping[str, Skill] | None = None, gate: Any = None,
                 on_error: Callable[[str, str | None], None] | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        self.info = manifest_info
        self.catalog = dict(catalog)
        self.evaluator = evaluator
        self.limits = limits or ServerLimits()
        if self.limits.max_message_bytes < MIN_MESSAGE_BYTES:
            raise ValueError("max_message_bytes must be at least 16 MiB (spec 02 §3.4)")
        self.auth = auth
        self.clock = clock or SystemClock()
        self._status = status
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._macros: OrderedDict[tuple[str, str], _Macro] = OrderedDict()
        interval = self.limits.progress_interval_s
        self._ticker = ProgressTicker(interval) if interval is not None and interval > 0 else None
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()
        self._confirm = ConfirmationTokens(secret or os.urandom(32), self.limits.confirmation_ttl_s,
                                           self.clock)
        self._validators: dict[str, Any] = {}  # tool name -> schema validator, built on first invoke
        self.skills = dict(skills or {})
        self.gate = gate
        self.on_error = on_error
        self.facts_profile = self._facts_profile()
        self._temporal = {p.predicate for p in self.facts_profile.predicates or () if p.temporal}
        self._intent_names = {str(i.get("name")) for i in self.info.intents}
        self._manifest_cache: dict[str, dict[str, Any]] = {}

    # -- manifest and status -----------------------------------------------------------------

    def _facts_profile(self) -> FactsProfile:
        predicates = list(self.info.predicates)
        if not any(p.predicate == "disclosure_upgrade" for p in predicates):
            predicates.append(PredicateSchema(
                predicate="disclosure_upgrade", arity=1, arg_types=["string"], arg_names=["macro_id"],
                direction="input", description="Ask for this macro-tool at full disclosure."))
        return FactsProfile(time_formats=list(self.info.time_formats), predicates=predicates)

    @property
    def status(self) -> str:
        return self._status

    def level_gaps(self) -> list[str]:
        """What keeps this server below conformance level 2 (MangleCP spec 10 §3, reference §9
        items 28-47); empty when every level-2 feature is configured. The framework provides
        the rest (determinism, contracts, disclosure, budgets, confirmation, readiness, cancel,
        progress, fact details); these depend on what the server is given."""
        gaps = []
        if not self.info.temporal or not self._temporal:
            gaps.append("temporal facts (capabilities.temporal and a temporal input predicate)")
        if not self.skills:
            gaps.append("skills (no Skill registered)")
        if not any(tool.outcome is not None for tool in self.catalog.values()):
            gaps.append("state_delta and suggested intents (no tool declares an outcome)")
        return gaps

    @property
    def conformance_level(self) -> int:
        """The level advertised: ``info.conformance_level``, lowered to 1 while `level_gaps`
        is not empty (a server never claims a level it does not reach)."""
        level = self.info.conformance_level
        return 1 if level >= 2 and self.level_gaps() else level

    def manifest_payload(self) -> dict[str, Any]:
        """The manifest payload (spec 04 §3), validated against `Manifest`.

        Built and validated once per status (the rest of it never changes after construction)
        and handed out as a copy, since callers may add to it (the HTTP binding's extensions).
        """
        cached = self._manifest_cache.get(self._status)
        if cached is None:
            cached = self._manifest_cache[self._status] = self._build_manifest_payload()
        return copy.deepcopy(cached)

    def _build_manifest_payload(self) -> dict[str, Any]:
        limits = {"max_message_bytes": self.limits.max_message_bytes,
                  "max_facts_per_request": self.limits.max_facts_per_request,
                  "max_derived_facts": self.limits.max_derived_facts}
        if self.limits.max_compute_ms is not None:
            limits["max_compute_ms"] = self.limits.max_compute_ms
        if self.limits.max_intervals_per_atom is not None:
            limits["max_intervals_per_atom"] = self.limits.max_intervals_per_atom
        domain: dict[str, Any] = {"id": self.info.domain_id, "description": self.info.domain_description}
        if self.info.categories:
            domain["categories"] = list(self.info.categories)
        payload = {
            "server_name": self.info.server_name, "server_version": self.info.server_version,
            "protocol": {"manglecp": PROTOCOL_VERSION, "supported_versions": list(SUPPORTED_VERSIONS),
                         "conformance_level": self.conformance_level},
            "status": self._status, "domain": domain, "endpoints": dict(self.info.endpoints),
            "intents": [dict(i) for i in self.info.intents],
            "facts_profile": self.facts_profile.dump(),
            "capabilities": {"temporal": self.info.temporal, "aggregation": True,
                             "external_predicates": [], "named_args": True},
            "limits": limits,
            "auth": {"required": self.auth is not None,
                     "schemes": list(self.auth.schemes) if self.auth else []},
            "extensions": dict(self.info.extensions),
        }
        return Manifest.model_validate(payload).dump()

    def manifest(self) -> dict[str, Any]:
        """The manifest envelope (``id: null``)."""
        return envelope("manifest", None, self.manifest_payload())

    def add_manifest_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(manifest_envelope)`` on every status change (session transports push it)."""
        with self._lock:
            self._listeners.append(listener)

    def remove_manifest_listener(self, listener: Callable[[dict[str, Any]], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def set_status(self, status: str) -> dict[str, Any]:
        """Change the status (booting -> ready -> draining) and push the new manifest."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        self._status = status
        manifest = self.manifest()
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(manifest)
        return manifest

    def close(self) -> None:
        """Release the evaluator (worker processes) and the progress thread."""
        if self._ticker is not None:
            self._ticker.close()
        self.evaluator.close()

    # -- dispatch ----------------------------------------------------------------------------

    def handle(self, message: bytes | str | Mapping[str, Any], *, session: Session | None = None,
               emit: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Process one client message; return the messages to send back, final one last.

        Args:
            message: raw bytes/text (size-checked) or an already-parsed dict.
            session: the connection; a fresh anonymous one per call when None.
            emit: when given, ``progress`` messages are sent through it as they happen;
                otherwise they are returned before the final message.
        Returns:
            ``[]`` for ``cancel``; else progress messages (if buffered) then exactly one
            ``intent_response`` / ``invoke_response`` / ``authenticate_response`` / ``error``.
        """
        replies = self._handle(message, session or Session(), emit)
        if replies and replies[-1].get("type") == "error" and self.on_error is not None:
            try:
                error = to_ftl_error(replies[-1].get("payload", {}))
                self.on_error(error.error_type, error.details.get("gate"))
            except Exception:
                log.exception("the on_error hook failed")
        return replies

    def _handle(self, message: bytes | str | Mapping[str, Any], session: Session,
                emit: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
        try:
            env = parse_message(message, max_bytes=self.limits.max_message_bytes)
        except ProtocolError as exc:
            return [exc.envelope()]
        request_id = env.id or None
        buffered: list[dict[str, Any]] = []
        sink = emit or buffered.append
        try:
            if env.type not in CLIENT_TYPES:
                raise ProtocolError("invalid_type", f"{env.type!r} is sent by servers, not clients.",
                                    {"type": env.type, "accepted_types": sorted(CLIENT_TYPES)})
            if env.type == "authenticate":
                return [self._authenticate(env, session)]
            principal = self._principal(session)
            if env.type == "cancel":
                cancel = parse_payload(env)
                assert isinstance(cancel, Cancel)
                session.cancel(cancel.request_id)
                return []
            self._check_status()
            self._check_rate(session.key or principal.identity)
            payload = parse_payload(env)
            if isinstance(payload, IntentRequest):
                return [self._evaluate(request_id, payload, principal, session)]
            assert isinstance(payload, InvokeRequest)
            final = self._invoke(request_id or "", payload, principal, session, sink)
            return buffered + [final]
        except ProtocolError as exc:
            return buffered + [exc.envelope(id=request_id)]
        except Exception:  # never a traceback on the wire
            correlation_id = uuid.uuid4().hex[:12]
            log.exception("internal error handling %s (correlation id %s)", env.type, correlation_id)
            return buffered + [make_error("internal_error",
                                          f"An internal error occurred (correlation id {correlation_id}).",
                                          {"correlation_id": correlation_id}, id=request_id)]

    # -- layer 1 checks ----------------------------------------------------------------------

    def _principal(self, session: Session) -> Principal:
        if self.auth is None:
            return session.principal or ANONYMOUS
        if session.principal is not None:
            return session.principal
        if session.credentials is None:
            raise ProtocolError("auth_required", "Authentication is required: send a bearer token.")
        principal = self.auth.verify(session.credentials)
        if principal is None:
            raise ProtocolError("auth_invalid", "The credentials are invalid or expired.")
        return principal

    def _authenticate(self, env: Any, session: Session) -> dict[str, Any]:
        request = parse_payload(env)
        assert isinstance(request, Authenticate)
        if self.auth is None:
            principal = ANONYMOUS
        else:
            if request.scheme.lower() not in self.auth.schemes:
                raise ProtocolError("auth_invalid", f"Scheme {request.scheme!r} is not supported.",
                                    {"supported_schemes": list(self.auth.schemes)})
            found = self.auth.verify(request.token)
            if found is None:
                raise ProtocolError("auth_invalid", "The credentials are invalid or expired.")
            principal = found
        session.principal = principal
        payload: dict[str, Any] = {"status": "authenticated", "identity": principal.identity,
                                   "permissions": sorted(principal.permissions)}
        if principal.trust_level:
            payload["trust_level"] = principal.trust_level
            payload["auto_confirm_effects"] = sorted(principal.auto_confirm_effects)
        return envelope("authenticate_response", env.id, payload)

    def _check_status(self) -> None:
        if self._status in ("booting", "draining"):
            raise ProtocolError("server_not_ready", f"The server is {self._status}.",
                                {"status": self._status},
                                retry_after_ms=self.limits.not_ready_retry_after_ms)

    def _check_rate(self, key: str) -> None:
        if self.limits.rate_per_s is None:
            return
        now = self.clock.monotonic()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(self.limits.rate_per_s,
                                                          self.limits.rate_burst, now)
            wait_ms = bucket.take(now)
        if wait_ms is not None:
            raise ProtocolError("rate_limited", "Too many requests.",
                                {"retry_after_ms": wait_ms}, retry_after_ms=wait_ms)

    # -- gate ----------------------------------------------------------------------------------

    def _visible(self, name: str) -> bool:
        """Gate 1 (visibility); no gate shows everything; a failing gate hides (fail closed)."""
        if self.gate is None:
            return True
        try:
            return bool(self.gate.visible(name))
        except Exception:
            log.exception("gate.visible(%r) failed; treating the tool as hidden", name)
            return False

    def _hidden_tools(self) -> tuple[str, ...]:
        return tuple(sorted(name for name in self.catalog if not self._visible(name)))

    def _gate_check(self, tool: ToolDefinition, request_id: str, request: InvokeRequest,
                    macro: _Macro, principal: Principal) -> dict[str, Any] | None:
        """Gates 2-4 on one invocation; a refusal becomes the error row of its kind. Returns
        what the gate lets the caller see of its decision (the decision's ``public()``), if
        anything: the invoke response carries it as ``x-gate_decision``."""
        if self.gate is None:
            return None
        facts = macro.bound.facts
        local = self.auth is None and principal is ANONYMOUS
        # string args only: policy engines (Cedar) want homogeneous sets
        summary = [{"pred": f.pred, "args": [a if isinstance(a, str) else canonical_json(a) for a in f.args]}
                   for f in facts[:50]]
        call = {"tool": tool.name, "args": dict(request.args), "side_effects": list(tool.side_effects),
                "principal": "local" if local else principal.identity,
                "context": {"intent": macro.bound.intent, "macro_id": request.macro_id,
                            "request_id": request_id, "fact_count": len(facts),
                            "predicates": sorted({f.pred for f in facts}), "facts": summary}}
        try:
            decision = self.gate.check(call)
        except FtlError as exc:
            row = exc.kind
            log.info("gate refused %s: %s (%s)", tool.name, exc.error_type, exc.details)
            details = {**exc.safe_details(), "error_type": exc.error_type}
            gate = row.gate or exc.details.get("gate")
            if gate:
                details["gate"] = gate
            raise ProtocolError(row.manglecp_code, exc.message, details,
                                retry_after_ms=exc.retry_after_ms, recoverable=row.recoverable) from None
        except Exception:
            correlation_id = uuid.uuid4().hex[:12]
            log.exception("gate check for %s failed (correlation id %s)", tool.name, correlation_id)
            raise ProtocolError("internal_error",
                                f"The gate check failed (correlation id {correlation_id}).",
                                {"correlation_id": correlation_id}) from None
        public = getattr(decision, "public", None)
        try:
            return public() if callable(public) else None
        except Exception:  # advisory: a decision that cannot be shown is left out, never fatal
            log.exception("gate decision for %s could not be rendered", tool.name)
            return None

    def _validator(self, tool: ToolDefinition) -> Any:
        """The JSON Schema (2020-12) validator of ``tool``'s input schema, built once. jsonschema
        loads here, at the first invocation, not at server start (boot time, issue 11 item 2)."""
        validator = self._validators.get(tool.name)
        if validator is None:
            import jsonschema

            validator = jsonschema.Draft202012Validator(dict(tool.input_schema))
            self._validators[tool.name] = validator
        return validator

    # -- intent evaluation (spec 05) ---------------------------------------------------------

    def _evaluate(self, request_id: str | None, request: IntentRequest, principal: Principal,
                  session: Session) -> dict[str, Any]:
        facts, violations = validate_facts(request.facts, self.facts_profile)
        if violations:
            raise facts_error(violations)
        if len(request.facts) > self.limits.max_facts_per_request:
            raise ProtocolError("too_many_facts",
                                f"The request has {len(request.facts)} facts; the limit is "
                                f"{self.limits.max_facts_per_request}.",
                                {"count": len(request.facts), "limit": self.limits.max_facts_per_request})
        intent = request.intent.name
        if not principal.permits(intent):
            raise ProtocolError("auth_insufficient", f"Intent {intent!r} is not permitted for this caller.")
        now_ms = int(self.clock.time() * 1000)
        if request.eval_time is None:
            eval_time_ms, eval_time_used = now_ms, format_time(now_ms)
        else:
            try:
                parsed = parse_time(request.eval_time, self.facts_profile.time_formats)
            except ValueError as exc:
                raise ProtocolError("malformed_message", "eval_time is not a valid time.",
                                    {"violations": [{"path": "/payload/eval_time", "message": str(exc)}]})
            if parsed == "_":
                raise ProtocolError("malformed_message", "eval_time cannot be unbounded.",
                                    {"violations": [{"path": "/payload/eval_time",
                                                     "message": "'_' is not a point in time"}]})
            eval_time_ms = now_ms if parsed == "now" else int(parsed)
            eval_time_used = request.eval_time
        # The predicates present, at C speed: the passes below run only when they apply
        # (a request may carry 10,000 facts; issue 11 item 5).
        present = set(map(itemgetter(0), facts))
        if present & self._temporal:
            # A temporal predicate sent without `t` holds at all times (spec 03 §4), so rules
            # see one shape for it.
            facts = [NormalFact(f.pred, f.args, ("_", "_")) if f.t is None and f.pred in self._temporal
                     else f for f in facts]

        def effective(client: int | None, server: int | None) -> int | None:
            return server if client is None else (client if server is None else min(client, server))

        c = request.constraints
        coverage = bool(self.limits.rule_coverage and request.options.model_extra
                        and request.options.model_extra.get("x-rule_coverage") is True)
        hidden = self._hidden_tools()
        cancel = threading.Event()
        if request_id:
            session.track_running(request_id, cancel)
        started = self.clock.monotonic()
        try:
            result = self.evaluator.evaluate(EvaluationInput(
                intent=intent, params=request.intent.params, facts=tuple(facts),
                eval_time_ms=eval_time_ms,
                max_facts_created=effective(c.max_facts_created, self.limits.max_derived_facts) or 0,
                max_compute_ms=effective(c.max_compute_ms, self.limits.max_compute_ms),
                max_intervals_per_atom=effective(c.max_intervals_per_atom,
                                                 self.limits.max_intervals_per_atom),
                cancel=cancel, hidden_tools=hidden, explain=request.options.include_proof_hints,
                rule_coverage=coverage))
        finally:
            if request_id:
                session.untrack_running(request_id)
        if cancel.is_set():
            raise ProtocolError("cancelled", "The evaluation was cancelled.")
        duration_ms = int((self.clock.monotonic() - started) * 1000)
        upgrades: set[str] = set()
        if "disclosure_upgrade" in present:
            upgrades = {str(f.args[0]) for f in facts if f.pred == "disclosure_upgrade" and f.args}
            facts = [f for f in facts if f.pred != "disclosure_upgrade"]
        bound = BoundContext(intent, dict(request.intent.params), tuple(facts))
        tools, hints, expiry = self._render(result, request, upgrades, bound, set(hidden), now_ms)
        with self._lock:
            self._purge(now_ms / 1000)
            for tool in tools:
                key = (session.key or principal.identity, tool["macro_id"])
                self._macros[key] = _Macro(tool["name"], bound, now_ms / 1000, expiry.get(tool["name"]))
                self._macros.move_to_end(key)
            while len(self._macros) > self.limits.macro_cache_size:
                self._macros.popitem(last=False)
        diagnostics: dict[str, Any] = {"facts_evaluated": result.facts_evaluated,
                                       "facts_derived": result.facts_derived,
                                       "phases_completed": result.phases_completed}
        if result.rules_fired is not None:
            diagnostics["rules_fired"] = result.rules_fired
        if coverage and result.rule_coverage is not None:
            diagnostics["rule_coverage"] = dict(result.rule_coverage)
        payload: dict[str, Any] = {
            "eval_time_used": eval_time_used, "eval_duration_ms": duration_ms, "macro_tools": tools,
            "diagnostics": diagnostics}
        if request.options.include_proof_hints:
            payload["proof_hints"] = hints
        return envelope("intent_response", request_id, payload)

    def _render(self, result: EvaluationResult, request: IntentRequest, upgrades: set[str],
                bound: BoundContext, hidden: set[str], now_ms: int
                ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, float]]:
        """Order, level, truncate and budget the selected tools (spec 05 §5, reference §4.7).

        Returns:
            (rendered tools, proof hints, tool name -> validity end in epoch s).
        """
        binding = bound.digest()
        chosen: list[RenderChoice] = []
        expiry: dict[str, float] = {}
        for selection in result.selections:
            tool = self.catalog.get(selection.tool)
            if tool is None or selection.tool in hidden:
                if tool is None:
                    log.warning("rules selected %r, which is not in the catalog", selection.tool)
                continue
            validity_s = tool.validity_s if tool.validity_s is not None else self.limits.macro_validity_s
            validity = None
            if validity_s is not None:
                expires_ms = now_ms + int(validity_s * 1000)
                expiry[tool.name] = expires_ms / 1000
                validity = {"not_before": format_time(now_ms), "expires_at": format_time(expires_ms)}
            chosen.append(RenderChoice(selection, tool, macro_id_for(tool, bound.intent, binding), "full",
                                       resources=tuple(selection.resources), validity=validity))
        chosen.sort(key=lambda c: (-c.selection.score, c.macro_id))
        preference = request.options.disclosure_preference
        limits = self.limits
        kept: list[RenderChoice] = []
        for choice in chosen:
            score = choice.selection.score
            if choice.macro_id in upgrades:
                level: str | None = "full"
            elif preference != "adaptive":
                level = preference
            elif score >= limits.full_threshold:
                level = "full"
            elif score >= limits.condensed_threshold:
                level = "condensed"
            elif score >= limits.minimal_threshold:
                level = "minimal"
            else:
                level = None
            if level is not None:
                choice.level = level
                kept.append(choice)
        cap = request.constraints.max_tools_returned
        if cap is not None:
            kept = kept[:cap]
        budget = request.constraints.max_tokens_budget
        if budget is not None:
            kept = self._fit_budget(kept, budget, upgrades)
        tools = [render_tool(choice, self.skills) for choice in kept]
        hints = {
            "derivations": [{"macro_id": c.macro_id, "selected_by": c.selection.phase,
                             "score": c.selection.score,
                             "supporting_facts": [wire_fact(f) for f in c.selection.supporting],
                             "rule_chain": [r for r in c.selection.rules if PRED_RE.match(r)]}
                            for c in kept],
            "excluded": [{"candidate": name, "excluded_by": phase, "reason": reason}
                         for name, phase, reason in sorted(result.excluded) if name not in hidden],
            "unmatched_facts": [{"pred": f.pred, "reason": "no rule used this fact for this intent"}
                                for f in result.unmatched],
        }
        return tools, hints, {c.tool.name: expiry[c.tool.name] for c in kept if c.tool.name in expiry}

    def _fit_budget(self, kept: list[RenderChoice], budget: int, upgrades: set[str]) -> list[RenderChoice]:
        """Fit ``max_tokens_budget`` (spec 05 §5.3, spec 06 §5.3), lowest-scored tools first:
        inline skills become references, then low-priority context resources go, then levels
        drop one step at a time (a ``disclosure_upgrade``d tool keeps ``full``), then tools go
        from the bottom."""
        kept = list(kept)

        def total() -> int:
            return sum(estimate_tokens(render_tool(choice, self.skills)) for choice in kept)

        for choice in reversed(kept):
            if total() <= budget:
                return kept
            if choice.level == "full" and choice.inline_skills and any(
                    self.skills.get(k) is not None and self.skills[k].inline for k in choice.selection.skills):
                choice.inline_skills = False
        while total() > budget:
            trimmable = [c for c in reversed(kept) if c.level == "full" and c.resources]
            if not trimmable:
                break
            trimmable[0].resources = trimmable[0].resources[:-1]
        while kept and total() > budget:
            for choice in reversed(kept):
                if choice.level != "minimal" and choice.macro_id not in upgrades:
                    choice.level = LEVELS[LEVELS.index(choice.level) + 1]
                    break
            else:
                kept.pop()
        return kept

    def _purge(self, now_s: float) -> None:
        """Evict cache entries past their window (or issue, without one) plus ``macro_ttl_s``.
        Caller holds the lock."""
        ttl = self.limits.macro_ttl_s
        for key in [k for k, m in self._macros.items()
                    if now_s > (m.expires_s if m.expires_s is not None else m.created_s) + ttl]:
            del self._macros[key]

    # -- invocation (spec 07) ----------------------------------------------------------------

    def _invoke(self, request_id: str, request: InvokeRequest, principal: Principal,
                session: Session, sink: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        key = (session.key or principal.identity, request.macro_id)
        now_s = self.clock.time()
        with self._lock:
            self._purge(now_s)
            macro = self._macros.get(key)
        if macro is None or macro.tool not in self.catalog or not self._visible(macro.tool):
            raise ProtocolError("macro_not_found",
                                f"Macro-tool {request.macro_id!r} is unknown or evicted; evaluate "
                                "the intent again.", {"macro_id": request.macro_id})
        if macro.expires_s is not None and now_s >= macro.expires_s:
            raise ProtocolError("macro_expired",
                                f"Macro-tool {request.macro_id!r} expired; evaluate the intent again.",
                                {"macro_id": request.macro_id,
                                 "expired_at": format_time(int(macro.expires_s * 1000))})
        if not principal.permits(macro.bound.intent):
            raise ProtocolError("auth_insufficient", "This caller may not invoke the macro-tool.")
        tool = self.catalog[macro.tool]
        errors = sorted(self._validator(tool).iter_errors(request.args),
                        key=lambda e: ("/" + "/".join(map(str, e.absolute_path)), str(e.validator)))
        if errors:
            schema_errors = [{"path": "/" + "/".join(map(str, e.absolute_path)),
                              "message": e.message if len(e.message) <= 300 else e.message[:297] + "...",
                              "keyword": str(e.validator)} for e in errors]
            raise ProtocolError("schema_validation_failed",
                                f"The args do not match the input schema of {tool.name} "
                                f"({len(schema_errors)} error(s)).",
                                {"schema_errors": schema_errors, "tool": tool.name})
        gate_decision = self._gate_check(tool, request_id, request, macro, principal)
        if tool.requires_confirmation and not principal.auto_confirms(tool.side_effects):
            token = request.confirmation_token
            if not token:
                issued = self._confirm.issue(request.macro_id, principal.identity, request.args)
                raise ProtocolError(
                    "confirmation_required",
                    f"{tool.name} needs the user's confirmation; resend with the confirmation_token "
                    "once the user agreed.",
                    {"tool": tool.name, "macro_id": request.macro_id,
                     "side_effects": list(tool.side_effects), "reversible": tool.reversible,
                     "confirmation_token": issued,
                     "expires_in_ms": int(self.limits.confirmation_ttl_s * 1000)})
            reason = self._confirm.redeem(token, request.macro_id, principal.identity, request.args)
            if reason is not None:
                raise ProtocolError("confirmation_invalid", f"The confirmation token is not valid: {reason}.",
                                    {"tool": tool.name, "macro_id": request.macro_id})
        return self._execute(request_id, tool, request, principal, session, sink, macro.bound,
                             gate_decision)

    def _execute(self, request_id: str, tool: ToolDefinition, request: InvokeRequest,
                 principal: Principal, session: Session,
                 sink: Callable[[dict[str, Any]], None], bound: BoundContext,
                 gate_decision: dict[str, Any] | None = None) -> dict[str, Any]:
        cancel = session.claim_cancel_flag(request_id)
        correlation_id = uuid.uuid4().hex[:12]
        sink_lock = threading.Lock()
        finished = threading.Event()

        def send(payload: dict[str, Any]) -> None:
            with sink_lock:
                if not finished.is_set():
                    sink(envelope("progress", request_id, payload))

        def progress(update: Mapping[str, Any]) -> None:
            payload: dict[str, Any] = {"status": "running"}
            detail = update.get("message") or update.get("detail")
            if detail:
                payload["detail"] = str(detail)[:500]
            percent = update.get("percent")
            if isinstance(percent, (int, float)) and not isinstance(percent, bool):
                payload["percent"] = max(0.0, min(100.0, float(percent)))
            send(payload)

        session.track_running(request_id, cancel)
        send({"status": "started"})
        started = self.clock.monotonic()
        watch = None  # periodic "still running" for long invocations (spec 07 §7)
        if self._ticker is not None:
            watch = self._ticker.watch(lambda elapsed_s: send(
                {"status": "running", "detail": f"{tool.name} running for {elapsed_s:.0f} s"}))
        try:
            result = tool.invoke(dict(request.args),
                                 InvocationContext(cancel, progress, correlation_id, principal.identity))
        except FtlError as exc:
            if cancel.is_set():
                raise ProtocolError("cancelled", "The invocation was cancelled.") from None
            log.info("tool %s failed with %s (correlation id %s): %s", tool.name, exc.error_type,
                     correlation_id, exc.details)
            details = {**exc.safe_details(), "error_type": exc.error_type}
            raise ProtocolError(exc.kind.manglecp_code, exc.message, details,
                                retry_after_ms=exc.retry_after_ms, recoverable=exc.kind.recoverable) from None
        except Exception:
            if cancel.is_set():
                raise ProtocolError("cancelled", "The invocation was cancelled.") from None
            log.exception("tool %s raised (correlation id %s)", tool.name, correlation_id)
            raise ProtocolError("internal_error",
                                f"{tool.name} failed unexpectedly (correlation id {correlation_id}).",
                                {"correlation_id": correlation_id}) from None
        finally:
            session.untrack_running(request_id)
            if watch is not None:
                self._ticker.unwatch(watch)
            with sink_lock:  # a progress message already on its way is dropped from here on
                finished.set()
        if cancel.is_set():
            raise ProtocolError("cancelled", "The invocation was cancelled.")
        duration_ms = int((self.clock.monotonic() - started) * 1000)
        try:
            result = to_jsonable_python(result)
        except Exception:
            result = None
        if not isinstance(result, dict):
            log.error("tool %s returned a non-object result (correlation id %s)", tool.name, correlation_id)
            raise ProtocolError("internal_error",
                                f"{tool.name} returned an invalid result (correlation id {correlation_id}).",
                                {"correlation_id": correlation_id})
        if tool.output_schema is not None:
            import jsonschema

            problems = list(jsonschema.Draft202012Validator(dict(tool.output_schema)).iter_errors(result))
            if problems:
                log.error("tool %s result breaks its output schema (correlation id %s): %s",
                          tool.name, correlation_id, problems[0].message)
                raise ProtocolError("internal_error",
                                    f"{tool.name} returned an invalid result (correlation id {correlation_id}).",
                                    {"correlation_id": correlation_id})
        payload = {"result": result, **self._outcome(tool, dict(request.args), result, bound, duration_ms,
                                                     correlation_id)}
        if gate_decision is not None:
            payload["x-gate_decision"] = gate_decision
        finished.set()
        sink(envelope("progress", request_id, {"status": "finalizing"}))
        return envelope("invoke_response", request_id, payload)

    def _outcome(self, tool: ToolDefinition, args: dict[str, Any], result: dict[str, Any],
                 bound: BoundContext, duration_ms: int, correlation_id: str) -> dict[str, Any]:
        """``state_delta``, ``observability`` and ``next`` of a successful invocation (spec 07
        §3-5). The outcome is advisory: a faulty one is logged and dropped, never turned into an
        error after the tool already ran."""
        outcome = InvocationOutcome()
        if tool.outcome is not None:
            try:
                outcome = tool.outcome(args, result, bound)
            except Exception:
                log.exception("outcome of %s failed (correlation id %s)", tool.name, correlation_id)
        now = format_time(int(self.clock.time() * 1000))
        source = {"source_type": "server", "source_id": f"{self.info.server_name}:{tool.name}",
                  "asserted_at": now}
        asserts = []
        for item in outcome.asserts:
            fact = self._delta_fact(item, tool.name)
            if fact is None:
                continue
            given = item.get("source")
            fact["source"] = {**source, **given} if isinstance(given, Mapping) else dict(source)
            fact["category"] = item.get("category") or "session"
            asserts.append(fact)
        if len(asserts) > self.limits.max_delta_facts:
            log.warning("%s asserted %d facts; keeping %d (max_delta_facts)", tool.name, len(asserts),
                        self.limits.max_delta_facts)
            asserts = asserts[:self.limits.max_delta_facts]
        retracts = [r for r in (self._delta_pattern(item, tool.name) for item in outcome.retracts) if r]
        out: dict[str, Any] = {}
        if asserts or retracts:
            out["state_delta"] = {"assert": asserts, "retract": retracts[:self.limits.max_delta_facts]}
        events = [{"action": tool.name, "status": "success", "duration_ms": duration_ms},
                  *(dict(e) for e in outcome.events)]
        out["observability"] = {"summary": outcome.summary or f"{tool.name} completed in {duration_ms} ms.",
                                "duration_ms": duration_ms,
                                "events": events[:self.limits.max_observability_events]}
        suggested = []
        for item in outcome.suggested_intents:
            name = item.get("name")
            if name not in self._intent_names:
                log.warning("%s suggested the unknown intent %r; dropped", tool.name, name)
                continue
            entry = {"name": name, "description": str(item.get("description") or name)}
            if item.get("params"):
                entry["params"] = dict(item["params"])
            suggested.append(entry)
        continuation = [f for f in (self._delta_fact(item, tool.name) for item in outcome.continuation_facts)
                        if f is not None]
        if suggested or continuation:
            out["next"] = {"suggested_intents": suggested, "continuation_facts": continuation}
        return out

    def _delta_fact(self, item: Mapping[str, Any], tool_name: str) -> dict[str, Any] | None:
        """A well-formed fact the profile declares, in wire form; None (logged) otherwise. A
        temporal predicate without ``t`` gets ``{"at": <now>}``: it held when it was asserted."""
        wire = {k: item[k] for k in ("pred", "args", "t") if k in item and item[k] is not None}
        if wire.get("pred") in self._temporal and "t" not in wire:
            wire["t"] = {"at": format_time(int(self.clock.time() * 1000))}
        _, violations = validate_facts([wire], self.facts_profile)
        if violations:
            log.error("%s produced an invalid delta fact: %s", tool_name, violations[0]["message"])
            return None
        return dict(wire)

    def _delta_pattern(self, item: Mapping[str, Any], tool_name: str) -> dict[str, Any] | None:
        """A retract pattern (``None`` = wildcard) of a declared predicate with the right arity."""
        pred, args = item.get("pred"), item.get("args")
        declared = {p.predicate: p for p in self.facts_profile.predicates or ()}
        schema = declared.get(pred) if isinstance(pred, str) else None
        if schema is None or not isinstance(args, list) or len(args) != schema.arity:
            log.error("%s produced an invalid retract pattern for %r", tool_name, pred)
            return None
        return {"pred": pred, "args": list(args)}


def http_error_status(message: Mapping[str, Any]) -> int:
    """HTTP status for a final message: 200 for responses, the code's status for errors."""
    if message.get("type") != "error":
        return 200
    return http_status(str(message.get("payload", {}).get("code", "internal_error")))
