"""Git bundles: a campaign's code carried to another machine and a task's result carried back.

A node of a cluster has no access to the driver's repository. What it needs is the integration
head's history, sent as a chain of bundles (`head_bundle`: the first with the whole history, each
next with the commits since the one before) that the node keeps in a cache (`NodeCache`) and
from which each attempt gets a private checkout at exactly its base. A verified task's result
comes back the same way: a bundle holding only the task commit on top of its base
(`commit_bundle`, a few KB for a small change), fetched by the driver into the task's branch
(`fetch_task_bundle`) and integrated as in worktree mode (`ftl.vcs.worktrees`).

Bundles are bytes in memory (they travel through Ray's object store); a file exists only for
the duration of a git call, in a private temporary folder.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ftl.vcs.git import Git, GitError

__all__ = ["head_bundle", "NodeCache", "commit_bundle", "fetch_task_bundle", "BUNDLE_REF"]

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


def head_bundle(repo: Path, commit: str, since: str | None = None) -> bytes:
    """A bundle of ``commit`` under `BUNDLE_REF`: its whole history, or only what is not in
    ``since`` (an ancestor the receiver has: the previous head it was sent).

    Args:
        repo: the driver's repository.
        commit: a commit id (the integration head).
        since: None, or an ancestor of ``commit`` (the bundle then needs it to be fetched).

    Returns:
        The bundle's bytes.

    Raises:
        GitError: git failed (the commit does not exist, the disk is full).
    """
    git = Git(repo)
    folder, path = _with_file()
    try:
        # A bundle carries refs, not bare commits: ftl's own ref, set for the call and
        # deleted after (one driver per repository, one bundle at a time: the caller's lock).
        ref = BUNDLE_REF
        git.run("update-ref", ref, commit)
        try:
            git.run("bundle", "create", "-q", str(path), ref, *([f"^{since}"] if since else []))
        finally:
            git.run("update-ref", "-d", ref)
        return path.read_bytes()
    finally:
        _cleanup(folder)


class NodeCache:
    """A node's copy of a campaign's integration history, kept across attempts.

    The driver sends each head as a link of a chain: the first link holds the whole history,
    each next one only the commits since the link before (`head_bundle` with ``since``), so
    the driver's cost per head does not grow with the history. A node fetches only the links
    it lacks, into a bare repository under ``root`` that every worker of the node shares
    (fetches are serialised by a lock file); each attempt then gets a private checkout that
    borrows its objects (``git clone --shared``).

    Args:
        root: the node's cache folder for the campaign (e.g. ``<tmp>/ftl-ray-cache/<id>``).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = root / "history.git"
        self._lock = root / "fetch.lock"

    def ensure(self, chain: Sequence[tuple[str, Callable[[], bytes]]]) -> int:
        """Make the chain's last head present: fetch the links after the newest one here.

        Args:
            chain: ``(head, load)`` per link, oldest first; ``load()`` returns the link's
                bundle bytes (called only for the links fetched).

        Returns:
            How many links were fetched (0 when the last head was here already).

        Raises:
            GitError: a link is damaged or does not chain.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self._lock, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            try:
                return self._fetch(chain)
            except GitError:
                # A fetch killed midway (its worker died) can leave a lock file or a broken
                # pack: start the cache again from the chain's first link, once. (An attempt
                # of this machine whose checkout borrows the old objects then fails its git
                # step and is blocked; this path is for a broken cache, not a busy one.)
                shutil.rmtree(self.repo, ignore_errors=True)
                return self._fetch(chain)

    def _fetch(self, chain: Sequence[tuple[str, Callable[[], bytes]]]) -> int:
        git = Git(self.repo)
        if not (self.repo / "HEAD").exists():
            self.repo.mkdir(parents=True, exist_ok=True)
            git.run("init", "-q", "--bare")
        present = git.run("cat-file", "--batch-check", input="".join(
            f"{head}^{{commit}}\n" for head, _ in chain)).stdout.splitlines()
        have = [not line.endswith(" missing") for line in present]
        if have and have[-1]:
            return 0
        start = max((i + 1 for i, ok in enumerate(have) if ok), default=0)
        for head, load in chain[start:]:
            folder, path = _with_file(load())
            try:
                git.run("fetch", "-q", "--no-tags", str(path),
                        f"+{BUNDLE_REF}:refs/ftl/heads/{head}")
            finally:
                _cleanup(folder)
        return len(chain) - start

    def checkout(self, dest: Path, commit: str) -> Git:
        """A private checkout at ``commit`` in ``dest`` (must not exist), borrowing the cache's
        objects. Raises GitError."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        Git(dest.parent).run("clone", "-q", "--shared", "--no-checkout", str(self.repo), str(dest))
        git = Git(dest)
        git.run("checkout", "-q", "--detach", commit)
        return git


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
    incoming = f"refs/ftl/incoming/{branch}"
    try:
        # Into a private ref first: the branch moves only to a checked commit (and a leftover
        # worktree that has the branch checked out does not stop the fetch).
        git.run("fetch", "-q", "--no-tags", str(path), f"+{BUNDLE_REF}:{incoming}")
        got = git.out("rev-parse", "--verify", f"{incoming}^{{commit}}")
        if got != commit:
            raise GitError(["fetch"], None, f"the bundle carries {got[:12]}, not {commit[:12]}")
        git.run("update-ref", f"refs/heads/{branch}", commit)
    finally:
        _cleanup(folder)
        git.ok("update-ref", "-d", incoming)
    return commit
