"""MangleCP wire layer: the envelope, every payload model, parsing, serialising and error envelopes.

Protocol draft ``2026-02-draft`` (MangleCP spec 02 envelope, 03 §3 wire facts, 04 manifest,
05 intents, 06 macro-tools, 07 invocation, 08 authentication, 09 errors). Both the client and the
server use this module; it knows nothing of ftl's tools. Error rows (HTTP status, ``recoverable``)
come from `ftl.errors.MANGLECP_CODES`, so no code is invented here.

Checking client facts against a facts profile, time values and the client's state-delta update
live in `ftl.manglecp.facts`, which builds on this module. The names in ``__all__`` that come from
there are re-exported (loaded on first access, PEP 562) for code written before the split; ftl's
own code imports each name from its home.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ftl.errors import MANGLECP_CODES, REGISTRY, FtlError

# Names that moved to ftl.manglecp.facts. They load from there on first access (`__getattr__`
# below): facts imports this module, so importing them here at load time would be a circle.
_MOVED_TO_FACTS = ("RESERVED_PREFIX", "INT53_MAX", "FACT_ISSUES", "UNBOUNDED", "NOW", "parse_time",
                   "format_time", "NormalFact", "validate_facts", "facts_error", "matches_pattern",
                   "apply_state_delta")

# This module's own names, then the names re-exported from ftl.manglecp.facts.
__all__ = [
    "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "MIN_MESSAGE_BYTES", "CLIENT_TYPES", "SERVER_TYPES",
    "MESSAGE_TYPES", "ID_REQUIRED_TYPES", "PRED_RE", "PRED_MAX_LEN",
    "ProtocolError", "code_row", "http_status", "make_error", "to_ftl_error", "retry_hint_ms",
    "Envelope", "Source", "Fact", "fact", "PredicateSchema", "FactsProfile", "ProtocolInfo", "Domain",
    "Endpoints", "IntentInfo", "Capabilities", "Limits", "AuthInfo", "Manifest", "IntentSpec",
    "Constraints", "DisclosureLevel", "Options", "IntentRequest", "Safety", "ToolMetadata",
    "MacroTool", "IntentResponse", "InvokeRequest", "StateDelta", "InvokeResponse", "Progress",
    "ErrorPayload", "Cancel", "Authenticate", "AuthenticateResponse", "PAYLOAD_MODELS",
    "envelope", "dumps", "encode", "parse_message", "parse_payload",
    *_MOVED_TO_FACTS,
]

PROTOCOL_VERSION = "2026-02-draft"
SUPPORTED_VERSIONS: tuple[str, ...] = (PROTOCOL_VERSION,)
MIN_MESSAGE_BYTES = 16 * 1024 * 1024  # spec 02 §3.4: every server accepts at least 16 MiB

# Spec 02 §2.2 plus the three types used by spec 02 §6.2 and spec 08 §3.3 (reference §11 item 1).
CLIENT_TYPES = frozenset({"intent_request", "invoke_request", "cancel", "authenticate"})
SERVER_TYPES = frozenset({"manifest", "intent_response", "invoke_response", "progress", "error",
                          "authenticate_response"})
MESSAGE_TYPES = CLIENT_TYPES | SERVER_TYPES
# Requests that need a non-empty id; `cancel` may carry null (reference §11 item 2).
ID_REQUIRED_TYPES = frozenset({"intent_request", "invoke_request", "authenticate"})

PRED_RE = re.compile(r"^[a-z][a-z0-9_]*$")
PRED_MAX_LEN = 128


# ---------------------------------------------------------------------------------------------
# Errors


class ProtocolError(Exception):
    """A MangleCP error to send back as an ``error`` envelope.

    Args:
        code: a spec 09 code (or an ``x-`` code of the registry).
        message: safe, human-readable text (never paths, traces or secrets).
        details: structured details (spec 09 §3.2 shapes).
        retry_after_ms: server hint, in ms.
        id: the id of the request this error answers; ``None`` when it cannot be correlated.
        recoverable: override of the registry's flag (used for tool errors whose registry row
            differs from the code's default).
    """

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None, *,
                 retry_after_ms: int | None = None, id: str | None = None,
                 recoverable: bool | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = dict(details) if details else None
        self.retry_after_ms = retry_after_ms
        self.id = id
        self.recoverable = recoverable

    def envelope(self, id: str | None = None) -> dict[str, Any]:
        """The ``error`` envelope; ``id`` (when given) replaces the stored one."""
        return make_error(self.code, self.message, self.details, self.retry_after_ms,
                          id if id is not None else self.id, recoverable=self.recoverable)


def code_row(code: str) -> tuple[int, bool]:
    """(HTTP status, recoverable) for ``code``: spec 09 §3.1, else the registry row using it.

    Unknown codes fail closed as (500, False).
    """
    if code in MANGLECP_CODES:
        return MANGLECP_CODES[code]
    for row in REGISTRY.values():
        if row.manglecp_code == code:
            return row.http_status, row.recoverable
    return 500, False


def http_status(code: str) -> int:
    """HTTP status of an error code (MangleCP spec 09 §3.1; reference §11 item 4)."""
    return code_row(code)[0]


def make_error(code: str, message: str, details: Mapping[str, Any] | None = None,
               retry_after_ms: int | None = None, id: str | None = None, *,
               recoverable: bool | None = None) -> dict[str, Any]:
    """Build an ``error`` envelope (MangleCP spec 09 §2).

    Args:
        code: error code; ``recoverable`` defaults to its registry flag.
        message: safe text.
        details: optional structured details.
        retry_after_ms: optional wait hint, in ms.
        id: the answered request's id, or ``None`` when it cannot be correlated.
    Returns:
        ``{"type": "error", "id": ..., "manglecp": ..., "payload": {code, message, recoverable, ...}}``.
    """
    payload: dict[str, Any] = {"code": code, "message": message,
                               "recoverable": code_row(code)[1] if recoverable is None else recoverable}
    if details:
        payload["details"] = dict(details)
    if retry_after_ms is not None:
        payload["retry_after_ms"] = int(retry_after_ms)
    return envelope("error", id, payload)


# MangleCP code -> ftl registry kind, for codes whose error carries no `details.error_type`.
_CODE_TO_KIND: dict[str, str] = {
    "unsupported_version": "unsupported_version",
    "malformed_message": "invalid_request",
    "message_too_large": "message_too_large",
    "invalid_type": "invalid_type",
    "auth_required": "auth_required",
    "auth_invalid": "auth_invalid",
    "auth_insufficient": "auth_insufficient",
    "invalid_facts": "invalid_facts",
    "unknown_predicate": "invalid_facts",
    "arity_mismatch": "invalid_facts",
    "type_mismatch": "invalid_facts",
    "reserved_predicate": "invalid_facts",
    "too_many_facts": "too_many_facts",
    "evaluation_timeout": "timeout",
    "derivation_limit_exceeded": "derivation_limit_exceeded",
    "interval_limit_exceeded": "derivation_limit_exceeded",
    "invalid_temporal_pattern": "evaluation_failed",
    "evaluation_failed": "evaluation_failed",
    "macro_not_found": "macro_not_found",
    "macro_expired": "macro_expired",
    "schema_validation_failed": "invalid_params",
    "confirmation_required": "confirmation_required",
    "confirmation_invalid": "approval_rejected",
    "execution_failed": "execution_failed",
    "server_not_ready": "server_not_ready",
    "rate_limited": "rate_limited",
    "internal_error": "internal_error",
    "cancelled": "cancelled",
}


def to_ftl_error(error_payload: Mapping[str, Any]) -> FtlError:
    """Turn a MangleCP error payload into the `FtlError` the runner's recovery understands.

    ``details.error_type`` wins when it names a registry kind (errors raised by ftl's own tools
    travel that way); otherwise the code is mapped (``evaluation_timeout`` -> ``timeout``,
    ``schema_validation_failed`` -> ``invalid_params``, the fact family -> ``invalid_facts``...);
    an ``x-`` code maps to the registry row that uses it; anything else is ``internal_error``.
    The error keeps the server's message, ``retry_after_ms``, and the details plus
    ``manglecp_code`` and ``recoverable``.
    """
    code = str(error_payload.get("code", "internal_error"))
    details = error_payload.get("details")
    details = dict(details) if isinstance(details, Mapping) else {}
    kind_name = details.get("error_type")
    if not (isinstance(kind_name, str) and kind_name in REGISTRY):
        kind_name = _CODE_TO_KIND.get(code)
        if kind_name is None:
            kind_name = next((row.error_type for row in REGISTRY.values() if row.manglecp_code == code),
                             "internal_error")
    details.setdefault("manglecp_code", code)
    details.setdefault("recoverable", bool(error_payload.get("recoverable", code_row(code)[1])))
    if kind_name == "timeout":
        details.setdefault("what", "evaluation")
    message = error_payload.get("message")
    return FtlError(kind_name, details, message=str(message) if message else None,
                    retry_after_ms=retry_hint_ms(error_payload.get("retry_after_ms")))


def retry_hint_ms(value: Any) -> int | None:
    """A server's ``retry_after_ms`` as whole ms, or None when it is no usable hint: not a
    number (``"soon"``, a boolean), negative, NaN or infinite (spec 09 §2 makes it a
    non-negative integer). Callers that sleep on it cap it themselves."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


