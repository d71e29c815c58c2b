"""Tests for ftl.errors: the registry's rows agree with MangleCP, JSON-RPC, response-v2 and the
ERROR handler's routes; FtlError keeps unsafe details out of responses and survives pickling."""

from __future__ import annotations

import pickle
import re

import pytest

from ftl.errors import (MANGLECP_CODES, REGISTRY, ErrorKind, FtlError, Klass, Route, _ROWS,
                        kind)

# The MCP SDK's reserved JSON-RPC codes (errors-and-gates reference §3.3, §4.1).
SDK_RESERVED = {-32000, -32001, -32020, -32021, -32022, -32042}

# response-v2 error categories (errors-and-gates reference §2.2, "the brief's eight").
V2_CATEGORIES = {"validation", "authentication", "authorization", "not_found", "conflict",
                 "rate_limit", "internal", "unavailable"}

# Rows whose standard MangleCP code keeps the code but deliberately changes its
# (http_status, recoverable) pair. Anything else that differs is an accident.
OVERRIDES = {
    # A failing verify may pass on a rerun, so MangleCP's "recoverable" is true for it even
    # though execution_failed is not recoverable in spec 09 §3.1.
    "flaky_test": (500, True),
}

# FTL's 14 error types (design.md §5) with the ERROR routes of states/error.py's docstring.
FTL_ROUTES = {
    "timeout": Route.PLAN,
    "quorum_failure": Route.RETURN_PARTIAL,
    "cascade_stuck": Route.CASCADE_ANALYSIS,
    "schema_invalid": Route.RETURN_ERRORS,
    "cycle_detected": Route.RETURN_ERRORS,
    "clarify_exhausted": Route.RETURN_QUESTIONS,
    "budget_exhausted": Route.OBSERVE,
    "iteration_exhausted": Route.CASCADE,
    "stuck_detected": Route.CASCADE,
    "aggregation_failed": Route.SUMMARY,  # "anything else -> RETURN an error summary"
}
# FTL types the docstring files under "anything else" but whose row names a more specific route,
# each for a stated reason. states/error.py turns PLAN into SUMMARY unless the error came from
# EXPLORE, and renders BLOCK_TASK as a summary return, so all of these end in a summary there.
FTL_ROUTE_EXCEPTIONS = {
    "decision_unknown": Route.PLAN,          # FTL ERROR_HANDLING: treat as CLARIFY -> PLAN
    "verify_failed": Route.BLOCK_TASK,       # task-level: the task blocks, the run goes on
    "idiom_violation": Route.BLOCK_TASK,
    "workspace_invalid": Route.BLOCK_TASK,
}
FTL_TYPES = set(FTL_ROUTES) | set(FTL_ROUTE_EXCEPTIONS)

ROWS = list(REGISTRY.values())
ROW_IDS = [row.error_type for row in ROWS]
STANDARD_ROWS = [row for row in ROWS if row.manglecp_code in MANGLECP_CODES]
CUSTOM_ROWS = [row for row in ROWS if row.manglecp_code not in MANGLECP_CODES]


def test_ftl_has_exactly_fourteen_error_types_in_the_tables() -> None:
    assert len(FTL_TYPES) == 14
    assert FTL_TYPES <= set(REGISTRY)


def test_registry_keys_are_unique_and_match_rows() -> None:
    assert len(_ROWS) == len(REGISTRY), "two rows share an error_type; one silently wins"
    for name, row in REGISTRY.items():
        assert row.error_type == name


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_manglecp_code_is_standard_or_custom(row: ErrorKind) -> None:
    assert row.manglecp_code in MANGLECP_CODES or row.manglecp_code.startswith("x-")


@pytest.mark.parametrize("row", STANDARD_ROWS, ids=lambda row: row.error_type)
def test_standard_code_keeps_spec_status_and_recoverable(row: ErrorKind) -> None:
    expected = OVERRIDES.get(row.error_type, MANGLECP_CODES[row.manglecp_code])
    assert (row.http_status, row.recoverable) == expected


def test_override_allowlist_is_exact() -> None:
    """Every allowlisted override really differs from the spec, so the list cannot rot."""
    differing = {row.error_type for row in STANDARD_ROWS
                 if (row.http_status, row.recoverable) != MANGLECP_CODES[row.manglecp_code]}
    assert differing == set(OVERRIDES)


@pytest.mark.parametrize("row", CUSTOM_ROWS, ids=lambda row: row.error_type)
def test_custom_codes_carry_an_explicit_http_status(row: ErrorKind) -> None:
    # _row's fallback for unknown codes is (500, False); a custom row must not rely on it.
    assert row.http_status in {404, 409, 503}  # 503: a lost worker, retried (worker_lost)
    assert re.fullmatch(r"x-[a-z][a-z_]*", row.manglecp_code)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_jsonrpc_code_avoids_sdk_reserved_and_is_in_range(row: ErrorKind) -> None:
    assert row.jsonrpc_code not in SDK_RESERVED
    standard = {-32700, -32600, -32601, -32602, -32603}
    assert row.jsonrpc_code in standard or -32099 <= row.jsonrpc_code <= -32000


