"""The error registry: one row per error kind, and the exception type that carries a kind.

Every surface (ERROR-state routing, MangleCP error envelopes, JSON-RPC errors for MCP clients,
the response-v2 envelope of the CLI and lib/ scripts) renders from the rows of `REGISTRY`;
nothing else in ftl invents an error code. Sources of the rows: FTL ERROR_HANDLING (error_type
and route), MangleCP spec 09 §3.1 (codes, HTTP status, recoverable), ThoughtGate's JSON-RPC codes
for the gate kinds, and the allocation of `shared/reference/errors-and-gates.md` §4.1 for ftl's
own kinds (-32060..-32099, clear of the MCP SDK's reserved codes).

Channels (reference §5 rule 4): a row with ``as_tool_result`` is an error the calling *agent*
should reason about (its work product failed verification, its own output broke a schema, an
approval it waited for timed out); MCP surfaces return it as a ``CallToolResult`` with
``isError`` holding a response-v2 envelope. Every other row is a protocol, gate or runner fault
and travels as a JSON-RPC error (`ftl.surfaces.jsonrpc`). ``docs/errors.md`` is generated from this table
(``python -m ftl.surfaces.errors_doc``).

This module imports nothing of ftl's: it sits at the bottom of the dependency graph.
"""

from __future__ import annotations

import enum
import functools
import re
from typing import Any, Literal, Mapping, NamedTuple

#: The four gates in the order they run; the first refusal wins (ThoughtGate REQ-CORE-003,
#: EC-ERR-005). Gate rows name one of these in ``gate``.
GATE_ORDER: tuple[str, ...] = ("visibility", "governance", "policy", "approval")

RetryAfterSource = Literal["none", "server"]

#: The 14 error types of FTL's ERROR_HANDLING table, in its order (behaviour reference §3).
#: ``docs/errors.md`` shows, for each, the check that produces it and the test that shows it
#: (`ftl.surfaces.errors_doc.PRODUCED_BY`).
FTL_ERROR_TYPES: tuple[str, ...] = (
    "timeout", "quorum_failure", "aggregation_failed", "clarify_exhausted", "decision_unknown",
    "schema_invalid", "cycle_detected", "budget_exhausted", "verify_failed", "idiom_violation",
    "workspace_invalid", "cascade_stuck", "iteration_exhausted", "stuck_detected")


class Klass(str, enum.Enum):
    """Whether a failure is worth one more attempt (FTL ERROR_HANDLING "classify")."""

    TRANSIENT = "transient"
    STRUCTURAL = "structural"


class Route(str, enum.Enum):
    """Where the ERROR state sends a campaign for an error kind (FTL ERROR_PATTERN)."""

    PLAN = "plan"                          # timeout: re-plan with the partial exploration
    RETURN_PARTIAL = "return_partial"      # quorum_failure: return what the explorers found
    CASCADE_ANALYSIS = "cascade_analysis"  # cascade_stuck: run cascade analysis and return it
    RETURN_ERRORS = "return_errors"        # schema_invalid, cycle_detected: return the plan errors
    RETURN_QUESTIONS = "return_questions"  # clarify_exhausted: return the open questions
    OBSERVE = "observe"                    # budget_exhausted: observe what happened
    CASCADE = "cascade"                    # iteration_exhausted, stuck_detected: force CASCADE
    BLOCK_TASK = "block_task"              # task-level failures: the task blocks, the run goes on
    SUMMARY = "summary"                    # anything else: return an error summary


# MangleCP spec 09 §3.1: the 28 standard codes -> (HTTP status, recoverable).
MANGLECP_CODES: dict[str, tuple[int, bool]] = {
    "unsupported_version": (400, True),
    "malformed_message": (400, False),
    "message_too_large": (413, True),
    "invalid_type": (400, False),
    "auth_required": (401, True),
    "auth_invalid": (401, True),
    "auth_insufficient": (403, False),
    "invalid_facts": (400, True),
    "unknown_predicate": (400, True),
    "arity_mismatch": (400, True),
    "type_mismatch": (400, True),
    "reserved_predicate": (400, False),
    "too_many_facts": (400, True),
    "evaluation_timeout": (408, True),
    "derivation_limit_exceeded": (413, True),
    "interval_limit_exceeded": (413, True),
    "invalid_temporal_pattern": (400, False),
    "evaluation_failed": (500, False),
    "macro_not_found": (404, True),
    "macro_expired": (410, True),
    "schema_validation_failed": (400, True),
    "confirmation_required": (403, True),
    "confirmation_invalid": (403, True),
    "execution_failed": (500, False),
    "server_not_ready": (503, True),
    "rate_limited": (429, True),
    "internal_error": (500, False),
    "cancelled": (499, False),
}