# ---------------------------------------------------------------------------------------------
# Models


class _Open(BaseModel):
    """Lenient base: unknown keys (``x-`` extensions, newer fields) are kept, never rejected.

    ``defer_build``: a model's validator is built at its first use, not at import, so a process
    that uses a few of these ~30 models (the stdio server, the client) does not pay for all of
    them at start (server boot, issue 11 item 2).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    def dump(self) -> dict[str, Any]:
        """JSON-ready dict without unset optional keys."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class _Strict(_Open):
    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True, defer_build=True)


class Envelope(_Strict):
    """Every message (spec 02 §2.1): ``type``, ``id`` (key required, value may be null),
    ``manglecp`` and an object ``payload``."""

    type: str
    id: str | None
    manglecp: str
    payload: dict[str, Any]


class Source(_Open):
    """Fact provenance (spec 03 §5)."""

    source_type: str
    source_id: str | None = None
    asserted_at: str | int | None = None


class Fact(_Open):
    """A fact on the wire (spec 03 §3): ``pred`` plus exactly one of ``args`` / ``named_args``."""

    pred: str = Field(pattern=PRED_RE.pattern, max_length=PRED_MAX_LEN)
    args: list[Any] | None = None
    named_args: dict[str, Any] | None = None
    t: dict[str, Any] | None = None
    source: Source | None = None
    category: Literal["server", "session", "derived"] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> "Fact":
        if (self.args is None) == (self.named_args is None):
            raise ValueError("a fact carries exactly one of 'args' or 'named_args'")
        return self


