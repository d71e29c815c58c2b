"""Tests for lib/framework_registry.py and lib/logging_config.py, FTL scripts over ftl's own
framework registry and operator log (subprocesses, envelope and FTL output modes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LIB = Path(__file__).resolve().parent.parent / "lib"


def run(repo: Path, script: str, *args: str, ftl: bool = False) -> tuple[int, str, str]:
    mode = ["--output", "ftl"] if ftl else []
    proc = subprocess.run([sys.executable, str(LIB / f"{script}.py"), "--repo", str(repo), *mode, *args],
                          capture_output=True, text=True, cwd=repo, timeout=60)
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def test_registry_lists_idioms_and_detects_from_imports(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("from fastapi import FastAPI\napp = FastAPI()\n")
    (tmp_path / "app" / "util.py").write_text("import os\n")
    code, out, _ = run(tmp_path, "framework_registry", "list", ftl=True)
    assert code == 0 and {"fastapi", "flask", "django"} <= set(json.loads(out))
    fastapi = json.loads(run(tmp_path, "framework_registry", "idioms", "FastAPI", ftl=True)[1])
    assert fastapi["required"] and fastapi["forbidden"]
    assert json.loads(run(tmp_path, "framework_registry", "idioms", "cobol", ftl=True)[1]) == {
        "required": [], "forbidden": []}
    detected = json.loads(run(tmp_path, "framework_registry", "detect", "app", ftl=True)[1])
    # one of two files imports it: FTL's "imported anywhere" tier
    assert detected == {"framework": "fastapi", "confidence": 0.75, "source": "imported by 1 of 2 Python files"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert json.loads(run(tmp_path, "framework_registry", "detect", "empty", ftl=True)[1])["framework"] == "none"


def test_registry_refuses_weight_and_missing_directories(tmp_path: Path) -> None:
    code, out, err = run(tmp_path, "framework_registry", "weight", "fastapi")
    envelope = json.loads(out)
    assert code == 2 and envelope["data"]["error_code"] == "VALIDATION_ERROR" and "planner" in envelope["error"]
    code, out, err = run(tmp_path, "framework_registry", "detect", "nowhere", ftl=True)
    assert (code, out) == (1, "") and "not a directory" in err


def test_logging_config_tails_clears_and_writes_the_operator_log(tmp_path: Path) -> None:
    assert run(tmp_path, "logging_config", "tail", ftl=True)[:2] == (0, "")
    assert run(tmp_path, "logging_config", "test", ftl=True)[1] == "Test entries written to log\n"
    lines = run(tmp_path, "logging_config", "tail", "-n", "2", ftl=True)[1].splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["Warning message", "Error message"]
    data = json.loads(run(tmp_path, "logging_config", "tail", "-n", "9")[1])["data"]
    assert len(data["lines"]) == 4  # debug, info, warning, error
    assert run(tmp_path, "logging_config", "clear", ftl=True)[1] == "Log cleared\n"
    assert (tmp_path / ".ftl" / "ftl.log").read_text() == ""
