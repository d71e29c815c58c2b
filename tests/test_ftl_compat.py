"""Differential test of the FTL output mode: the scripted sequence of tests/compat/sequence.json
runs against ftl's lib/*.py with FTL_OUTPUT=ftl, and every step must print what FTL printed
(tests/compat/golden/, recorded from FTL's own scripts by tests/compat/record_ftl.py) after
normalising ids and timestamps, or be listed in tests/compat/differences.json with the reason
documented in docs/ftl-compat.md. The scripts run in process (same code path as a subprocess:
`_common.run` and its SystemExit) so the ~90 calls take about a second."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LIB = REPO_ROOT / "lib"
sys.path.insert(0, str(REPO_ROOT / "tests" / "compat"))

from harness import DIFFERENCES, GOLDEN, compare, run_sequence  # noqa: E402

DOC = REPO_ROOT / "docs" / "ftl-compat.md"


def _load(script: str):
    name = f"_ftl_compat_{script}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, LIB / f"{script}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def in_process(script: str, args: list[str], stdin: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``lib/<script>.py ARGS`` in this process: (exit code, stdout, stderr)."""
    module = _load(script)
    common = sys.modules["_common"]
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                common.run(module.cli, list(args))
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 0
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("ftl-compat")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FTL_OUTPUT", "ftl")
        patch.chdir(work)
        actual = run_sequence(in_process, work)
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))["steps"]
    return compare(actual, golden)


def test_every_step_equals_ftl_or_is_a_documented_difference(outcome) -> None:
    documented = json.loads(DIFFERENCES.read_text(encoding="utf-8"))["steps"]
    undocumented = [r["id"] for r in outcome if not r["equal"] and r["id"] not in documented]
    stale = [r["id"] for r in outcome if r["equal"] and r["id"] in documented]
    equal = sum(r["equal"] for r in outcome)
    print(f"\nFTL compat: {len(outcome)} calls compared, {equal} equal, "
          f"{len(outcome) - equal} documented differences")
    detail = {r["id"]: {"ftl": r["golden"], "ftl_rs": r["actual"]} for r in outcome
              if r["id"] in undocumented}
    assert not undocumented, json.dumps(detail, indent=1)[:6000]
    assert not stale, f"equal now, drop from differences.json: {stale}"


def test_every_documented_difference_names_a_section_of_the_doc() -> None:
    documented = json.loads(DIFFERENCES.read_text(encoding="utf-8"))
    text = DOC.read_text(encoding="utf-8")
    for step, reason in documented["steps"].items():
        assert reason in documented["reasons"], (step, reason)
    for reason in documented["reasons"]:
        assert f"`{reason}`" in text, f"docs/ftl-compat.md does not explain {reason}"
