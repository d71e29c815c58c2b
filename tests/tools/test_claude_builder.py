"""The Claude builder tool against the stand-in CLI (recorded-format scenarios) and against the
real, pinned Claude Code CLI with no login (offline: it answers without reaching the API)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from ftl.config import ClaudeSettings
from ftl.server.tools.claude import ClaudeBuildArgs, claude_argv, claude_builder

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = ROOT / "examples" / "claude-builder" / "stand_in_claude.py"
CLAUDE_CODE_VERSION = "2.1.329"


def workspace(**overrides):
    spec = {"workspace_id": "001-greet", "campaign_id": "c-1", "seq": "001", "slug": "greet",
            "type": "BUILD", "attempt": 1, "objective": "write greet", "delta": [],
            "creates": ["app/greet.py"], "verify": "true", "budget": 2, "timeout_s": 30}
    spec.update(overrides)
    return spec


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """Run the tool with the stand-in CLI in ``scenario``; returns (result, argv records)."""
    log = tmp_path / "argv"
    monkeypatch.setenv("FTL_STAND_IN_LOG", str(log))

    def run(repo: Path, scenario: str, ctx_for, resume: str | None = None, **settings):
        monkeypatch.setenv("FTL_STAND_IN_SCENARIOS", json.dumps({"*": scenario}))
        config = ClaudeSettings(command=[sys.executable, str(STAND_IN)], **settings)
        result = claude_builder(ClaudeBuildArgs(workspace=workspace(), claude=config,
                                                resume_session_id=resume), ctx_for(repo))
        records = [json.loads(line) for line in (log / "argv.jsonl").read_text().splitlines()]
        return result, records
    return run


def test_argv_maps_the_budget_to_max_turns_and_passes_the_settings() -> None:
    settings = ClaudeSettings(command=["npx", "claude"], model="sonnet", permission_mode="acceptEdits",
                              extra_args=["--strict-mcp-config"], turns_per_budget=7)
    assert claude_argv(settings, max_turns=14, agent="ftl:builder", resume_session_id="s-1") == [
        "npx", "claude", "-p", "--output-format", "stream-json", "--verbose", "--max-turns", "14",
        "--agent", "ftl:builder", "--model", "sonnet", "--permission-mode", "acceptEdits",
        "--resume", "s-1", "--strict-mcp-config"]


def test_success_reports_cost_tokens_session_and_the_files(git_repo, ctx_for, stand_in) -> None:
    result, records = stand_in(git_repo, "success", ctx_for, turns_per_budget=5)
    assert result["status"] == "complete" and result["error_type"] is None
    assert result["files_changed"] == ["app/greet.py"] and result["out_of_scope"] == []
    assert result["total_cost_usd"] == 0.0125 and result["num_turns"] == 3
    assert result["usage"]["input_tokens"] == 3600 and result["session_id"]
    assert result["delivered"] == "created app/greet.py"
    assert records[0]["argv"][records[0]["argv"].index("--max-turns") + 1] == "10"  # budget 2 x 5
    assert Path(records[0]["cwd"]).resolve() == git_repo.resolve()


def test_max_turns_is_budget_exhausted(git_repo, ctx_for, stand_in) -> None:
    result, _ = stand_in(git_repo, "max_turns", ctx_for)
    assert result["error_type"] == "budget_exhausted" and result["num_turns"] == 20


def test_a_429_gives_rate_limited_with_its_retry_after(git_repo, ctx_for, stand_in) -> None:
    result, _ = stand_in(git_repo, "rate_limit_once", ctx_for)
    assert result["error_type"] == "rate_limited" and result["limit_kind"] == "rate_limit"
    assert 0 < result["retry_after_ms"] <= 1000 and result["reopens_at"]


def test_a_usage_limit_gives_its_reset_time(git_repo, ctx_for, stand_in) -> None:
    result, _ = stand_in(git_repo, "usage_limit_once", ctx_for)
    assert result["error_type"] == "rate_limited" and result["limit_kind"] == "usage_limit"
    assert result["reopens_at"] and result["retry_after_ms"] <= 2000


def test_a_stall_is_stopped_and_the_retry_resumes_the_session(git_repo, ctx_for, stand_in) -> None:
    result, _ = stand_in(git_repo, "stall_once", ctx_for, idle_timeout_s=1.0)
    assert result["error_type"] == "stalled" and result["session_id"]
    assert result["duration_ms"] < 20000
    again, records = stand_in(git_repo, "stall_once", ctx_for, resume=result["session_id"])
    assert again["status"] == "complete"
    argv = records[-1]["argv"]
    assert argv[argv.index("--resume") + 1] == result["session_id"]


def test_malformed_lines_are_counted_and_the_run_completes(git_repo, ctx_for, stand_in) -> None:
    result, _ = stand_in(git_repo, "malformed", ctx_for)
    assert result["status"] == "complete"
    assert result["stream"]["malformed_lines"] == 3 and result["stream"]["unknown_events"] == 1


def test_a_crash_mid_stream_is_task_failed(git_repo, ctx_for, stand_in) -> None:
    result, _ = stand_in(git_repo, "crash", ctx_for)
    assert result["error_type"] == "task_failed" and result["exit_code"] == 3
    assert "without a result event" in result["reason"]
    assert result["stream"]["malformed_lines"] == 1  # the torn last line
    # no result, no cost; the reply it made before dying still counts its tokens
    assert result["total_cost_usd"] == 0.0 and result["num_turns"] == 1
    assert result["usage"] == {"input_tokens": 1200, "output_tokens": 340,
                               "cache_read_input_tokens": 5000, "cache_creation_input_tokens": 800}


def test_tool_calls_the_permission_settings_refused_are_reported_with_the_fix(git_repo, ctx_for,
                                                                              stand_in) -> None:
    result, _ = stand_in(git_repo, "denied", ctx_for)
    assert result["status"] == "blocked"
    assert result["permission_denials"] == [
        {"tool": "Bash", "input": '{"command": "pytest -q", "description": "Run the tests"}'}]
    assert result["reason"].startswith("could not run the test suite; Claude Code's permission "
                                       "settings refused 1 tool call(s) (Bash)")
    assert "permission_mode" in result["reason"] and "--allowedTools" in result["reason"]
    ok, _ = stand_in(git_repo, "success", ctx_for)
    assert ok["status"] == "complete" and ok["permission_denials"] == []


# --------------------------------------------------------------------------- the real CLI

def _real_claude() -> str | None:
    cached = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "ftl-ci" / "claude-code" / "node_modules" / ".bin" / "claude"
    return os.environ.get("FTL_CLAUDE") or shutil.which("claude") or (
        str(cached) if cached.exists() else None)


@pytest.fixture
def real_claude(tmp_path, monkeypatch) -> str:
    binary = _real_claude()
    if binary is None:
        pytest.skip("the Claude Code CLI is not installed: `npm install @anthropic-ai/claude-code@"
                    f"{CLAUDE_CODE_VERSION}` (or set FTL_CLAUDE)")
    home = tmp_path / "home"  # no credentials there: the CLI is not logged in
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
                 "CLAUDE_CONFIG_DIR", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return binary


def test_the_real_cli_not_logged_in_is_a_structural_login_error(git_repo, ctx_for, real_claude) -> None:
    from ftl.errors import kind
    from ftl.engine.recovery import classify_command

    settings = ClaudeSettings(command=[real_claude], agent=None)
    result = claude_builder(ClaudeBuildArgs(workspace=workspace(timeout_s=60), claude=settings),
                            ctx_for(git_repo))
    assert result["error_type"] == "agent_login_required", result
    assert result["session_id"] and result["stream"]["events"] >= 2
    error = classify_command(result, what="build", seq="001")
    assert error.error_type == "agent_login_required" and not error.transient
    assert "/login" in kind("agent_login_required").remediation


def test_the_real_cli_without_the_ftl_plugin_is_a_configuration_error(git_repo, ctx_for,
                                                                      real_claude) -> None:
    settings = ClaudeSettings(command=[real_claude])  # agent ftl:builder, not installed here
    result = claude_builder(ClaudeBuildArgs(workspace=workspace(timeout_s=60), claude=settings),
                            ctx_for(git_repo))
    assert result["error_type"] == "configuration_error", result
    assert "ftl:builder" in result["reason"]
