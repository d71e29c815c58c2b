"""Bundles carry a campaign's history to a node and a task's commit back (ftl.vcs.bundles),
without Ray: a node's cache fetches only the links it lacks, and a task commit made there is
fetched into the driver's task branch and checked."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ftl.vcs.bundles import NodeCache, commit_bundle, fetch_task_bundle, head_bundle
from ftl.vcs.git import Git, GitError

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"}


def _commit(git: Git, name: str, text: str) -> str:
    (git.cwd / name).write_text(text)
    git.run("add", name)
    git.run("commit", "-qm", f"add {name}")
    return git.out("rev-parse", "HEAD")


@pytest.fixture
def driver(tmp_path: Path) -> Git:
    repo = tmp_path / "driver"
    repo.mkdir()
    git = Git(repo, IDENTITY)
    git.run("init", "-q")
    return git


def test_a_node_fetches_only_the_links_it_lacks(driver: Git, tmp_path: Path) -> None:
    heads = [_commit(driver, f"f{i}.txt", f"{i}\n") for i in range(3)]
    loads: list[int] = []

    def link(i: int, since: str | None):
        data = head_bundle(driver.cwd, heads[i], since)
        return heads[i], (lambda: loads.append(i) or data)

    chain = [link(0, None), link(1, heads[0]), link(2, heads[1])]
    cache = NodeCache(tmp_path / "node-cache")
    assert cache.ensure(chain[:2]) == 2 and loads == [0, 1]
    assert cache.ensure(chain[:2]) == 0  # already there: nothing fetched
    assert cache.ensure(chain) == 1 and loads == [0, 1, 2]  # only the new link
    checkout = cache.checkout(tmp_path / "attempt" / "repo", heads[2])
    assert checkout.out("rev-parse", "HEAD") == heads[2]
    assert (checkout.cwd / "f0.txt").read_text() == "0\n"
    # A later link holds only the new commits: it is smaller than the whole history.
    assert len(head_bundle(driver.cwd, heads[2], heads[1])) < len(head_bundle(driver.cwd, heads[2]))


def test_a_new_driver_starts_a_new_chain_that_a_warm_cache_takes(driver: Git, tmp_path: Path) -> None:
    first = _commit(driver, "a.txt", "a\n")
    cache = NodeCache(tmp_path / "node-cache")
    cache.ensure([(first, lambda: head_bundle(driver.cwd, first))])
    second = _commit(driver, "b.txt", "b\n")
    # After a resume the chain starts again with the whole history of the new head.
    assert cache.ensure([(second, lambda: head_bundle(driver.cwd, second))]) == 1
    assert cache.checkout(tmp_path / "c" / "repo", second).out("rev-parse", "HEAD") == second


def test_a_link_that_does_not_chain_is_a_git_error(driver: Git, tmp_path: Path) -> None:
    first = _commit(driver, "a.txt", "a\n")
    second = _commit(driver, "b.txt", "b\n")
    cache = NodeCache(tmp_path / "node-cache")
    with pytest.raises(GitError):  # the link needs `first`, which this node never got
        cache.ensure([(second, lambda: head_bundle(driver.cwd, second, first))])


def test_a_task_commit_comes_back_into_its_branch(driver: Git, tmp_path: Path) -> None:
    base = _commit(driver, "a.txt", "a\n")
    cache = NodeCache(tmp_path / "node-cache")
    cache.ensure([(base, lambda: head_bundle(driver.cwd, base))])
    node = Git(cache.checkout(tmp_path / "attempt" / "repo", base).cwd, IDENTITY)
    made = _commit(node, "new.txt", "task output\n")
    carried = commit_bundle(node.cwd, base, made)
    assert fetch_task_bundle(driver.cwd, carried, "ftl/c1/task/1-x", made) == made
    shown = subprocess.run(["git", "show", "ftl/c1/task/1-x:new.txt"], cwd=driver.cwd,
                           capture_output=True, text=True, check=True)
    assert shown.stdout == "task output\n"
    with pytest.raises(GitError):  # the node said another commit: refused
        fetch_task_bundle(driver.cwd, carried, "ftl/c1/task/1-y", base)