def fact(pred: str, *args: Any) -> dict[str, Any]:
    """A positional wire fact: ``fact("task", "001", "BUILD")`` -> ``{"pred": "task", "args": [...]}``."""
    return {"pred": pred, "args": list(args)}


class PredicateSchema(_Open):
    """One entry of ``facts_profile.predicates`` (spec 03 §4)."""

    predicate: str
    arity: int = Field(ge=0)
    arg_types: list[Literal["string", "number", "boolean", "any"]] | None = None
    arg_names: list[str] | None = None
    temporal: bool = False
    description: str | None = None
    direction: Literal["input", "output", "both"] = "both"


class FactsProfile(_Open):
    time_formats: list[str] = Field(default_factory=lambda: ["rfc3339", "epoch_ms"])
    predicates: list[PredicateSchema] | None = None
    schema_uri: str | None = None


class ProtocolInfo(_Open):
    manglecp: str
    supported_versions: list[str] | None = None
    conformance_level: int = Field(ge=1, le=3)


class Domain(_Open):
    id: str
    description: str
    categories: list[str] | None = None


class Endpoints(_Open):
    intent_eval: str | None = None
    macro_invoke: str | None = None


class IntentInfo(_Open):
    name: str
    description: str
    required_facts: list[str] | None = None
    optional_facts: list[str] | None = None


class Capabilities(_Open):
    temporal: bool
    aggregation: bool = True
    external_predicates: list[dict[str, Any]] = Field(default_factory=list)
    named_args: bool | None = None


class Limits(_Open):
    max_message_bytes: int = Field(ge=MIN_MESSAGE_BYTES)
    max_facts_per_request: int = Field(ge=1)
    max_derived_facts: int = Field(ge=1)
    max_intervals_per_atom: int | None = None
    max_compute_ms: int | None = None


class AuthInfo(_Open):
    required: bool
    schemes: list[str] = Field(default_factory=list)
    token_url: str | None = None


class Manifest(_Open):
    """The manifest payload (spec 04 §3, plus ``protocol.conformance_level`` from spec 10 §3.1)."""

    server_name: str
    server_version: str
    protocol: ProtocolInfo
    status: Literal["ready", "booting", "degraded", "draining"]
    domain: Domain
    endpoints: Endpoints = Field(default_factory=Endpoints)
    intents: list[IntentInfo] = Field(default_factory=list)
    facts_profile: FactsProfile
    capabilities: Capabilities
    limits: Limits
    auth: AuthInfo
    extensions: dict[str, Any] = Field(default_factory=dict)


