"""The rooms of ``ftl.manglecp`` stay visible: imports point one way, and ftl's own code imports
each name from the module that defines it, not through the re-exports of ``ftl.manglecp.server``
or ``ftl.manglecp.messages`` (those exist only for code written before those modules were split)."""

from __future__ import annotations

import ast
import graphlib
import importlib
from pathlib import Path

from module_probe import sibling_imports

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ftl" / "manglecp"
PROJECT_DIRS = ("ftl", "states", "lib", "tests", "bench", "examples")

# module -> the sibling modules it may import at module level (the lower rooms, wire layer first)
LOWER_ROOMS = {"messages": set(), "facts": {"messages"}, "definitions": {"messages", "facts"},
               "access": {"definitions", "messages"}, "render": {"definitions", "messages", "facts"}}
# split module -> the modules that now define the names it re-exports
REEXPORTS = {"server": ("definitions", "access", "render"), "messages": ("facts",)}


def _top_level_imports(path: Path) -> set[str]:
    """The ``ftl.manglecp`` siblings ``path`` imports when it loads (not inside functions)."""
    return sibling_imports(path, "ftl.manglecp")


def test_manglecp_modules_import_without_a_circle() -> None:
    graph = {path.stem: _top_level_imports(path) for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle
    for module, allowed in LOWER_ROOMS.items():
        assert graph[module] <= allowed, f"{module} imports {sorted(graph[module] - allowed)}"


def _defined_in(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _uses_of(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, name) for each name taken from ``ftl.manglecp.<module>``: ``from ... import name``,
    and ``alias.name`` after ``import ftl.manglecp.<module> as alias`` or
    ``from ftl.manglecp import <module>``."""
    full, uses, aliases = f"ftl.manglecp.{module}", [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == full:
            uses += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "ftl.manglecp":
            aliases.update(a.asname or a.name for a in node.names if a.name == module)
        elif isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == full and a.asname)
    return uses + [(node.lineno, node.attr) for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                   and node.value.id in aliases]


def test_project_code_imports_names_from_their_homes() -> None:
    misplaced = []
    for module, homes in REEXPORTS.items():
        own = _defined_in(PACKAGE / f"{module}.py")
        for folder in PROJECT_DIRS:
            for path in sorted((ROOT / folder).rglob("*.py")):
                text = path.read_text(encoding="utf-8")
                if "ftl.manglecp" not in text or module not in text or ".venv" in path.parts:
                    continue
                misplaced += [f"{path.relative_to(ROOT)}:{line} {name} (import it from one of {homes})"
                              for line, name in _uses_of(ast.parse(text), module) if name not in own]
    assert misplaced == []


def test_reexports_are_the_objects_of_their_homes() -> None:
    for module_name, home_names in REEXPORTS.items():
        module = importlib.import_module(f"ftl.manglecp.{module_name}")
        homes = {home: importlib.import_module(f"ftl.manglecp.{home}") for home in home_names}
        own = _defined_in(PACKAGE / f"{module_name}.py")
        for name in module.__all__:
            if name in own:
                continue
            defining = [home for home in homes if name in _defined_in(PACKAGE / f"{home}.py")]
            assert len(defining) == 1, f"{module_name}.{name} is re-exported but defined in {defining or 'no module'}"
            assert getattr(module, name) is getattr(homes[defining[0]], name)


def test_the_package_names_load_from_the_modules_that_define_them() -> None:
    package = importlib.import_module("ftl.manglecp")
    for name in package.__all__:
        home = package._HOME[name]
        assert name in _defined_in(PACKAGE / f"{home}.py"), f"ftl.manglecp.{name} is not defined in {home}.py"
        assert getattr(package, name) is getattr(importlib.import_module(f"ftl.manglecp.{home}"), name)