def test_ftl_types_have_distinct_codes_in_their_block() -> None:
    codes = {REGISTRY[name].jsonrpc_code for name in FTL_TYPES}
    assert len(codes) == len(FTL_TYPES)
    assert all(-32077 <= code <= -32060 for code in codes)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_v2_error_type_is_a_core_category(row: ErrorKind) -> None:
    assert row.v2_error_type in V2_CATEGORIES
    assert re.fullmatch(r"[A-Z][A-Z0-9_]*", row.v2_error_code)


@pytest.mark.parametrize("name", sorted(FTL_ROUTES))
def test_ftl_type_routes_match_error_handler(name: str) -> None:
    assert REGISTRY[name].route is FTL_ROUTES[name]


@pytest.mark.parametrize("name", sorted(FTL_ROUTE_EXCEPTIONS))
def test_ftl_route_exceptions_are_as_listed(name: str) -> None:
    assert REGISTRY[name].route is FTL_ROUTE_EXCEPTIONS[name]


@pytest.mark.parametrize("name,klass", [
    ("timeout", Klass.TRANSIENT), ("quorum_failure", Klass.TRANSIENT),
    ("network_error", Klass.TRANSIENT), ("lock_contention", Klass.TRANSIENT),
    ("flaky_test", Klass.TRANSIENT), ("rate_limited", Klass.TRANSIENT),
    ("schema_invalid", Klass.STRUCTURAL), ("cycle_detected", Klass.STRUCTURAL),
    ("budget_exhausted", Klass.STRUCTURAL), ("verify_failed", Klass.STRUCTURAL),
    ("dependency_missing", Klass.STRUCTURAL), ("invalid_state", Klass.STRUCTURAL),
])
def test_classes_follow_ftl_error_handling(name: str, klass: Klass) -> None:
    assert REGISTRY[name].klass is klass
    assert REGISTRY[name].transient is (klass is Klass.TRANSIENT)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_message_placeholders_are_safe_keys(row: ErrorKind) -> None:
    placeholders = set(re.findall(r"\{(\w+)\}", row.message))
    assert placeholders <= row.safe_keys, f"template names unsafe keys {placeholders - row.safe_keys}"
    assert row.remediation.strip()


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_every_row_formats_with_no_details(row: ErrorKind) -> None:
    error = FtlError(row.error_type)
    assert error.error_type == row.error_type
    assert error.message and "{" not in error.message


def test_gate_rows_name_a_known_gate() -> None:
    gates = {row.gate for row in ROWS if row.gate}
    assert gates == {"visibility", "governance", "policy", "approval"}


def test_safe_details_filters_by_safe_keys() -> None:
    error = FtlError("verify_failed", {"seq": "003", "exit_code": 1, "output_tail": "token=abc",
                                       "path": "/home/me/repo"})
    assert error.safe_details() == {"seq": "003", "exit_code": 1}
    assert error.details["path"] == "/home/me/repo"  # kept for the server-side log
    assert error.message == "Task 003's verify command failed (exit 1)."


def test_message_never_formats_an_unsafe_key() -> None:
    error = FtlError("internal_error", {"correlation_id": "abc123", "exception": "KeyError: secret"})
    assert "abc123" in error.message
    assert "secret" not in error.message
    assert error.safe_details() == {"correlation_id": "abc123"}


def test_missing_placeholder_renders_a_question_mark() -> None:
    assert FtlError("verify_failed", {"seq": "007"}).message == \
        "Task 007's verify command failed (exit ?)."


def test_explicit_message_wins() -> None:
    error = FtlError("conflict", {"what": "x"}, message="Campaign c1 is already active.")
    assert str(error) == "Campaign c1 is already active."


@pytest.mark.parametrize("name", ["no_such_kind", "", "TIMEOUT"])
def test_unknown_kinds_fall_back_to_internal_error(name: str) -> None:
    assert kind(name) is REGISTRY["internal_error"]
    error = FtlError(name, {"correlation_id": "c9"})
    assert error.error_type == "internal_error"
    assert not error.transient


def test_pickle_round_trip_keeps_everything() -> None:
    error = FtlError("rate_limited", {"retry_after_ms": 7000, "url": "https://x"},
                     retry_after_ms=7000)
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, FtlError)
    assert (again.error_type, again.details, again.message, again.retry_after_ms) == \
        (error.error_type, error.details, error.message, error.retry_after_ms)
    assert again.kind is REGISTRY["rate_limited"]


def test_pickle_round_trip_of_an_overridden_message() -> None:
    error = FtlError("conflict", {"what": "busy"}, message="custom text")
    again = pickle.loads(pickle.dumps(error))
    assert again.message == "custom text" and again.details == {"what": "busy"}
