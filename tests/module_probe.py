"""Import probes shared by the tests: run a script in a fresh interpreter and report the modules
it imported (the import-set guards of issue 11: light commands must not load heavy modules), and
read which sibling modules a package's module imports when it loads (the layout tests)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

_PROBE = """
import json, runpy, sys
report, sys.argv = sys.argv[1], sys.argv[2:]
code = 0
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as stop:
    code = stop.code
with open(report, "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def run_script(script: Path, *args: str, cwd: Path, stdin: str | None = None
               ) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run ``script ARGS`` in ``cwd``; return the process and ``{"code", "modules"}`` (its exit
    code and the sorted names in ``sys.modules`` at exit). Raises AssertionError with the
    script's stderr when it wrote no report."""
    report = cwd / "probe-modules.json"
    done = subprocess.run([sys.executable, "-c", _PROBE, str(report), str(script), *args], cwd=cwd,
                          input=stdin, capture_output=True, text=True, timeout=60)
    assert report.exists(), done.stderr[-2000:]
    return done, json.loads(report.read_text())


def sibling_imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` (e.g. ``"ftl.store"``) that the file ``path`` imports when it
    loads: module-level imports, including those under ``if``/``try`` (``TYPE_CHECKING`` blocks
    too), not those inside functions. Returns their names within the package."""
    prefix = package + "."
    depth = package.count(".") + 1
    found = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):
            body.extend(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
            found.add(node.module.split(".")[depth])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[depth] for alias in node.names
                         if alias.name.startswith(prefix))
    return found

