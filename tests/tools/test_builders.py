"""Shell and agent builders: outcomes, environment, file-scope detection, agent output contract."""

from __future__ import annotations

import pytest

from ftl.errors import FtlError
from ftl.server.tools.builders import BuildArgs, agent_builder, out_of_scope, parse_build_result, shell_builder
from ftl.server.tools.verifier import VerifyArgs, run_verify

from .conftest import agent, write

RESULT_KEYS = {"status", "error_type", "retry_after_ms", "delivered", "reason", "utilized",
               "exit_code", "output", "timed_out", "cancelled", "duration_ms", "files_changed",
               "out_of_scope", "change_detection", "timeout_s"}


def workspace(**overrides):
    spec = {"workspace_id": "001-edit-a", "campaign_id": "c-1", "seq": "001", "slug": "edit-a",
            "type": "BUILD", "attempt": 2, "objective": "edit a", "delta": ["a.py"],
            "verify": "true", "run": "echo done", "budget": 5, "timeout_s": 20}
    spec.update(overrides)
    return spec


def shell(repo, ctx_for, **overrides):
    result = shell_builder(BuildArgs(workspace=workspace(**overrides)), ctx_for(repo))
    assert set(result) == RESULT_KEYS
    return result


def run_agent(repo, ctx_for, mode, exclude=(), **overrides):
    args = BuildArgs(workspace=workspace(**overrides), command=agent(mode), exclude_paths=list(exclude))
    result = agent_builder(args, ctx_for(repo))
    assert set(result) == RESULT_KEYS
    return result


# --------------------------------------------------------------------------- shell builder

def test_shell_builder_complete_with_changes_in_scope(git_repo, ctx_for):
    result = shell(git_repo, ctx_for, run="echo 'A = 2' > a.py && echo built")
    assert result["status"] == "complete" and result["error_type"] is None
    assert result["exit_code"] == 0 and result["output"] == "built\n"
    assert result["files_changed"] == ["a.py"] and result["out_of_scope"] == []
    assert result["change_detection"] == "git"


def test_shell_builder_flags_files_outside_delta_and_creates(git_repo, ctx_for):
    result = shell(git_repo, ctx_for, creates=["pkg/new.py"],
                   run="echo x > a.py; mkdir -p pkg; echo y > pkg/new.py; echo z > b.py; "
                       "mkdir -p .ftl; echo db > .ftl/ftl.db; rm README.md")
    assert result["status"] == "complete"
    assert result["files_changed"] == ["README.md", "a.py", "b.py", "pkg/new.py"]
    assert result["out_of_scope"] == ["README.md", "b.py"]


def test_shell_builder_changes_already_dirty_before_the_run_are_not_charged(git_repo, ctx_for):
    write(git_repo, {"b.py": "B = 'dirty before'\n"})
    result = shell(git_repo, ctx_for, run="echo x > a.py")
    assert result["files_changed"] == ["a.py"] and result["out_of_scope"] == []


def test_shell_builder_in_a_plain_directory_uses_a_tree_walk(tmp_path, ctx_for):
    write(tmp_path, {"a.py": "1"})
    result = shell(tmp_path, ctx_for, run="echo 22 > a.py; echo 1 > other.py")
    assert result["change_detection"] == "walk"
    assert result["files_changed"] == ["a.py", "other.py"] and result["out_of_scope"] == ["other.py"]


def test_shell_builder_failure_and_environment(git_repo, ctx_for):
    result = shell(git_repo, ctx_for, run='echo "$FTL_WORKSPACE_ID $FTL_TASK_SEQ $FTL_ATTEMPT"; exit 4')
    assert result["status"] == "failed" and result["error_type"] == "task_failed"
    assert result["exit_code"] == 4 and result["output"] == "001-edit-a 001 2\n"


def test_shell_builder_timeout(git_repo, ctx_for):
    result = shell(git_repo, ctx_for, run="sleep 30", timeout_s=0.3)
    assert result["status"] == "failed" and result["error_type"] == "timeout" and result["timed_out"]
    assert result["exit_code"] is None


def test_shell_builder_output_is_a_bounded_tail(git_repo, ctx_for):
    args = BuildArgs(workspace=workspace(run="seq 1 100000"))
    result = shell_builder(args, ctx_for(git_repo, output_limit_bytes=2000))
    assert result["status"] == "complete" and len(result["output"]) <= 2000
    assert result["output"].endswith("99999\n100000\n")


