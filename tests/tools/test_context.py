"""`resolve_workdir`: the folder a build or verify command runs in stays inside the repository,
whatever the ``workdir`` names (a symlink, ``..``, an absolute path), and the fast path (no
symlink, no ``..``) answers what resolving the whole path answers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.server.tools.context import ToolContext, resolve_workdir


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "real-repo"
    (root / ".ftl" / "worktrees" / "001-a").mkdir(parents=True)
    (root / "sub").mkdir()
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", root / "out-link")
    os.symlink(root / "sub", root / "in-link")
    os.symlink(root, tmp_path / "repo-link")  # the repository itself named through a symlink
    (root / "file").write_text("x")
    return root


@pytest.mark.parametrize("via_link", [False, True])
@pytest.mark.parametrize("workdir, expected", [
    (".ftl/worktrees/001-a", ".ftl/worktrees/001-a"),
    ("sub", "sub"),
    ("in-link", "sub"),                 # a symlink that stays inside: where it points
    ("sub/../.ftl/worktrees/001-a", ".ftl/worktrees/001-a"),
    ("./sub", "sub"),
    ("sub/", "sub"),                    # an empty part: resolved whole, same folder
    (".ftl//worktrees/001-a", ".ftl/worktrees/001-a"),
])
def test_a_workdir_inside_the_repository_is_its_resolved_folder(repo: Path, via_link: bool,
                                                                workdir: str, expected: str) -> None:
    base = repo.parent / "repo-link" if via_link else repo
    assert resolve_workdir(ToolContext(repo=base), workdir, "$.workdir") == repo / expected
    assert resolve_workdir(ToolContext(repo=base), None, "$.workdir") == base


@pytest.mark.parametrize("workdir", ["out-link", "..", "../outside", "sub/../../outside", "missing",
                                     "file", "/tmp", "in-link/../../outside"])
def test_a_workdir_that_leaves_the_repository_or_is_no_folder_is_refused(repo: Path, workdir: str) -> None:
    with pytest.raises(FtlError) as raised:
        resolve_workdir(ToolContext(repo=repo), workdir, "$.workdir")
    assert raised.value.error_type == "workspace_invalid"
    assert workdir not in str(raised.value.details) and str(repo) not in str(raised.value.details)
