"""A git worktree per task, a task's result as a commit, and one integration branch per campaign.

Names (git refs are paths, so a branch ``ftl/<id>`` could not sit beside ``ftl/<id>/...``):

* integration branch ``ftl/<campaign_id>/integration``: created at the user's ``HEAD`` when the
  campaign's first isolated task starts; every verified task commit is integrated into it, one
  at a time, in completion order. It is the campaign's truth for code; the user's branch moves
  only on `land`.
* task branch ``ftl/<campaign_id>/task/<seq>-<slug>``, checked out in the worktree
  ``.ftl/worktrees/<seq>-<slug>``, or in an earlier task's worktree once that task is integrated
  (`Worktrees.release`: a reset writes only the files that differ, a new worktree every file),
  reset to the integration head for each fresh attempt, so a task sees exactly its
  dependencies' results (they were integrated before it became ready) plus its own changes.
  The workspace row records where an attempt ran (``workdir``).
* a task commit carries trailers (``Ftl-Campaign``, ``Ftl-Task``, ``Ftl-Attempt``,
  ``Ftl-Spec``): resume asks git "is this task's commit there, and is it integrated?" before it
  acts, so a crash at any point neither loses nor double-integrates a result.

Integration never checks anything out: ``git merge-tree --write-tree`` (git >= 2.38) computes the
merged tree, ``git commit-tree`` records it, and ``git update-ref NEW OLD`` moves the branch only
if nobody moved it meanwhile. Most of these steps run in process through libgit2
(`ftl.vcs.libgit`) where it answers as git would; git itself runs everywhere else. A task whose base is still the head is fast-forwarded (linear
history); a conflict moves nothing and raises `MergeConflict` with the paths and the tasks
whose integrated commits touched them (never file contents).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ftl.vcs import libgit
from ftl.vcs.git import Git, GitError

__all__ = ["Worktrees", "TaskTree", "TaskCommit", "Integration", "MergeConflict", "Probe",
           "probe", "spec_digest", "integration_branch", "task_branch", "WORKTREES_DIR",
           "MIN_GIT"]

WORKTREES_DIR = Path(".ftl") / "worktrees"
POOL_SIZE = 8  # idle worktrees kept for reuse (`Worktrees.release`)
MIN_GIT = (2, 38)  # git merge-tree --write-tree
_TRAILER_KEYS = ("Ftl-Campaign", "Ftl-Task", "Ftl-Slug", "Ftl-Attempt", "Ftl-Spec")
_SPEC_KEYS = ("run", "verify", "delta", "creates", "builder")


def integration_branch(campaign_id: str) -> str:
    return f"ftl/{campaign_id}/integration"


def task_branch(campaign_id: str, name: str) -> str:
    return f"ftl/{campaign_id}/task/{name}"


def spec_digest(spec: dict[str, Any]) -> str:
    """12 hex digits naming what a task does (run, verify, delta, creates, builder): a commit
    made for another version of the task (a re-plan changed it) is not this task's result."""
    data = json.dumps({key: spec.get(key) for key in _SPEC_KEYS}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Probe:
    """Whether worktree isolation can work in a directory.

    Attributes:
        available: a git work tree whose top level is the directory, with a commit, git >= 2.38.
        reason: why not (one line for the user), "" when available.
        head: the commit ``HEAD`` names, when there is one.
        dirty: count of tracked files with uncommitted changes (worktree tasks do not see them).
    """

    available: bool
    reason: str = ""
    head: str | None = None
    dirty: int = 0


def probe(repo: Path) -> Probe:
    """Can ``repo`` run tasks in worktrees? Never raises."""
    git = Git(repo)
    try:
        version = git.out("version")
    except GitError:
        return Probe(False, "git is not installed")
    found = re.search(r"(\d+)\.(\d+)", version)
    if not found or (int(found[1]), int(found[2])) < MIN_GIT:
        return Probe(False, f"git {'.'.join(map(str, MIN_GIT))} or newer is needed for worktree "
                            "isolation")
    try:
        if git.out("rev-parse", "--is-inside-work-tree") != "true":
            return Probe(False, "the repository is not a git work tree")
        if git.out("rev-parse", "--show-prefix"):
            return Probe(False, "the repository folder is not the top level of its git work tree")
    except GitError:
        return Probe(False, "the repository is not a git work tree")
    try:
        head = git.out("rev-parse", "--verify", "-q", "HEAD^{commit}")
    except GitError:
        return Probe(False, "the git repository has no commit yet")
    try:
        dirty = len([line for line in git.out("status", "--porcelain", "--untracked-files=no")
                     .splitlines() if line.strip()])
    except GitError:
        dirty = 0
    return Probe(True, head=head, dirty=dirty)


@dataclass(frozen=True)
class TaskTree:
    """A task's worktree for one attempt.

    Attributes:
        name: ``<seq>-<slug>`` (the workspace id).
        path: absolute path of the worktree.
        workdir: the same, relative to the repository (what tools receive).
        branch: the task branch checked out there.
        base: the commit the attempt started from (an integration head).
    """

    name: str
    path: Path
    workdir: str
    branch: str
    base: str


@dataclass(frozen=True)
class TaskCommit:
    """A task's result: ``commit`` on top of ``base``, with its ftl trailers."""

    commit: str
    base: str
    trailers: dict[str, str] = field(default_factory=dict)

    @property
    def attempt(self) -> str:
        return self.trailers.get("Ftl-Attempt", "")


@dataclass(frozen=True)
class Integration:
    """The integration of one task commit.

    Attributes:
        head: the integration branch's head afterwards.
        previous: its head before.
        fast_forward: the task's base was the head, so the head moved to the task commit.
        already: the commit was integrated before (nothing moved; resume after a crash).
    """

    head: str
    previous: str
    fast_forward: bool = False
    already: bool = False


class MergeConflict(Exception):
    """A task commit does not merge cleanly into the integration head.

    Attributes:
        paths: the conflicting paths (relative to the repository), sorted.
        other_seqs: seqs of the integrated tasks whose commits touched those paths since the
            task's base, in integration order (may be empty for a change made outside ftl).
    """

    def __init__(self, paths: list[str], other_seqs: list[str]) -> None:
        self.paths = paths
        self.other_seqs = other_seqs
        super().__init__(f"conflict in {', '.join(paths[:5])} with task(s) {', '.join(other_seqs)}")


class Worktrees:
    """Worktrees, task commits and the integration branch of one campaign in one repository.

    Thread-safe: tasks prepare, commit and integrate from the scheduler's worker threads.
    Worktree creation and removal and branch moves are serialised (they share git's ref and
    worktree bookkeeping); builds and commits in different worktrees run in parallel;
    integration is one at a time (``integrate``'s lock), in completion order.

    Args:
        repo: the repository (top level of its git work tree; see `probe`).
        campaign_id: the campaign.

    Every method raises GitError when git fails in a way the method does not describe.
    """

    def __init__(self, repo: Path, campaign_id: str) -> None:
        self.repo = repo.resolve()
        self.campaign_id = campaign_id
        self.git = Git(self.repo)
        self.integration = integration_branch(campaign_id)
        self._refs_lock = threading.Lock()
        self._integration_lock = threading.Lock()
        # The integration head as last read or moved here: one driver per repository (the run
        # lock) moves it, so the git call that would read it again is saved.
        self._head: str | None = None
        # Worktrees of integrated tasks, kept for the next tasks (`release`, `prepare`): resetting
        # one writes only the files that differ; adding one writes every file (a 5,000-file
        # repository: seconds per task on a slow disk).
        self._idle: list[Path] = []
        # Worktrees a task holds now (`prepare`, `reuse` until `release`/`remove_path`): a
        # folder taken from the pool stands at another task's path, which `remove` must spare.
        self._busy: dict[Path, str] = {}  # folder -> the task name holding it
        libgit.load()  # before the tasks start, not inside the first one's git call

    # --- the integration branch ---
    def ensure_integration(self) -> str:
        """The integration head; the branch is created at ``HEAD`` when it does not exist yet."""
        with self._refs_lock:
            if self._head is not None:
                return self._head
            found = libgit.ensure_branch(self.repo, self.integration)
            if found is not None:
                self._head = found
                return found
            existing = self._resolve(self.integration)
            if existing:
                self._head = existing
                return existing
            head = self.git.out("rev-parse", "--verify", "HEAD^{commit}")
            self.git.run("branch", "--no-track", self.integration, head)
            self._head = head
            return head

    def head(self) -> str | None:
        """The integration head, or None before the branch exists (read from git)."""
        return self._resolve(self.integration)

    def is_integrated(self, commit: str) -> bool:
        head = self.head()
        return head is not None and self.git.ok("merge-base", "--is-ancestor", commit, head)

    # --- task worktrees ---
    def path_of(self, name: str) -> Path:
        return self.repo / WORKTREES_DIR / name

    def prepare(self, name: str, base: str | None = None) -> TaskTree:
        """A clean worktree for task ``name`` at ``base`` (default: the integration head).

        An existing worktree of the same name is reset (``checkout --force -B``, ``clean -ffdx``:
        untracked and ignored files of an earlier attempt go too); a leftover folder that is no
        longer a worktree is removed first. The task holds it until `release` or `remove_path`.
        """
        tree = self._prepare(name, base or self.ensure_integration())
        with self._refs_lock:
            self._busy[tree.path] = name
        return tree

    def _prepare(self, name: str, base: str) -> TaskTree:
        branch = task_branch(self.campaign_id, name)
        path = self.path_of(name)
        with self._refs_lock:
            if path in self._idle:  # released by this task (a re-run): no other task may take it
                self._idle.remove(path)
            if path.exists() and not (path / ".git").is_file():
                shutil.rmtree(path)
            if path.exists() and not self._reset(path, branch, base):
                self._remove_locked(path)  # a broken worktree: start over
            while not path.exists() and self._idle:  # an integrated task's worktree, reset
                idle = self._idle.pop()
                if self._reset(idle, branch, base):
                    return self._tree(name, idle, base)
                self._remove_locked(idle)
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                if libgit.add_worktree(self.repo, name=name, path=path, branch=branch, base=base):
                    return self._tree(name, path, base)
                try:
                    self.git.run("worktree", "add", "-q", "--force", "-B", branch, str(path), base)
                except GitError:  # git still lists a worktree there that is gone: prune, retry
                    self.git.run("worktree", "prune")
                    # After a crash the branch may sit in an earlier task's released folder
                    # (git will not move a branch checked out elsewhere): that folder is ours.
                    held = self._holding(branch)
                    if held is not None and self._reset(held, branch, base):
                        return self._tree(name, held, base)
                    self.git.run("worktree", "add", "-q", "--force", "-B", branch, str(path), base)
        return self._tree(name, path, base)

    def renew(self, tree: TaskTree, base: str | None = None) -> TaskTree:
        """``tree``'s folder again, reset to ``base`` (default: the integration head) for a
        re-run of its task (a merge conflict's second round): the task keeps the folder it
        holds, so no other task can be given it between a release and a prepare."""
        base = base or self.ensure_integration()
        with self._refs_lock:
            if self._busy.get(tree.path) == tree.name and self._reset(tree.path, tree.branch, base):
                return self._tree(tree.name, tree.path, base)
        self.release(tree)
        return self.prepare(tree.name, base)

    def _holding(self, branch: str, *, anywhere: bool = False) -> Path | None:
        """The worktree of ours (under `WORKTREES_DIR`; any work tree of the repository with
        ``anywhere``) that has ``branch`` checked out.

        Raises: GitError: ``git worktree list`` failed."""
        ours = (self.repo / WORKTREES_DIR).resolve()
        where: Path | None = None
        for line in self.git.out("worktree", "list", "--porcelain").splitlines():
            if line.startswith("worktree "):
                where = Path(line[len("worktree "):]).resolve()
            elif line == f"branch refs/heads/{branch}" and where is not None \
                    and (anywhere or where.is_relative_to(ours)):
                return where
        return None

    def _tree(self, name: str, path: Path, base: str) -> TaskTree:
        return TaskTree(name=name, path=path, workdir=path.relative_to(self.repo).as_posix(),
                        branch=task_branch(self.campaign_id, name), base=base)

    def _reset(self, path: Path, branch: str, base: str) -> bool:
        """Put the worktree at ``path`` on ``branch`` at ``base`` with nothing else in it
        (libgit2, else ``checkout --force -B`` and ``clean -ffdx``); False when git fails or
        another work tree has ``branch`` checked out (asked of git itself, not libgit2)."""
        if libgit.reset_worktree(path, branch=branch, base=base):
            return True
        try:  # a branch another work tree has checked out stays where it is: git before 2.44
            held = self._holding(branch, anywhere=True)  # would move it under that work tree
        except GitError:
            return False
        if held is not None and held != path.resolve():
            return False
        tree = Git(path)
        try:
            tree.run("checkout", "-q", "--force", "-B", branch, base)
            tree.run("clean", "-q", "-ffdx")
        except GitError:
            return False
        return True

    def release(self, tree: TaskTree) -> None:
        """``tree``'s task is done with it (its commit is integrated, or a re-run starts): keep
        the worktree for the next `prepare`, up to `POOL_SIZE`, else remove it. Idempotent."""
        with self._refs_lock:
            self._busy.pop(tree.path, None)
            if tree.path in self._idle or not (tree.path / ".git").is_file():
                return
            if len(self._idle) < POOL_SIZE:
                self._idle.append(tree.path)
                return
        self.remove_path(tree.path)

    def remove_path(self, path: Path) -> None:
        """Remove the worktree at ``path`` (a task's own, or one it was given from the pool)."""
        with self._refs_lock:
            self._busy.pop(path, None)
            self._remove_folder_locked(path)

    def _remove_folder_locked(self, path: Path) -> None:
        if path in self._idle:
            self._idle.remove(path)
        if not libgit.remove_worktree(self.repo, name=path.name, path=path):
            self._remove_locked(path)

    def reuse(self, name: str, base: str, workdir: str | None = None) -> TaskTree | None:
        """The existing worktree of ``name`` if it still stands on ``base`` (its uncommitted
        files are an earlier attempt's build, kept for verify after a crash); else None.
        ``workdir``: where that attempt ran, relative to the repository (the workspace row's
        ``workdir``: a worktree taken from the pool stands at another task's path)."""
        path = self.repo / workdir if workdir else self.path_of(name)
        with self._refs_lock:  # checked and taken at once: `remove` cannot delete it between
            if self._busy.get(path, name) != name or not (path / ".git").is_file():
                return None
            try:
                current = Git(path).out("rev-parse", "HEAD")
            except GitError:
                return None
            if current != base:
                return None
            if path in self._idle:  # ours again: out of the pool other tasks take from
                self._idle.remove(path)
            self._busy[path] = name
        return self._tree(name, path, base)

    def stage(self, tree: TaskTree) -> list[str]:
        """Stage every change in ``tree`` (``git add -A``: ignored files such as ``__pycache__``
        are not changes) and return the changed paths against its base, sorted."""
        changed = libgit.stage_all(tree.path, tree.base)
        if changed is not None:
            return changed
        tree_git = Git(tree.path)
        tree_git.run("add", "-A")
        out = tree_git.run("diff", "--cached", "--name-only", "-z", "--no-renames", tree.base).stdout
        return sorted(path for path in out.split("\0") if path)

    def commit(self, tree: TaskTree, *, seq: str, slug: str, attempt: int,
               spec: dict[str, Any]) -> TaskCommit:
        """Commit what `stage` staged (an empty commit when the task changed nothing, so every
        verified task has its record) with the campaign's identity and trailers."""
        trailers = {"Ftl-Campaign": self.campaign_id, "Ftl-Task": seq, "Ftl-Slug": slug,
                    "Ftl-Attempt": f"{tree.name}/{attempt}", "Ftl-Spec": spec_digest(spec)}
        message = (f"ftl: {tree.name}\n\nTask {seq} ({slug}), attempt {attempt}, of campaign "
                   f"{self.campaign_id}.\n\n"
                   + "".join(f"{key}: {value}\n" for key, value in trailers.items()))
        commit = libgit.commit(tree.path, branch=tree.branch, parent=tree.base, message=message,
                               **self._signer(tree.name))
        if commit is None:
            Git(tree.path, self._identity(tree.name)).run(
                "commit", "-q", "--allow-empty", "--no-verify", "-F", "-", input=message)
            commit = Git(tree.path).out("rev-parse", "HEAD")
        return TaskCommit(commit=commit, base=tree.base, trailers=trailers)

    def task_commit(self, name: str) -> TaskCommit | None:
        """The commit on task ``name``'s branch made by this campaign, or None (no branch, or
        the branch is at a base without a task commit)."""
        branch = task_branch(self.campaign_id, name)
        if not self._resolve(branch):
            return None
        raw = self.git.out("log", "-1", "--format=%H%x00%P%x00%(trailers:only,unfold)", branch)
        commit, parents, text = (raw.split("\0") + ["", ""])[:3]
        trailers = _parse_trailers(text)
        if trailers.get("Ftl-Campaign") != self.campaign_id or not trailers.get("Ftl-Task"):
            return None
        # The branch may stand at another task's commit, or at an integration merge that
        # repeats its trailers (`prepare` moves it to the integration head): only this task's
        # own commit, one parent, counts.
        if not trailers.get("Ftl-Attempt", "").startswith(f"{name}/") or len(parents.split()) != 1:
            return None
        return TaskCommit(commit=commit, base=parents.split()[0], trailers=trailers)

    # --- integration ---
    def integrate(self, task: TaskCommit, *, name: str) -> Integration:
        """Integrate ``task`` into the integration branch (one integration at a time).

        Raises:
            MergeConflict: the commit conflicts with the head; nothing moved.
        """
        with self._integration_lock:
            head = self.ensure_integration()
            if task.base == head:  # nothing integrated since the task started: fast-forward
                self._move(task.commit, head)
                return Integration(head=task.commit, previous=head, fast_forward=True)
            known = libgit.is_ancestor(self.repo, task.commit, head)
            if known is None:
                known = self.git.ok("merge-base", "--is-ancestor", task.commit, head)
            if known:
                return Integration(head=head, previous=head, already=True)
            message = (f"ftl: integrate {name}\n\n"
                       + "".join(f"{key}: {value}\n" for key, value in task.trailers.items()))
            new = libgit.merge_disjoint(self.repo, head=head, task=task.commit, base=task.base,
                                        message=message, **self._signer(name))
            if new is not None:
                self._move(new, head)
                return Integration(head=new, previous=head)
            merged = self.git.run("merge-tree", "--write-tree", "--name-only", "--no-messages",
                                  "-z", head, task.commit, ok_codes=(0, 1))
            tree, *rest = merged.stdout.split("\0")
            if merged.returncode == 1:
                paths = sorted({path for path in rest if path})
                raise MergeConflict(paths, self._tasks_touching(task.base, head, paths))
            new = Git(self.repo, self._identity(name)).out(
                "commit-tree", tree.strip(), "-p", head, "-p", task.commit, "-F", "-", input=message)
            self._move(new, head)
            return Integration(head=new, previous=head)

    def _move(self, new: str, old: str) -> None:
        """Move the integration branch from ``old`` to ``new`` (compare-and-swap: git refuses
        if it is not at ``old``, e.g. moved by hand; the cached head is then dropped)."""
        moved = libgit.move_ref(self.repo, f"refs/heads/{self.integration}", new, old)
        if moved is False:
            self._head = None
            raise GitError(["update-ref", f"refs/heads/{self.integration}", new, old], 1,
                           f"the integration branch no longer points at {old[:12]}")
        if moved is None:
            try:
                self.git.run("update-ref", f"refs/heads/{self.integration}", new, old)
            except GitError:
                self._head = None
                raise
        self._head = new

    def _tasks_touching(self, base: str, head: str, paths: list[str]) -> list[str]:
        if not paths:
            return []
        out = self.git.out("log", "--no-merges", "--reverse",
                           "--format=%(trailers:key=Ftl-Task,valueonly,separator=%x2C)",
                           f"{base}..{head}", "--", *paths)
        seqs: list[str] = []
        for line in out.splitlines():
            for seq in line.split(","):
                if seq.strip() and seq.strip() not in seqs:
                    seqs.append(seq.strip())
        return seqs

    # --- after a crash ---
    def release_stale_locks(self) -> list[str]:
        """Remove the lock files a killed git call of this campaign left behind, so that the
        resumed run's git calls do not fail on them: ``<ref>.lock`` under the campaign's refs,
        and ``index.lock`` / ``HEAD.lock`` / ``locked`` (a ``git worktree add`` killed midway)
        of its task worktrees. Only safe while no git call of the campaign runs: the resume
        calls it holding the run lock, after the crashed run's commands were reaped.

        Returns:
            The removed files, relative to git's common directory, sorted. Never raises.
        """
        try:
            common = Path(self.git.out("rev-parse", "--git-common-dir"))
        except GitError:
            return []
        common = common if common.is_absolute() else (self.repo / common)
        stale: list[Path] = []
        refs = common / "refs" / "heads" / "ftl" / self.campaign_id
        if refs.is_dir():
            stale += refs.rglob("*.lock")
        if (refs.parent / f"{self.campaign_id}.lock").exists():
            stale.append(refs.parent / f"{self.campaign_id}.lock")
        ours = (self.repo / WORKTREES_DIR).resolve()
        admin_root = common / "worktrees"
        for admin in admin_root.iterdir() if admin_root.is_dir() else []:
            try:
                target = Path((admin / "gitdir").read_text().strip()).resolve()
            except OSError:
                continue
            if target.is_relative_to(ours):
                stale += [admin / name for name in ("index.lock", "HEAD.lock", "locked")
                          if (admin / name).exists()]
        removed = []
        for path in stale:
            try:
                path.unlink()
                removed.append(path.relative_to(common).as_posix())
            except OSError:
                continue
        return sorted(removed)

    # --- cleaning up ---
    def remove(self, name: str) -> None:
        """Remove task ``name``'s worktree (its branch stays), unless another task holds that
        folder now (one given from the pool, e.g. after a crash between this task's integration
        and its stored end). Idempotent."""
        path = self.path_of(name)
        with self._refs_lock:
            if self._busy.get(path, name) == name:
                self._busy.pop(path, None)
                self._remove_folder_locked(path)

    def finish(self) -> list[str]:
        """End of the campaign: remove its worktrees and delete the task branches whose tips
        the integration branch contains (their work is in it, or they hold none); keep a task
        branch whose commit is not integrated (a conflict to look at). A few git calls in all,
        not a few per task. Returns the task branches kept. Never raises."""
        prefix = f"refs/heads/ftl/{self.campaign_id}/task/"
        try:
            with self._refs_lock:
                self._idle.clear()  # they stand at task paths: removed below with the rest
                self._busy.clear()
                names = self.git.out("for-each-ref", "--format=%(refname)", prefix).splitlines()
                for ref in names:
                    path = self.path_of(ref[len(prefix):])
                    if path.exists():
                        shutil.rmtree(path, ignore_errors=True)
                self.git.run("worktree", "prune")
                head = self._resolve(self.integration)
                merged = set(self.git.out("for-each-ref", "--format=%(refname)",
                                          f"--merged={head}", prefix).splitlines()) if head else set()
                if merged:
                    self.git.run("update-ref", "--stdin",
                                 input="".join(f"delete {ref}\n" for ref in sorted(merged)))
            return sorted(ref[len("refs/heads/"):] for ref in names if ref not in merged)
        except (GitError, OSError):
            return []

    def _remove_locked(self, path: Path) -> None:
        if (path / ".git").is_file():
            try:
                self.git.run("worktree", "remove", "--force", "--force", str(path))
            except GitError:
                pass
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        self.git.run("worktree", "prune")

    # --- helpers ---
    def _resolve(self, branch: str) -> str | None:
        try:
            return self.git.out("rev-parse", "--verify", "-q", f"refs/heads/{branch}")
        except GitError:
            return None

    def _signer(self, name: str) -> dict[str, str]:
        """Author and committer of ftl's commits for ``name``: ``{"name", "email"}``."""
        return {"name": f"ftl {name}", "email": f"ftl+{self.campaign_id}@ftl.invalid"}

    def _identity(self, name: str) -> dict[str, str]:
        """`_signer` as git's environment variables."""
        who = self._signer(name)
        return {"GIT_AUTHOR_NAME": who["name"], "GIT_AUTHOR_EMAIL": who["email"],
                "GIT_COMMITTER_NAME": who["name"], "GIT_COMMITTER_EMAIL": who["email"]}


def _parse_trailers(text: str) -> dict[str, str]:
    trailers: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in _TRAILER_KEYS:
            trailers[key.strip()] = value.strip()
    return trailers


def leftover_names(repo: Path) -> Iterable[str]:
    """Names of the worktree folders under ``.ftl/worktrees`` (any campaign)."""
    root = repo / WORKTREES_DIR
    return sorted(entry.name for entry in root.iterdir() if entry.is_dir()) if root.is_dir() else []
