"""Transport-independent MangleCP server framework: validation, limits, auth, rendering, invocation.

A `ManglecpServer` takes one message (bytes, text or dict) and returns the messages to send back.
It runs the layer-1 checks (MangleCP spec 08 §2.1) in the order size -> envelope -> version ->
type -> auth -> status -> rate limit -> payload -> facts, hands valid intents to an `Evaluator`
(the selection engine, e.g. clingo rules), renders the selected macro-tools with disclosure levels
(spec 05 §5, spec 06), caches them for invocation, and runs invocations with schema validation,
confirmation tokens, progress and cancellation (spec 07). Transports (stdio, HTTP, in-process)
only move bytes; they all call `ManglecpServer.handle`.
"""

from __future__ import annotations

import base64
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
from typing import Any, Callable, Iterable, Mapping, Protocol

import jsonschema
from pydantic_core import to_jsonable_python

from ftl.errors import FtlError
from ftl.manglecp.messages import (
    CLIENT_TYPES, MIN_MESSAGE_BYTES, PROTOCOL_VERSION, SUPPORTED_VERSIONS, Cancel, FactsProfile,
    IntentRequest, InvokeRequest, Manifest, NormalFact, PredicateSchema, ProtocolError,
    Authenticate, envelope, facts_error, format_time, http_status, make_error, parse_message,
    parse_payload, parse_time, validate_facts)

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


@dataclass(frozen=True)
class Selection:
    """One tool chosen by the evaluator.

    Attributes:
        tool: a catalog name.
        score: relevance 0-100 (drives adaptive disclosure and ordering).
        phase: ``skeleton``, ``flesh`` or ``dependency`` (``metadata.selection_phase``).
        rules: predicate-level rule chain for proof hints (names only).
    """

    tool: str
    score: int
    phase: str
    rules: tuple[str, ...] = ()


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
    """

    intent: str
    params: Mapping[str, Any]
    facts: tuple[NormalFact, ...]
    eval_time_ms: int
    max_facts_created: int
    max_compute_ms: int | None = None
    max_intervals_per_atom: int | None = None
    cancel: threading.Event | None = None


@dataclass(frozen=True)
class EvaluationResult:
    """The evaluator's answer.

    Attributes:
        selections: chosen tools (any order; the server sorts).
        excluded: ``(tool, phase, reason)`` for proof hints.
        facts_evaluated: facts in the store at the start (server + session).
        facts_derived: facts derived by this evaluation.
        phases_completed: pipeline phases run.
    """

    selections: tuple[Selection, ...]
    excluded: tuple[tuple[str, str, str], ...] = ()
    facts_evaluated: int = 0
    facts_derived: int = 0
    phases_completed: int = 6


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
    rate limiting (token bucket per identity; ``rate_per_s=None`` disables it), the macro cache
    (``macro_ttl_s``, ``macro_cache_size``), adaptive disclosure thresholds (spec 05 §5.2
    defaults 70/40/20), confirmation token lifetime and the retry hint for ``server_not_ready``.
    """

    max_message_bytes: int = MIN_MESSAGE_BYTES
    max_facts_per_request: int = 10_000
    max_derived_facts: int = 100_000
    max_compute_ms: int | None = 30_000
    max_intervals_per_atom: int | None = None
    rate_per_s: float | None = None
    rate_burst: int = 20
    macro_ttl_s: float = 3600.0
    macro_cache_size: int = 4096
    full_threshold: int = 70
    condensed_threshold: int = 40
    minimal_threshold: int = 20
    confirmation_ttl_s: float = 300.0
    not_ready_retry_after_ms: int = 1000


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
        self._lock = threading.Lock()

    def _register(self, request_id: str, event: threading.Event) -> None:
        with self._lock:
            self._running[request_id] = event

    def _unregister(self, request_id: str) -> None:
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
            events = list(self._running.values())
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


def macro_id_for(tool: ToolDefinition, intent: str) -> str:
    """Deterministic macro id: ``"m-" + sha256(canonical [name, version, intent])[:16]``.

    Same tool, version and intent give the same id in every process (no salted `hash()`).
    """
    digest = hashlib.sha256(canonical_json([tool.name, tool.version, intent]).encode("utf-8"))
    return "m-" + digest.hexdigest()[:16]


def estimate_tokens(rendered: Mapping[str, Any]) -> int:
    """Token estimate of a rendered tool: ceil(canonical JSON length / 4) (reference §11 item 14)."""
    return math.ceil(len(canonical_json(rendered)) / 4)


