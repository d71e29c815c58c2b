"""The rooms of the ``ftl.store`` package stay visible: each module owns one concern, imports only
the siblings below it, and ``from ftl.store import name`` keeps working for every name ftl, its
scripts, tests, benchmarks and examples import (the package was one module, ``ftl/store.py``)."""

from __future__ import annotations

import ast
import graphlib
import json
import re
import subprocess
import sys
from pathlib import Path

from module_probe import sibling_imports

import ftl.store

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ftl" / "store"
PROJECT_DIRS = ("ftl", "states", "lib", "tests", "bench", "examples")
MAX_LINES = 500

# module -> the sibling modules it may import at module level (the package's order, lowest first)
ALLOWED = {
    "codec": set(), "schema": set(),
    "campaigns": {"codec"}, "plans": {"codec"}, "tasks": {"codec"}, "task_set": {"codec", "tasks"},
    "workspaces": {"codec"}, "explorations": {"codec"}, "memory_tables": {"codec"},
}


def _top_level_imports(path: Path) -> set[str]:
    """The ``ftl.store`` siblings ``path`` imports when it loads (not inside functions)."""
    return sibling_imports(path, "ftl.store")


def test_store_modules_import_downwards_without_a_circle() -> None:
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(ALLOWED), "place the new module in ALLOWED (tests/test_store_layout.py)"
    graph = {name: _top_level_imports(PACKAGE / f"{name}.py") for name in modules}
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle
    for name, allowed in ALLOWED.items():
        assert graph[name] <= allowed, f"ftl.store.{name} imports {sorted(graph[name] - allowed)}"


def test_each_module_says_what_it_owns_and_stays_small() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert ast.get_docstring(ast.parse(text)), f"{path.name} needs a module docstring"
        assert text.count("\n") <= MAX_LINES, f"{path.name} has {text.count(chr(10))} lines"


def _names_imported_from_store() -> dict[str, str]:
    """name -> where it is imported, for every ``from ftl.store import name`` in the project."""
    found: dict[str, str] = {}
    for folder in PROJECT_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(PACKAGE):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "ftl.store" and not node.level:
                    for alias in node.names:
                        found.setdefault(alias.name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_name_imported_from_the_store_is_still_there() -> None:
    names = _names_imported_from_store()
    assert {"Store", "TRANSITIONS", "_INSERT_BATCH"} <= set(names)  # the scan sees the imports
    missing = [f"{where} imports {name}" for name, where in names.items() if not hasattr(ftl.store, name)]
    assert missing == []


def test_importing_the_store_loads_neither_the_models_nor_logging() -> None:
    # TRANSITIONS is built on first use: the store alone never loads pydantic (tests/test_cold_start.py)
    probe = ("import json, sys; import ftl.store; before = sorted(sys.modules); ftl.store.TRANSITIONS; "
             "print(json.dumps([before, sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=True)
    before, after = (set(names) for names in json.loads(done.stdout))
    ftl_modules = {m for m in before if m == "ftl" or m.startswith("ftl.")}
    assert ftl_modules - {m for m in before if m.startswith("ftl.store")} == {"ftl", "ftl.dag", "ftl.errors"}
    assert not {"ftl.models", "pydantic", "logging"} & before
    assert "ftl.models" in after


# The store's private plumbing, which code outside the package once reached for (ftl/memory/store.py
# did, twenty times, when the memory room still held its own SQL).
_PRIVATE = {"_session", "_clock", "_now", "_conn", "_lock", "_translate", "_memory_ready"}


def test_no_room_outside_the_package_reaches_into_the_stores_private_plumbing() -> None:
    offenders = []
    for directory in ("ftl", "states", "lib"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            if PACKAGE in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Attribute) and node.attr in _PRIVATE
                        and "store" in ast.unparse(node.value).lower()):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert offenders == []


# Where SQL text outside the store is not the store's: path prefix -> why.
_NOT_THE_STORE = {
    "ftl/postmortem/": "the spool is a scratch SQLite database of its own, not the store's file",
    "ftl/sanitize.py": "a pattern that finds SQL in a message, to scrub it",
}
# SQL statements as they start.
_SQL = re.compile(r"\b(SELECT\b.+\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
                  r"|CREATE\s+(TEMP\s+)?(TABLE|INDEX|VIRTUAL\s+TABLE|TRIGGER)|PRAGMA\s+\w+)\b", re.S)


def test_the_store_is_the_only_package_that_writes_sql() -> None:
    # design.md §2: ftl/memory/ keeps the rules (scoring, ranking, walks) and calls the store
    offenders = []
    for directory in ("ftl", "states", "lib"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if PACKAGE in path.parents or any(where.startswith(p) for p in _NOT_THE_STORE):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
                    offenders.append(f"{where}:{node.lineno} {node.value[:60]!r}")
                elif isinstance(node, ast.Attribute) and node.attr in ("execute", "executemany", "cursor"):
                    offenders.append(f"{where}:{node.lineno} .{node.attr}")
    assert offenders == []


def test_the_sql_check_sees_a_statement() -> None:
    assert _SQL.search("SELECT id FROM memory_entry") and _SQL.search("INSERT OR IGNORE INTO t VALUES (1)")
    assert _SQL.search("UPDATE memory_entry SET x = 1") and _SQL.search("CREATE VIRTUAL TABLE f USING fts5(a)")
    assert not _SQL.search("Select the entries from memory") and not _SQL.search("update the set")