class ErrorKind(NamedTuple):
    """One registry row (immutable). Field names are the ones every surface uses.

    A NamedTuple rather than a frozen dataclass: every ``ftl`` command imports this module,
    and building a 15-field dataclass costs about 2.5 ms of each start (issue 11 item 1).

    Attributes:
        error_type: ftl's name for the kind (FTL error_type where FTL has one).
        klass: transient (retry once) or structural (recover in state or go to ERROR).
        route: the ERROR handler's route for this kind.
        manglecp_code: code in a MangleCP error payload (standard or ``x-`` custom).
        recoverable: MangleCP ``recoverable`` flag.
        http_status: HTTP status for the HTTP bindings (MangleCP spec 09 §3.1).
        jsonrpc_code: JSON-RPC 2.0 ``error.code`` for MCP clients.
        v2_error_type: response-v2 ``data.error_type`` category.
        v2_error_code: response-v2 ``data.error_code`` (SCREAMING_SNAKE_CASE).
        message: safe message template; ``{name}`` placeholders take only ``safe_keys``.
        remediation: what the caller can do about it.
        safe_keys: detail keys allowed into a response (everything else stays in the log).
        gate: the gate that raises this kind, if any (one of `GATE_ORDER`).
        as_tool_result: True when an MCP surface returns the error as a ``CallToolResult``
            with ``isError`` (an error the agent should reason about); False: a JSON-RPC error.
        retry_after_source: where a ``retry_after_ms`` hint comes from: ``"server"`` (the
            peer said how long to wait: rate limits, a booting server) or ``"none"``. Only
            ``"server"`` rows put ``retry_after`` into JSON-RPC ``error.data`` (ThoughtGate
            §1.7 fills it for rate limiting only).
    """

    error_type: str
    klass: Klass
    route: Route
    manglecp_code: str
    recoverable: bool
    http_status: int
    jsonrpc_code: int
    v2_error_type: str
    v2_error_code: str
    message: str
    remediation: str
    safe_keys: frozenset[str] = frozenset()
    gate: str | None = None
    as_tool_result: bool = False
    retry_after_source: RetryAfterSource = "none"

    @property
    def transient(self) -> bool:
        return self.klass is Klass.TRANSIENT


def _row(error_type: str, klass: str, route: Route, manglecp_code: str, jsonrpc_code: int,
         v2: tuple[str, str], message: str, remediation: str, safe_keys: tuple[str, ...] = (),
         gate: str | None = None, http_status: int | None = None,
         recoverable: bool | None = None, as_tool_result: bool = False,
         retry_after_source: RetryAfterSource = "none") -> ErrorKind:
    std_status, std_recoverable = MANGLECP_CODES.get(manglecp_code, (500, False))
    return ErrorKind(
        error_type=error_type, klass=Klass(klass), route=route, manglecp_code=manglecp_code,
        recoverable=std_recoverable if recoverable is None else recoverable,
        http_status=std_status if http_status is None else http_status,
        jsonrpc_code=jsonrpc_code, v2_error_type=v2[0], v2_error_code=v2[1],
        message=message, remediation=remediation, safe_keys=frozenset(safe_keys), gate=gate,
        as_tool_result=as_tool_result, retry_after_source=retry_after_source)