def render_tool(tool: ToolDefinition, macro_id: str, level: str, selection: Selection) -> dict[str, Any]:
    """A MacroTool dict at ``level`` (spec 06 §4 field whitelist: minimal never carries a
    description or metadata; only full carries schemas and safety)."""
    out: dict[str, Any] = {"macro_id": macro_id, "name": tool.name, "disclosure_level": level}
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
    if tool.instructions:
        out["context_injection"] = {"instructions": tool.instructions}
    out["metadata"] = metadata
    return out


@dataclass
class _Macro:
    tool: str
    intent: str
    created_s: float


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
    """

    def __init__(self, manifest_info: ServerInfo, catalog: Mapping[str, ToolDefinition],
                 evaluator: Evaluator, *, limits: ServerLimits | None = None,
                 auth: BearerAuth | None = None, clock: Clock | None = None,
                 status: str = "ready", secret: bytes | None = None) -> None:
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
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()
        self._confirm = ConfirmationTokens(secret or os.urandom(32), self.limits.confirmation_ttl_s,
                                           self.clock)
        self._validators = {name: jsonschema.Draft202012Validator(dict(tool.input_schema))
                            for name, tool in self.catalog.items()}
        self.facts_profile = self._facts_profile()

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

    def manifest_payload(self) -> dict[str, Any]:
        """The manifest payload (spec 04 §3), validated against `Manifest`."""
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
                         "conformance_level": self.info.conformance_level},
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
        """Release the evaluator (worker processes)."""
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
        session = session or Session()
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

        def effective(client: int | None, server: int | None) -> int | None:
            return server if client is None else (client if server is None else min(client, server))

        c = request.constraints
        cancel = threading.Event()
        if request_id:
            session._register(request_id, cancel)
        started = self.clock.monotonic()
        try:
            result = self.evaluator.evaluate(EvaluationInput(
                intent=intent, params=request.intent.params, facts=tuple(facts),
                eval_time_ms=eval_time_ms,
                max_facts_created=effective(c.max_facts_created, self.limits.max_derived_facts) or 0,
                max_compute_ms=effective(c.max_compute_ms, self.limits.max_compute_ms),
                max_intervals_per_atom=effective(c.max_intervals_per_atom,
                                                 self.limits.max_intervals_per_atom),
                cancel=cancel))
        finally:
            if request_id:
                session._unregister(request_id)
        if cancel.is_set():
            raise ProtocolError("cancelled", "The evaluation was cancelled.")
        duration_ms = int((self.clock.monotonic() - started) * 1000)
        upgrades = {str(f.args[0]) for f in facts if f.pred == "disclosure_upgrade" and f.args}
        tools, hints = self._render(intent, result, request, upgrades)
        with self._lock:
            for tool in tools:
                key = (session.key or principal.identity, tool["macro_id"])
                self._macros[key] = _Macro(tool["name"], intent, self.clock.time())
                self._macros.move_to_end(key)
            while len(self._macros) > self.limits.macro_cache_size:
                self._macros.popitem(last=False)
        payload: dict[str, Any] = {
            "eval_time_used": eval_time_used, "eval_duration_ms": duration_ms, "macro_tools": tools,
            "diagnostics": {"facts_evaluated": result.facts_evaluated,
                            "facts_derived": result.facts_derived,
                            "phases_completed": result.phases_completed}}
        if request.options.include_proof_hints:
            payload["proof_hints"] = hints
        return envelope("intent_response", request_id, payload)

    def _render(self, intent: str, result: EvaluationResult, request: IntentRequest,
                upgrades: set[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Order, level, truncate and budget the selected tools (spec 05 §5, reference §4.7)."""
        chosen: list[tuple[Selection, ToolDefinition, str]] = []
        for selection in result.selections:
            tool = self.catalog.get(selection.tool)
            if tool is None:
                log.warning("rules selected %r, which is not in the catalog", selection.tool)
                continue
            chosen.append((selection, tool, macro_id_for(tool, intent)))
        chosen.sort(key=lambda item: (-item[0].score, item[2]))
        preference = request.options.disclosure_preference
        limits = self.limits
        levels: list[str | None] = []
        for selection, _, mid in chosen:
            if mid in upgrades:
                levels.append("full")
            elif preference != "adaptive":
                levels.append(preference)
            elif selection.score >= limits.full_threshold:
                levels.append("full")
            elif selection.score >= limits.condensed_threshold:
                levels.append("condensed")
            elif selection.score >= limits.minimal_threshold:
                levels.append("minimal")
            else:
                levels.append(None)
        kept = [(item, level) for item, level in zip(chosen, levels) if level is not None]
        cap = request.constraints.max_tools_returned
        if cap is not None:
            kept = kept[:cap]
        budget = request.constraints.max_tokens_budget
        if budget is not None:
            kept = self._fit_budget(kept, budget, upgrades)
        tools = [render_tool(tool, mid, level, sel) for (sel, tool, mid), level in kept]
        hints = {
            "derivations": [{"macro_id": mid, "selected_by": sel.phase, "score": sel.score,
                             "rule_chain": list(sel.rules)} for (sel, _, mid), _ in kept],
            "excluded": [{"candidate": name, "excluded_by": phase, "reason": reason}
                         for name, phase, reason in sorted(result.excluded)],
        }
        return tools, hints

    @staticmethod
    def _fit_budget(kept: list, budget: int, upgrades: set[str]) -> list:
        """Demote the lowest-scored tools one level at a time, then drop from the bottom."""
        kept = list(kept)

        def total() -> int:
            return sum(estimate_tokens(render_tool(tool, mid, level, sel))
                       for (sel, tool, mid), level in kept)

        while kept and total() > budget:
            for index in range(len(kept) - 1, -1, -1):
                (sel, tool, mid), level = kept[index]
                if level != "minimal" and mid not in upgrades:
                    kept[index] = ((sel, tool, mid), LEVELS[LEVELS.index(level) + 1])
                    break
            else:
                kept.pop()
        return kept

    # -- invocation (spec 07) ----------------------------------------------------------------

    def _invoke(self, request_id: str, request: InvokeRequest, principal: Principal,
                session: Session, sink: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        key = (session.key or principal.identity, request.macro_id)
        with self._lock:
            macro = self._macros.get(key)
            if macro is not None and self.clock.time() - macro.created_s > self.limits.macro_ttl_s:
                del self._macros[key]
                macro = None
        if macro is None or macro.tool not in self.catalog:
            raise ProtocolError("macro_not_found",
                                f"Macro-tool {request.macro_id!r} is unknown or evicted; evaluate "
                                "the intent again.", {"macro_id": request.macro_id})
        if not principal.permits(macro.intent):
            raise ProtocolError("auth_insufficient", "This caller may not invoke the macro-tool.")
        tool = self.catalog[macro.tool]
        errors = sorted(self._validators[tool.name].iter_errors(request.args),
                        key=lambda e: ("/" + "/".join(map(str, e.absolute_path)), str(e.validator)))
        if errors:
            schema_errors = [{"path": "/" + "/".join(map(str, e.absolute_path)),
                              "message": e.message if len(e.message) <= 300 else e.message[:297] + "...",
                              "keyword": str(e.validator)} for e in errors]
            raise ProtocolError("schema_validation_failed",
                                f"The args do not match the input schema of {tool.name} "
                                f"({len(schema_errors)} error(s)).",
                                {"schema_errors": schema_errors, "tool": tool.name})
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
        return self._execute(request_id, tool, request, principal, session, sink)

    def _execute(self, request_id: str, tool: ToolDefinition, request: InvokeRequest,
                 principal: Principal, session: Session,
                 sink: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        cancel = threading.Event()
        correlation_id = uuid.uuid4().hex[:12]

        def progress(update: Mapping[str, Any]) -> None:
            payload: dict[str, Any] = {"status": "running"}
            detail = update.get("message") or update.get("detail")
            if detail:
                payload["detail"] = str(detail)[:500]
            percent = update.get("percent")
            if isinstance(percent, (int, float)) and not isinstance(percent, bool):
                payload["percent"] = max(0.0, min(100.0, float(percent)))
            sink(envelope("progress", request_id, payload))

        session._register(request_id, cancel)
        sink(envelope("progress", request_id, {"status": "started"}))
        started = self.clock.monotonic()
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
            session._unregister(request_id)
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
            problems = list(jsonschema.Draft202012Validator(dict(tool.output_schema)).iter_errors(result))
            if problems:
                log.error("tool %s result breaks its output schema (correlation id %s): %s",
                          tool.name, correlation_id, problems[0].message)
                raise ProtocolError("internal_error",
                                    f"{tool.name} returned an invalid result (correlation id {correlation_id}).",
                                    {"correlation_id": correlation_id})
        sink(envelope("progress", request_id, {"status": "finalizing"}))
        return envelope("invoke_response", request_id, {
            "result": result,
            "observability": {"summary": f"{tool.name} completed in {duration_ms} ms.",
                              "duration_ms": duration_ms,
                              "events": [{"action": tool.name, "status": "success",
                                          "duration_ms": duration_ms}]}})


def http_error_status(message: Mapping[str, Any]) -> int:
    """HTTP status for a final message: 200 for responses, the code's status for errors."""
    if message.get("type") != "error":
        return 200
    return http_status(str(message.get("payload", {}).get("code", "internal_error")))
