"""The rooms of ``ftl.manglecp`` stay visible: imports point one way, and ftl's own code imports
each name from the module that defines it, not through ``ftl.manglecp.server``'s re-exports
(those exist only for code written before the server module was split)."""

from __future__ import annotations

import ast
import graphlib
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ftl" / "manglecp"
PROJECT_DIRS = ("ftl", "states", "lib", "tests", "bench", "examples")

# module -> the sibling modules it may import at module level (the server's parts sit below it)
LOWER_ROOMS = {"definitions": {"messages"}, "access": {"definitions", "messages"},
               "render": {"definitions", "messages"}}


def _top_level_imports(path: Path) -> set[str]:
    """The ``ftl.manglecp`` siblings ``path`` imports when it loads (not inside functions)."""
    found = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):  # e.g. `if TYPE_CHECKING:` blocks
            body.extend(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ftl.manglecp."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names
                         if alias.name.startswith("ftl.manglecp."))
    return found


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
    return names


def test_project_code_imports_server_names_from_their_homes() -> None:
    own = _defined_in(PACKAGE / "server.py")
    misplaced = []
    for folder in PROJECT_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "ftl.manglecp.server" not in text or ".venv" in path.parts:
                continue
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.module == "ftl.manglecp.server":
                    misplaced += [f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}"
                                  for alias in node.names if alias.name not in own]
    assert misplaced == [], "import these from ftl.manglecp.definitions / access / render"


def test_server_reexports_are_the_objects_of_their_homes() -> None:
    server = importlib.import_module("ftl.manglecp.server")
    homes = {home: importlib.import_module(f"ftl.manglecp.{home}") for home in LOWER_ROOMS}
    own = _defined_in(PACKAGE / "server.py")
    for name in server.__all__:
        if name in own:
            continue
        defining = [home for home in homes if name in _defined_in(PACKAGE / f"{home}.py")]
        assert len(defining) == 1, f"{name} is re-exported but defined in {defining or 'no module'}"
        assert getattr(server, name) is getattr(homes[defining[0]], name)