class IntentSpec(_Strict):
    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class Constraints(_Strict):
    """Client limits (spec 05 §2.2); each effective value is min(client, server)."""

    max_facts_created: int | None = Field(None, ge=0)
    max_intervals_per_atom: int | None = Field(None, ge=0)
    max_compute_ms: int | None = Field(None, ge=0)
    max_tools_returned: int | None = Field(None, ge=0)
    max_tokens_budget: int | None = Field(None, ge=0)


DisclosureLevel = Literal["full", "condensed", "minimal"]


class Options(_Strict):
    include_proof_hints: bool = False
    disclosure_preference: Literal["full", "condensed", "minimal", "adaptive"] = "adaptive"


class IntentRequest(_Strict):
    """``intent_request`` payload (spec 05 §2). ``facts`` stay raw: `validate_facts` checks them
    one by one so every violation is reported."""

    intent: IntentSpec
    facts: list[Any] = Field(default_factory=list)
    eval_time: str | int | None = None
    constraints: Constraints = Field(default_factory=Constraints)
    options: Options = Field(default_factory=Options)


class Safety(_Open):
    requires_user_confirmation: bool
    side_effects: list[str]
    reversible: bool = False
    idempotent: bool = False


class ToolMetadata(_Open):
    selection_phase: str | None = None
    score: float | None = None
    source_rules: list[str] | None = None


class MacroTool(_Open):
    """A macro-tool as rendered in an ``intent_response`` (spec 06 §2)."""

    macro_id: str
    name: str
    disclosure_level: DisclosureLevel
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    context_injection: dict[str, Any] | None = None
    safety: Safety | None = None
    validity: dict[str, Any] | None = None
    metadata: ToolMetadata | None = None


class IntentResponse(_Open):
    """``intent_response`` payload (spec 05 §4)."""

    eval_time_used: str | int
    eval_duration_ms: int | None = None
    macro_tools: list[MacroTool]
    proof_hints: dict[str, Any] | None = None
    required_skills: list[dict[str, Any]] | None = None
    diagnostics: dict[str, Any] | None = None

    def tool(self, name: str) -> MacroTool | None:
        """The returned macro-tool called ``name`` (first match), or None."""
        return next((t for t in self.macro_tools if t.name == name), None)


class InvokeRequest(_Strict):
    """``invoke_request`` payload (spec 07 §2)."""

    macro_id: str = Field(min_length=1)
    args: dict[str, Any]
    eval_time: str | int | None = None
    confirmation_token: str | None = None


class StateDelta(_Open):
    assert_: list[dict[str, Any]] = Field(default_factory=list, alias="assert")
    retract: list[dict[str, Any]] = Field(default_factory=list)


class InvokeResponse(_Open):
    """``invoke_response`` payload (spec 07 §3)."""

    result: dict[str, Any]
    state_delta: StateDelta | None = None
    observability: dict[str, Any] | None = None
    next: dict[str, Any] | None = None


class Progress(_Open):
    status: Literal["started", "running", "finalizing"]
    detail: str | None = None
    percent: float | None = Field(None, ge=0, le=100)


class ErrorPayload(_Open):
    code: str
    message: str
    details: dict[str, Any] | None = None
    recoverable: bool
    retry_after_ms: int | None = None


class Cancel(_Open):
    request_id: str = Field(min_length=1)


class Authenticate(_Strict):
    scheme: str
    token: str


class AuthenticateResponse(_Open):
    status: Literal["authenticated"]
    identity: str
    permissions: list[str] = Field(default_factory=list)
    trust_level: str | None = None
    auto_confirm_effects: list[str] | None = None


PAYLOAD_MODELS: dict[str, type[BaseModel]] = {
    "manifest": Manifest, "intent_request": IntentRequest, "intent_response": IntentResponse,
    "invoke_request": InvokeRequest, "invoke_response": InvokeResponse, "progress": Progress,
    "error": ErrorPayload, "cancel": Cancel, "authenticate": Authenticate,
    "authenticate_response": AuthenticateResponse,
}


# ---------------------------------------------------------------------------------------------
# Serialising and parsing