def test_shell_builder_needs_a_run_command_and_a_valid_workspace(git_repo, ctx_for):
    with pytest.raises(FtlError) as no_run:
        shell_builder(BuildArgs(workspace=workspace(run=None)), ctx_for(git_repo))
    assert no_run.value.error_type == "schema_invalid"
    broken = workspace()
    del broken["verify"]
    broken["budget"] = "lots"
    with pytest.raises(FtlError) as invalid:
        shell_builder(BuildArgs(workspace=broken), ctx_for(git_repo))
    paths = {v["path"] for v in invalid.value.details["violations"]}
    assert paths == {"$.workspace.verify", "$.workspace.budget"}


def test_out_of_scope_rules(tmp_path):
    (tmp_path / "pkg").mkdir()
    changed = ["./a.py", "pkg/x.py", "docs/y.md", "other/z.py", ".ftl/ftl.db", "shared/s.py"]
    assert out_of_scope(changed, ["a.py", "pkg", "docs/"], tmp_path, exclude=["shared"]) == ["other/z.py"]


# --------------------------------------------------------------------------- agent builder

def test_agent_complete(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "complete")
    assert result["status"] == "complete" and result["delivered"] == "wrote a.py"
    assert result["utilized"] == [{"name": "sibling-x", "type": "failure"}]
    assert result["files_changed"] == ["a.py"] and result["out_of_scope"] == []


def test_agent_blocked_keeps_reason_despite_nonzero_exit(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "blocked")
    assert (result["status"], result["exit_code"]) == ("blocked", 1)
    assert result["reason"] == "delta insufficient - requires b.py"


def test_agent_garbage_output_is_schema_invalid(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "garbage")
    assert (result["status"], result["error_type"]) == ("failed", "schema_invalid")
    assert "no JSON object" in result["reason"]


def test_agent_rate_limit_in_json(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "rate-limit-json")
    assert (result["status"], result["error_type"], result["retry_after_ms"]) == ("failed", "rate_limited", 1500)


def test_agent_rate_limit_by_exit_code(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "rate-limit-exit")
    assert (result["status"], result["error_type"], result["retry_after_ms"]) == ("failed", "rate_limited", None)
    assert result["exit_code"] == 75 and "429" in result["output"]


def test_agent_complete_with_failing_exit_is_task_failed(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "complete-exit-1")
    assert (result["status"], result["error_type"]) == ("failed", "task_failed")


def test_agent_out_of_scope_and_excluded_paths(git_repo, ctx_for):
    assert run_agent(git_repo, ctx_for, "out-of-scope")["out_of_scope"] == ["elsewhere.py"]
    (git_repo / "elsewhere.py").unlink()
    result = run_agent(git_repo, ctx_for, "out-of-scope", exclude=["elsewhere.py"])
    assert result["files_changed"] == ["elsewhere.py"] and result["out_of_scope"] == []


def test_agent_result_is_the_last_object_with_a_status(git_repo, ctx_for):
    result = run_agent(git_repo, ctx_for, "chatty")
    assert result["status"] == "complete" and result["delivered"] == "chatty done"


def test_agent_sees_workspace_environment(git_repo, ctx_for):
    assert run_agent(git_repo, ctx_for, "echo-env")["delivered"] == "001-edit-a 001 2"


def test_agent_builder_needs_a_command(git_repo, ctx_for):
    with pytest.raises(FtlError) as caught:
        agent_builder(BuildArgs(workspace=workspace()), ctx_for(git_repo))
    assert caught.value.error_type == "configuration_error"


def test_agent_timeout(git_repo, ctx_for):
    args = BuildArgs(workspace=workspace(timeout_s=0.3), command=["sleep", "30"])
    result = agent_builder(args, ctx_for(git_repo))
    assert (result["status"], result["error_type"], result["timed_out"]) == ("failed", "timeout", True)


def test_parse_build_result_reports_why_an_object_is_rejected():
    raw, build, problem = parse_build_result('{"status": "done"}')
    assert raw == {"status": "done"} and build is None and "$.status" in problem


# --------------------------------------------------------------------------- verifier

def test_verify_pass_fail_timeout(tmp_path, ctx_for):
    ctx = ctx_for(tmp_path)
    assert run_verify(VerifyArgs(command="test 1 -eq 1"), ctx)["passed"] is True
    failed = run_verify(VerifyArgs(command="echo FAIL; exit 1"), ctx)
    assert (failed["passed"], failed["exit_code"], failed["output"]) == (False, 1, "FAIL\n")
    slow = run_verify(VerifyArgs(command="sleep 30", timeout_s=0.3), ctx)
    assert slow["passed"] is False and slow["timed_out"] and slow["exit_code"] is None
