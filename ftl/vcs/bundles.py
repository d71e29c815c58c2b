"""Git bundles: a campaign's code carried to another machine and a task's result carried back.

A node of a cluster has no access to the driver's repository. What it needs is one file: a
bundle of the integration head (`head_bundle`), from which `checkout_from_bundle` makes a
private checkout at exactly that commit. A verified task's result comes back the same way: a
bundle holding only the task commit on top of its base (`commit_bundle`, a few KB for a small
change), fetched by the driver into the task's branch (`fetch_task_bundle`) and integrated as
in worktree mode (`ftl.vcs.worktrees`).

Bundles are bytes in memory (they travel through Ray's object store); a file exists only for
the duration of a git call, in a private temporary folder.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ftl.vcs.git import Git, GitError

__all__ = ["head_bundle", "checkout_from_bundle", "commit_bundle", "fetch_task_bundle",
           "BUNDLE_REF"]

#: The ref a bundle carries its commit under (one ref per bundle).
BUNDLE_REF = "refs/ftl/bundle"


def _with_file(data: bytes | None = None) -> tuple[Path, Path]:
    folder = Path(tempfile.mkdtemp(prefix="ftl-bundle-"))
    path = folder / "carry.bundle"
    if data is not None:
        path.write_bytes(data)
    return folder, path


def _cleanup(folder: Path) -> None:
    for entry in folder.iterdir():
        entry.unlink(missing_ok=True)
    folder.rmdir()


def head_bundle(repo: Path, commit: str) -> bytes:
    """A bundle of ``commit`` and its whole history, under `BUNDLE_REF`.

    Args:
        repo: the driver's repository.
        commit: a commit id (the integration head).

    Returns:
        The bundle's bytes.

    Raises:
        GitError: git failed (the commit does not exist, the disk is full).
    """
    git = Git(repo)
    folder, path = _with_file()
    try:
        # A bundle needs a ref: a private one, moved atomically and deleted after.
        ref = f"refs/ftl/carry/{os.getpid()}-{commit[:12]}"
        git.run("update-ref", ref, commit)
        try:
            git.run("bundle", "create", "-q", str(path), ref)
        finally:
            git.run("update-ref", "-d", ref)
        return path.read_bytes()
    finally:
        _cleanup(folder)


def checkout_from_bundle(bundle: bytes, dest: Path, commit: str) -> Git:
    """A new repository at ``dest`` (must not exist) checked out at ``commit`` from ``bundle``.

    Returns:
        A `Git` for the checkout.

    Raises:
        GitError: the bundle is damaged or does not hold ``commit``.
    """
    dest.mkdir(parents=True)
    git = Git(dest)
    folder, path = _with_file(bundle)
    try:
        git.run("init", "-q")
        git.run("fetch", "-q", "--no-tags", str(path), "+refs/*:refs/ftl/base/*")
        git.run("checkout", "-q", "--detach", commit)
        return git
    finally:
        _cleanup(folder)


def commit_bundle(checkout: Path, base: str, commit: str) -> bytes:
    """A bundle of the commits between ``base`` (excluded: the receiver has it) and ``commit``.

    Raises:
        GitError: git failed.
    """
    git = Git(checkout)
    git.run("update-ref", BUNDLE_REF, commit)
    folder, path = _with_file()
    try:
        if base == commit:
            raise GitError(["bundle"], None, "nothing to carry: the commit is its base")
        git.run("bundle", "create", "-q", str(path), BUNDLE_REF, f"^{base}")
        return path.read_bytes()
    finally:
        _cleanup(folder)


def fetch_task_bundle(repo: Path, bundle: bytes, branch: str, commit: str) -> str:
    """Fetch a task's result bundle into ``branch`` of the driver's repository.

    Args:
        repo: the driver's repository (it must have the bundle's base).
        bundle: `commit_bundle`'s bytes.
        branch: the task branch (``ftl/<campaign>/task/<seq>-<slug>``), created or moved.
        commit: the commit the bundle must carry (the node said so); checked.

    Returns:
        ``commit``.

    Raises:
        GitError: the bundle is damaged, needs a base the repository lacks, or carries another
            commit.
    """
    git = Git(repo)
    folder, path = _with_file(bundle)
    try:
        git.run("fetch", "-q", "--no-tags", str(path), f"+{BUNDLE_REF}:refs/heads/{branch}")
        got = git.out("rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}")
    finally:
        _cleanup(folder)
    if got != commit:
        raise GitError(["fetch"], None, f"the bundle carries {got[:12]}, not {commit[:12]}")
    return commit
