"""The one error model on every surface: registry invariants (codes unique where they must be,
none of the MCP SDK's reserved codes, every kind named in the source exists, docs/errors.md in
sync), the JSON-RPC rendering of ftl.surfaces.jsonrpc (ThoughtGate's ErrorData population rules and its
EC-ERR edge cases), client-bound sanitising, and the structured JSON logs of ftl.telemetry.logs."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import mcp_types.jsonrpc as sdk_jsonrpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.surfaces import envelope, errors_doc, jsonrpc
from ftl.telemetry import logs
from ftl.errors import GATE_ORDER, REGISTRY, FtlError, kind
from ftl.sanitize import REDACTED, looks_internal, redact_paths, sanitize_text

ROOT = Path(__file__).resolve().parents[1]
ROWS = list(REGISTRY.values())

# Kinds allowed to share one JSON-RPC code: the standard codes by meaning (the kind travels in
# data.error_type), authentication (one code, two MangleCP codes) and "the peer is not
# available" (network and a booting server). Any other shared code is an accident.
SHARED_JSONRPC = {
    -32600: {"invalid_request", "message_too_large"},
    -32601: {"invalid_type", "method_not_found"},
    -32602: {"unsupported_version", "invalid_params"},
    -32603: {"invalid_state", "internal_error"},
    -32074: {"auth_required", "auth_invalid"},
    -32013: {"network_error", "server_not_ready"},
}
# ThoughtGate's gate codes (reference §1.6), kept so ftl can run behind ThoughtGate.
GATE_CODES = {"tool_not_exposed": -32015, "governance_denied": -32014, "policy_denied": -32003,
              "approval_rejected": -32007, "approval_timeout": -32008, "approval_not_found": -32017}
# Errors the agent should reason about (reference §5 rule 4), returned as isError tool results.
TOOL_RESULT_KINDS = {"clarify_exhausted", "decision_unknown", "schema_invalid", "cycle_detected",
                     "verify_failed", "idiom_violation", "task_failed", "flaky_test",
                     "approval_timeout"}


# --------------------------------------------------------------------------- registry

def test_jsonrpc_codes_are_unique_except_the_documented_groups() -> None:
    by_code: dict[int, set[str]] = {}
    for row in ROWS:
        by_code.setdefault(row.jsonrpc_code, set()).add(row.error_type)
    shared = {code: kinds for code, kinds in by_code.items() if len(kinds) > 1}
    assert shared == SHARED_JSONRPC


def test_sdk_reserved_set_matches_the_installed_sdk() -> None:
    """Every server-range code mcp_types defines is in our reserved set, so a new SDK code
    cannot slip past the registry check below."""
    sdk_codes = {value for name, value in vars(sdk_jsonrpc).items()
                 if name.isupper() and isinstance(value, int) and -32099 <= value <= -32000}
    assert sdk_codes == jsonrpc.SDK_RESERVED_CODES


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.error_type)
def test_no_jsonrpc_code_is_reserved_by_the_sdk(row) -> None:
    assert row.jsonrpc_code not in jsonrpc.SDK_RESERVED_CODES


def test_gate_kinds_keep_thoughtgate_codes_and_name_their_gate() -> None:
    assert {name: REGISTRY[name].jsonrpc_code for name in GATE_CODES} == GATE_CODES
    assert {row.gate for row in ROWS if row.gate} == set(GATE_ORDER)
    assert GATE_ORDER == ("visibility", "governance", "policy", "approval")


def test_standard_codes_name_their_own_kind() -> None:
    for code, name in jsonrpc.STANDARD_KINDS.items():
        assert REGISTRY[name].jsonrpc_code == code


def test_tool_result_channel_is_exactly_the_agent_errors() -> None:
    assert {row.error_type for row in ROWS if row.as_tool_result} == TOOL_RESULT_KINDS


def test_only_server_hinted_kinds_put_retry_after_on_the_wire() -> None:
    assert {row.error_type for row in ROWS if row.retry_after_source == "server"} == \
        {"rate_limited", "server_not_ready"}
    assert all(REGISTRY[name].transient for name in ("rate_limited", "server_not_ready"))


def test_requested_safe_keys_are_present() -> None:
    assert {"macro_id", "confirmation_token", "side_effects", "reversible", "expires_in_ms"} <= \
        REGISTRY["confirmation_required"].safe_keys
    assert "problem" in REGISTRY["network_error"].safe_keys
    assert {"intent", "offered"} <= REGISTRY["tool_not_exposed"].safe_keys


def test_illegal_transition_is_a_user_facing_conflict_naming_the_legal_moves() -> None:
    row = REGISTRY["illegal_transition"]
    assert (row.v2_error_type, row.v2_error_code, row.http_status) == \
        ("validation", "INVALID_STATE_TRANSITION", 409)
    assert row.jsonrpc_code not in {-32603} and not row.transient
    for status in ("pending", "running", "complete", "blocked"):
        assert status in row.remediation
    assert "legal_moves" in row.safe_keys
    error = FtlError("illegal_transition", {"what": "Task 001 cannot go complete -> running.",
                                            "legal_moves": []})
    assert error.message == "Task 001 cannot go complete -> running."


def test_protocol_error_is_a_server_fault_that_never_carries_upstream_text() -> None:
    row = REGISTRY["protocol_error"]
    assert row.jsonrpc_code == -32002 and row.v2_error_type == "internal"
    assert row.safe_keys == {"message_type", "violations"}


_LITERAL = re.compile(r"\b(?:FtlError|kind)\(\s*(?:error_type\s*=\s*)?[\"']([^\"']*)[\"']")


def _kind_literals() -> list[tuple[str, str]]:
    found = []
    for folder in ("ftl", "states", "lib"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _LITERAL.findall(path.read_text(encoding="utf-8")):
                found.append((str(path.relative_to(ROOT)), name))
    return found


def test_every_kind_named_in_the_source_is_in_the_registry() -> None:
    literals = _kind_literals()
    assert len(literals) > 100, "the scan found too little; has the source layout changed?"
    unknown = sorted({(where, name) for where, name in literals if name not in REGISTRY})
    assert unknown == [], f"kinds missing from ftl/errors.py: {unknown}"


def test_the_source_scan_catches_a_typo(tmp_path: Path) -> None:
    sample = 'raise FtlError("verify_faild", {})\nx = kind(\n    "timeout")\nFtlError(error_type="nope")'
    assert _LITERAL.findall(sample) == ["verify_faild", "timeout", "nope"]


def test_docs_errors_md_is_generated_from_the_registry() -> None:
    committed = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert committed == errors_doc.render(), "run `python -m ftl.surfaces.errors_doc`"
    for row in ROWS:
        assert f"`{row.error_type}`" in committed


def test_errors_doc_check_reports_a_stale_file(tmp_path: Path) -> None:
    target = tmp_path / "errors.md"
    assert errors_doc.main(["--check", "--output", str(target)]) == 1
    assert errors_doc.main(["--output", str(target)]) == 0
    assert errors_doc.main(["--check", "--output", str(target)]) == 0
    target.write_text(target.read_text() + "edited\n")
    assert errors_doc.main(["--check", "--output", str(target)]) == 1


# --------------------------------------------------------------------------- jsonrpc rendering

@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.error_type)
def test_every_kind_renders_with_its_code_and_the_population_rules(row) -> None:
    error = FtlError(row.error_type, {"tool": "shell_builder", "retry_after_ms": 1500},
                     retry_after_ms=1500)
    obj = jsonrpc.error_object(error, "corr-1", tool="shell_builder")
    data = obj["data"]
    assert obj["code"] == row.jsonrpc_code
    assert data["correlation_id"] == "corr-1" and data["error_type"] == row.error_type
    assert ("gate" in data) is (row.gate is not None) and data.get("gate") == row.gate
    system = row.v2_error_type in jsonrpc.SYSTEM_CATEGORIES and row.gate is None
    assert ("tool" in data) is (not system)
    assert ("retry_after" in data) is (row.retry_after_source == "server")
    if "retry_after" in data:
        assert data["retry_after"] == 2  # 1500 ms rounded up to whole seconds
    assert not set(data.get("details", {})) & {"tool", "gate", "correlation_id", "retry_after_ms"}
    json.dumps(obj, allow_nan=False)


def test_optional_fields_are_omitted_when_empty() -> None:
    obj = jsonrpc.error_object(FtlError("cancelled"), "c-2")
    assert obj["data"] == {"correlation_id": "c-2", "error_type": "cancelled"}


def test_unclassified_exception_is_an_internal_error_with_only_a_correlation_id(caplog) -> None:
    caplog.set_level(logging.INFO, logger="ftl")
    try:
        raise KeyError("SELECT secret FROM users password=hunter2 at /srv/app/db.py")
    except KeyError as exc:
        obj = jsonrpc.error_object(exc, "run7-3")
    assert obj == {"code": -32603, "message": "An internal error occurred (correlation id run7-3).",
                   "data": {"correlation_id": "run7-3", "error_type": "internal_error"}}
    record = next(r for r in caplog.records if getattr(r, "correlation_id", None) == "run7-3")
    assert record.levelno == logging.ERROR and record.exc_info[0] is KeyError  # trace in the log only


class _BrokenDetails(FtlError):
    def safe_details(self):  # noqa: D401 - a failure inside the error path
        raise RuntimeError("boom while rendering")


def test_ec_err_001_an_error_while_building_the_error_gives_a_bare_32603(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="ftl")
    broken = _BrokenDetails("verify_failed", {"seq": "001"}, message="Task 001 failed.")
    obj = jsonrpc.error_object(broken, "corr-err")
    assert obj == {"code": -32603, "message": "Internal error",
                   "data": {"correlation_id": "corr-err", "error_type": "internal_error"}}
    unserialisable = FtlError("schema_invalid", {"count": object()})
    assert jsonrpc.error_object(unserialisable, "corr-err2")["message"] == "Internal error"
    assert any("building the error object failed" in r.getMessage() for r in caplog.records)


def test_ec_err_002_messages_over_one_kib_are_cut_on_a_character_boundary() -> None:
    obj = jsonrpc.error_object(FtlError("conflict", {"what": "ü" * 3000}), "c")
    assert len(obj["message"].encode("utf-8")) <= 1024
    obj["message"].encode("utf-8")  # a whole number of characters
    assert obj["message"].endswith("…")
    long_detail = jsonrpc.error_object(FtlError("conflict", {"what": "x" * 5000}), "c")
    assert len(long_detail["data"]["details"]["what"].encode()) <= 1024


def test_ec_err_003_invalid_utf8_from_an_upstream_is_replaced() -> None:
    upstream = b"upstream said \xff\xfe\xfd and stopped"
    text = sanitize_text(upstream)
    assert "\ufffd" in text and text.startswith("upstream said")
    surrogate = FtlError("conflict", {"what": "bad \udcff byte"})
    obj = jsonrpc.error_object(surrogate, "c")
    json.dumps(obj, ensure_ascii=False).encode("utf-8")  # encodable: no lone surrogate left
    assert "\udcff" not in obj["message"]


def test_ec_err_004_a_missing_or_unsafe_correlation_id_is_generated() -> None:
    ids = jsonrpc.CorrelationIds("run42")
    assert [ids.next(), ids.next()] == ["run42-1", "run42-2"]
    assert re.fullmatch(r"[0-9a-f]{12}", jsonrpc.CorrelationIds().run_id)
    obj = jsonrpc.error_object(FtlError("cancelled"), None)
    assert re.fullmatch(r"[0-9a-f]{12}", obj["data"]["correlation_id"])
    for bad in ("abc\ninjected", "x" * 65, "", " lead", 12, None):
        assert jsonrpc.accept_correlation_id(bad) is None
    assert jsonrpc.accept_correlation_id("req-7.a:b_c") == "req-7.a:b_c"
    injected = jsonrpc.error_object(FtlError("cancelled"), "evil\nline")
    assert "\n" not in injected["data"]["correlation_id"]


def test_ec_err_006_sensitive_data_is_scrubbed_and_unsafe_keys_never_leave(tmp_path: Path) -> None:
    error = FtlError("conflict", {
        "what": f"Authorization: Bearer abc123def456ghi password=hunter2 at {tmp_path}/state.db",
        "policy_id": "secret-policy", "rule": "admin_*", "arguments": {"token": "t0k3n"}})
    obj = jsonrpc.error_object(error, "c")
    text = json.dumps(obj)
    for leaked in ("abc123def456ghi", "hunter2", str(tmp_path), "secret-policy", "admin_*", "t0k3n"):
        assert leaked not in text
    assert "state.db" in text and REDACTED in text


def test_messages_carrying_internals_fall_back_to_the_template() -> None:
    cases = [
        "Traceback (most recent call last):\n  File \"/srv/x.py\", line 3, in f",
        "UPDATE task SET status = 'x' WHERE seq = 1 failed",
        "UNIQUE constraint failed: task.seq",
        'forbid(principal, action, resource) when { context.x };',
    ]
    for text in cases:
        assert looks_internal(text)
        obj = jsonrpc.error_object(FtlError("workspace_invalid", {"seq": "004"}, message=text), "c")
        assert obj["message"] == "The workspace for task 004 is invalid."
        env = envelope.failure(FtlError("workspace_invalid", {"seq": "004"}, message=text))
        assert env["error"] == "The workspace for task 004 is invalid."
    assert not looks_internal("select a tool from the list, then update the plan")


def test_details_are_bounded() -> None:
    violations = [{"path": f"/tasks/{i}", "message": "bad"} for i in range(500)]
    obj = jsonrpc.error_object(FtlError("schema_invalid", {"count": 500, "violations": violations}), "c")
    kept = obj["data"]["details"]["violations"]
    assert len(kept) == jsonrpc.MAX_DETAIL_ITEMS + 1 and kept[-1] == "… 450 more"
    assert kept[0] == {"path": "/tasks/0", "message": "bad"}  # JSON pointers are not paths


@pytest.mark.parametrize("code,error_type,expected", [
    (-32015, "tool_not_exposed", "tool_not_exposed"),
    (-32015, "policy_denied", "internal_error"),     # data disagrees with the code: fail closed
    (-32602, None, "invalid_params"),
    (-32601, "method_not_found", "method_not_found"),
    (-32099, "nonsense", "internal_error"),
])
def test_kind_for_code_decodes_received_errors(code: int, error_type, expected: str) -> None:
    assert jsonrpc.kind_for_code(code, error_type) == expected


# --------------------------------------------------------------------------- sanitising

@pytest.mark.parametrize("text,expected", [
    ("/tmp/pytest-of-x/case/plan.json missing", "…/plan.json missing"),
    ("C:\\Users\\me\\plan.json", "…/plan.json"),
    ("see file:///home/me/x.txt", "see …"),
    ("pointer /tasks/0/seq stays", "pointer /tasks/0/seq stays"),
    ("url https://example.org/tmp/x stays", "url https://example.org/tmp/x stays"),
    ("relative src/a.py stays", "relative src/a.py stays"),
])
def test_redact_paths(text: str, expected: str) -> None:
    assert redact_paths(text) == expected


def test_redact_paths_knows_this_process_directories(tmp_path: Path, monkeypatch) -> None:
    odd = tmp_path / "elsewhere"
    odd.mkdir()
    monkeypatch.chdir(odd)
    assert redact_paths(f"wrote {odd}/out.txt") == "wrote …/out.txt"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["tasks", "0", "payload", "facts", "seq", "a-b"]), min_size=1, max_size=5))
def test_json_pointers_are_never_mistaken_for_paths(parts: list[str]) -> None:
    pointer = "/" + "/".join(parts)
    assert redact_paths(pointer) == pointer


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=3000))
def test_sanitize_text_always_gives_bounded_valid_text(raw: bytes) -> None:
    text = sanitize_text(raw)
    assert len(text.encode("utf-8")) <= 1024
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)


# --------------------------------------------------------------------------- logs

def _log_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.fixture(autouse=True)
def _restore_ftl_logger():
    logger = logging.getLogger("ftl")
    level, handlers = logger.level, list(logger.handlers)
    yield
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(level)


@pytest.fixture
def json_log():
    stream = io.StringIO()
    logs.configure("DEBUG", stream=stream)
    return stream


def test_log_lines_carry_correlation_gate_tool_and_kind(json_log: io.StringIO) -> None:
    logs.log_error(FtlError("policy_denied", {"tool": "deploy", "policy": "p-secret"}),
                   correlation_id="c-9", tool="deploy", surface="jsonrpc")
    line = _log_lines(json_log)[-1]
    assert line["level"] == "WARNING" and line["correlation_id"] == "c-9"
    assert (line["gate"], line["tool"], line["error_type"]) == ("policy", "deploy", "policy_denied")
    assert line["details"]["policy"] == "p-secret"  # the log keeps what the client never sees
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["timestamp"])


def test_log_lines_are_scrubbed_and_keep_tracebacks(json_log: io.StringIO) -> None:
    try:
        raise ValueError("token=abcdef123456 broke")
    except ValueError as exc:
        logs.log_error(FtlError("internal_error", {"correlation_id": "c-1"}), correlation_id="c-1",
                       exc_info=exc)
    line = _log_lines(json_log)[-1]
    assert line["level"] == "ERROR" and line["exception"] == "ValueError"
    assert "Traceback" in line["traceback"] and "abcdef123456" not in line["traceback"]


@pytest.mark.parametrize("error_type,level", [
    ("internal_error", logging.ERROR), ("invalid_state", logging.ERROR),
    ("approval_rejected", logging.INFO), ("governance_denied", logging.WARNING),
    ("tool_not_exposed", logging.WARNING), ("schema_invalid", logging.INFO),
    ("not_found", logging.INFO), ("rate_limited", logging.WARNING), ("timeout", logging.WARNING),
])
def test_levels_follow_thoughtgate(error_type: str, level: int) -> None:
    assert logs.level_for(FtlError(error_type)) == level


def test_configure_replaces_its_own_handler_and_writes_files(tmp_path: Path) -> None:
    first = logs.configure("INFO", tmp_path / "a" / "ftl.jsonl")
    second = logs.configure("WARNING", tmp_path / "b.jsonl")
    logger = logging.getLogger("ftl")
    assert first not in logger.handlers and second in logger.handlers
    logging.getLogger("ftl.test").warning("disk %s", "full", extra={"correlation_id": "c-5"})
    second.flush()
    line = json.loads((tmp_path / "b.jsonl").read_text().splitlines()[-1])
    assert line["message"] == "disk full" and line["correlation_id"] == "c-5"
    assert (tmp_path / "a" / "ftl.jsonl").read_text() == ""
    with pytest.raises(ValueError):
        logs.configure("LOUD")


def test_unknown_kind_names_fail_closed_everywhere() -> None:
    assert kind("no_such_kind") is REGISTRY["internal_error"]
    obj = jsonrpc.error_object(FtlError("no_such_kind"), "c")
    assert obj["code"] == -32603 and obj["data"]["error_type"] == "internal_error"
