"""The context every embedded tool implementation receives, whatever transport carried the call.

A tool is a plain function ``tool(args: ArgsModel, ctx: ToolContext) -> dict``: the MangleCP
server framework validates the arguments against the tool's input schema, builds the context,
and turns the returned dict into the ``invoke_response`` result.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ftl.errors import FtlError


@dataclass
class ToolContext:
    """Per-invocation context.

    Attributes:
        repo: the repository the server works on (every relative path is resolved inside it).
        cancel: set when the client cancels the invocation or the server drains; long tools
            poll it and stop their subprocesses.
        progress: reports progress (``{"message": str, "percent": float | None}``); a no-op on
            transports without sessions.
        correlation_id: the request's correlation id, for server-side logs.
        output_limit_bytes: how much command output a tool keeps (tail), in bytes.
    """

    repo: Path
    cancel: threading.Event = field(default_factory=threading.Event)
    progress: Callable[[dict[str, Any]], None] = lambda update: None
    correlation_id: str = ""
    output_limit_bytes: int = 64 * 1024

    @property
    def store_path(self) -> Path:
        return self.repo / ".ftl" / "ftl.db"


def resolve_workdir(ctx: ToolContext, workdir: str | None, where: str) -> Path:
    """The folder a command runs in: ``ctx.repo``, or ``workdir`` (relative to it) when given.

    Args:
        workdir: a relative path inside the repository (a task's worktree), or None.
        where: the JSON path of the argument, for the error.

    Raises:
        FtlError(workspace_invalid): ``workdir`` is absolute, leaves the repository, or is not
            an existing folder (the path itself is not echoed back).
    """
    if not workdir:
        return ctx.repo
    relative = Path(workdir)
    root = _resolved(ctx.repo)
    # a "..", a "." or a symlink on the way: resolved whole
    target = None if relative.is_absolute() else (_below(root, relative.parts)
                                                  or (root / relative).resolve())
    if target is None or not target.is_relative_to(root) or not target.is_dir():
        raise FtlError("workspace_invalid", {"seq": "?", "issues": [
            f"{where} must name an existing folder inside the repository"]})
    return target


@functools.lru_cache(maxsize=64)
def _resolved(repo: Path) -> Path:
    """``repo`` with its symlinks resolved, once per path (every build and verify asks)."""
    return repo.resolve()


def _below(root: Path, parts: tuple[str, ...]) -> Path | None:
    """``root`` joined with ``parts`` when that already is the resolved path: no part is ``..``
    or ``.`` and none is a symlink (one ``lstat`` each, where resolving from ``/`` takes one per
    part of the whole path); None otherwise."""
    path = root
    for part in parts:
        if part in ("..", "."):
            return None
        path = path / part
        if os.path.islink(path):
            return None
    return path
