"""The MangleCP server: one message in, the messages to send back out (transport-independent).

A `ManglecpServer` takes one message (bytes, text or dict) and returns the messages to send back.
It runs the layer-1 checks (MangleCP spec 08 §2.1) in the order size -> envelope -> version ->
type -> auth -> status -> rate limit -> payload -> facts, hands valid intents to an `Evaluator`
(the selection engine, e.g. clingo rules), renders the selected macro-tools with disclosure levels,
skills, context resources and validity windows (spec 05 §5, spec 06), caches them with the
evaluation they are bound to (reference §5.5), and runs invocations with expiry, schema
validation, an optional gate, confirmation tokens, periodic progress and cancellation, answering
with the result, a state delta and suggested next intents (spec 07). It advertises its manifest
and status (spec 04 §3, §3.2). Transports (stdio, HTTP, in-process) only move bytes; they all call
`ManglecpServer.handle`; `http_error_status` maps a final message to its HTTP status (spec 09).

The parts it is built from live beside it: `ftl.manglecp.definitions` (tool definitions, limits,
manifest content, the evaluator interface, clocks), `ftl.manglecp.access` (principals, bearer
auth, sessions, rate limit, confirmation tokens) and `ftl.manglecp.render` (macro ids, disclosure
levels, token estimate). The names in ``__all__`` that come from those modules are re-exported for
code written before the split; ftl's own code imports each name from its home.

Gate hook: an optional duck-typed ``gate`` object with ``visible(tool_name) -> bool`` (tools it
hides are absent: never selected, ``macro_not_found`` on invoke) and ``check(call)`` (called on
every invocation after schema validation and before anything runs; it raises an `FtlError` of a
gate kind, rendered from that kind's registry row). When ``check`` returns an object with
``public() -> dict``, the invoke response carries that dict as the extension ``x-gate_decision``.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Mapping

from pydantic_core import to_jsonable_python

from ftl.errors import FtlError
from ftl.ids import unique_hex
from ftl.manglecp.access import ANONYMOUS, BearerAuth, ConfirmationTokens, Principal, Session, TokenBucket
from ftl.manglecp.definitions import (
    BoundContext, Clock, EvaluationInput, EvaluationResult, Evaluator, InvocationContext,
    InvocationOutcome, Selection, ServerInfo, ServerLimits, Skill, SystemClock, ToolDefinition,
    canonical_json)
from ftl.manglecp.facts import NormalFact, facts_error, format_time, parse_time, validate_facts
from ftl.manglecp.messages import (
    CLIENT_TYPES, MIN_MESSAGE_BYTES, PRED_RE, PROTOCOL_VERSION, SUPPORTED_VERSIONS, Cancel,
    FactsProfile, IntentRequest, InvokeRequest, Manifest, PredicateSchema, ProtocolError,
    Authenticate, dumps, encode, envelope, http_status, make_error, parse_message, parse_payload,
    to_ftl_error)
from ftl.manglecp.progress import ProgressTicker
from ftl.manglecp.render import LEVELS, RenderChoice, estimate_tokens, macro_id_for, render_tool, wire_fact
from ftl.manglecp.schema_check import SchemaCheck
from ftl.sanitize import looks_internal, sanitize_text, sanitize_value

# The server's own names, then the names re-exported from the modules split out of this one.
__all__ = [
    "ManglecpServer", "STATUSES", "encode_reply", "http_error_status",
    "ANONYMOUS", "BearerAuth", "ConfirmationTokens", "Principal", "Session", "TokenBucket",
    "BoundContext", "Clock", "EvaluationInput", "EvaluationResult", "Evaluator", "InvocationContext",
    "InvocationOutcome", "Selection", "ServerInfo", "ServerLimits", "Skill", "SystemClock",
    "ToolDefinition", "canonical_json",
    "LEVELS", "RenderChoice", "estimate_tokens", "macro_id_for", "render_tool", "wire_fact",
]

log = logging.getLogger("ftl.manglecp.server")

STATUSES = ("ready", "booting", "degraded", "draining")


# ---------------------------------------------------------------------------------------------
# The macro cache (reference §5.5)


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
        self._validators: dict[tuple[str, str], Any] = {}  # (tool, "input"|"output") -> validator, built on first use
        self.skills = dict(skills or {})
        self.gate = gate
        self.on_error = on_error
        self.facts_profile = self._facts_profile()
        self._temporal = {p.predicate for p in self.facts_profile.predicates or () if p.temporal}
        self._declared = {p.predicate: p for p in self.facts_profile.predicates or ()}
        # (pred, argument types, stamped here) of delta facts that passed `validate_facts`
        self._valid_delta_shapes: set[tuple[Any, ...]] = set()
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
            correlation_id = unique_hex(12)
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
        # string args only: policy engines (Cedar) want homogeneous sets
        summary = [{"pred": f.pred, "args": [a if isinstance(a, str) else canonical_json(a) for a in f.args]}
                   for f in facts[:50]]
        call = {"tool": tool.name, "args": dict(request.args), "side_effects": list(tool.side_effects),
                # One name for an unauthenticated caller on every surface ("anonymous", as the
                # MCP server and the gate docs say): a policy about it applies everywhere.
                "principal": principal.identity,
                "context": {"intent": macro.bound.intent, "macro_id": request.macro_id,
                            "request_id": request_id, "fact_count": len(facts),
                            "predicates": sorted({f.pred for f in facts}), "facts": summary}}
        try:
            decision = self.gate.check(call)
        except FtlError as exc:
            row = exc.kind
            log.info("gate refused %s: %s (%s)", tool.name, exc.error_type, exc.details)
            details = {**sanitize_value(exc.safe_details()), "error_type": exc.error_type}
            gate = row.gate or exc.details.get("gate")
            if gate:
                details["gate"] = sanitize_text(str(gate), 256)
            raise ProtocolError(row.manglecp_code, _safe_message(exc), details,
                                retry_after_ms=exc.retry_after_ms, recoverable=row.recoverable) from None
        except Exception:
            correlation_id = unique_hex(12)
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

    def _validator(self, tool: ToolDefinition, schema: str = "input") -> SchemaCheck:
        """The JSON Schema (2020-12) check of ``tool``'s ``input`` or ``output`` schema
        (`ftl.manglecp.schema_check`), built once, at the first invocation, not at server start
        (boot time, issue 11 item 2)."""
        validator = self._validators.get((tool.name, schema))
        if validator is None:
            validator = SchemaCheck(tool.input_schema if schema == "input" else tool.output_schema)
            self._validators[(tool.name, schema)] = validator
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
            # "now" is echoed as the time it stood for (spec 05: the server's clock)
            eval_time_used = format_time(eval_time_ms) if parsed == "now" else request.eval_time
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
        if session.cancel_pending(request_id):  # do not ask the gate (an approver) for nothing
            raise ProtocolError("cancelled", "The invocation was cancelled.")
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
        try:
            return self._execute(request_id, tool, request, principal, session, sink, macro.bound,
                                 gate_decision)
        except ProtocolError as error:
            if gate_decision is not None:  # the gates let it through; the tool then failed
                error.details = {**(error.details or {}), "x-gate_decision": gate_decision}
            raise

    def _execute(self, request_id: str, tool: ToolDefinition, request: InvokeRequest,
                 principal: Principal, session: Session,
                 sink: Callable[[dict[str, Any]], None], bound: BoundContext,
                 gate_decision: dict[str, Any] | None = None) -> dict[str, Any]:
        cancel = session.claim_cancel_flag(request_id)
        correlation_id = unique_hex(12)
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
        if cancel.is_set():  # cancelled before it was tracked (queued, validating, at the gate)
            session.untrack_running(request_id)
            raise ProtocolError("cancelled", "The invocation was cancelled.")
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
            details = {**sanitize_value(exc.safe_details()), "error_type": exc.error_type}
            raise ProtocolError(exc.kind.manglecp_code, _safe_message(exc), details,
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
        if isinstance(result, dict) and not _encodable(result):
            log.error("tool %s returned a result JSON cannot carry (NaN, infinity or nesting too deep; "
                      "correlation id %s)", tool.name, correlation_id)
            result = None
        if not isinstance(result, dict):
            log.error("tool %s returned a non-object result (correlation id %s)", tool.name, correlation_id)
            raise ProtocolError("internal_error",
                                f"{tool.name} returned an invalid result (correlation id {correlation_id}).",
                                {"correlation_id": correlation_id})
        if tool.output_schema is not None:
            problems = list(self._validator(tool, "output").iter_errors(result))
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
            fact = self._delta_fact(item, tool.name, now)
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
        continuation = [f for f in (self._delta_fact(item, tool.name, now)
                                    for item in outcome.continuation_facts)
                        if f is not None]
        if suggested or continuation:
            out["next"] = {"suggested_intents": suggested, "continuation_facts": continuation}
        return out

    def _delta_fact(self, item: Mapping[str, Any], tool_name: str,
                    now: str | None = None) -> dict[str, Any] | None:
        """A well-formed fact the profile declares, in wire form; None (logged) otherwise. A
        temporal predicate without ``t`` gets ``{"at": now}`` (``now``: RFC 3339; None: the
        clock's): it held when it was asserted.

        A fact whose arguments are all strings and booleans, with no ``t`` or the one given
        here, passes or fails `validate_facts` by its predicate and the types of its arguments
        alone, so that verdict is remembered per such shape (two delta facts per task)."""
        wire = {k: item[k] for k in ("pred", "args", "t") if k in item and item[k] is not None}
        pred, args = wire.get("pred"), wire.get("args")
        stamped = pred in self._temporal and "t" not in wire
        if stamped:
            wire["t"] = {"at": now if now is not None else format_time(int(self.clock.time() * 1000))}
        shape = None
        if (type(pred) is str and type(args) is list and (stamped or "t" not in wire)
                and all(type(value) is str or type(value) is bool for value in args)):
            shape = (pred, tuple(map(type, args)), stamped)
            if shape in self._valid_delta_shapes:
                return dict(wire)
        _, violations = validate_facts([wire], self.facts_profile)
        if violations:
            log.error("%s produced an invalid delta fact: %s", tool_name, violations[0]["message"])
            return None
        if shape is not None:
            self._valid_delta_shapes.add(shape)
        return dict(wire)

    def _delta_pattern(self, item: Mapping[str, Any], tool_name: str) -> dict[str, Any] | None:
        """A retract pattern (``None`` = wildcard) of a declared predicate with the right arity."""
        pred, args = item.get("pred"), item.get("args")
        schema = self._declared.get(pred) if isinstance(pred, str) else None
        if schema is None or not isinstance(args, list) or len(args) != schema.arity:
            log.error("%s produced an invalid retract pattern for %r", tool_name, pred)
            return None
        return {"pred": pred, "args": list(args)}


def _safe_message(error: FtlError) -> str:
    """The client-facing message of a tool's or a gate's `FtlError`, by the same rule as the
    JSON-RPC and response-v2 surfaces (design §7: internals only in the server log): a message
    carrying a traceback, SQL or policy text becomes the registry row's template; then secrets
    are scrubbed, absolute paths cut and the text capped (`ftl.sanitize.sanitize_text`)."""
    text = str(error.message or "")
    if looks_internal(text):
        text = error.template_message()
    return sanitize_text(text) or error.error_type


def _encodable(value: Any) -> bool:
    """Whether `dumps` can write ``value``: no NaN or infinity (RFC 8259 has neither), no
    nesting deep enough for RecursionError, nothing that is not JSON."""
    try:
        dumps(value)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def encode_reply(message: Mapping[str, Any]) -> tuple[bytes, Mapping[str, Any]]:
    """The wire bytes of a server message, and the message they carry.

    A message that cannot be encoded (a NaN in a gate decision, an infinite number in a proof
    hint...) is logged under a new correlation id and replaced by an ``internal_error`` with the
    same id, so the client always gets its final message instead of waiting for ever (spec 09
    §2: every request ends in a response or an error). Transports send the returned bytes; a
    replaced ``progress`` message should be dropped instead (the final one follows).

    Returns:
        (UTF-8 JSON without a newline, the message encoded: ``message`` or its replacement).
    """
    try:
        return encode(message), message
    except (ValueError, TypeError, RecursionError) as exc:
        correlation_id = unique_hex(12)
        log.error("a %s for %r cannot be encoded (%s; correlation id %s)", message.get("type"),
                  message.get("id"), type(exc).__name__, correlation_id)
        replacement = make_error("internal_error",
                                 f"The reply could not be encoded (correlation id {correlation_id}).",
                                 {"correlation_id": correlation_id}, id=message.get("id"))
        return encode(replacement), replacement


def http_error_status(message: Mapping[str, Any]) -> int:
    """HTTP status for a final message: 200 for responses, the code's status for errors."""
    if message.get("type") != "error":
        return 200
    return http_status(str(message.get("payload", {}).get("code", "internal_error")))
