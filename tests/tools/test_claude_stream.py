"""Claude Code's stream-json reader and the builder's outcome rules: pure, no processes.

Event shapes are the ones Claude Code 2.1.329 prints (recorded with no login: see
``test_claude_builder.py`` for the real CLI).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.server.tools.claude import outcome
from ftl.server.tools.claude_stream import StreamReader, limit_from_text, not_logged_in

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
SESSION = "3845e69e-702f-420d-b48d-3dc59bfd709e"


def _result(**fields) -> str:
    base = {"type": "result", "subtype": "success", "is_error": False, "session_id": SESSION,
            "num_turns": 3, "duration_api_ms": 2100, "total_cost_usd": 0.0421, "result": "done",
            "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30,
                      "cache_creation_input_tokens": 40, "server_tool_use": {"x": 1}}}
    return json.dumps({**base, **fields})


def _read(*lines: str) -> StreamReader:
    reader = StreamReader()
    for line in lines:
        reader.feed(line)
    return reader


def test_a_success_run_yields_session_cost_turns_and_tokens() -> None:
    summary = _read(json.dumps({"type": "system", "subtype": "init", "session_id": SESSION}),
                    json.dumps({"type": "assistant", "session_id": SESSION,
                                "message": {"content": [{"type": "text", "text": "hi"}]}}),
                    _result()).summary
    assert summary.session_id == SESSION and summary.result_seen and summary.subtype == "success"
    assert summary.cost_fields() == {
        "total_cost_usd": 0.0421, "num_turns": 3, "duration_api_ms": 2100, "session_id": SESSION,
        "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30,
                  "cache_creation_input_tokens": 40}}
    assert summary.errors == []


def test_malformed_lines_and_unknown_events_are_counted_not_fatal() -> None:
    summary = _read("not json", "[1, 2]", '{"no_type": 1}', '{"type": "assistant", "mess',
                    json.dumps({"type": "telemetry_v9", "payload": {}}), "", _result()).summary
    assert (summary.malformed_lines, summary.unknown_events, summary.events) == (4, 1, 2)
    assert summary.total_cost_usd == 0.0421


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=80), st.binary(max_size=80),
                          st.dictionaries(st.sampled_from(["type", "subtype", "session_id",
                                                           "total_cost_usd", "usage", "message",
                                                           "num_turns", "result", "is_error"]),
                                          st.one_of(st.none(), st.booleans(), st.integers(),
                                                    st.floats(allow_nan=False), st.text(max_size=10),
                                                    st.sampled_from(["result", "assistant", "system"])),
                                          max_size=6).map(json.dumps)), max_size=20))
def test_the_reader_never_raises_and_counts_every_line(lines: list) -> None:
    reader = StreamReader()
    for line in lines:
        reader.feed(line)
    summary = reader.summary
    non_blank = sum(1 for line in lines if (line.decode("utf-8", "replace") if isinstance(line, bytes)
                                            else line).strip())
    assert summary.events + summary.malformed_lines == non_blank
    assert summary.total_cost_usd >= 0 and summary.num_turns >= 0
    assert all(isinstance(v, int) and v >= 0 for v in summary.usage.values())


def test_the_real_clis_not_logged_in_reply_is_recognised() -> None:
    summary = _read(json.dumps({"type": "assistant", "session_id": SESSION, "error": "authentication_failed",
                                "is_api_error_message": True,
                                "message": {"content": [{"type": "text",
                                                         "text": "Not logged in · Please run /login"}]}}),
                    _result(is_error=True, result="Not logged in · Please run /login",
                            total_cost_usd=0, api_error_status=None)).summary
    assert any(not_logged_in(text) for text in summary.errors)
    decided = outcome(summary, exit_code=1, stderr="", idle_timed_out=False, now=NOW)
    assert decided["error_type"] == "agent_login_required"


def test_usage_limit_with_an_epoch_reset() -> None:
    reset = int((NOW + timedelta(hours=3)).timestamp())
    limit = limit_from_text(f"Claude AI usage limit reached|{reset}", NOW)
    assert limit is not None and limit.kind == "usage_limit"
    assert limit.reopens_at == NOW + timedelta(hours=3) and limit.retry_after_ms == 3 * 3600 * 1000


def test_usage_limit_with_a_clock_reset_in_a_named_zone() -> None:
    limit = limit_from_text("You've hit your limit · resets 3pm (Europe/Paris)", NOW)
    # 12:00 UTC is 13:00 in Paris (CET, UTC+1): 15:00 Paris is 14:00 UTC the same day.
    assert limit is not None and limit.reopens_at == datetime(2026, 11, 24, 14, 0, tzinfo=timezone.utc)
    earlier = limit_from_text("5-hour limit reached ∙ resets 9am", NOW)
    assert earlier.reopens_at == datetime(2026, 11, 25, 9, 0, tzinfo=timezone.utc)  # tomorrow


def test_a_429_with_retry_after_and_an_overloaded_api() -> None:
    limit = limit_from_text('API Error: 429 {"error":{"type":"rate_limit_error"}} retry-after: 7', NOW)
    assert limit.kind == "rate_limit" and limit.retry_after_ms == 7000
    assert limit_from_text("API Error: 529 overloaded_error", NOW).reopens_at is None
    assert limit_from_text("API Error: 500 internal", NOW) is None


def test_outcome_rules() -> None:
    def decide(*lines: str, exit_code: int | None = 0, **kw) -> dict:
        return outcome(_read(*lines).summary, exit_code=exit_code, stderr=kw.get("stderr", ""),
                       idle_timed_out=kw.get("idle", False), now=NOW)

    assert decide(_result(result='{"status": "complete", "delivered": "a.py"}')) == {
        "status": "complete", "error_type": None, "delivered": "a.py", "reason": None, "utilized": []}
    blocked = decide(_result(result='{"status": "blocked", "reason": "needs a key"}'))
    assert (blocked["status"], blocked["reason"]) == ("blocked", "needs a key")
    assert decide(_result(subtype="error_max_turns", is_error=True), exit_code=1)["error_type"] \
        == "budget_exhausted"
    assert decide(_result(subtype="error_during_execution", is_error=True),
                  exit_code=1)["error_type"] == "task_failed"
    assert decide(json.dumps({"type": "system", "subtype": "init", "session_id": SESSION}),
                  exit_code=3)["reason"].startswith("Claude Code ended without a result event")
    assert decide(exit_code=None, idle=True)["error_type"] == "stalled"
    limited = decide(json.dumps({"type": "system", "subtype": "api_retry", "error_status": 429,
                                 "retry_delay_ms": 1500, "error": "rate_limit"}),
                     _result(is_error=True, result="API Error: 429 rate limited"), exit_code=1)
    assert limited["error_type"] == "rate_limited" and limited["limit_kind"] == "rate_limit"


def _decide(*lines: str, exit_code: int | None = 0, stderr: str = "", idle: bool = False) -> dict:
    return outcome(_read(*lines).summary, exit_code=exit_code, stderr=stderr, idle_timed_out=idle,
                   now=NOW)


def test_a_429_the_cli_retried_past_does_not_fail_a_finished_build() -> None:
    # The CLI retries the API on its own (api_retry events); a run that then ends with a
    # success result built the task: calling it rate-limited would pay for it twice and close
    # the gate for every sibling.
    retried = json.dumps({"type": "system", "subtype": "api_retry", "error_status": 429,
                          "retry_delay_ms": 1200, "error": "rate_limit"})
    done = _result(result='{"status": "complete", "delivered": "a.py"}')
    assert _decide(retried, done)["status"] == "complete"
    assert _decide(done, stderr="warning: got HTTP 429, retrying")["status"] == "complete"
    # A run that printed its success result and then hung until the idle timeout stopped it.
    assert _decide(done, exit_code=None, idle=True)["status"] == "complete"


def test_the_clis_current_limit_wordings_close_the_gate_until_their_reset(monkeypatch) -> None:
    import ftl.server.tools.claude_stream as stream

    session = limit_from_text("You've hit your session limit · resets 3pm (America/Bogota)", NOW)
    assert session.kind == "usage_limit"  # Bogota is UTC-5: 15:00 there is 20:00 UTC
    assert session.reopens_at == datetime(2026, 11, 24, 20, 0, tzinfo=timezone.utc)
    weekly = limit_from_text("You've hit your weekly limit · resets Sep 15 at 7pm (UTC)", NOW)
    assert weekly.reopens_at == datetime(2027, 9, 15, 19, 0, tzinfo=timezone.utc)  # next year's
    dated = limit_from_text("Opus limit reached · resets Nov 27, 2am (UTC)", NOW)
    assert dated.reopens_at == datetime(2026, 11, 27, 2, 0, tzinfo=timezone.utc)
    # No zone named: the CLI printed this machine's local time.
    monkeypatch.setattr(stream, "_local_zone", lambda: timezone(timedelta(hours=-5)))
    local = limit_from_text("5-hour limit reached ∙ resets 3pm", NOW)
    assert local.reopens_at == datetime(2026, 11, 24, 20, 0, tzinfo=timezone.utc)


def test_a_limit_message_that_offers_login_is_a_limit_not_a_login_prompt() -> None:
    text = ("You've hit your limit · resets 5:40pm (Europe/Berlin)\n"
            "/login to switch to an API usage-billed account.")
    decided = _decide(_result(is_error=True, result=text, total_cost_usd=0), exit_code=1)
    assert decided["error_type"] == "rate_limited" and decided["limit_kind"] == "usage_limit"
    assert not not_logged_in(text)


def test_a_cost_that_is_not_a_finite_number_is_not_counted() -> None:
    summary = _read(_result(total_cost_usd=float("inf"), num_turns=float("nan"))).summary
    assert summary.total_cost_usd == 0.0 and summary.num_turns == 0


def test_permission_denials_are_kept_once_each_scrubbed_and_capped() -> None:
    reader = StreamReader()
    secret = "ghp_" + "a" * 36
    reader.feed(json.dumps({"type": "system", "subtype": "permission_denied", "tool_name": "Bash",
                            "tool_use_id": "t1", "tool_input": {"command": f"curl -H {secret}"}}))
    denials = [{"tool_name": "Bash", "tool_use_id": "t1", "tool_input": {"command": "x"}}]  # seen
    denials += [{"tool_name": "Write", "tool_use_id": f"w{i}", "tool_input": {"file_path": f"f{i}"}}
                for i in range(30)]
    reader.feed(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                            "result": "", "permission_denials": denials + ["junk", {"tool_name": 3}]}))
    summary = reader.summary
    assert summary.denials_seen == 32  # t1 once, 30 writes, the nameless one
    assert len(summary.permission_denials) == 20
    assert summary.permission_denials[0]["tool"] == "Bash" and secret not in summary.permission_denials[0]["input"]
    assert summary.permission_denials[1] == {"tool": "Write", "input": '{"file_path": "f0"}'}


def test_a_run_without_a_result_counts_each_reply_once_and_the_result_overrides() -> None:
    reader = StreamReader()
    usage = {"input_tokens": 10, "output_tokens": 2}
    for reply, scale in (("m1", 1), ("m1", 1), ("m2", 3)):  # m1 streamed in two parts
        reader.feed(json.dumps({"type": "assistant", "message": {
            "id": reply, "content": [], "usage": {k: v * scale for k, v in usage.items()}}}))
    assert reader.summary.num_turns == 2
    assert reader.summary.usage["input_tokens"] == 40 and reader.summary.usage["output_tokens"] == 8
    reader.feed(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "",
                            "num_turns": 5, "usage": {"input_tokens": 99, "output_tokens": 7}}))
    reader.feed(json.dumps({"type": "assistant", "message": {"id": "m3", "usage": usage}}))
    assert reader.summary.num_turns == 5 and reader.summary.usage["input_tokens"] == 99


def test_a_denied_call_s_secret_is_scrubbed_before_the_input_is_cut() -> None:
    reader = StreamReader()
    pem = ("-----BEGIN RSA PRIVATE KEY-----\n" + "MIIEpAIBAAKCAQEA" * 40 + "\n-----END RSA PRIVATE KEY-----\n")
    reader.feed(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "",
                            "permission_denials": [{"tool_name": "Write", "tool_use_id": "w1", "tool_input": {
                                "file_path": "/home/alice/secret/key.pem", "content": pem}}]}))
    (denial,) = reader.summary.permission_denials
    assert "MIIEpAIB" not in denial["input"] and "/home/alice" not in denial["input"]
    assert len(denial["input"].encode()) <= 200
