"""Whether libgit2 reads a repository's ignore rules as git does: the check `ftl.vcs.libgit`
makes before it answers a status or stages from one.

libgit2 (1.9) and git disagree on some rules, each found by differential runs against the
git CLI and pinned by a case of tests/vcs/test_libgit.py:

* a negation (``!keep``, the ``!.gitkeep`` idiom): in either direction, a file one lists as
  untracked and the other ignores;
* a directory rule made only of ``*`` and ``/`` (``*/``, ``/*/``, ``**/``, ``//``): libgit2
  then ignores files at the top, the ``.gitignore`` itself included, that git lists;
* trailing whitespace other than spaces (a tab), which libgit2 trims and git keeps;
* a ``**`` that is not a whole path segment (``bar**/**``, ``y/__pyca**/**``): git splits a
  rule's literal prefix off before matching, so the ``**`` after it counts as leading, and
  libgit2 matches files git does not;
* a folder rule (``build/``) and a symbolic link to a folder: git lists the link, libgit2
  ignores it. Any ignored symbolic link makes libgit.py step aside.

A rule holding one of these, or a backslash escape, a control byte or a byte-order mark
(`odd_rules`), in any source git reads makes libgit.py leave the question to git: every
``.gitignore`` in the work tree (committed, changed, new, or itself ignored), the git
directory's ``info/exclude``, and ``core.excludesFile`` or its XDG default. A ``.gitignore``
that is a symbolic link counts as odd too (git no longer follows one).

The committed files are looked at once per tree (a tree's id names its content: a memo keyed
by it is never stale, and a new commit re-reads only the folders it changed).
"""

from __future__ import annotations

import os
import stat
from typing import Any

__all__ = ["odd_rules", "differ"]

_NAME = ".gitignore"
_LINK = 0o120000  # a tree entry's mode for a symbolic link
_IGNORED = 1 << 14  # libgit2's GIT_STATUS_IGNORED (an int test: the enum's & costs 2 us)
# The bytes a plain rule may hold besides printable ASCII and UTF-8: none of the controls.
_CONTROLS = bytes((*range(32), 127))
# Tree id -> whether its committed .gitignore files hold an odd rule. Ids never go stale;
# the memo is emptied when it grows past the bound.
_trees: dict[Any, bool] = {}
_TREES_KEPT = 20_000
# Path -> (stamp, odd) for the sources outside the work tree, read again when the stamp moves.
_outer: dict[str, tuple[tuple[int, ...], bool]] = {}


def odd_rules(data: bytes) -> bool:
    """Whether the ignore file ``data`` holds a rule libgit2 may read differently from git
    (the module docstring); comments and blank lines are not rules.

    Args:
        data: the file's bytes as on disk (LF or CRLF lines).
    Returns:
        True when libgit.py must leave the answer to git.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        return True
    for line in data.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]  # git and libgit2 both drop a CR before the LF
        if not line or line.startswith(b"#"):
            continue
        if line.startswith(b"!") or b"\\" in line or len(line.translate(None, _CONTROLS)) != len(line):
            return True
        body = line.rstrip(b" ")
        if body.endswith(b"/") and not body.strip(b"*/"):
            return True
        if b"**" in body and any(b"**" in part and part != b"**" for part in body.split(b"/")):
            return True
    return False


def differ(repo: Any, outer: tuple[str, ...], found: dict[str, int]) -> bool:
    """Whether a rule libgit2 may read differently from git applies in ``repo`` (the module
    docstring): about 20 us when nothing changed since the last call (most of it
    finding ``HEAD``'s tree).

    Args:
        repo: a ``pygit2.Repository`` with a work tree.
        outer: the ignore files of ``repo`` outside its work tree (``info/exclude``,
            ``core.excludesFile`` or its XDG default: `ftl.vcs.libgit`'s ``_outer_files``).
        found: ``repo.status(untracked_files="all", ignored=True)``: the ``.gitignore`` files
            that differ from ``HEAD``, are new, or are ignored are read from the work tree.
    Returns:
        True when libgit.py must leave the answer to git.
    Raises:
        pygit2.GitError, OSError, KeyError: reading the repository failed (libgit.py then
        steps aside too).
    """
    if any(_odd_outer(path) for path in outer):
        return True
    for name, flags in found.items():
        if name == _NAME or name.endswith("/" + _NAME):
            if _odd_file(os.path.join(repo.workdir, name)):
                return True
        elif flags & _IGNORED and name[-1:] != "/" and os.path.islink(os.path.join(repo.workdir, name)):
            return True  # maybe a link to a folder, which libgit2 matches with a folder rule
    import pygit2

    try:
        head = repo.head  # one lookup: ``head_is_unborn`` costs another
    except pygit2.GitError:  # no commit yet: nothing committed to read
        return False
    return _odd_tree(head.peel(pygit2.Tree))


def _odd_file(path: str) -> bool:
    try:
        found = os.lstat(path)
        if stat.S_ISLNK(found.st_mode):
            return True
        with open(path, "rb") as handle:
            return odd_rules(handle.read())
    except (FileNotFoundError, NotADirectoryError):
        return False


def _odd_outer(path: str) -> bool:
    """`_odd_file` for a file outside the work tree, kept while its inode, size, mtime and
    ctime (ns) stay the same."""
    try:
        found = os.stat(path)
    except OSError:
        return False
    stamp = (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)
    kept = _outer.get(path)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    odd = _odd_file(path)
    _outer[path] = (stamp, odd)
    return odd


def _odd_tree(tree: Any) -> bool:
    odd = _trees.get(tree.id)
    if odd is not None:
        return odd
    odd = False
    for entry in tree:
        if entry.type_str == "tree":
            odd = _odd_tree(entry)
        elif entry.name == _NAME:
            odd = entry.filemode == _LINK or (entry.type_str == "blob" and odd_rules(entry.data))
        if odd:
            break
    if len(_trees) >= _TREES_KEPT:
        _trees.clear()
    _trees[tree.id] = odd
    return odd
