"""MangleCP wire layer: the envelope, every payload model, parsing, serialising and error envelopes.

Protocol draft ``2026-02-draft`` (MangleCP spec 02 envelope, 03 facts, 04 manifest, 05 intents,
06 macro-tools, 07 invocation, 08 authentication, 09 errors). Both the client and the server use
this module; it knows nothing of ftl's tools. Error rows (HTTP status, ``recoverable``) come from
`ftl.errors.MANGLECP_CODES`, so no code is invented here.
"""

from __future__ import annotations

import difflib
import json
import re
from datetime import datetime, timezone
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, Iterable, Literal, Mapping, NamedTuple, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ftl.errors import MANGLECP_CODES, REGISTRY, FtlError

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
RESERVED_PREFIX = "_manglecp_"
INT53_MAX = 2**53 - 1
FACT_ISSUES = ("invalid_facts", "unknown_predicate", "arity_mismatch", "type_mismatch",
               "reserved_predicate")


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
    retry = error_payload.get("retry_after_ms")
    return FtlError(kind_name, details, message=str(message) if message else None,
                    retry_after_ms=int(retry) if isinstance(retry, (int, float)) else None)


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
            obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
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


# ---------------------------------------------------------------------------------------------
# Time values (spec 03 §4)

UNBOUNDED = "_"
NOW = "now"


def parse_time(value: Any, formats: Iterable[str] = ("rfc3339", "epoch_ms")) -> int | str:
    """A wire time value as epoch milliseconds, or the markers ``"now"`` / ``"_"``.

    Accepts RFC 3339 strings (``rfc3339``), integer epoch ms (``epoch_ms``), ``"now"`` and ``"_"``
    always (reference §11 item 21).

    Raises:
        ValueError: any other value, or a format the server does not advertise.
    """
    formats = set(formats)
    if value in (NOW, UNBOUNDED):
        return value
    if isinstance(value, bool):
        raise ValueError("a time is an RFC 3339 string or epoch milliseconds, not a boolean")
    if isinstance(value, int):
        if "epoch_ms" not in formats:
            raise ValueError("epoch milliseconds are not accepted by this server")
        return value
    if isinstance(value, str) and "rfc3339" in formats and "T" in value.upper():
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an RFC 3339 time") from None
        if parsed.tzinfo is None:
            raise ValueError(f"{value!r} has no UTC offset (RFC 3339 requires one)")
        return int(parsed.timestamp() * 1000)
    raise ValueError(f"{value!r} is not a time value (RFC 3339 string, epoch ms, 'now' or '_')")


