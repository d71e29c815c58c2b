"""The file-scope rule: which changed paths a task was not allowed to touch (FTL builder rule
"only delta files", behaviour reference §7 and §8.3 item 7). Pure; used by the builders (changes
seen in the tree they ran in) and by the runner (the task commit's diff against its base)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

__all__ = ["out_of_scope", "normalize_path"]


def normalize_path(path: str) -> str:
    """``path`` with forward slashes and without leading ``./``."""
    path = path.replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path


def out_of_scope(changed: Iterable[str], allowed: Iterable[str], repo: Path | None = None,
                 exclude: Iterable[str] = ()) -> list[str]:
    """Changed paths a task was not allowed to touch.

    A path is in scope when it equals an allowed path (``delta`` + ``creates``) or lies under an
    allowed entry that is a directory (ends with ``/`` or is a directory in ``repo``). Paths under
    ``exclude`` (other running tasks' scopes) and under ``.ftl/`` are never charged.

    Returns:
        The out-of-scope paths, sorted.
    """
    files: set[str] = set()
    dirs: list[str] = []
    for entry in allowed:
        entry = normalize_path(entry)
        if entry.endswith("/") or (repo is not None and (repo / entry).is_dir()):
            dirs.append(entry.rstrip("/") + "/")
        else:
            files.add(entry)
    skipped = [".ftl/"]
    for entry in exclude:
        entry = normalize_path(entry)
        files.add(entry)
        skipped.append(entry.rstrip("/") + "/")
    return sorted(p for p in map(normalize_path, changed)
                  if p not in files and not any(p.startswith(d) for d in dirs + skipped))