T, S = "transient", "structural"
_ROWS: tuple[ErrorKind, ...] = (
    # --- FTL's error types (FTL ERROR_HANDLING), JSON-RPC -32060.. in the reference's order.
    _row("timeout", T, Route.PLAN, "evaluation_timeout", -32060, ("unavailable", "TIMEOUT"),
         "{what} did not finish within {timeout_s} s.",
         "Raise the timeout (task timeout_s or explorer_timeout_s in ftl.toml) or make the step faster.",
         ("what", "timeout_s", "seq", "tool")),
    _row("quorum_failure", T, Route.RETURN_PARTIAL, "evaluation_failed", -32061,
         ("unavailable", "QUORUM_NOT_MET"),
         "Only {completed} of {required} required explorers returned a usable result.",
         "Check the explorer errors in the event log; lower explorer_quorum in ftl.toml if fewer "
         "explorers are enough.", ("completed", "required", "missing")),
    _row("aggregation_failed", S, Route.SUMMARY, "evaluation_failed", -32062,
         ("internal", "AGGREGATION_FAILED"), "Explorer results could not be aggregated.",
         "Inspect the explorer results in the store; re-run the campaign.", ("modes",)),
    _row("clarify_exhausted", S, Route.RETURN_QUESTIONS, "confirmation_required", -32063,
         ("validation", "CLARIFICATION_LIMIT"),
         "The planner still needs clarification after {count} rounds.",
         "Answer the returned questions in the objective or give a plan with --plan.",
         ("count", "questions"), as_tool_result=True),
    _row("decision_unknown", S, Route.PLAN, "invalid_type", -32064,
         ("validation", "INVALID_FORMAT"), "The planner's decision could not be read.",
         "Make the planner emit a Confidence: PROCEED|CLARIFY|CONFIRM header.", (),
         as_tool_result=True),
    _row("schema_invalid", S, Route.RETURN_ERRORS, "schema_validation_failed", -32065,
         ("validation", "VALIDATION_ERROR"), "The input does not match its schema ({count} violation(s)).",
         "Fix each violation at the JSON path given in details.violations and submit again.",
         ("count", "violations"), as_tool_result=True),
    _row("cycle_detected", S, Route.RETURN_ERRORS, "invalid_temporal_pattern", -32066,
         ("conflict", "CIRCULAR_DEPENDENCY"), "The task dependencies form a cycle: {cycle}.",
         "Remove one dependency on the cycle so the plan is a DAG.", ("cycle", "violations"),
         as_tool_result=True),
    _row("budget_exhausted", S, Route.OBSERVE, "derivation_limit_exceeded", -32067,
         ("authorization", "QUOTA_EXCEEDED"), "Task {seq} used up its budget.",
         "Raise the task's budget or split it into smaller tasks; a Claude Code run out of "
         "turns: raise max_turns (planner_max_turns for the planner) in [claude].",
         ("seq", "budget")),
    _row("verify_failed", S, Route.BLOCK_TASK, "execution_failed", -32068,
         ("validation", "VERIFICATION_FAILED"), "Task {seq}'s verify command failed (exit {exit_code}).",
         "Read the verify output in the workspace record; fix the code or the verify command.",
         ("seq", "exit_code"), as_tool_result=True),
    _row("idiom_violation", S, Route.BLOCK_TASK, "invalid_facts", -32069,
         ("validation", "IDIOM_VIOLATION"), "Task {seq} breaks a project idiom: {idiom} at {where}.",
         "Change the code at each file:line in details.violations to follow the idiom (or fix "
         "the idiom in the plan if it is wrong), then resume.", ("seq", "idiom", "where", "violations"),
         as_tool_result=True),
    _row("workspace_invalid", S, Route.BLOCK_TASK, "x-workspace_invalid", -32070,
         ("conflict", "WORKSPACE_INVALID"), "The workspace for task {seq} is invalid.",
         "Check the task's delta and the repository state, then resume.", ("seq", "issues"),
         http_status=409, recoverable=False),
    _row("cascade_stuck", S, Route.CASCADE_ANALYSIS, "x-cascade_stuck", -32071,
         ("unavailable", "RESOURCE_BUSY"), "No task can progress: {unreachable} task(s) unreachable.",
         "Read the cascade analysis; revise the plan (--revised-plan) or accept the blocks.",
         ("unreachable",), http_status=409, recoverable=False),
    _row("iteration_exhausted", S, Route.CASCADE, "derivation_limit_exceeded", -32072,
         ("authorization", "QUOTA_EXCEEDED"), "EXECUTE ran {count} times, over the limit.",
         "Raise max_iterations in ftl.toml or simplify the plan.", ("count",)),
    _row("stuck_detected", S, Route.CASCADE, "execution_failed", -32073,
         ("unavailable", "STEP_STALE"), "The ready set did not change for {count} iterations.",
         "Read the cascade analysis for the blocked roots.", ("count",)),
    _row("task_failed", S, Route.BLOCK_TASK, "execution_failed", -32076,
         ("internal", "TASK_FAILED"), "Task {seq}'s builder failed (exit {exit_code}).",
         "Read the builder output in the workspace record and fix the task.", ("seq", "exit_code"),
         as_tool_result=True),
    _row("dependency_missing", S, Route.RETURN_ERRORS, "invalid_facts", -32077,
         ("validation", "MISSING_REQUIRED"), "A required dependency is missing: {name}.",
         "Install or configure the missing dependency.", ("name",)),
    _row("merge_conflict", S, Route.BLOCK_TASK, "x-merge_conflict", -32091,
         ("conflict", "MERGE_CONFLICT"),
         "Task {seq}'s commit conflicts with task {other_seq} in the integration branch.",
         "The task was re-run once on the new integration head; make the two tasks' deltas "
         "disjoint or make one depend on the other, then resume.",
         ("seq", "other_seq", "paths"), http_status=409, recoverable=False),
    # --- Agent builders observed through their event stream (issue 12).
    _row("stalled", T, Route.BLOCK_TASK, "evaluation_timeout", -32092, ("unavailable", "AGENT_STALLED"),
         "Task {seq}'s agent wrote no event for {idle_timeout_s} s and was stopped.",
         "The task was retried once, continuing the same agent session; if it stalls again, "
         "raise idle_timeout_s in ftl.toml or split the task.",
         ("seq", "idle_timeout_s", "session_id")),
    # --- Task attempts on a Ray cluster (issue 14).
    _row("worker_lost", T, Route.BLOCK_TASK, "x-worker_lost", -32093, ("unavailable", "WORKER_LOST"),
         "Task {seq}'s Ray worker or node was lost ({cause}).",
         "The attempt was retried once on the cluster; if it is lost again, check the nodes "
         "(`ray status`) and resume the campaign.", ("seq", "cause"), http_status=503,
         recoverable=True),
    _row("cluster_lost", T, Route.SUMMARY, "server_not_ready", -32095, ("unavailable", "CLUSTER_LOST"),
         "The Ray cluster at {address} was lost ({cause}).",
         "The run stopped and nothing is lost: the interrupted tasks are pending again and the "
         "finished ones stay integrated. Start the cluster again (or choose another with "
         "--ray-address), then run `ftl campaign resume`.", ("address", "cause"), http_status=503,
         recoverable=True),
    _row("agent_login_required", S, Route.SUMMARY, "auth_required", -32094,
         ("authentication", "AGENT_NOT_LOGGED_IN"),
         "The Claude Code CLI is not logged in: {problem}.",
         "Log in once on this machine: run `claude` and type /login (or `claude setup-token` "
         "for a long-lived token), or export ANTHROPIC_API_KEY for the ftl process; then "
         "resume the campaign.", ("problem", "seq")),
    # --- Transient causes named by FTL ERROR_HANDLING.
    _row("network_error", T, Route.SUMMARY, "server_not_ready", -32013,
         ("unavailable", "UNAVAILABLE"), "A network call failed.",
         "Check connectivity to the tool server; the call was retried once.", ("tool", "problem")),
    _row("lock_contention", T, Route.SUMMARY, "server_not_ready", -32078,
         ("conflict", "RESOURCE_BUSY"), "A resource was locked by another process.",
         "Wait for the other process; the call was retried once.", ("resource",)),
    _row("flaky_test", T, Route.BLOCK_TASK, "execution_failed", -32079,
         ("validation", "VERIFICATION_FAILED"), "Task {seq}'s verify failed and may be flaky.",
         "The verify was retried; if it keeps failing it is treated as verify_failed.", ("seq",),
         recoverable=True, as_tool_result=True),
    # --- Protocol and gate kinds (reference §4.1 second table).
    _row("parse_error", S, Route.SUMMARY, "malformed_message", -32700, ("validation", "INVALID_FORMAT"),
         "The message is not valid JSON.", "Send one JSON object.", ("line", "column")),
    _row("invalid_request", S, Route.SUMMARY, "malformed_message", -32600,
         ("validation", "VALIDATION_ERROR"), "The message is not a valid request.",
         "Send a request that matches the protocol's envelope.", ("violations",)),
    _row("invalid_type", S, Route.SUMMARY, "invalid_type", -32601, ("validation", "INVALID_FORMAT"),
         "Unknown message type {type}.", "Use one of the protocol's message types.", ("type",)),
    _row("method_not_found", S, Route.SUMMARY, "invalid_type", -32601, ("not_found", "METHOD_NOT_FOUND"),
         "Method {method} is not served here.",
         "Call a method the server supports (tools/list, tools/call); list the tools first.",
         ("method",)),
    _row("message_too_large", S, Route.SUMMARY, "message_too_large", -32600,
         ("validation", "CONTENT_TOO_LARGE"), "The message is larger than {limit_bytes} bytes.",
         "Send a smaller message.", ("limit_bytes", "size_bytes")),
    _row("unsupported_version", S, Route.SUMMARY, "unsupported_version", -32602,
         ("validation", "UNSUPPORTED_VERSION"), "Protocol version {requested_version} is not supported.",
         "Resend with one of details.supported_versions.", ("requested_version", "supported_versions")),
    _row("invalid_params", S, Route.SUMMARY, "schema_validation_failed", -32602,
         ("validation", "VALIDATION_ERROR"), "The arguments do not match the tool's input schema.",
         "Fix each entry of details.schema_errors.", ("schema_errors",)),
    _row("invalid_facts", S, Route.SUMMARY, "invalid_facts", -32080, ("validation", "VALIDATION_ERROR"),
         "{count} fact(s) failed validation.", "Fix the facts listed in details.violations.",
         ("count", "violations"), recoverable=True),
    _row("too_many_facts", S, Route.SUMMARY, "too_many_facts", -32081, ("validation", "VALIDATION_ERROR"),
         "The request has {count} facts; the limit is {limit}.", "Send fewer facts.", ("count", "limit")),
    _row("derivation_limit_exceeded", S, Route.SUMMARY, "derivation_limit_exceeded", -32082,
         ("validation", "QUOTA_EXCEEDED"), "Evaluation derived more facts than allowed.",
         "Send fewer facts or raise max_facts_created within the server limit.", ("budget",)),
    _row("evaluation_failed", S, Route.SUMMARY, "evaluation_failed", -32083,
         ("internal", "EVALUATION_FAILED"), "The server could not evaluate the intent.",
         "Report the correlation id to the server's operator.", ()),
    _row("auth_required", S, Route.SUMMARY, "auth_required", -32074, ("authentication", "UNAUTHENTICATED"),
         "Authentication is required.", "Send a bearer token.", ()),
    _row("auth_invalid", S, Route.SUMMARY, "auth_invalid", -32074, ("authentication", "UNAUTHENTICATED"),
         "The credentials are invalid or expired.", "Send a valid bearer token.", ()),
    _row("auth_insufficient", S, Route.SUMMARY, "auth_insufficient", -32084,
         ("authorization", "FORBIDDEN"), "The credentials do not permit this call.",
         "Use credentials with the needed scope.", ()),
    _row("tool_not_exposed", S, Route.BLOCK_TASK, "macro_not_found", -32015, ("not_found", "NOT_FOUND"),
         "Tool {tool} is not available.", "Use a tool listed by the server.",
         ("tool", "intent", "offered"), gate="visibility"),
    _row("macro_not_found", T, Route.SUMMARY, "macro_not_found", -32085, ("not_found", "NOT_FOUND"),
         "Macro-tool {macro_id} is unknown or evicted.", "Evaluate the intent again and invoke the new macro_id.",
         ("macro_id",)),
    _row("macro_expired", T, Route.SUMMARY, "macro_expired", -32075, ("not_found", "NOT_FOUND"),
         "Macro-tool {macro_id} has expired.", "Evaluate the intent again and invoke the new macro_id.",
         ("macro_id",)),
    _row("governance_denied", S, Route.BLOCK_TASK, "auth_insufficient", -32014,
         ("authorization", "FORBIDDEN"), "Tool {tool} is denied by a governance rule.",
         "Ask the operator to change the governance rules in ftl.toml.", ("tool",), gate="governance"),
    _row("policy_denied", S, Route.BLOCK_TASK, "auth_insufficient", -32003,
         ("authorization", "FORBIDDEN"), "Tool {tool} is denied by policy.",
         "Ask the operator to review the Cedar policies.", ("tool",), gate="policy"),
    _row("approval_rejected", S, Route.BLOCK_TASK, "confirmation_invalid", -32007,
         ("authorization", "FORBIDDEN"), "The call to {tool} was rejected by the approver.",
         "Change the call or ask the approver again.", ("tool",), gate="approval"),
    # Structural, not transient (issue 15): a retry would ask the approver again at once, so an
    # approver that never answers is asked once per task attempt; the task blocks and a later
    # attempt (resume, re-plan, CASCADE retry) asks again.
    _row("approval_timeout", S, Route.BLOCK_TASK, "confirmation_required", -32008,
         ("unavailable", "UNAVAILABLE"), "No approval for {tool} arrived in time.",
         "Approve sooner or raise the approval timeout, then resume: the next attempt asks again.",
         ("tool", "timeout_s"), gate="approval", as_tool_result=True),
    _row("approval_not_found", S, Route.BLOCK_TASK, "confirmation_invalid", -32017,
         ("not_found", "NOT_FOUND"), "No approval workflow is configured for {tool}.",
         "Configure an approval command or file in ftl.toml.", ("tool",), gate="approval"),
    _row("configuration_error", S, Route.SUMMARY, "internal_error", -32016,
         ("validation", "CONFIGURATION_ERROR"), "The configuration is invalid: {problem}.",
         "Fix the configuration file and run again.", ("problem", "violations")),
    _row("confirmation_required", S, Route.BLOCK_TASK, "confirmation_required", -32086,
         ("authorization", "CONFIRMATION_REQUIRED"), "Tool {tool} needs a confirmation token.",
         "Ask the user, then retry with the token the server issued.",
         ("tool", "macro_id", "confirmation_token", "side_effects", "reversible", "expires_in_ms")),
    _row("rate_limited", T, Route.SUMMARY, "rate_limited", -32009,
         ("rate_limit", "RATE_LIMIT_EXCEEDED"), "Too many requests.",
         "Wait retry_after_ms, then retry.", ("retry_after_ms",), retry_after_source="server"),
    _row("server_not_ready", T, Route.SUMMARY, "server_not_ready", -32013,
         ("unavailable", "UNAVAILABLE"), "The tool server is not ready ({status}).",
         "Wait retry_after_ms, then retry.", ("status", "retry_after_ms"),
         retry_after_source="server"),
    _row("execution_failed", S, Route.BLOCK_TASK, "execution_failed", -32087,
         ("internal", "EXECUTION_FAILED"), "Tool {tool} failed.", "Read the event log for the failure.",
         ("tool",)),
    _row("cancelled", S, Route.SUMMARY, "cancelled", -32006, ("conflict", "CANCELLED"),
         "The operation was cancelled.", "Resume the campaign with `ftl campaign resume`.", ()),
    _row("not_found", S, Route.SUMMARY, "x-not_found", -32088, ("not_found", "NOT_FOUND"),
         "{what} was not found.", "Check the name or id and try again.", ("what",),
         http_status=404, recoverable=False),
    _row("conflict", S, Route.SUMMARY, "x-conflict", -32089, ("conflict", "CONFLICT"),
         "{what}", "Check the current state and try again.", ("what",),
         http_status=409, recoverable=False),
    _row("illegal_transition", S, Route.SUMMARY, "x-illegal_transition", -32090,
         ("validation", "INVALID_STATE_TRANSITION"), "{what}",
         "Make one of the moves listed in details.legal_moves. Task moves: pending -> running "
         "(dependencies complete) or blocked (propagation); running -> complete, blocked, or "
         "pending (resume only); blocked -> pending (re-plan only); complete is final.",
         ("what", "seq", "from_status", "to_status", "legal_moves"),
         http_status=409, recoverable=False),
    _row("protocol_error", S, Route.SUMMARY, "malformed_message", -32002,
         ("internal", "PROTOCOL_ERROR"), "The server sent a reply that breaks the protocol.",
         "Check that the server speaks a supported protocol version; report the correlation id "
         "to its operator.", ("message_type", "violations")),
    _row("invalid_state", S, Route.SUMMARY, "internal_error", -32603,
         ("internal", "INVALID_STATE_TRANSITION"), "Trigger {trigger} is not allowed in state {state}.",
         "This is a runner bug or a corrupted store; report the correlation id.", ("trigger", "state")),
    _row("internal_error", S, Route.SUMMARY, "internal_error", -32603, ("internal", "INTERNAL_ERROR"),
         "An internal error occurred (correlation id {correlation_id}).",
         "Report the correlation id; the details are in the server-side log.", ("correlation_id",)),
)

