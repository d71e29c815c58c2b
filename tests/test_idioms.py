"""ftl.idioms: idioms checked by code (issue 15 item 1) and the idiom entries of a plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.errors import FtlError
from ftl.idioms import (FRAMEWORK_IDIOMS, FRAMEWORK_MIN_CONFIDENCE, TEST_RUNNER_CONFIDENCE,
                        CodeIdiom, check_idioms, code_idioms, detected_frameworks, violation_error)
from ftl.models import IDIOM_LANGUAGES, IdiomRule, Idioms
from ftl.validation import parse_plan

NO_PRINT = {"text": "No print calls", "pattern": "print($$$)", "language": "python"}


def write(root: Path, files: dict[str, str | bytes]) -> list[str]:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return list(files)


def test_forbidden_pattern_names_file_and_line(tmp_path: Path) -> None:
    changed = write(tmp_path, {"pkg/a.py": "x = 1\n\nprint(x)\nprint('a', 'b')\n",
                               "pkg/b.py": "def f():\n    return 'print(no call)'\n"})
    violations = check_idioms(tmp_path, changed, {"forbidden": [NO_PRINT]})
    assert [(v.file, v.line, v.kind, v.source) for v in violations] == [
        ("pkg/a.py", 3, "forbidden", "plan"), ("pkg/a.py", 4, "forbidden", "plan")]
    error = violation_error("007", violations)
    assert error.error_type == "idiom_violation" and not error.transient
    assert error.kind.route.value == "block_task"
    assert "No print calls" in error.message and "pkg/a.py:3" in error.message
    assert "and 1 more" in error.message
    assert error.safe_details()["where"] == "pkg/a.py:3"
    assert len(error.safe_details()["violations"]) == 2


def test_only_changed_files_are_checked(tmp_path: Path) -> None:
    write(tmp_path, {"old.py": "print('legacy')\n", "new.py": "value = 2\n"})
    assert check_idioms(tmp_path, ["new.py"], {"forbidden": [NO_PRINT]}) == []


def test_required_idiom_missing_names_the_files_it_looked_in(tmp_path: Path) -> None:
    changed = write(tmp_path, {"a.py": "import logging\n", "b.py": "x = 1\n", "notes.md": "hi\n"})
    required = {"text": "Loggers come from logging.getLogger(__name__)",
                "pattern": "logging.getLogger(__name__)"}
    [violation] = check_idioms(tmp_path, changed, {"required": [required]})
    assert violation.kind == "required" and violation.file is None
    assert violation.files == ("a.py", "b.py")  # notes.md is not Python
    assert "missing in a.py, b.py" in violation.describe()
    (tmp_path / "b.py").write_text("import logging\nlog = logging.getLogger(__name__)\n")
    assert check_idioms(tmp_path, changed, {"required": [required]}) == []
    # A task that changed no Python file is not held to a Python idiom.
    assert check_idioms(tmp_path, ["notes.md"], {"required": [required]}) == []


def test_regex_idiom_matches_lines_of_any_text_file(tmp_path: Path) -> None:
    changed = write(tmp_path, {"conf.toml": "a = 1\npassword = 'x'\n", "m.py": "ok = True\n"})
    rule = {"text": "No passwords in files", "regex": r"(?i)^\s*password\s*="}
    assert [(v.file, v.line) for v in check_idioms(tmp_path, changed, {"forbidden": [rule]})] == [
        ("conf.toml", 2)]


def test_plain_string_idioms_are_guidance_only(tmp_path: Path) -> None:
    changed = write(tmp_path, {"a.py": "print('x')\n"})
    assert code_idioms({"required": ["Use print sparingly"], "forbidden": ["print"]}) == []
    assert check_idioms(tmp_path, changed, {"forbidden": ["print($$$)"]}) == []


def test_pattern_language_selects_files(tmp_path: Path) -> None:
    changed = write(tmp_path, {"app.js": "console.log('x');\nprint('not python');\n",
                               "app.py": "console.log('x')\n"})
    js_rule = {"text": "No console.log", "pattern": "console.log($$$)", "language": "javascript"}
    assert [(v.file, v.line) for v in check_idioms(tmp_path, changed, {"forbidden": [js_rule]})] == [
        ("app.js", 1)]
    assert [v.file for v in check_idioms(tmp_path, changed, {"forbidden": [NO_PRINT]})] == []


def test_unreadable_missing_and_escaping_paths_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, {"bin.py": b"print(1)\x00\x01", "latin.py": "print('é')\n".encode("latin-1")})
    (tmp_path.parent / "outside.py").write_text("print(1)\n")
    changed = ["bin.py", "latin.py", "deleted.py", "../outside.py", "/etc/passwd"]
    assert check_idioms(tmp_path, changed, {"forbidden": [NO_PRINT]}) == []


def test_framework_rules_apply_from_confidence_0_6(tmp_path: Path) -> None:
    changed = write(tmp_path, {"app.py": "from flask import Flask\napp = Flask(__name__)\n"
                                         "app.secret_key = 'hunter2'\n"})
    below = FRAMEWORK_MIN_CONFIDENCE - 0.01
    assert check_idioms(tmp_path, changed, {}, {"flask": below}) == []
    [violation] = check_idioms(tmp_path, changed, {}, {"Flask": FRAMEWORK_MIN_CONFIDENCE})
    assert (violation.file, violation.line, violation.source) == ("app.py", 3, "framework:flask")
    # The plan's own idioms are added to the framework's.
    both = check_idioms(tmp_path, changed, {"required": [NO_PRINT]}, {"flask": 0.85})
    assert [v.source for v in both] == ["framework:flask", "plan"]


# One sample that breaks each registry idiom and one that follows it.
REGISTRY_SAMPLES: dict[str, tuple[str, str, str]] = {
    # text prefix: (file name, breaking source, following source)
    "No blocking time.sleep()": (
        "api.py", "import time\nasync def read():\n    time.sleep(1)\n",
        "import asyncio, time\nasync def read():\n    await asyncio.sleep(1)\ndef sync():\n"
        "    time.sleep(1)\n"),
    "No blocking requests calls": (
        "api.py", "import requests\nasync def read():\n    return requests.get('u').json()\n",
        "import requests\ndef read():\n    return requests.get('u').json()\n"),
    "Request bodies are pydantic": (
        "api.py", "async def create(request):\n    data = await request.json()\n",
        "async def create(item: Item):\n    data = await client.json()\n"),
    "Debug mode is not switched on": (
        "app.py", "app.run(host='0.0.0.0', debug=True)\n", "app.run(debug=False)\napp.run()\n"),
    "The secret key is not hard-coded": (
        "app.py", "app.config['SECRET_KEY'] = 'dev'\n",
        "import os\napp.secret_key = os.environ['SECRET_KEY']\napp.config['OTHER'] = 'x'\n"),
    "Tests use plain assert": (
        "tests/test_x.py", "class T:\n    def test_a(self):\n        self.assertEqual(1, 1)\n",
        "def test_a():\n    assert 1 == 1\n"),
    "Temporary directories come from the tmp_path": (
        "test_files.py", "import tempfile\ndef test_a():\n    d = tempfile.mkdtemp()\n",
        "def test_a(tmp_path):\n    d = tmp_path\n"),
}
ALL_RULES = [(name, rule) for name, rules in FRAMEWORK_IDIOMS.items() for rule in rules]


def test_registry_covers_three_real_frameworks_with_samples() -> None:
    assert {"fastapi", "flask", "pytest"} <= set(FRAMEWORK_IDIOMS)
    assert all(any(rule.text.startswith(prefix) for prefix in REGISTRY_SAMPLES)
               for _, rule in ALL_RULES)


@pytest.mark.parametrize("name,rule", ALL_RULES, ids=[r.text[:30] for _, r in ALL_RULES])
def test_each_registry_rule_catches_its_breach_and_spares_the_idiom(
        tmp_path: Path, name: str, rule: CodeIdiom) -> None:
    file, breaking, following = next(sample for prefix, sample in REGISTRY_SAMPLES.items()
                                     if rule.text.startswith(prefix))
    write(tmp_path / "bad", {file: breaking})
    write(tmp_path / "good", {file: following})
    bad = [v for v in check_idioms(tmp_path / "bad", [file], {}, {name: 0.95}) if v.idiom == rule.text]
    assert bad and bad[0].file == file and bad[0].source == f"framework:{name}"
    assert [v for v in check_idioms(tmp_path / "good", [file], {}, {name: 0.95})
            if v.idiom == rule.text] == []


def test_pytest_rules_look_at_test_files_only(tmp_path: Path) -> None:
    changed = write(tmp_path, {"helpers.py": "class H:\n    def f(self):\n        self.assertOk()\n"})
    assert check_idioms(tmp_path, changed, {}, {"pytest": 0.95}) == []


def test_detected_frameworks_reads_the_pattern_explorer_result() -> None:
    pattern = {"framework": "fastapi", "confidence": 0.85, "test_runner": "pytest",
               "frameworks": [{"name": "fastapi", "confidence": 0.85},
                              {"name": "starlette", "confidence": 0.75}]}
    assert detected_frameworks(pattern) == {"fastapi": 0.85, "starlette": 0.75,
                                            "pytest": TEST_RUNNER_CONFIDENCE}
    assert detected_frameworks(None, plan_framework="Flask", plan_confidence=None) == {"flask": 0.5}
    assert detected_frameworks({"framework": "none", "confidence": 0.0}) == {}


def test_detection_from_a_real_pattern_exploration(tmp_path: Path) -> None:
    from ftl.server.tools.context import ToolContext
    from ftl.server.tools.explorers import ExploreArgs, explore_pattern

    write(tmp_path, {"app.py": "from flask import Flask\napp = Flask(__name__)\n",
                     "views.py": "from flask import Blueprint\n",
                     "tests/test_app.py": "import pytest\n"})
    pattern = explore_pattern(ExploreArgs(objective="add a view"), ToolContext(repo=tmp_path))
    frameworks = detected_frameworks(pattern)
    assert frameworks["flask"] >= FRAMEWORK_MIN_CONFIDENCE
    assert frameworks["pytest"] == TEST_RUNNER_CONFIDENCE
    assert {rule.source for rule in code_idioms({}, frameworks)} == {"framework:flask",
                                                                     "framework:pytest"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30), st.sampled_from(["x", "'s'", "a, b=1"]))
def test_every_print_line_and_only_those_is_reported(tmp_path_factory, lines: list[bool],
                                                     argument: str) -> None:
    root = tmp_path_factory.mktemp("prop")
    source = "".join(f"print({argument})\n" if is_print else "printer = print_it\n"
                     for is_print in lines)
    write(root, {"m.py": source})
    reported = [v.line for v in check_idioms(root, ["m.py"], {"forbidden": [NO_PRINT]})]
    assert reported == [number for number, is_print in enumerate(lines, 1) if is_print]


# --- the plan's idiom entries (ftl.models.Idioms)

def plan_with(idioms: dict) -> dict:
    return {"objective": "o", "idioms": idioms,
            "tasks": [{"seq": 1, "slug": "a", "verify": "true", "delta": ["a.py"]}]}


def test_plan_idioms_accept_strings_patterns_and_regexes() -> None:
    plan = parse_plan(plan_with({"required": ["guidance", {"text": "t", "regex": "^x"}],
                                 "forbidden": [NO_PRINT]}))
    assert plan.idioms.required[0] == "guidance"
    assert plan.idioms.forbidden[0] == IdiomRule(**NO_PRINT)
    assert Idioms.model_validate(plan.idioms.model_dump(mode="json")) == plan.idioms


@pytest.mark.parametrize("entry,fragment", [
    ({"text": "t"}, "exactly one of 'pattern' or 'regex'"),
    ({"text": "t", "pattern": "p", "regex": "r"}, "exactly one of"),
    ({"text": "t", "regex": "("}, "does not compile"),
    ({"text": "t", "pattern": ""}, "at least 1 character"),
    ({"text": "t", "pattern": "print($$$)", "language": "cobol"}, "'python'"),
    ({"text": "t", "regex": "x", "language": "python"}, "'language' goes with 'pattern'"),
    ({"text": "", "regex": "x"}, "at least 1 character"),
    ({"text": "t", "regex": "x", "severity": "high"}, "Extra inputs"),
])
def test_bad_idiom_entries_are_schema_invalid_at_their_path(entry: dict, fragment: str) -> None:
    with pytest.raises(FtlError) as info:
        parse_plan(plan_with({"forbidden": ["ok", entry]}))
    assert info.value.error_type == "schema_invalid"
    [violation] = info.value.details["violations"]
    assert violation["path"].startswith("$.idioms.forbidden[1]")
    assert fragment in violation["message"]


def test_every_idiom_language_is_an_ast_grep_language() -> None:
    from ast_grep_py import SgRoot

    for language in IDIOM_LANGUAGES:
        SgRoot("x", language).root()  # panics on a language ast-grep does not ship
    assert set(IDIOM_LANGUAGES) == set(IdiomRule.model_fields["language"].annotation.__args__[0].__args__)
