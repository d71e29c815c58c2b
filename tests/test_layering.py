"""ftl's rooms import downwards only (design.md §2, "Dependencies point downwards").

Every module under ftl/, states/ (installed as ``ftl.states``) and lib/ is read with ``ast``;
nothing is imported. An import counts wherever it stands (module level or inside a function)
and so does ``importlib.import_module("literal")``; imports under ``if TYPE_CHECKING:`` do not,
since they never run (the usual way to name a type from a higher room in an annotation).

A room is a package folder of ftl (``ftl/engine/`` -> ``engine``), ``states/`` (part of the
engine), ``lib/``, or the ground floor: the modules directly in ftl/. A new room must be placed
in `LAYERS` before the test passes.
"""

from __future__ import annotations

import ast
import graphlib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUND = "ground"

# Top to bottom. A module may import its own room and the rooms of any later layer; rooms that
# share a layer are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("lib",),             # FTL-compatible scripts: thin front ends over ftl/
    ("surfaces",),        # cli, clickutil, mcp_server; envelope, jsonrpc, errors_doc
    ("postmortem",),      # replay and diagrams: read event logs and the machine's transitions
    ("engine",),          # runner, machine + states, scheduler, recovery, replan, tools, ...
    ("executors",),       # where task attempts run: local threads, a Ray cluster
    ("server",),          # ftl's embedded MangleCP server and its tools
    ("manglecp", "vcs"),  # the protocol; the only room that runs git
    ("gate", "memory"),   # the four gates; cross-campaign memory
    ("telemetry",),       # logs, metrics, progress views
    ("store",),           # the SQLite store: campaigns, plans, tasks, workspaces, explorations
    (GROUND,),            # models, errors, config, dag, events, sanitize, ...
)
RANK = {room: depth for depth, layer in enumerate(LAYERS) for room in layer}

# Front doors: modules that nothing imports (a console script, `python -m`, or the CLI's lazy
# command table loads them by name), ranked with the surfaces whatever folder files them.
ENTRY_POINTS = {
    "ftl.__main__": "surfaces",  # `python -m ftl` runs the CLI
    "ftl.schemas": "surfaces",   # `python -m ftl.schemas` writes schemas/ from every published model
    # `ftl replay` / `ftl diagram`: filed with the postmortem they drive (replay, spool, HTML and
    # their CLI in one room), loaded by `ftl.surfaces.cli`'s lazy command table
    "ftl.postmortem.cli": "surfaces",
}

# Upward imports that exist today, each with why and the fix. The test fails when one of them
# disappears, so the list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "states":
        parts.insert(0, "ftl")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _room(module: str) -> str | None:
    """The room of a dotted module name; None for what is not ftl's (stdlib, third party)."""
    if module in ENTRY_POINTS:
        return ENTRY_POINTS[module]
    parts = module.split(".")
    if parts[0] == "lib":
        return "lib"
    if parts[0] != "ftl":
        return None
    if len(parts) == 1:
        return GROUND
    if parts[1] == "states":
        return "engine"
    return parts[1] if (ROOT / "ftl" / parts[1]).is_dir() else GROUND


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, dotted target) of every ftl or lib import in ``path`` that runs, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from ftl import dag` names a module; `from ftl.dag import x` names the module itself
            found += [(node.lineno, f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base)
                      for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            found.append((node.lineno, node.args[0].value))
        pending.extend(ast.iter_child_nodes(node))
    return [(line, target) for line, target in found if _room(target) is not None]


@cache
def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[:2] == ["ftl", "states"]:
        parts = parts[1:]
    elif parts[0] != "ftl" and parts[0] != "lib":
        return False
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@cache
def _edges() -> tuple[tuple[str, int, str, str], ...]:
    """(path, line, importer module, imported module) for every import between two of ftl's modules."""
    edges = []
    for folder in ("ftl", "states", "lib"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = _module_name(path)
            edges += sorted({(str(path.relative_to(ROOT)), line, module, target)
                             for line, target in _imports(path, module)})
    return tuple(edges)


def _crosses_upwards(importer: str, imported: str) -> bool:
    source, target = _room(importer), _room(imported)
    return source != target and RANK[target] <= RANK[source]


def _known(importer: str, imported: str) -> bool:
    return any(importer == a and (imported == b or imported.startswith(b + ".")) for a, b in KNOWN_UPWARD)


def test_every_room_is_placed_in_the_layers() -> None:
    rooms = {_room(_module_name(path)) for folder in ("ftl", "states", "lib")
             for path in (ROOT / folder).rglob("*.py")}
    assert rooms - set(RANK) == set(), "place the new room in LAYERS (tests/test_layering.py)"


def test_imports_point_downwards() -> None:
    upward = [f"{path}:{line} {importer} imports {imported} "
              f"({_room(importer)} may not import {_room(imported)})"
              for path, line, importer, imported in _edges()
              if _crosses_upwards(importer, imported) and not _known(importer, imported)]
    assert upward == [], "\n".join(upward)


def test_known_upward_imports_are_still_there() -> None:
    present = {(a, b) for a, b in KNOWN_UPWARD for _, _, importer, imported in _edges()
               if importer == a and (imported == b or imported.startswith(b + "."))}
    assert set(KNOWN_UPWARD) - present == set(), "fixed: remove these from KNOWN_UPWARD"
    assert all(_crosses_upwards(a, b) for a, b in KNOWN_UPWARD), "not upward: remove from KNOWN_UPWARD"


def test_rooms_import_without_a_circle() -> None:
    graph: dict[str, set[str]] = {room: set() for room in RANK}
    for _, _, importer, imported in _edges():
        if _room(importer) != _room(imported) and not _known(importer, imported):
            graph[_room(importer)].add(_room(imported))
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle


def test_nothing_imports_a_front_door() -> None:
    # what makes a front door's rank safe: no module depends on it, so it cannot close a circle
    found = [f"{path}:{line} {importer} imports {imported}" for path, line, importer, imported in _edges()
             if imported in ENTRY_POINTS and importer != imported]
    assert found == [], "\n".join(found)


def test_ground_floor_imports_only_the_ground_floor() -> None:
    # the rule the layers imply, stated on its own so its failure names the ground floor
    above = [f"{path}:{line} {importer} imports {imported}"
             for path, line, importer, imported in _edges()
             if _room(importer) == GROUND and _room(imported) != GROUND and not _known(importer, imported)]
    assert above == [], "\n".join(above)


def test_the_scan_sees_imports_at_any_depth_but_not_for_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import json\n"
        "from typing import TYPE_CHECKING\n"
        "from ftl import dag\n"
        "if TYPE_CHECKING:\n"
        "    from ftl.engine.runner import Runner\n"
        "def later():\n"
        "    from ftl.surfaces.cli import main\n"
        "    return importlib.import_module('ftl.postmortem.replay')\n"
        "from . import status\n", encoding="utf-8")
    assert sorted(target for _, target in _imports(source, "ftl.engine.probe")) == [
        "ftl.dag", "ftl.engine.status", "ftl.postmortem.replay", "ftl.surfaces.cli"]
