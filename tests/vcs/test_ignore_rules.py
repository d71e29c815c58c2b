"""ftl.vcs.ignore_rules: which ignore files make libgit.py leave a question to git. The rules
themselves were sorted against git by tests/vcs/test_libgit.py; here each kind is named once,
and the committed files are found wherever they sit in the tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pygit2
import pytest

from ftl.vcs import ignore_rules


@pytest.mark.parametrize("data", [
    b"!keep\n", b"d/*\n!.gitkeep\n", b"*/\n", b"/*/\n", b"**/\n", b"**/*/\n", b"//\n", b"/\n",
    b"top.txt\t\n", b"a\\ \n", b"\\#not-a-comment\n", b"\xef\xbb\xbf*.log\n", b"x\x0by\n",
    b"*.log\r\n!keep\r\n", b"*.log\n\n  \n*/  \n", b"bar**/**\n", b"y/__pyca**/**\n",
    b"/x.log***/**/\n", b"**.py\n",
])
def test_odd_rules(data: bytes) -> None:
    assert ignore_rules.odd_rules(data)


@pytest.mark.parametrize("data", [
    b"", b"\n\n", b"# !comment\n#*/\n", b"*.log\n", b"build/\n/top.txt\n", b"d/*/\ns/*.py\n",
    b"*\n", b"/*\n", b"**\n", b"d/**/\n", b"*.log\r\nbuild/\r\n", b"trailing spaces  \n",
    "\u00fc.txt\n".encode(), b"[ab].txt\n**/w\n", b"**/node_modules\nlogs/**\na/**/b\n",
    b"__pycache__/\n*.pyc\n/dist\n.venv/\n.DS_Store\n*.egg-info/\n",
])
def test_plain_rules(data: bytes) -> None:
    assert not ignore_rules.odd_rules(data)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_a_committed_odd_rule_is_found_in_any_folder_and_after_later_commits(tmp_path: Path) -> None:
    """The memo is keyed by tree id: a commit that changes another folder reuses the answer for
    the unchanged one, and one that fixes the rule is read afresh."""
    root = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "main", str(root))
    (root / "a/b/c").mkdir(parents=True)
    (root / "a/b/c/.gitignore").write_text("*.tmp\n")
    (root / "z.txt").write_text("z\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "plain")
    repo = pygit2.Repository(str(root))
    assert not ignore_rules.differ(repo, (), {})
    (root / "a/b/c/.gitignore").write_text("*\n!keep\n")
    assert ignore_rules.differ(repo, (), {"a/b/c/.gitignore": 256})  # changed: read from disk
    git(root, "commit", "-qam", "odd")
    assert ignore_rules.differ(repo, (), {})  # committed: found in HEAD's tree
    (root / "z.txt").write_text("changed\n")
    git(root, "commit", "-qam", "elsewhere")
    assert ignore_rules.differ(repo, (), {})
    (root / "a/b/c/.gitignore").write_text("*.tmp\n")
    git(root, "commit", "-qam", "plain again")
    assert not ignore_rules.differ(repo, (), {})


def test_a_symlinked_gitignore_is_odd_and_a_missing_source_is_not(tmp_path: Path) -> None:
    root = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "main", str(root))
    (root / "rules").write_text("*.log\n")
    os.symlink("rules", root / ".gitignore")
    repo = pygit2.Repository(str(root))
    assert not ignore_rules.differ(repo, (str(tmp_path / "missing"),), {})
    assert ignore_rules.differ(repo, (), {".gitignore": 128})
    git(root, "add", "-A")
    git(root, "commit", "-qm", "link")
    assert ignore_rules.differ(repo, (), {})


def test_an_outer_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    exclude = tmp_path / "exclude"
    exclude.write_text("*.log\n")
    root = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "main", str(root))
    repo = pygit2.Repository(str(root))
    assert not ignore_rules.differ(repo, (str(exclude),), {})
    exclude.write_text("!*.log\n")
    assert ignore_rules.differ(repo, (str(exclude),), {})
