"""A campaign's intent, on disk before anything slow: what `ftl campaign run` was asked to do.

The CLI writes ``.ftl/intents/<pid>-<ns>.json`` (objective, the plan files' content as read,
the options) as its first act, before importing the runner, validating the plan or booting the
tool server; the runner removes it once the campaign row holds the same inputs. A kill in
between leaves the intent, and `ftl campaign resume` starts the campaign from it (issue "crash
safety", item 2). Plain ``json`` and ``os`` only: this module is imported on the CLI's hot path.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["INTENTS_DIR", "write_intent", "discard_intent", "pending_intent"]

INTENTS_DIR = Path(".ftl") / "intents"


def write_intent(repo: Path, intent: dict[str, Any]) -> Path | None:
    """Write ``intent`` (JSON-serialisable) durably: a temporary file, fsync, rename.

    Returns:
        The intent file, or None when it could not be written (the run goes on without it).
    """
    folder = repo / INTENTS_DIR
    path = folder / f"{os.getpid()}-{time.time_ns()}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump({**intent, "pid": os.getpid()}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except (OSError, TypeError, ValueError):
        return None
    return path


def discard_intent(path: Path | None) -> None:
    """Remove an intent file (its campaign is recorded, or it was refused). Idempotent."""
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pending_intent(repo: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest intent whose writer is gone (killed before its campaign was recorded), or
    None. Unreadable files (a torn write cannot happen: they are renamed into place) are
    skipped."""
    folder = repo / INTENTS_DIR
    if not folder.is_dir():
        return None
    found: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stem.rsplit("-", 1)[-1].zfill(24)):
        try:
            intent = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        pid = intent.get("pid")
        if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
            continue  # its writer still runs (and holds the run lock, or will)
        found.append((path, intent))
    return found[-1] if found else None