REGISTRY: Mapping[str, ErrorKind] = {row.error_type: row for row in _ROWS}


def kind(error_type: str) -> ErrorKind:
    """Return the registry row for ``error_type``; unknown names map to ``internal_error``.

    Failing closed here means a typo can never invent a code on a surface.
    """
    return REGISTRY.get(error_type, REGISTRY["internal_error"])


class _SafeFormat(dict):
    def __missing__(self, key: str) -> str:
        return "?"


class FtlError(Exception):
    """An error of a registry kind, with structured details.

    Args:
        error_type: a key of `REGISTRY` (unknown keys become ``internal_error``).
        details: structured context. Only the row's ``safe_keys`` ever reach a response;
            the rest stays in the server-side log.
        message: overrides the row's template (must already be safe to show).
        retry_after_ms: server hint for transient kinds (rate limits), in ms.
    """

    def __init__(self, error_type: str, details: Mapping[str, Any] | None = None, *,
                 message: str | None = None, retry_after_ms: int | None = None) -> None:
        self.kind = kind(error_type)
        self.details: dict[str, Any] = dict(details or {})
        self.retry_after_ms = retry_after_ms
        self.message = message or self.template_message()
        super().__init__(self.message)

    def template_message(self) -> str:
        """The row's message template filled from the safe details only (``?`` for a missing
        one): what a surface shows when an explicit message is unfit to leave ftl."""
        return self.kind.message.format_map(_SafeFormat(self.safe_details()))

    @property
    def error_type(self) -> str:
        return self.kind.error_type

    @property
    def transient(self) -> bool:
        return self.kind.transient

    def safe_details(self) -> dict[str, Any]:
        """The details a response may carry (the row's allowlist)."""
        return {k: v for k, v in self.details.items() if k in self.kind.safe_keys}

    def __reduce__(self):  # picklable across process pools
        return (_rebuild, (self.kind.error_type, self.details, self.message, self.retry_after_ms))


