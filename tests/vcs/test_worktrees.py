"""ftl.vcs: task worktrees, task commits, integration (fast-forward, merge, conflict), landing
and cleaning, on real git repositories."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.vcs.git import GitError
from ftl.vcs.land import clean, land
from ftl.vcs.worktrees import MergeConflict, Worktrees, probe, spec_digest

SPEC = {"run": "edit", "verify": "true", "delta": ["a.txt"], "creates": [], "builder": None}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text(".ftl/\n__pycache__/\n")
    (root / "shared.txt").write_text("one\ntwo\nthree\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def finished_task(trees: Worktrees, name: str, path: str, text: str, base: str | None = None):
    tree = trees.prepare(name, base)
    (tree.path / path).write_text(text)
    changed = trees.stage(tree)
    return tree, changed, trees.commit(tree, seq=name[:3], slug=name[4:], attempt=1, spec=SPEC)


def test_probe_says_why_isolation_cannot_work(tmp_path: Path, repo: Path) -> None:
    assert probe(repo).available
    plain = tmp_path / "plain"
    plain.mkdir()
    assert probe(plain).reason == "the repository is not a git work tree"
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    assert probe(empty).reason == "the git repository has no commit yet"
    (repo / "sub").mkdir()
    assert "not the top level" in probe(repo / "sub").reason
    (repo / "shared.txt").write_text("dirty\n")
    assert probe(repo).dirty == 1


def test_parallel_tasks_see_only_their_base_and_integrate_in_completion_order(repo: Path) -> None:
    trees = Worktrees(repo, "c-1")
    first = trees.prepare("001-a")
    second = trees.prepare("002-b")
    assert first.base == second.base == git(repo, "rev-parse", "HEAD")
    (first.path / "a.txt").write_text("a\n")
    (second.path / "b.txt").write_text("half")  # never visible to task 001
    assert not (first.path / "b.txt").exists()
    (first.path / "__pycache__").mkdir()
    (first.path / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert trees.stage(first) == ["a.txt"]  # ignored build artefacts are not changes
    commit_a = trees.commit(first, seq="001", slug="a", attempt=1, spec=SPEC)
    (second.path / "b.txt").write_text("b\n")
    assert trees.stage(second) == ["b.txt"]
    commit_b = trees.commit(second, seq="002", slug="b", attempt=1, spec=SPEC)

    fast = trees.integrate(commit_a, name="001-a")
    assert fast.fast_forward and fast.head == commit_a.commit
    merged = trees.integrate(commit_b, name="002-b")
    assert not merged.fast_forward and merged.previous == commit_a.commit
    files = git(repo, "ls-tree", "--name-only", trees.integration).splitlines()
    assert {"a.txt", "b.txt", "shared.txt"} <= set(files)
    assert trees.is_integrated(commit_a.commit) and trees.is_integrated(commit_b.commit)
    # Integrating again moves nothing (a resume after a crash).
    again = trees.integrate(commit_b, name="002-b")
    assert again.already and again.head == merged.head
    # The user's branch and checkout are untouched.
    assert git(repo, "rev-parse", "main") == first.base
    assert not (repo / "a.txt").exists()


def test_task_commit_carries_trailers_and_is_found_again(repo: Path) -> None:
    trees = Worktrees(repo, "c-2")
    _, _, commit = finished_task(trees, "001-a", "a.txt", "a\n")
    found = trees.task_commit("001-a")
    assert found is not None and found.commit == commit.commit and found.base == commit.base
    assert found.trailers == {"Ftl-Campaign": "c-2", "Ftl-Task": "001", "Ftl-Slug": "a",
                              "Ftl-Attempt": "001-a/1", "Ftl-Spec": spec_digest(SPEC)}
    assert Worktrees(repo, "c-other").task_commit("001-a") is None
    # A fresh attempt resets the branch to its base: the old commit is no longer the result.
    trees.prepare("001-a")
    assert trees.task_commit("001-a") is None
    assert not (trees.path_of("001-a") / "a.txt").exists()


def test_a_branch_standing_at_another_tasks_commit_has_no_commit_of_its_own(repo: Path) -> None:
    # `prepare` moves a task's branch to the integration head, which is often another task's
    # commit, or an integration merge that repeats its trailers. Neither is this task's result:
    # taken as one, a resumed task completed without running and its work was lost.
    trees = Worktrees(repo, "c-3")
    first, _, one = finished_task(trees, "001-a", "a.txt", "a\n")
    trees.integrate(one, name="001-a")
    trees.release(first)
    trees.prepare("002-b")  # at the head: task 001's commit
    assert trees.task_commit("002-b") is None
    side = trees.prepare("003-c", base=one.base)  # started before 001 was integrated
    (side.path / "c.txt").write_text("c\n")
    trees.stage(side)
    three = trees.commit(side, seq="003", slug="c", attempt=1, spec=SPEC)
    merged = trees.integrate(three, name="003-c")
    assert not merged.fast_forward
    trees.prepare("004-d")  # at the merge, whose message repeats 003's trailers
    assert git(repo, "log", "-1", "--format=%(trailers:key=Ftl-Task,valueonly)",
               trees.integration).strip() == "003"
    assert trees.task_commit("004-d") is None
    assert trees.task_commit("003-c").commit == three.commit  # its own commit still counts


def test_a_re_run_keeps_its_folder_and_no_other_task_is_given_it(repo: Path) -> None:
    trees = Worktrees(repo, "c-6")
    first, _, one = finished_task(trees, "001-a", "a.txt", "a\n")
    trees.integrate(one, name="001-a")
    trees.release(first)
    tree = trees.prepare("002-b", base=one.base)  # from the pool: 001's folder
    (tree.path / "b.txt").write_text("round 1\n")
    again = trees.renew(tree)  # a merge conflict: round 2 on the new head, same folder
    assert again.path == tree.path and again.base == one.commit and not (again.path / "b.txt").exists()
    other = trees.prepare("003-c")
    assert other.path != again.path


def test_a_task_preparing_its_own_released_folder_takes_it_out_of_the_pool(repo: Path) -> None:
    # A re-run after a merge conflict releases its folder, then prepares its own name again:
    # the folder must not stay in the pool, or the next task would be given the same one.
    trees = Worktrees(repo, "c-4")
    tree = trees.prepare("001-a")
    trees.release(tree)
    again = trees.prepare("001-a")
    other = trees.prepare("002-b")
    assert again.path == tree.path and other.path != again.path
    (again.path / "a.txt").write_text("a\n")
    assert trees.stage(again) == ["a.txt"] and not (other.path / "a.txt").exists()


def test_removing_a_tasks_folder_spares_it_while_another_task_holds_it(repo: Path) -> None:
    # Task 001's folder went to the pool and task 002 took it; after a crash, 001's resume
    # integrates its commit again and removes "its" folder: 002's build there must stay.
    trees = Worktrees(repo, "c-5")
    first = trees.prepare("001-a")
    trees.release(first)
    second = trees.prepare("002-b")
    assert second.path == first.path == trees.path_of("001-a")
    (second.path / "b.txt").write_text("built\n")
    trees.remove("001-a")
    assert (second.path / "b.txt").read_text() == "built\n"
    # A resume that reuses 002's built folder holds it the same way.
    fresh = Worktrees(repo, "c-5")
    reused = fresh.reuse("002-b", second.base, workdir=second.workdir)
    assert reused is not None and reused.path == second.path
    assert fresh.reuse("003-c", second.base, workdir=second.workdir) is None  # already held
    fresh.remove("001-a")
    assert (second.path / "b.txt").exists()
    fresh.release(reused)
    fresh.remove("001-a")  # nobody holds it now: removed
    assert not second.path.exists()


def test_conflict_moves_nothing_and_names_the_other_task(repo: Path) -> None:
    trees = Worktrees(repo, "c-3")
    base = trees.ensure_integration()
    _, _, one = finished_task(trees, "001-one", "shared.txt", "one\nTWO by 001\nthree\n", base)
    _, _, two = finished_task(trees, "002-two", "shared.txt", "one\nTWO by 002\nthree\n", base)
    head = trees.integrate(one, name="001-one").head
    with pytest.raises(MergeConflict) as caught:
        trees.integrate(two, name="002-two")
    assert caught.value.paths == ["shared.txt"] and caught.value.other_seqs == ["001"]
    assert trees.head() == head
    assert "TWO by 001" in git(repo, "show", f"{trees.integration}:shared.txt")


def test_reuse_keeps_an_unfinished_build_only_on_its_base(repo: Path) -> None:
    trees = Worktrees(repo, "c-4")
    tree = trees.prepare("001-a")
    (tree.path / "a.txt").write_text("built before the crash\n")
    kept = trees.reuse("001-a", tree.base)
    assert kept is not None and (kept.path / "a.txt").exists()
    assert trees.reuse("001-a", "0" * 40) is None
    assert trees.reuse("009-missing", tree.base) is None


def test_land_fast_forwards_refuses_dirty_and_conflicting_targets(repo: Path) -> None:
    trees = Worktrees(repo, "c-5")
    _, _, commit = finished_task(trees, "001-a", "a.txt", "a\n")
    trees.integrate(commit, name="001-a")
    (repo / "shared.txt").write_text("uncommitted\n")
    with pytest.raises(FtlError) as dirty:
        land(repo, "c-5")
    assert dirty.value.error_type == "conflict" and "uncommitted" in dirty.value.message
    assert (repo / "shared.txt").read_text() == "uncommitted\n"
    git(repo, "checkout", "-q", "--", "shared.txt")
    landed = land(repo, "c-5")
    assert landed.how == "fast-forward" and (repo / "a.txt").read_text() == "a\n"
    assert land(repo, "c-5").how == "up-to-date"


def test_land_on_a_diverged_branch_merges_or_refuses_on_conflict(repo: Path) -> None:
    trees = Worktrees(repo, "c-6")
    _, _, commit = finished_task(trees, "001-a", "shared.txt", "one\nfrom ftl\nthree\n")
    trees.integrate(commit, name="001-a")
    before = git(repo, "rev-parse", "main")
    (repo / "shared.txt").write_text("one\nfrom the user\nthree\n")
    git(repo, "commit", "-qam", "user edit")
    user_head = git(repo, "rev-parse", "main")
    with pytest.raises(FtlError) as conflict:
        land(repo, "c-6")
    assert "shared.txt" in conflict.value.message
    assert git(repo, "rev-parse", "main") == user_head != before
    assert (repo / "shared.txt").read_text() == "one\nfrom the user\nthree\n"
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    # A branch that is not checked out lands without touching any work tree.
    git(repo, "branch", "side", before)
    landed = land(repo, "c-6", into="side")
    assert landed.how == "fast-forward" and git(repo, "rev-parse", "side") == commit.commit
    with pytest.raises(FtlError) as missing:
        land(repo, "c-missing")
    assert missing.value.error_type == "not_found"


def test_finish_and_clean_remove_worktrees_and_keep_unintegrated_work(repo: Path) -> None:
    trees = Worktrees(repo, "c-7")
    base = trees.ensure_integration()
    _, _, one = finished_task(trees, "001-one", "shared.txt", "x\n", base)
    _, _, two = finished_task(trees, "002-two", "shared.txt", "y\n", base)
    trees.integrate(one, name="001-one")
    with pytest.raises(MergeConflict):
        trees.integrate(two, name="002-two")
    kept = trees.finish()
    assert kept == ["ftl/c-7/task/002-two"]
    assert not trees.path_of("001-one").exists() and not trees.path_of("002-two").exists()
    assert "ftl/c-7/task/001-one" not in git(repo, "branch", "--list", "ftl/*")
    # A crash leaves worktrees behind; clean removes them (and keeps the active campaign's).
    Worktrees(repo, "c-8").prepare("001-left")
    active = Worktrees(repo, "c-9")
    active.prepare("001-live")
    result = clean(repo, ["c-7", "c-8", "c-9"], keep_worktrees_of="c-9")
    assert result["removed"] == ["001-left"]
    assert active.path_of("001-live").exists()
    assert "ftl/c-7/task/002-two" in result["kept_branches"]


def test_locks_left_by_killed_git_calls_are_released_after_a_crash(repo: Path) -> None:
    trees = Worktrees(repo, "c-10")
    tree, _, commit = finished_task(trees, "001-a", "a.txt", "a\n")
    common = repo / ".git"
    ref_lock = common / "refs" / "heads" / "ftl" / "c-10" / "integration.lock"
    ref_lock.parent.mkdir(parents=True, exist_ok=True)
    ref_lock.write_text("")
    (admin,) = (common / "worktrees").iterdir()
    (admin / "index.lock").write_text("")
    (admin / "locked").write_text("initializing")
    with pytest.raises(GitError):
        trees.integrate(commit, name="001-a")  # what the resumed run would meet
    assert trees.release_stale_locks() == [
        "refs/heads/ftl/c-10/integration.lock", f"worktrees/{admin.name}/index.lock",
        f"worktrees/{admin.name}/locked"]
    assert trees.integrate(commit, name="001-a").fast_forward
    assert trees.prepare("001-a").path == tree.path  # the worktree is usable again
    assert trees.release_stale_locks() == []


def _merge_tree_of_git(repo: Path, head: str, task: str) -> str:
    return git(repo, "merge-tree", "--write-tree", head, task).splitlines()[0]


def test_disjoint_changes_merge_in_process_to_gits_tree(repo: Path) -> None:
    """Adds and edits of different files merge in process (libgit2) to the tree git's own
    merge gives; edits of one file, deletions and a file against a folder go to git."""
    from ftl.vcs import libgit

    trees = Worktrees(repo, "c-m")
    base = trees.ensure_integration()
    _, _, one = finished_task(trees, "001-one", "a.txt", "a\n", base)
    two_tree = trees.prepare("002-two", base)
    (two_tree.path / "sub").mkdir()
    (two_tree.path / "sub" / "b.txt").write_text("b\n")
    (two_tree.path / "shared.txt").write_text("one\ntwo\nthree\nfour\n")
    trees.stage(two_tree)
    two = trees.commit(two_tree, seq="002", slug="two", attempt=1, spec=SPEC)
    head = trees.integrate(one, name="001-one").head
    expected = _merge_tree_of_git(repo, head, two.commit)
    identity = {"name": "t", "email": "t@t"}
    merged = libgit.merge_disjoint(repo, head=head, task=two.commit, base=base, message="m\n", **identity)
    assert merged is not None and git(repo, "rev-parse", f"{merged}^{{tree}}") == expected
    assert git(repo, "rev-parse", f"{merged}^1", f"{merged}^2").split() == [head, two.commit]
    result = trees.integrate(two, name="002-two")
    assert git(repo, "rev-parse", f"{result.head}^{{tree}}") == expected
    assert git(repo, "log", "-1", "--format=%an <%ae>", result.head) == "ftl 002-two <ftl+c-m@ftl.invalid>"

    # Not disjoint: both edit shared.txt (different lines), one deletes, a file against a folder.
    _, _, three = finished_task(trees, "003-three", "shared.txt", "zero\none\ntwo\nthree\nfour\n",
                                result.head)
    _, _, four = finished_task(trees, "004-four", "shared.txt", "one\ntwo\nthree\nfour\nfive\n",
                               result.head)
    head = trees.integrate(three, name="003-three").head
    assert libgit.merge_disjoint(repo, head=head, task=four.commit, base=result.head,
                                 message="m\n", **identity) is None
    merged_by_git = trees.integrate(four, name="004-four")  # git merges the two edits
    assert git(repo, "show", f"{merged_by_git.head}:shared.txt") == "zero\none\ntwo\nthree\nfour\nfive"
    gone = trees.prepare("005-gone", merged_by_git.head)
    (gone.path / "a.txt").unlink()
    trees.stage(gone)
    deleting = trees.commit(gone, seq="005", slug="gone", attempt=1, spec=SPEC)
    _, _, folder = finished_task(trees, "006-folder", "c.txt", "c\n", merged_by_git.head)
    head = trees.integrate(folder, name="006-folder").head
    assert libgit.merge_disjoint(repo, head=head, task=deleting.commit, base=merged_by_git.head,
                                 message="m\n", **identity) is None
    file_tree = trees.prepare("007-file", head)
    (file_tree.path / "e").write_text("a file\n")
    trees.stage(file_tree)
    as_file = trees.commit(file_tree, seq="007", slug="file", attempt=1, spec=SPEC)
    dir_tree = trees.prepare("008-dir", head)
    (dir_tree.path / "e").mkdir()
    (dir_tree.path / "e" / "x.txt").write_text("in a folder\n")
    trees.stage(dir_tree)
    as_dir = trees.commit(dir_tree, seq="008", slug="dir", attempt=1, spec=SPEC)
    head = trees.integrate(as_file, name="007-file").head
    assert libgit.merge_disjoint(repo, head=head, task=as_dir.commit, base=as_file.base,
                                 message="m\n", **identity) is None
    with pytest.raises(MergeConflict):
        trees.integrate(as_dir, name="008-dir")


@pytest.mark.parametrize("attributes", [False, True])  # True: libgit2 declines, git resets it
def test_a_released_worktree_serves_the_next_task_reset_to_its_base(repo: Path, attributes: bool) -> None:
    from ftl.vcs.worktrees import POOL_SIZE

    if attributes:
        (repo / ".gitattributes").write_text("*.txt text\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "attributes")
    trees = Worktrees(repo, "c-p")
    first, _, commit = finished_task(trees, "001-one", "a.txt", "a\n")
    (first.path / "__pycache__").mkdir()
    (first.path / "__pycache__" / "x.pyc").write_bytes(b"\0")  # ignored: must go too
    (first.path / "stray.txt").write_text("untracked\n")
    head = trees.integrate(commit, name="001-one").head
    trees.release(first)
    trees.release(first)  # idempotent

    second = trees.prepare("002-two")
    assert second.path == first.path and second.base == head  # the same folder, reset
    assert second.workdir == first.workdir and second.name == "002-two"
    assert git(second.path, "rev-parse", "--abbrev-ref", "HEAD") == "ftl/c-p/task/002-two"
    assert git(second.path, "status", "--porcelain", "--ignored") == ""
    assert (second.path / "a.txt").read_text() == "a\n"  # the integrated work is the base
    # A crash during its build: resume finds it through the workspace row's workdir.
    (second.path / "b.txt").write_text("built\n")
    found = trees.reuse("002-two", head, second.workdir)
    assert found is not None and found.path == second.path and trees.reuse("002-two", head) is None
    assert trees.stage(found) == ["b.txt"]

    # Past POOL_SIZE idle worktrees, a released one is removed.
    extra = [trees.prepare(f"{n:03d}-extra") for n in range(3, 4 + POOL_SIZE)]
    for tree in extra:
        trees.release(tree)
    assert len(trees._idle) == POOL_SIZE
    assert sum(tree.path.exists() for tree in extra) == POOL_SIZE
    trees.finish()
    assert not any(tree.path.exists() for tree in extra) and not trees._idle


@pytest.mark.parametrize("attributes", [False, True])  # True: libgit2 declines first, then git's turn
def test_a_reset_never_moves_a_branch_another_worktree_has_checked_out(repo: Path, attributes: bool) -> None:
    """Neither libgit2 nor the git CLI fallback takes it (git before 2.44 would move it under
    that worktree, leaving two worktrees on one branch)."""
    if attributes:
        (repo / ".gitattributes").write_text("*.txt text\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "attributes")
    trees = Worktrees(repo, "c-h")
    base = trees.ensure_integration()
    holder, _, commit = finished_task(trees, "001-one", "a.txt", "a\n")
    other = trees.prepare("002-two")
    assert trees._reset(other.path, holder.branch, base) is False
    assert git(repo, "rev-parse", holder.branch) == commit.commit  # not moved
    assert git(other.path, "rev-parse", "--abbrev-ref", "HEAD") == other.branch
    assert trees._reset(holder.path, holder.branch, base) is True  # its own branch: fine


def test_after_a_crash_a_task_whose_branch_sits_in_another_tasks_folder_starts_again(repo: Path) -> None:
    """Killed while task 002 ran in task 001's released folder: the resumed run (an empty pool)
    prepares 002 again although its branch is still checked out there (git refuses to move it)."""
    trees = Worktrees(repo, "c-k")
    first, _, commit = finished_task(trees, "001-one", "a.txt", "a\n")
    head = trees.integrate(commit, name="001-one").head
    trees.release(first)
    second = trees.prepare("002-two")
    assert second.path == first.path
    (second.path / "half.txt").write_text("half-done build\n")

    resumed = Worktrees(repo, "c-k")
    again = resumed.prepare("002-two")
    assert again.base == head and again.branch == second.branch
    assert git(again.path, "rev-parse", "--abbrev-ref", "HEAD") == second.branch
    assert git(again.path, "status", "--porcelain", "--ignored") == ""
    (again.path / "b.txt").write_text("b\n")
    assert resumed.stage(again) == ["b.txt"]