def format_time(epoch_ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 UTC string with millisecond precision."""
    stamp = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------------------------------
# Fact validation (spec 03, spec 09 §4.1) - shared by the server (layer 1) and the client.


class NormalFact(NamedTuple):
    """A validated fact in positional form: an immutable ``(pred, args, t)`` tuple.

    A named tuple, not a dataclass: one is built per client fact of every request, and a frozen
    dataclass costs about twice as much to build (issue 11 item 5).

    Attributes:
        pred: predicate name.
        args: argument values (``int64`` wrappers already turned into ints).
        t: ``(start, end)`` for temporal facts, each epoch ms, ``"now"`` or ``"_"``; else None.
    """

    pred: str
    args: tuple[Any, ...]
    t: tuple[int | str, int | str] | None = None

    def key(self) -> str:
        """Identity for deduplication (spec 03 §5: provenance is not part of it).

        The repr of the normalised values: canonical (objects arrive with sorted keys), much
        cheaper than JSON, never dependent on the process (no hash()).
        """
        return repr((self.pred, self.args, self.t))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_value(value: Any, path: str) -> tuple[Any, str | None]:
    """Normalise one argument value; return (value, problem or None)."""
    if value is None:
        return None, f"{path} is null; null is a wildcard and is not allowed in asserted facts"
    if isinstance(value, bool) or isinstance(value, str):
        return value, None
    if isinstance(value, int):
        if abs(value) > INT53_MAX:
            return value, (f"{path} is outside +-(2^53-1); send it as "
                           '{"_type": "int64", "value": "<decimal>"}')
        return value, None
    if isinstance(value, float):
        return value, None
    if isinstance(value, dict) and value.get("_type") == "int64":
        text = value.get("value")
        if not (isinstance(text, str) and re.fullmatch(r"-?\d{1,19}", text)):
            return value, f"{path} int64 wrapper needs a decimal string 'value'"
        number = int(text)
        if not -(2**63) <= number < 2**63:
            return value, f"{path} int64 value out of range"
        return number, None
    if isinstance(value, list):
        items = []
        for i, item in enumerate(value):
            item, problem = _check_value(item, f"{path}[{i}]")
            if problem:
                return value, problem
            items.append(item)
        return items, None
    if isinstance(value, dict):
        if "_var" in value:
            return value, f"{path} is a variable; variables are not allowed in asserted facts"
        out = {}
        for k in sorted(value):
            item, problem = _check_value(value[k], f"{path}.{k}")
            if problem:
                return value, problem
            out[k] = item
        return out, None
    return value, f"{path} has an unsupported value"


_TYPE_OK = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "any": lambda v: True,
}


def validate_facts(facts: Sequence[Any], profile: FactsProfile | None, *,
                   reserved_ok: bool = False) -> tuple[list[NormalFact], list[dict[str, Any]]]:
    """Check client facts one by one and convert them to positional form (layer 1, spec 08 §2.1).

    Checks: object shape, predicate syntax (``^[a-z][a-z0-9_]*$``, <= 128 chars), the reserved
    ``_manglecp_`` prefix, declared predicate (when the profile declares any) with a
    ``difflib`` suggestion, ``direction`` (clients may send only ``input``/``both``), arity,
    ``arg_types``, ``named_args`` against ``arg_names``, null/variables, ``t`` for temporal
    predicates only, time values in the advertised ``time_formats``.

    Returns:
        (normalised facts, deduplicated in order, violations sorted by ``fact_index``). Each
        violation: ``fact_index``, ``predicate``, ``issue`` (one of `FACT_ISSUES`), ``message``
        and, where they apply, ``expected_arity``/``actual_arity``, ``expected_type``/
        ``actual_type``, ``argument_index``, ``suggestion``.
    """
    declared: dict[str, PredicateSchema] = {}
    if profile is not None and profile.predicates:
        declared = {p.predicate: p for p in profile.predicates}
    formats = profile.time_formats if profile is not None else ["rfc3339", "epoch_ms"]
    violations: list[dict[str, Any]] = []
    out: list[NormalFact] = []
    seen: set[Any] = set()
    index = 0
    fast = _fast_shapes_of(profile, declared, reserved_ok)
    batch = _validate_batch(facts, fast) if fast else None
    if batch is not None:
        return batch, []

    def bad(issue: str, message: str, pred: Any = None, **extra: Any) -> None:
        entry = {"fact_index": index, "predicate": pred if isinstance(pred, str) else "",
                 "issue": issue, "message": message}
        entry.update({k: v for k, v in extra.items() if v is not None})
        violations.append(entry)

    for index, item in enumerate(facts):
        # Fast path (issue 11 item 5): a plain {"pred", "args"} fact of a declared input
        # predicate whose arguments are strings or 53-bit integers of the declared types passes
        # every check below; the fact itself is its identity because str and int never compare
        # equal (bools, floats and nested values take the full path). The type check is inlined
        # and the tuple built directly: this loop runs once per fact.
        if type(item) is dict and len(item) == 2:
            pred, args = item.get("pred"), item.get("args")
            shape = fast.get(pred) if type(pred) is str else None
            if shape is not None and type(args) is list and len(args) == len(shape):
                for value, kind in zip(args, shape):
                    if type(value) is not kind or (kind is int and not -INT53_MAX <= value <= INT53_MAX):
                        break
                else:
                    normal = _new_tuple(NormalFact, (pred, tuple(args), None))
                    if normal not in seen:
                        seen.add(normal)
                        out.append(normal)
                    continue
        if not isinstance(item, dict) and not isinstance(item, Mapping):
            bad("invalid_facts", f"fact {index} is a JSON {_json_type(item)}, not an object")
            continue
        pred = item.get("pred")
        if not isinstance(pred, str):
            bad("invalid_facts", f"fact {index} needs a string 'pred'")
            continue
        if pred.startswith(RESERVED_PREFIX) and not reserved_ok:
            bad("reserved_predicate", f"predicate names may not start with {RESERVED_PREFIX!r}", pred)
            continue
        if not PRED_RE.match(pred) or len(pred) > PRED_MAX_LEN:
            bad("invalid_facts", f"predicate {pred[:40]!r} must match ^[a-z][a-z0-9_]*$ and have at "
                f"most {PRED_MAX_LEN} characters", pred)
            continue
        schema = declared.get(pred)
        if declared and schema is None:
            close = difflib.get_close_matches(pred, sorted(declared), n=1)
            bad("unknown_predicate", f"predicate {pred!r} is not declared in the facts profile", pred,
                suggestion=close[0] if close else None)
            continue
        if schema is not None and schema.direction == "output":
            bad("invalid_facts", f"predicate {pred!r} is derived by the server; clients may not send it",
                pred)
            continue
        has_args, has_named = "args" in item and item["args"] is not None, (
            "named_args" in item and item["named_args"] is not None)
        if has_args == has_named:
            bad("invalid_facts", "a fact carries exactly one of 'args' or 'named_args'", pred)
            continue
        if has_named:
            named = item["named_args"]
            names = schema.arg_names if schema is not None else None
            if not isinstance(named, Mapping) or not names:
                bad("invalid_facts", f"predicate {pred!r} has no declared arg_names; use 'args'", pred)
                continue
            unknown = sorted(set(named) - set(names))
            missing = [n for n in names if n not in named]
            if unknown or missing:
                bad("invalid_facts", f"named_args must be exactly {names}; unknown {unknown}, "
                    f"missing {missing}", pred)
                continue
            args = [named[n] for n in names]
        else:
            args = item["args"]
            if not isinstance(args, list):
                bad("invalid_facts", "'args' must be an array", pred)
                continue
        if schema is not None and len(args) != schema.arity:
            bad("arity_mismatch", f"predicate {pred!r} takes {schema.arity} argument(s), got {len(args)}",
                pred, expected_arity=schema.arity, actual_arity=len(args))
            continue
        values: list[Any] = []
        failed = False
        for position, value in enumerate(args):
            value, problem = _check_value(value, f"argument {position}")
            if problem:
                bad("invalid_facts", problem, pred, argument_index=position)
                failed = True
                break
            wanted = (schema.arg_types[position] if schema is not None and schema.arg_types
                      and position < len(schema.arg_types) else "any")
            if not _TYPE_OK[wanted](value):
                bad("type_mismatch", f"argument {position} of {pred!r} must be a {wanted}", pred,
                    argument_index=position, expected_type=wanted, actual_type=_json_type(value))
                failed = True
                break
            values.append(value)
        if failed:
            continue
        interval = None
        t = item.get("t")
        if t is not None:
            if schema is not None and not schema.temporal:
                bad("invalid_facts", f"predicate {pred!r} is not temporal; drop 't'", pred)
                continue
            try:
                interval = _interval(t, formats)
            except ValueError as exc:
                bad("invalid_facts", f"bad temporal annotation: {exc}", pred)
                continue
        normal = NormalFact(pred, tuple(values), interval)
        identity = normal if interval is None and all(
            type(v) is str or type(v) is int for v in normal.args) else normal.key()
        if identity not in seen:
            seen.add(identity)
            out.append(normal)
    violations.sort(key=lambda v: v["fact_index"])
    return out, violations


_new_tuple = tuple.__new__  # builds a NormalFact without its Python-level __new__


def _validate_batch(facts: Sequence[Any], fast: Mapping[str, tuple[type, ...]]) -> list[NormalFact] | None:
    """`validate_facts` for a batch in which every fact takes the fast path (a plain
    ``{"pred", "args"}`` of a predicate in ``fast`` whose arguments have exactly its types, ints
    within 53 bits), checked with whole-list operations that run in C rather than one Python
    step per fact (issue 11 item 5: batch validation). Returns the deduplicated facts in order,
    or None when any fact needs the per-fact checks (which then report the violations)."""
    try:
        if set(map(type, facts)) != {dict} or set(map(len, facts)) != {2}:
            return None
        preds = list(map(itemgetter("pred"), facts))
        args = list(map(itemgetter("args"), facts))
        if set(map(type, args)) != {list}:
            return None
        arities = set(zip(preds, map(len, args)))
        if any(len(fast.get(pred, ())) != arity for pred, arity in arities):
            return None  # an unknown predicate or a wrong arity (arity 0 has no fast shape)
        if set(map(type, chain.from_iterable(args))) != {str} or any(
                int in fast[pred] for pred, _ in arities):
            # Not all strings: each (pred, (type of each argument)) must be a fast shape.
            kinds = set(zip(preds, map(tuple, map(map, repeat(type), args))))
            if any(fast[pred] != shape for pred, shape in kinds) or any(
                    type(v) is int and not -INT53_MAX <= v <= INT53_MAX for v in chain.from_iterable(args)):
                return None
    except (KeyError, TypeError):  # a key missing, an unhashable pred
        return None
    # dict.fromkeys keeps the first of equal facts, in order; str and int never compare equal,
    # so equal tuples are the same fact.
    return list(dict.fromkeys(map(_new_tuple, repeat(NormalFact), zip(preds, map(tuple, args), repeat(None)))))


_SHAPES: dict[tuple[int, bool], tuple[Any, dict[str, tuple[type, ...]]]] = {}


def _fast_shapes_of(profile: FactsProfile | None, declared: Mapping[str, PredicateSchema],
                    reserved_ok: bool) -> dict[str, tuple[type, ...]]:
    """`_fast_shapes` of ``profile``, computed once per profile object (a server validates
    every request against the same one). The entry holds the profile, so its id stays its own."""
    if profile is None:
        return _fast_shapes(declared, reserved_ok)
    key = (id(profile), reserved_ok)
    entry = _SHAPES.get(key)
    if entry is None or entry[0] is not profile:
        if len(_SHAPES) >= 64:
            _SHAPES.clear()
        entry = _SHAPES[key] = (profile, _fast_shapes(declared, reserved_ok))
    return entry[1]


def _fast_shapes(declared: Mapping[str, PredicateSchema], reserved_ok: bool) -> dict[str, tuple[type, ...]]:
    """Predicate -> the Python type of each argument, for the declared non-temporal predicates
    a client may send whose arguments are all ``string`` or ``number`` (numbers as ints on the
    fast path) and whose name passes the syntax checks; the other predicates take the full path."""
    shapes: dict[str, tuple[type, ...]] = {}
    for name, schema in declared.items():
        if (schema.direction == "output" or schema.temporal or not PRED_RE.match(name)
                or len(name) > PRED_MAX_LEN or (name.startswith(RESERVED_PREFIX) and not reserved_ok)):
            continue
        types = list(schema.arg_types or [])
        if len(types) != schema.arity or any(t not in ("string", "number") for t in types):
            continue
        shapes[name] = tuple(str if t == "string" else int for t in types)
    return shapes


def _interval(t: Any, formats: Iterable[str]) -> tuple[int | str, int | str]:
    if not isinstance(t, Mapping):
        raise ValueError("'t' must be an object")
    if "at" in t:
        if set(t) - {"at"}:
            raise ValueError("a point annotation has only 'at'")
        at = parse_time(t["at"], formats)
        if at == UNBOUNDED:
            raise ValueError("'at' cannot be unbounded")
        return at, at
    if set(t) != {"start", "end"}:
        raise ValueError("an interval annotation has 'start' and 'end'")
    start, end = parse_time(t["start"], formats), parse_time(t["end"], formats)
    if isinstance(start, int) and isinstance(end, int) and start > end:
        raise ValueError("interval start is after its end")
    return start, end


def facts_error(violations: list[dict[str, Any]], id: str | None = None) -> ProtocolError:
    """The error for a batch of fact violations (spec 09 §4.1; reference §11 item 17).

    One issue kind across the batch gives that code (``reserved_predicate`` alone stays
    non-recoverable); a mixed batch gives ``invalid_facts``.
    """
    issues = {v["issue"] for v in violations}
    code = issues.pop() if len(issues) == 1 else "invalid_facts"
    return ProtocolError(code, f"{len(violations)} fact(s) failed validation.",
                         {"count": len(violations), "violations": violations}, id=id)


# ---------------------------------------------------------------------------------------------
# State delta, client side (spec 07 §4; conformance C-9)


def _delta_key(fact: Mapping[str, Any]) -> str:
    return json.dumps([fact.get("pred"), fact.get("args"), fact.get("t")], sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)


def matches_pattern(pattern: Mapping[str, Any], fact: Mapping[str, Any]) -> bool:
    """Whether a retract ``pattern`` matches ``fact``: same predicate and arity, and every
    non-null pattern argument equal to the fact's (``null`` is a wildcard; spec 07 §4)."""
    pattern_args, fact_args = pattern.get("args") or [], fact.get("args") or []
    return (pattern.get("pred") == fact.get("pred") and len(pattern_args) == len(fact_args)
            and all(p is None or p == a for p, a in zip(pattern_args, fact_args)))


def apply_state_delta(facts: Sequence[Mapping[str, Any]], delta: Mapping[str, Any] | None
                      ) -> list[dict[str, Any]]:
    """A client's working set after an invocation's ``state_delta`` (spec 07 §4; reference §6.4).

    Every retract is applied before any assert, as one step. Asserted facts re-enter as
    ``session`` facts (conformance C-9) without the server's ``source``: provenance is not part
    of a fact's identity, and a fact the client sends is the client's. Facts are deduplicated on
    (pred, args, t). Pure: the input is not changed.

    Args:
        facts: the working set, wire facts (``{"pred", "args", "t"?, ...}``).
        delta: ``{"assert": [...], "retract": [...]}`` (either may be missing), or None.
    Returns:
        the new working set, in order: kept facts, then new asserts.
    """
    delta = delta or {}
    retracts = [r for r in delta.get("retract") or [] if isinstance(r, Mapping)]
    kept = [dict(f) for f in facts if not any(matches_pattern(r, f) for r in retracts)]
    seen = {_delta_key(f) for f in kept}
    for item in delta.get("assert") or []:
        if not isinstance(item, Mapping):
            continue
        fact = {"pred": item.get("pred"), "args": list(item.get("args") or [])}
        if item.get("t") is not None:
            fact["t"] = item["t"]
        fact["category"] = "session"
        key = _delta_key(fact)
        if key not in seen:
            seen.add(key)
            kept.append(fact)
    return kept
