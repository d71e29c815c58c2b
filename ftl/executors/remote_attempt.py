"""One task attempt on a cluster node: check out the base, build, verify, commit, carry back.

This is the part of a task that travels (`ftl.executors.ray_cluster` runs it as one Ray task).
It needs only git, a shell and ftl's own modules on the node; it never touches the driver's
repository, store or event log. Everything that decides (retries, blocking, integration) stays
on the driver, which reads the returned dict.

The attempt is a generator: it yields its placement first (so the driver can say where the task
runs while it runs), then its result. Each attempt works in a fresh private checkout at its
base, made from the machine's cache of the campaign's history (`ftl.vcs.bundles.NodeCache`)
and removed at the end, so a retry never sees a failed try's files and two attempts never see
each other's (a worker killed mid-attempt leaves its checkout, ``<tmp>/ftl-<campaign_id>-*``).
The cache (``<tmp>/ftl-ray-cache/<campaign_id>``) stays for later attempts; `forget` removes
both at the campaign's end.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ftl.server.tools.proc import run_command
from ftl.vcs.bundles import NodeCache, commit_bundle
from ftl.vcs.scope import out_of_scope
from ftl.vcs.worktrees import TaskTree, Worktrees

__all__ = ["run_attempt", "placement", "cache_root", "forget", "OUTPUT_TAIL_BYTES"]

OUTPUT_TAIL_BYTES = 64 * 1024


def placement(node: str) -> dict[str, Any]:
    """Where this attempt runs: ``{"node": id, "worker": "pid N on HOST", "host": HOST}``."""
    host = socket.gethostname()
    return {"node": node, "worker": f"pid {os.getpid()} on {host}", "host": host}


def _command(command: str, cwd: Path, timeout_s: float, env: dict[str, str],
             limit: int) -> dict[str, Any]:
    result = run_command(command, cwd=cwd, timeout_s=timeout_s, env=env,
                         output_limit_bytes=limit)  # no ledger: dies with this worker
    return {"exit_code": result.exit_code, "output": result.output[-limit:],
            "timed_out": result.timed_out, "cancelled": result.cancelled,
            "duration_ms": result.duration_ms, "timeout_s": timeout_s}


def cache_root(campaign_id: str) -> Path:
    """This machine's cache of a campaign's history (shared by the nodes and workers on it)."""
    return Path(tempfile.gettempdir()) / "ftl-ray-cache" / campaign_id


def forget(campaign_id: str) -> int:
    """Remove a campaign's history cache and the attempt checkouts a killed worker left on
    this machine. Returns how many entries were removed."""
    root = Path(tempfile.gettempdir())
    removed = 0
    for entry in [cache_root(campaign_id), *root.glob(f"ftl-{campaign_id}-*")]:
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def run_attempt(request: dict[str, Any], chain: Sequence[tuple[str, Callable[[], bytes]]],
                node: str) -> Iterator[dict[str, Any]]:
    """Run one attempt of one task; yield `placement`, then the result.

    Args:
        request: what the driver sends: ``campaign_id``, ``seq``, ``slug``, ``name``
            (``<seq>-<slug>``), ``attempt`` (int), ``attempt_id`` (the driver's id of this
            try), ``base`` (commit id), ``run`` (shell command or None), ``verify`` (shell
            command), ``timeout_s`` / ``verify_timeout_s`` (s), ``delta`` / ``creates``
            (paths the task may change), ``spec`` (for the commit's Ftl-Spec trailer),
            ``env`` (extra environment), ``output_limit_bytes``, ``idioms`` and
            ``frameworks`` (checked on the changed files, `ftl.idioms`).
        chain: the bundle links ending at ``base`` (`ftl.vcs.bundles.NodeCache.ensure`).
        node: this node's id (12 hex characters).

    Yields:
        `placement`; then ``{"attempt_id", "node", "worker", "phase", "build", "verify",
        "files_changed", "out_of_scope", "violations", "commit", "bundle"}`` where ``phase``
        says how far it got: ``build`` (the build failed: ``build`` holds the command result),
        ``scope`` (files outside the delta), ``idioms`` (idiom violations), ``verify`` (the
        verify failed) or ``done`` (``commit`` and ``bundle`` carry the verified result).

    Raises:
        ftl.vcs.git.GitError: the bundle cannot be checked out or the commit not made (the
            driver classifies it); a kill of the worker surfaces on the driver as a lost worker.
    """
    where = placement(node)
    yield where
    limit = int(request.get("output_limit_bytes") or OUTPUT_TAIL_BYTES)
    result: dict[str, Any] = {"attempt_id": request["attempt_id"], **where, "phase": "build",
                              "build": None, "verify": None, "files_changed": [],
                              "out_of_scope": [], "violations": [], "commit": None,
                              "bundle": None}
    scratch = Path(tempfile.mkdtemp(prefix=f"ftl-{request['campaign_id']}-{request['name']}-"))
    try:
        checkout = scratch / "repo"
        cache = NodeCache(cache_root(request["campaign_id"]))
        cache.ensure(chain)
        cache.checkout(checkout, request["base"])
        env = {"FTL_WORKSPACE_ID": request["name"], "FTL_TASK_SEQ": request["seq"],
               "FTL_ATTEMPT": str(request["attempt"]), "FTL_CAMPAIGN_ID": request["campaign_id"],
               "FTL_NODE": node, **(request.get("env") or {})}
        if request.get("run"):
            build = _command(request["run"], checkout, float(request["timeout_s"]), env, limit)
            build["status"] = "complete" if build["exit_code"] == 0 and not build["timed_out"] \
                else "failed"
            build["delivered"] = f"ran: {request['run']}" if build["status"] == "complete" else ""
        else:
            build = {"status": "complete", "delivered": "nothing to run", "exit_code": 0,
                     "output": "", "timed_out": False, "cancelled": False, "duration_ms": 0}
        result["build"] = build
        if build["status"] != "complete":
            yield result
            return
        trees = Worktrees(checkout, request["campaign_id"])
        tree = TaskTree(name=request["name"], path=checkout, workdir=".",
                        branch="", base=request["base"])
        changed = trees.stage(tree)
        result["files_changed"] = changed
        result["out_of_scope"] = out_of_scope(changed, [*request.get("delta", []),
                                                        *request.get("creates", [])], checkout)
        if result["out_of_scope"]:
            result["phase"] = "scope"
            yield result
            return
        if request.get("idioms") or request.get("frameworks"):
            from ftl.idioms import check_idioms

            own = set(request.get("delta", [])) | set(request.get("creates", []))
            violations = check_idioms(checkout, [p for p in changed if p in own],
                                      request.get("idioms"), request.get("frameworks"))
            if violations:
                result.update(phase="idioms", violations=violations)
                yield result
                return
        result["phase"] = "verify"
        verify = _command(request["verify"], checkout, float(request["verify_timeout_s"]), env,
                          limit)
        verify["passed"] = verify["exit_code"] == 0 and not verify["timed_out"]
        result["verify"] = verify
        if not verify["passed"]:
            yield result
            return
        made = trees.commit(tree, seq=request["seq"], slug=request["slug"],
                            attempt=int(request["attempt"]), spec=request["spec"])
        result.update(phase="done", commit=made.commit,
                      bundle=commit_bundle(checkout, request["base"], made.commit))
        yield result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
