"""Tests for ftl.surfaces.envelope: the response-v2 shapes (errors-and-gates reference §2.1-2.4) and the
trust boundary (only safe details, no secrets, bounded messages, nothing from exceptions)."""

from __future__ import annotations

import json
import re

import pytest

from ftl.surfaces import envelope
from ftl.surfaces.envelope import Warning
from ftl.errors import REGISTRY, FtlError
from ftl.sanitize import REDACTED

REQUEST_ID = re.compile(r"^req_[0-9a-f]{16}$")


def _check_common(env: dict) -> None:
    assert set(env) == {"success", "data", "error", "meta"}
    assert env["meta"]["version"] == "response-v2"
    assert env["meta"]["request_id"]
    json.dumps(env)  # every envelope is plain JSON


def test_success_shape() -> None:
    env = envelope.success({"campaign_id": "c1", "tasks": []})
    _check_common(env)
    assert env["success"] is True and env["error"] is None
    assert env["data"] == {"campaign_id": "c1", "tasks": []}
    assert REQUEST_ID.match(env["meta"]["request_id"])
    assert env["meta"]["warnings"] == [] and env["meta"]["warning_details"] == []


def test_success_without_data_has_an_empty_object() -> None:
    env = envelope.success()
    assert env["data"] == {} and env["error"] is None


def test_request_ids_are_fresh_unless_given() -> None:
    assert envelope.success()["meta"]["request_id"] != envelope.success()["meta"]["request_id"]
    assert envelope.success(request_id="req_given")["meta"]["request_id"] == "req_given"
    failed = envelope.failure(FtlError("cancelled"), request_id="req_x")
    assert failed["meta"]["request_id"] == "req_x"


@pytest.mark.parametrize("error_type", sorted(REGISTRY))
def test_failure_shape_for_every_registry_row(error_type: str) -> None:
    env = envelope.failure(FtlError(error_type))
    _check_common(env)
    row = REGISTRY[error_type]
    assert env["success"] is False
    assert isinstance(env["error"], str) and env["error"].strip()
    data = env["data"]
    assert data["error_code"] == row.v2_error_code
    assert data["error_type"] == row.v2_error_type
    assert data["ftl_error_type"] == error_type
    assert data["remediation"] == row.remediation
    assert isinstance(data["details"], dict)


def test_failure_details_carry_only_safe_keys() -> None:
    error = FtlError("verify_failed", {"seq": "003", "exit_code": 1, "output_tail": "Traceback ...",
                                       "workspace_path": "/home/me/.ftl/ws/003"})
    env = envelope.failure(error)
    assert env["data"]["details"] == {"seq": "003", "exit_code": 1}
    text = json.dumps(env)
    assert "Traceback" not in text and "/home/me" not in text


def test_secrets_are_scrubbed_from_message_and_details() -> None:
    error = FtlError("conflict", {"what": "push to https://bob:hunter22@git.example/r failed, "
                                          "token=ghp_abcdefghijklmnopqrstuv"})
    env = envelope.failure(error)
    text = json.dumps(env)
    assert "hunter22" not in text and "ghp_abcdefghijklmnopqrstuv" not in text
    assert REDACTED in env["error"] and REDACTED in env["data"]["details"]["what"]


def test_explicit_message_is_scrubbed_too() -> None:
    env = envelope.failure(FtlError("configuration_error", message="bad value api_key=k-99999"))
    assert "k-99999" not in env["error"]


def test_message_is_truncated_to_one_kib() -> None:
    env = envelope.failure(FtlError("conflict", {"what": "é" * 4000}))
    assert len(env["error"].encode("utf-8")) <= 1024
    assert env["error"].endswith("…")
    assert env["error"].startswith("éé")


def test_retry_after_is_passed_on_only_when_known() -> None:
    limited = envelope.failure(FtlError("rate_limited", {"retry_after_ms": 7000}, retry_after_ms=7000))
    assert limited["data"]["retry_after_ms"] == 7000
    assert limited["data"]["error_type"] == "rate_limit"
    assert "retry_after_ms" not in envelope.failure(FtlError("cancelled"))["data"]


def test_warnings_render_code_severity_message_context() -> None:
    warnings = [Warning("PARTIAL_FAILURE", "1 of 4 explorers failed", {"missing": ["delta"]}),
                Warning("CONTENT_TRUNCATED", "output cut to 1 KiB"),
                Warning("SOMETHING_NEW", "unknown codes default to warning")]
    env = envelope.success({"complete": 3}, warnings=warnings)
    meta = env["meta"]
    assert meta["warnings"] == ["1 of 4 explorers failed", "output cut to 1 KiB",
                                "unknown codes default to warning"]
    assert meta["warning_details"] == [
        {"code": "PARTIAL_FAILURE", "severity": "warning", "message": "1 of 4 explorers failed",
         "context": {"missing": ["delta"]}},
        {"code": "CONTENT_TRUNCATED", "severity": "info", "message": "output cut to 1 KiB",
         "context": {}},
        {"code": "SOMETHING_NEW", "severity": "warning",
         "message": "unknown codes default to warning", "context": {}},
    ]
    assert env["success"] is True and env["error"] is None  # warnings never make a failure


def test_failure_can_carry_warnings() -> None:
    env = envelope.failure(FtlError("cancelled"), warnings=[Warning("LOG_TAIL_REPAIRED", "cut 12 bytes")])
    assert env["meta"]["warning_details"][0]["severity"] == "warning"


def test_warning_severities_use_the_response_v2_levels() -> None:
    assert set(envelope.WARNINGS.values()) <= {"info", "warning", "error"}


def test_warning_text_is_scrubbed() -> None:
    env = envelope.success(warnings=[Warning("FALLBACK_USED", "retried with token=s3cr3t-value",
                                             {"url": "https://u:pw@h/x"})])
    text = json.dumps(env["meta"])
    assert "s3cr3t-value" not in text and "pw@" not in text


def test_internal_failure_reveals_nothing_but_the_correlation_id() -> None:
    try:
        raise RuntimeError("psycopg: password=hunter2 at /srv/app/db.py line 12")
    except RuntimeError:
        env = envelope.internal_failure("corr12345")
    _check_common(env)
    assert env["success"] is False
    assert env["data"]["ftl_error_type"] == "internal_error"
    assert env["data"]["error_code"] == "INTERNAL_ERROR"
    assert env["data"]["details"] == {"correlation_id": "corr12345"}
    assert env["error"] == "An internal error occurred (correlation id corr12345)."
    text = json.dumps(env)
    for leaked in ("psycopg", "hunter2", "/srv/app", "RuntimeError", "Traceback"):
        assert leaked not in text


def test_internal_failure_makes_a_correlation_id_when_none_is_given() -> None:
    env = envelope.internal_failure()
    correlation = env["data"]["details"]["correlation_id"]
    assert re.fullmatch(r"[0-9a-f]{12}", correlation)
    assert correlation in env["error"]