def envelope(type: str, id: str | None, payload: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    """A message dict ``{type, id, manglecp, payload}`` (spec 02 §2.1)."""
    body = payload.dump() if isinstance(payload, _Open) else (
        payload.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(payload, BaseModel) else dict(payload))
    return {"type": type, "id": id, "manglecp": PROTOCOL_VERSION, "payload": body}


def dumps(message: Mapping[str, Any]) -> str:
    """One-line JSON text of a message: no spaces, full Unicode (spec 02 §3, stdio binding)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode(message: Mapping[str, Any]) -> bytes:
    """UTF-8 bytes of `dumps` (no BOM, no trailing newline)."""
    return dumps(message).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent as a float; one beyond the double range (it
    would read as infinity, which no reply could carry back) is refused."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a double")
    return value


def _pydantic_violations(exc: ValidationError, prefix: str = "") -> list[dict[str, str]]:
    return [{"path": prefix + "/" + "/".join(str(p) for p in err["loc"]), "message": err["msg"]}
            for err in exc.errors(include_url=False)]


def parse_message(raw: bytes | str | Mapping[str, Any], *,
                  max_bytes: int | None = None) -> Envelope:
    """Parse and check one message up to its envelope (MangleCP spec 02 §2-3, spec 09).

    Order: size (bytes/str only) -> UTF-8 and JSON -> envelope shape -> version -> type ->
    non-empty id for requests.

    Returns:
        the `Envelope` (payload still a raw dict; see `parse_payload`).
    Raises:
        ProtocolError: ``message_too_large`` (id null), ``malformed_message`` (id null when the
            message has no usable id), ``unsupported_version`` (with ``requested_version`` and
            ``supported_versions``), ``invalid_type``.
    """
    if isinstance(raw, (bytes, bytearray, str)):
        data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        if max_bytes is not None and len(data) > max_bytes:
            raise ProtocolError("message_too_large",
                                f"The message is {len(data)} bytes; the limit is {max_bytes} bytes.",
                                {"limit_bytes": max_bytes, "size_bytes": len(data)})
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]  # tolerated on input; never sent
        try:
            obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant,
                             parse_float=_finite_float)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ProtocolError("malformed_message", "The message is not valid UTF-8 JSON.",
                                {"violations": [{"path": "/", "message": _short(exc)}]}) from None
    else:
        obj = raw
    if not isinstance(obj, Mapping):
        raise ProtocolError("malformed_message", "A message must be one JSON object.",
                            {"violations": [{"path": "/", "message": "expected an object"}]})
    raw_id = obj.get("id")
    usable_id = raw_id if isinstance(raw_id, str) and raw_id else None
    try:
        env = Envelope.model_validate(obj)
    except ValidationError as exc:
        raise ProtocolError("malformed_message", "The message is not a valid MangleCP envelope.",
                            {"violations": _pydantic_violations(exc)}, id=usable_id) from None
    if env.manglecp not in SUPPORTED_VERSIONS:
        raise ProtocolError("unsupported_version",
                            f"Protocol version {env.manglecp!r} is not supported.",
                            {"requested_version": env.manglecp,
                             "supported_versions": list(SUPPORTED_VERSIONS)}, id=usable_id)
    if env.type not in MESSAGE_TYPES:
        raise ProtocolError("invalid_type", f"Unknown message type {env.type!r}.",
                            {"type": env.type, "known_types": sorted(MESSAGE_TYPES)}, id=usable_id)
    if env.type in ID_REQUIRED_TYPES and usable_id is None:
        raise ProtocolError("malformed_message", "A request needs a non-empty string id.",
                            {"violations": [{"path": "/id", "message": "expected a non-empty string"}]})
    return env


def parse_payload(env: Envelope) -> BaseModel:
    """Validate ``env.payload`` against its type's model.

    Raises:
        ProtocolError(malformed_message): with ``details.violations[] = {path, message}``.
    """
    model = PAYLOAD_MODELS[env.type]
    try:
        return model.model_validate(env.payload)
    except ValidationError as exc:
        raise ProtocolError("malformed_message", f"The {env.type} payload is not valid.",
                            {"violations": _pydantic_violations(exc, "/payload")},
                            id=env.id or None) from None


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def __getattr__(name: str) -> Any:
    """A name that moved to `ftl.manglecp.facts`, loaded from there on first access (PEP 562).

    Raises:
        AttributeError: ``name`` is neither defined here nor one of the moved names.
    """
    if name in _MOVED_TO_FACTS:
        return getattr(importlib.import_module("ftl.manglecp.facts"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
