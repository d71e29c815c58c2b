"""The FTL output mode's adapter (lib/_common.py): how the mode is chosen, what a failure looks
like in it, and FTL's regex generalisation of failure triggers (lib/observer.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parent.parent
LIB = REPO_ROOT / "lib"


def call(repo: Path, script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "FTL_OUTPUT"}
    environ.update(env or {})
    return subprocess.run([sys.executable, str(LIB / f"{script}.py"), *args], cwd=repo, env=environ,
                          capture_output=True, text=True, timeout=60)


def test_mode_comes_from_the_flag_or_the_environment_and_defaults_to_the_envelope(tmp_path: Path) -> None:
    envelope = call(tmp_path, "campaign", "active")
    assert json.loads(envelope.stdout)["data"] == {} and envelope.returncode == 0
    by_env = call(tmp_path, "campaign", "active", env={"FTL_OUTPUT": "ftl"})
    by_flag = call(tmp_path, "campaign", "--output", "ftl", "active")
    assert by_env.stdout == by_flag.stdout == "null\n"  # FTL printed null
    refused = call(tmp_path, "campaign", "--output", "yaml", "active")
    payload = json.loads(refused.stdout)
    assert refused.returncode == 2 and payload["data"]["error_code"] == "VALIDATION_ERROR"


def test_failures_in_ftl_mode_are_one_line_on_stderr_with_ftls_exit_code(tmp_path: Path) -> None:
    crash = call(tmp_path, "campaign", "update-task", "001", "complete", env={"FTL_OUTPUT": "ftl"})
    assert crash.returncode == 1 and crash.stdout == ""
    assert crash.stderr.startswith("Error: ") and crash.stderr.count("\n") == 1
    assert "Traceback" not in crash.stderr and str(tmp_path) not in crash.stderr
    usage = call(tmp_path, "memory", "add-failure", env={"FTL_OUTPUT": "ftl"})
    assert usage.returncode == 2 and usage.stdout == "" and usage.stderr.startswith("usage error: ")
    printed = call(tmp_path, "plan", "read", "--id", "3", env={"FTL_OUTPUT": "ftl"})
    assert printed.returncode == 1 and "Traceback" not in printed.stderr  # no campaign: FTL raised too


def test_a_json_error_ftl_printed_is_printed_with_its_exit_code(tmp_path: Path) -> None:
    done = call(tmp_path, "memory", "feedback-batch", "--utilized", "[]", env={"FTL_OUTPUT": "ftl"})
    assert done.returncode == 1 and json.loads(done.stdout) == {"error": "Must provide --injected or --injected-b64"}
    missing = call(tmp_path, "decision_parser", "nothing.md", "--output", "ftl")
    assert missing.returncode == 1 and json.loads(missing.stdout) == {"error": "File not found: nothing.md"}


def _lib_module(name: str):
    """The commands module of ``lib/NAME.py`` (``lib/_NAME.py``: the script only launches it)."""
    import importlib

    if str(LIB) not in sys.path:
        sys.path.insert(0, str(LIB))
    return importlib.import_module(f"_{name}")


OBSERVER = _lib_module("observer")


@settings(max_examples=120, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab1 2\t'\"\\.*()[]-:x"), max_size=60))
def test_a_generalised_trigger_always_compiles_and_matches_itself(trigger: str) -> None:
    pattern = OBSERVER.generalize_to_regex(trigger)
    assert re.fullmatch(pattern, trigger, flags=re.DOTALL), (trigger, pattern)


def test_generalised_trigger_matches_other_numbers_and_quoted_names() -> None:
    pattern = OBSERVER.generalize_to_regex("ImportError: cannot import 'tokenize' (line 12)")
    assert re.fullmatch(pattern, "ImportError: cannot import 'lex'  (line 7)")
    assert not re.fullmatch(pattern, "ValueError: cannot import 'lex' (line 7)")


EXPLORATION = _lib_module("exploration")
DECISIONS = _lib_module("decision_parser")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.just('x {"mode": "delta", "status": "ok"} y'),
                          st.just('```json {"mode": "pattern"} ```')), max_size=6))
def test_explorer_output_lines_parse_to_objects_or_are_skipped(lines: list[str]) -> None:
    found = EXPLORATION._lines_as_results("\n".join(lines))
    assert all(isinstance(item, dict) for item in found)
    assert len(found) <= sum(1 for line in "\n".join(lines).splitlines() if line.strip())


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet=st.sampled_from("#:`{}[]\"' \nConfidence:PROCEEDCLARIFYtasks?1.-"), max_size=200))
def test_any_planner_output_gives_a_decision(text: str) -> None:
    result = DECISIONS.decide(text)
    assert result["decision"] in DECISIONS.FTL_EXIT and isinstance(result["markers_found"], list)
    if "plan_json" in result:
        assert set(result["validation"]) == {"valid", "errors"}


def test_memory_commands_in_the_envelope_carry_ftls_payload_and_ftls_extra_keys(tmp_path: Path) -> None:
    entry = json.dumps({"name": "missing-dep", "trigger": "ModuleNotFoundError: No module named yaml",
                        "fix": "pip install pyyaml", "cost": 1500})
    added = json.loads(call(tmp_path, "memory", "add-failure", "--json", entry).stdout)
    assert added["success"] and added["data"] == {"status": "added"}
    found = json.loads(call(tmp_path, "memory", "context", "--objective", "yaml module").stdout)["data"]
    assert [f["name"] for f in found["failures"]] == ["missing-dep"] and found["patterns"] == []
    assert found["failures"][0]["occurrences"] == 1 and found["failures"][0]["_relevance"] == 1.0
    bad = call(tmp_path, "memory", "add-failure", "--json", "[1]")
    assert bad.returncode == 2 and json.loads(bad.stdout)["data"]["error_code"] == "VALIDATION_ERROR"