def _rebuild(error_type: str, details: dict, message: str, retry_after_ms: int | None) -> FtlError:
    return FtlError(error_type, details, message=message, retry_after_ms=retry_after_ms)


# A unit's first letters -> ms per unit (checked in order: "ms"/"msec"/"milli" before "m").
_UNIT_MS = (("milli", 1), ("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000))


@functools.cache
def _retry_after_pattern() -> re.Pattern[str]:
    # Compiled at first use: this module loads on the light commands.
    return re.compile(
        r"(?i)retry[-_ ]after(?P<header_ms>[-_ ]?ms)?\"?\s*[:=]?\s*\"?(?P<value>\d+(?:\.\d+)?)\s*"
        r"(?P<unit>milliseconds?|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)?\b")


def retry_after_ms(text: str) -> int | None:
    """A server's retry-after hint found in ``text`` (a command's output, an API error), in ms:
    ``Retry-After: 7`` -> 7000 (an HTTP header's seconds), ``retry_after_ms=250`` -> 250,
    ``"retry-after": "7"`` -> 7000, ``retry after 2 minutes`` -> 120000; units ms, s, min and h in
    their usual spellings. None when ``text`` gives none."""
    match = _retry_after_pattern().search(text or "")
    if not match:
        return None
    value, unit = float(match.group("value")), (match.group("unit") or "").lower()
    if not unit:
        return int(value if match.group("header_ms") else value * 1000)
    per_unit = next(ms for prefix, ms in _UNIT_MS if unit.startswith(prefix))
    return int(value * per_unit)
