"""FTL-compatible ``framework_registry.py``: the frameworks ftl recognises, their idioms, and
detection in a directory.

FTL framework_registry.py (enzokro/crinzo-plugins ``ftl/lib/framework_registry.py``, commit
89a2f8e): ``detect [PATH]``, ``idioms FRAMEWORK``, ``list``, ``weight FRAMEWORK``. The registry is
ftl's pattern explorer's (`ftl.server.tools.explorers.FRAMEWORKS`: more frameworks than FTL's
five, each with its own idiom texts) and detection is that explorer's (FTL's confidence tiers:
README "Framework Idioms" section 0.95, imported by most Python files 0.85, imported anywhere
0.75, plus 0.65 for a declared dependency). FTL's ``weight`` (a number its planner prompt
multiplied by) has no counterpart in ftl's planner, so ``weight`` is refused with that reason
and ``detect`` prints no ``complexity_weight`` (docs/ftl-compat.md, ``framework-registry``).
Output and exit codes: see ``lib/_common.py``.
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import Env, FtlRefusal, Reply, command, script_group, wrap

cli = script_group("framework_registry.py", "Frameworks, their idioms and detection (FTL framework_registry.py).")


def _framework(name: str):
    """The registry entry called ``name`` (or one of its aliases, any case), else None."""
    from ftl.server.tools.explorers import FRAMEWORKS

    wanted = name.strip().lower()
    return next((fw for fw in FRAMEWORKS if wanted in {fw.name, *(a.lower() for a in fw.aliases)}), None)


@command(cli, "list")
def list_(env: Env) -> Reply:
    """The frameworks of the registry, most specific first. data: {"items": [name]}."""
    from ftl.server.tools.explorers import FRAMEWORKS

    names = [fw.name for fw in FRAMEWORKS]
    return Reply(wrap(names), ftl=names, ftl_indent=None)


@command(cli, "idioms")
@click.argument("name", metavar="FRAMEWORK")
def idioms(env: Env, name: str) -> Reply:
    """The idioms builders follow for FRAMEWORK. data: {required: [str], forbidden: [str]}
    (both empty for a framework the registry does not know, as in FTL)."""
    fw = _framework(name)
    found = {"required": list(fw.required), "forbidden": list(fw.forbidden)} if fw else {"required": [], "forbidden": []}
    return Reply(found, ftl=found)


@command(cli, "detect")
@click.argument("path", type=click.Path(file_okay=False, path_type=Path), default=Path("."), required=False)
def detect(env: Env, path: Path) -> Reply:
    """The framework of the code under PATH (default: the current directory), by the pattern
    explorer's rules. data: {framework (name or "none"), confidence (0-1), source (the
    evidence, joined), frameworks: [{name, confidence, evidence, import_fraction}]}; FTL output
    without ``frameworks``. PATH not a directory -> NOT_FOUND.
    """
    from ftl.server.tools.context import ToolContext
    from ftl.server.tools.explorers import ExploreArgs, explore_pattern

    root = path if path.is_absolute() else Path.cwd() / path
    if not root.is_dir():
        raise FtlRefusal("not_found", {"what": f"directory {path.as_posix()}"},
                         message=f"{path.as_posix()} is not a directory; give the code's directory.",
                         ftl_stderr=f"Error: {path.as_posix()} is not a directory")
    found = explore_pattern(ExploreArgs(), ToolContext(repo=root.resolve()))
    ranked = found.get("frameworks") or []
    top = ranked[0] if ranked else None
    if top is None:
        source = "No Python files" if not found.get("python_files") else "No framework imports detected"
        result = {"framework": "none", "confidence": 0.0, "source": source}
    else:
        result = {"framework": top["name"], "confidence": top["confidence"], "source": "; ".join(top["evidence"])}
    return Reply({**result, "frameworks": ranked}, ftl=result)


@command(cli, "weight")
@click.argument("name", metavar="FRAMEWORK")
def weight(env: Env, name: str) -> Reply:
    """Refused: FTL's complexity weight fed its planner prompt's formula, which ftl's planner
    does not use. VALIDATION_ERROR (exit 2; FTL output: the message on stderr, exit 1)."""
    message = ("framework_registry.py weight is not provided: ftl's planner has no framework "
               "complexity weight; use idioms or detect.")
    raise FtlRefusal("schema_invalid", {"count": 1, "violations": [
        {"path": "COMMAND", "message": "weight is not provided", "fix": "use idioms or detect"}]},
        message=message, ftl_stderr=message)

