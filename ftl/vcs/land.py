"""Taking a campaign's result: land its integration branch on the user's branch, clean leftovers.

`land` is the only place ftl moves a user's branch, and it refuses rather than risk anything:
uncommitted changes to tracked files in the checkout that holds the target, or a merge that
conflicts, leave every branch and file as they were (the merge is aborted) and raise a
``conflict`` naming the paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftl.errors import FtlError
from ftl.vcs.git import Git, GitError
from ftl.vcs.worktrees import WORKTREES_DIR, Worktrees, integration_branch

__all__ = ["Landing", "land", "clean"]


@dataclass(frozen=True)
class Landing:
    """What `land` did.

    Attributes:
        target: the branch that received the campaign's work.
        source: the integration branch.
        previous: the target's commit before; ``head``: after.
        how: ``fast-forward``, ``merge`` or ``up-to-date``.
    """

    target: str
    source: str
    previous: str
    head: str
    how: str

    def to_json(self) -> dict[str, str]:
        return {"target": self.target, "source": self.source, "previous": self.previous,
                "head": self.head, "how": self.how}


def _checked_out_at(git: Git, branch: str) -> Path | None:
    """The worktree that has ``branch`` checked out, if any (``git worktree list``)."""
    path: Path | None = None
    for line in git.out("worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            path = Path(line[len("worktree "):])
        elif line == f"branch refs/heads/{branch}":
            return path
    return None


def land(repo: Path, campaign_id: str, into: str | None = None) -> Landing:
    """Merge campaign ``campaign_id``'s integration branch into ``into`` (default: the branch
    checked out in ``repo``): a fast-forward when possible, else a merge commit.

    Raises:
        FtlError(not_found): the campaign has no integration branch, or ``into`` does not exist.
        FtlError(conflict): ``HEAD`` is detached and no ``into`` was given; the checkout holding
            the target has uncommitted changes to tracked files; the merge conflicts (its
            paths are named; nothing changed).
    """
    git = Git(repo)
    source = integration_branch(campaign_id)
    try:
        source_head = git.out("rev-parse", "--verify", "-q", f"refs/heads/{source}")
    except GitError:
        raise FtlError("not_found", {"what": f"integration branch {source}"}) from None
    if into is None:
        try:
            into = git.out("symbolic-ref", "--short", "-q", "HEAD")
        except GitError:
            raise FtlError("conflict", {"what": "HEAD is detached; name the branch to land on "
                                                "with --into BRANCH"}) from None
    try:
        previous = git.out("rev-parse", "--verify", "-q", f"refs/heads/{into}")
    except GitError:
        raise FtlError("not_found", {"what": f"branch {into}"}) from None
    if git.ok("merge-base", "--is-ancestor", source_head, previous):
        return Landing(into, source, previous, previous, "up-to-date")
    checkout = _checked_out_at(git, into)
    if checkout is not None:
        return _land_in_checkout(Git(checkout), into, source, previous)
    return _land_on_ref(git, into, source, source_head, previous)


def _land_in_checkout(git: Git, into: str, source: str, previous: str) -> Landing:
    dirty = [line[3:] for line in git.out("status", "--porcelain", "--untracked-files=no").splitlines()
             if line.strip()]
    if dirty:
        raise FtlError("conflict", {"what": f"branch {into} has uncommitted changes "
                                            f"({', '.join(dirty[:5])}); commit or stash them, "
                                            "then land again"})
    if git.ok("merge-base", "--is-ancestor", previous, source):
        git.run("merge", "-q", "--ff-only", source)
        return Landing(into, source, previous, git.out("rev-parse", "HEAD"), "fast-forward")
    try:
        git.run("merge", "-q", "--no-ff", "--no-edit", "-m", f"Land {source}", source)
    except GitError:
        paths = git.out("diff", "--name-only", "--diff-filter=U").splitlines()
        git.run("merge", "--abort", ok_codes=(0, 128))
        raise FtlError("conflict", {"what": f"landing {source} on {into} conflicts in "
                                            f"{', '.join(paths[:10]) or 'the work tree'}; nothing "
                                            "was changed; merge it by hand (git merge "
                                            f"{source})"}) from None
    return Landing(into, source, previous, git.out("rev-parse", "HEAD"), "merge")


def _land_on_ref(git: Git, into: str, source: str, source_head: str, previous: str) -> Landing:
    if git.ok("merge-base", "--is-ancestor", previous, source_head):
        git.run("update-ref", f"refs/heads/{into}", source_head, previous)
        return Landing(into, source, previous, source_head, "fast-forward")
    merged = git.run("merge-tree", "--write-tree", "--name-only", "--no-messages", "-z",
                     previous, source_head, ok_codes=(0, 1))
    tree, *rest = merged.stdout.split("\0")
    if merged.returncode == 1:
        paths = sorted({path for path in rest if path})
        raise FtlError("conflict", {"what": f"landing {source} on {into} conflicts in "
                                            f"{', '.join(paths[:10])}; nothing was changed"})
    new = git.out("commit-tree", tree.strip(), "-p", previous, "-p", source_head,
                  "-m", f"Land {source}")
    git.run("update-ref", f"refs/heads/{into}", new, previous)
    return Landing(into, source, previous, new, "merge")


def clean(repo: Path, campaign_ids: list[str], keep_worktrees_of: str | None = None
          ) -> dict[str, list[str]]:
    """Remove the worktrees under ``.ftl/worktrees`` (left by a crash, or by any campaign) and
    the task branches of ``campaign_ids`` whose work is integrated.

    Args:
        campaign_ids: campaigns whose task branches are tidied.
        keep_worktrees_of: a campaign (the active one) whose worktrees stay.

    Returns:
        ``{"removed": [worktree names], "kept_branches": [task branches whose commits were
        never integrated]}``.
    """
    git = Git(repo)
    owners: dict[str, str] = {}  # worktree folder -> the branch checked out there
    path: str | None = None
    try:
        listing = git.out("worktree", "list", "--porcelain").splitlines()
    except GitError:  # not a git work tree: there are no worktrees to clean
        return {"removed": [], "kept_branches": []}
    for line in listing:
        if line.startswith("worktree "):
            path = line[len("worktree "):]
        elif line.startswith("branch ") and path is not None:
            owners[Path(path).name] = line[len("branch refs/heads/"):]
    root = repo / WORKTREES_DIR
    names = sorted(entry.name for entry in root.iterdir() if entry.is_dir()) if root.is_dir() else []
    keep_prefix = f"ftl/{keep_worktrees_of}/" if keep_worktrees_of else None
    removed = [name for name in names
               if not (keep_prefix and owners.get(name, "").startswith(keep_prefix))]
    for name in removed:
        Worktrees(repo, keep_worktrees_of or "-").remove(name)
    kept: list[str] = []
    for campaign_id in campaign_ids:
        if campaign_id != keep_worktrees_of:
            kept += Worktrees(repo, campaign_id).finish()
    return {"removed": removed, "kept_branches": kept}
