"""In-process git for the per-task hot path: libgit2 through pygit2, the git CLI as the reference.

Each task costs a few git questions (what changed in the checkout, stage it, commit it). A git
process costs 1.5-2.5 ms to start before it does anything; libgit2 answers the same questions on
a small repository in 0.05-0.3 ms, and in about the same time as git on a large one (5,000 files:
10.8 ms both). Issue 11 item 3.

libgit2 is not git, so every function here answers only where it agrees with git and returns
None otherwise; the caller then runs the git CLI, which stays the reference behaviour:

* pygit2 is missing, or the repository does not open (libgit2's owner check, an unknown
  extension, a broken index);
* the configuration names behaviour libgit2 lacks: an external filter driver (``filter.*``:
  git-lfs and the like, whose clean step libgit2 would skip), a sparse checkout, a split index,
  an object format other than SHA-1;
* a case where libgit2's answer differs from git's (each found by tests/vcs/test_libgit.py
  against the CLI): ``core.ignorecase``; an intent-to-add entry in status and staging; a changed
  ``.gitattributes``, an attribute file outside the work tree changed since the index was
  written, or a changed file with a ``working-tree-encoding`` in status and staging;
  a symlink turned file in staging; in staging under an automatic line-end conversion, a
  changed file whose staged blob holds a carriage return but is not plain CRLF text (git's
  and libgit2's "safer autocrlf" rules differ); in status and staging, an ignore rule libgit2
  reads differently (a negation, ``*/``: `ftl.vcs.ignore_rules`); a commit message git would
  clean; a base tree with ``.gitattributes`` for a new worktree;
* any libgit2 error on the way (nothing is written before the last step succeeds).

Nothing here runs hooks or signs, like `ftl.vcs.git`'s ``GIT_OPTIONS``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ftl.vcs import ignore_rules

__all__ = ["load", "status", "stage_all", "commit", "move_ref", "add_worktree", "reset_worktree",
           "remove_worktree", "is_ancestor", "merge_disjoint"]

pygit2: Any = None  # imported on first use: the light commands never need it
FileStatus: Any = None
_MISSING = False

# Configuration that libgit2 does not honour the way git does (see the module docstring).
# core.ignorecase: on a case-sensitive file system git takes ``file.txt`` for the tracked
# ``File.txt`` and leaves it alone, libgit2 stages its content as ``File.txt``.
_UNSUPPORTED = ("core.sparsecheckout", "core.splitindex", "extensions.objectformat",
                "extensions.worktreeconfig", "core.fsmonitor", "core.ignorecase")
# The empty blob: what an intent-to-add index entry (`git add -N`) records.
_EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
# A repository's ignore files and attribute files outside its work tree (`_outer_files`).
Outer = tuple[tuple[str, ...], tuple[str, ...]]


def load() -> bool:
    """Import pygit2 now (about 60 ms once per process) rather than inside the first task's
    git call; False when it is missing (every question then goes to the git CLI)."""
    global pygit2, FileStatus, _MISSING
    if pygit2 is None and not _MISSING:
        try:
            import pygit2 as module
            from pygit2.enums import FileStatus as flags
        except ImportError:  # a broken install
            _MISSING = True
            return False
        pygit2, FileStatus = module, flags
    return pygit2 is not None


def _open(path: Path) -> Any:
    """The repository whose work tree holds ``path``, or None when libgit2 should not be used."""
    if pygit2 is None and not load():
        return None
    try:
        repo = pygit2.Repository(str(path))
        if repo.is_bare or repo.workdir is None or not _supported(repo):
            return None
        return repo
    except (pygit2.GitError, KeyError, ValueError, OSError):
        return None


def _supported(repo: Any) -> bool:
    """Whether ``repo``'s configuration asks for nothing libgit2 lacks (module docstring)."""
    return _configuration(repo) is not None


def _config_files(repo: Any) -> tuple[str, ...]:
    """The files libgit2 reads ``repo``'s configuration from: the repository's own (in the
    common git directory, for a linked worktree) and the system, XDG and global ones of
    libgit2's search path (read when the repository is opened: its configuration object keeps
    the files it was loaded from)."""
    gitdir = repo.path
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as handle:
            common = os.path.join(gitdir, handle.read().strip())
    except OSError:
        common = gitdir
    return (os.path.join(common, "config"), *_outer_config_files())


def _outer_config_files() -> tuple[str, ...]:
    from pygit2.enums import ConfigLevel

    files = []
    for level, name in (("SYSTEM", "gitconfig"), ("XDG", "config"), ("GLOBAL", ".gitconfig"),
                        ("PROGRAMDATA", "config")):
        try:
            folders = pygit2.settings.search_path[getattr(ConfigLevel, level)] or ""
        except (AttributeError, ValueError, pygit2.GitError):
            continue
        files += [os.path.join(folder, name) for folder in folders.split(os.pathsep) if folder]
    return tuple(files)


def _stamp(files: tuple[str, ...]) -> tuple[Any, ...]:
    """Inode, size and mtime (ns) of each of ``files`` (None where there is none)."""
    found: list[Any] = []
    for name in files:
        try:
            stat = os.stat(name)
        except OSError:
            found.append(None)
            continue
        found.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def _configuration(repo: Any) -> int | None:
    """A digest of ``repo``'s configuration entries, or None when they ask for something
    libgit2 lacks (module docstring). libgit2 re-reads a configuration file that changed on disk
    before it lists the entries; a kept repository object does not re-read all of what it
    derived from them (``core.excludesFile``), so a changed digest means opening it again."""
    entries = _config_entries(repo)
    return None if entries is None else hash(tuple(entries))


def _config_entries(repo: Any) -> list[tuple[str, Any]] | None:
    """``repo``'s configuration as ``[(lower-case name, value)]``, or None (`_configuration`)."""
    entries = []
    for entry in repo.config:
        name = entry.name.lower()
        if name.startswith("filter.") or (name in _UNSUPPORTED and entry.value not in (
                "false", "0", "", None)):
            return None
        entries.append((name, entry.value))
    return entries


# Per kind of rule file git reads outside the work tree: (the file in the git directory's
# info/, the configuration key naming a file, the name of the XDG default).
_OUTER_RULES = {"exclude": ("exclude", "core.excludesFile", "ignore"),
                "attributes": ("attributes", "core.attributesFile", "attributes")}


def _outer_files(repo: Any, kind: str) -> tuple[str, ...]:
    """The ignore (``kind`` "exclude") or attribute ("attributes") files of ``repo`` outside its
    work tree: ``info/<kind>`` of its git directory and of the common one (a linked worktree),
    and the file ``core.excludesFile`` / ``core.attributesFile`` names or, without it, the XDG
    default as git finds it (``$XDG_CONFIG_HOME/git/ignore``, else ``~/.config/git/ignore``)
    and as libgit2 does (its XDG search path). More files than either reads is only slower.

    Returns:
        Absolute paths, some of which may not exist.
    Raises:
        pygit2.GitError: the configuration could not be read.
    """
    from pygit2.enums import ConfigLevel

    info, key, xdg_name = _OUTER_RULES[kind]
    gitdir = repo.path
    files = [os.path.join(gitdir, "info", info)]
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as handle:
            files.append(os.path.join(gitdir, handle.read().strip(), "info", info))
    except OSError:
        pass
    try:
        configured = str(repo.config[key])
    except KeyError:
        configured = ""
    if configured:
        files.append(os.path.expanduser(configured))
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        files.append(os.path.join(xdg, "git", xdg_name))
        try:
            folders = pygit2.settings.search_path[ConfigLevel.XDG] or ""
        except (AttributeError, ValueError):
            folders = ""
        files += [os.path.join(folder, xdg_name) for folder in folders.split(os.pathsep) if folder]
    return tuple(dict.fromkeys(files))


def _attributes_after_index(repo: Any, files: tuple[str, ...]) -> bool:
    """Whether one of the attribute ``files`` outside the work tree (`_outer_files`) changed
    after, or in the same second as, the last write of ``repo``'s index. Files whose stat data
    is racy (changed in the second the index was written: git is built with 1 s resolution by
    default) git hashes again under the new attributes and may call modified; libgit2 compares
    nanoseconds and does not (found by a helper against the CLI). A ``.gitattributes`` in the
    work tree shows up as changed instead (`_is_attributes`)."""
    changed = []
    for name in files:  # usually none exists: then one stat each
        try:
            changed.append(os.stat(name).st_mtime_ns)
        except OSError:
            continue
    if not changed:
        return False
    try:
        written = os.stat(os.path.join(repo.path, "index")).st_mtime_ns
    except OSError:
        return False
    return max(changed) >= written - 1_000_000_000


def _rules_differ(repo: Any, outer: Outer, found: dict[str, int]) -> bool:
    """Whether ``repo``'s ignore rules (`ignore_rules.differ`) or its attribute files outside
    the work tree (`_attributes_after_index`) may make libgit2 answer differently from git;
    ``found``: ``repo.status(untracked_files="all", ignored=True)``."""
    return ignore_rules.differ(repo, outer[0], found) or _attributes_after_index(repo, outer[1])


# Repositories kept for `status`, per thread (libgit2 objects must not be used by two threads at
# once): str(path) -> [repository, identity, prefix of ``path`` in its work tree, the
# configuration's files (none when it includes others), their `_stamp`, its `Outer` files
# (found again with the object: a changed configuration may name others)]. Opening one
# costs more than the status question on a small repository (0.15-0.3 ms against 0.05-0.1 ms,
# twice per task in a shared checkout). Reuse is safe for this read-only question: libgit2
# re-reads the index and the refs when they change on disk, and the identity (the inodes of
# ``path``, the work tree's ``.git`` and the git directory, and the configuration's digest)
# catches a checkout removed and made again at the same place and a changed configuration.
_kept = threading.local()
_KEPT_PER_THREAD = 8


def _identity(path: Path, repo: Any) -> tuple[int, ...]:
    found = (os.stat(path), os.stat(os.path.join(repo.workdir, ".git")), os.stat(repo.path))
    return tuple(number for stat in found for number in (stat.st_dev, stat.st_ino))


def _open_kept(path: Path) -> tuple[Any, str, Outer] | None:
    """`_open` for `status`: ``(repository, prefix of path in its work tree with a trailing
    "/", or "", its ignore and attribute files outside the work tree (`_outer_files`))``,
    reusing this thread's repository object for ``path`` while it is the same
    checkout; None when libgit2 should not be used."""
    kept: dict[str, list[Any]] = _kept.__dict__.setdefault("repos", {})
    key = str(path)
    entry = kept.pop(key, None)
    if entry is not None:
        repo, identity, prefix, files, stamp, _ = entry
        try:
            if _identity(path, repo) == identity[:-1]:
                # The configuration's files unchanged: its digest is too (a stat each, where
                # listing the entries costs 50-80 us). With includes, always the digest.
                now = _stamp(files) if files else None
                if now is not None and now == stamp:
                    kept[key] = entry  # the most recently used last
                    return repo, prefix, entry[5]
                if _configuration(repo) == identity[-1]:
                    entry[4] = now
                    kept[key] = entry
                    return repo, prefix, entry[5]
        except (pygit2.GitError, KeyError, ValueError, OSError):
            pass
    repo = _open(path)
    if repo is None:
        return None
    try:
        files = _config_files(repo)
        stamp = _stamp(files)
        # Opened again after the stamp: a change between the first load and the stamp would
        # otherwise be in neither (rare: once per thread and checkout).
        repo = _open(path)
        if repo is None:
            return None
        prefix = Path(os.path.relpath(Path(path).resolve(), Path(repo.workdir).resolve())).as_posix()
        entries = _config_entries(repo)
        identity = _identity(path, repo) + (None if entries is None else hash(tuple(entries)),)
        outer = (_outer_files(repo, "exclude"), _outer_files(repo, "attributes"))
    except (pygit2.GitError, KeyError, ValueError, OSError):
        return None
    if entries is None or any(name.startswith("include") for name, _ in entries):
        files = ()  # included files are not stamped: every look lists the entries
    prefix = "" if prefix == "." else prefix + "/"
    kept[key] = [repo, identity, prefix, files, stamp, outer]
    while len(kept) > _KEPT_PER_THREAD:
        kept.pop(next(iter(kept)))
    return repo, prefix, outer


def _forget_kept(path: Path) -> None:
    getattr(_kept, "repos", {}).pop(str(path), None)


def _kept_repo(path: Path, *, index: bool = False) -> Any:
    """This thread's repository object for the work tree or git directory at ``path``
    (`_open_kept`: opened again when the checkout or the configuration changed), or None when
    libgit2 should not be used. Opening one costs 100-150 us, and a worktree task asked four
    times. ``index``: re-read the index first when its file changed on disk (the git CLI, or
    another thread's object, may have written it; libgit2 compares its size, inode and
    nanosecond mtime). A write that fails drops the object (`_forget_kept`)."""
    opened = _kept_opened(path, index=index)
    return None if opened is None else opened[0]


def _kept_opened(path: Path, *, index: bool = False) -> tuple[Any, str, Outer] | None:
    """`_kept_repo` with the rest of `_open_kept`'s answer."""
    opened = _open_kept(path)
    if opened is None:
        return None
    if index:
        try:
            opened[0].index.read(False)
        except (pygit2.GitError, OSError, ValueError):
            _forget_kept(path)
            return None
    return opened


def _porcelain(flags: int) -> str:
    """``git status --porcelain=v1``'s two-letter code for libgit2 status ``flags``."""
    if flags & FileStatus.CONFLICTED:
        return "UU"
    if flags & FileStatus.WT_NEW and not flags & (FileStatus.INDEX_NEW | FileStatus.INDEX_MODIFIED):
        return "??"
    index = ("A" if flags & FileStatus.INDEX_NEW else "M" if flags & FileStatus.INDEX_MODIFIED
             else "D" if flags & FileStatus.INDEX_DELETED else "R" if flags & FileStatus.INDEX_RENAMED
             else "T" if flags & FileStatus.INDEX_TYPECHANGE else " ")
    tree = ("M" if flags & FileStatus.WT_MODIFIED else "D" if flags & FileStatus.WT_DELETED
            else "T" if flags & FileStatus.WT_TYPECHANGE else "R" if flags & FileStatus.WT_RENAMED
            else " ")
    return index + tree


def status(path: Path) -> dict[str, str] | None:
    """``git status --porcelain=v1 --untracked-files=all --no-renames -- .`` run in ``path``, in
    process.

    Returns:
        ``{path: "XY"}`` for the paths under ``path`` that differ from ``HEAD`` (relative to
        ``path``, ``/`` separators, ignored files left out); None when libgit2 cannot answer
        like git (the module docstring): run the CLI.
    """
    opened = _open_kept(path)
    if opened is None:
        return None
    repo, prefix, outer = opened
    try:
        if prefix.startswith("../"):
            return None
        found = repo.status(untracked_files="all", ignored=True)
        if _rules_differ(repo, outer, found):
            return None
        changes = {}
        for name, flags in found.items():
            flags &= ~FileStatus.IGNORED  # an ignored file git rm --cached is still "D "
            if not flags:
                continue
            if _is_attributes(name):  # anywhere: a parent folder's rules apply here
                return None
            if not name.startswith(prefix):
                continue
            if _maybe_intent_to_add(repo, name, flags):
                return None
            if flags & (FileStatus.WT_NEW | FileStatus.WT_MODIFIED) and _reencoded(repo, name):
                return None
            changes[name[len(prefix):]] = _porcelain(flags)
    except (pygit2.GitError, OSError, ValueError, KeyError):
        _forget_kept(path)  # open it afresh next time
        return None
    return changes


def _maybe_intent_to_add(repo: Any, name: str, flags: int) -> bool:
    """Whether ``name``'s index entry may be a ``git add -N`` (of a new path, or after
    ``git rm --cached``): staged against ``HEAD`` as the empty blob, which is what such an entry
    records. libgit2 does not tell the flag apart: where git says " A", " D" or "DA" it says
    "AM", "AD" or "MM", or "A " and "M " when the file is empty too, and its ``add -A`` leaves
    the flag on an empty file's entry, which git's clears (on a changed file its ``add`` and
    ``remove`` do what git's do). A plain ``git add`` of an empty file looks the same and goes
    to git too, only slower."""
    return bool(flags & (FileStatus.INDEX_NEW | FileStatus.INDEX_MODIFIED)) \
        and str(repo.index[name].id) == _EMPTY_BLOB


def _reencoded(repo: Any, name: str) -> bool:
    """Whether git converts ``name`` from a ``working-tree-encoding`` (e.g. UTF-16) on the way
    in, which libgit2 does not do: it would hash the raw bytes. About 20 us a path."""
    return repo.get_attr(name, "working-tree-encoding") not in (None, False)


# The bytes git's binary test counts as text (convert.c ``gather_stats``): all but NUL, DEL and
# the controls below 32 other than BS, HT, LF, FF, CR and ESC.
_TEXT_BYTES = bytes((8, 9, 10, 12, 13, 27, *range(32, 127), *range(128, 256)))


def _auto_eol(repo: Any, name: str) -> bool:
    """Whether git may convert ``name``'s line ends automatically on the way in, so that the
    "safer autocrlf" rule of `_cr_rules_differ` applies (convert.c ``convert_attrs``): ``text``
    set to ``auto``; else, when ``text`` is neither set nor unset (a value other than ``auto``,
    ``text=true`` included, counts as unspecified), the older ``crlf`` attribute at ``auto``;
    else, when neither decides, ``core.autocrlf`` true or input. Errs towards True."""
    text = repo.get_attr(name, "text")
    if text is True or text is False:  # set or unset: a fixed conversion, or none
        return False
    if text == "auto":
        return True
    crlf = repo.get_attr(name, "crlf")
    if crlf is True or crlf is False or crlf == "input":
        return False
    if crlf == "auto":
        return True
    try:
        return str(repo.config["core.autocrlf"]).lower() in ("true", "input", "yes", "on", "1")
    except KeyError:
        return False


def _cr_rules_differ(repo: Any, blob_id: Any) -> bool:
    """Whether git and libgit2 may disagree on converting a file whose staged blob is
    ``blob_id``, under an automatic line-end conversion (`_auto_eol`). Both leave the line ends
    as they are when the staged blob already holds carriage returns, but git only when that
    blob is text with CRLF (convert.c ``has_crlf_in_index``), libgit2 at any CR (crlf.c
    ``has_cr_in_index``): a binary blob with a CR, rewritten as CRLF text, is normalised by git
    and not by libgit2 (found by tests/vcs/test_libgit.py). A staged blob with a CR is left to
    git unless it is plainly CRLF text: no lone CR and no byte git's binary test counts against
    text (git tolerates a few; this check none)."""
    data = repo[blob_id].data
    if b"\r" not in data:
        return False
    return data.count(b"\r") != data.count(b"\r\n") or bool(data.translate(None, _TEXT_BYTES))


def _is_attributes(name: str) -> bool:
    """Whether ``name`` (a changed path) is a ``.gitattributes``. Files that did not change
    but read differently under the new attributes are noticed by git when their stat data is
    racy at the 1 s resolution git is built with by default, and not by libgit2, which compares
    nanoseconds (found by tests/vcs/test_libgit.py)."""
    return name == ".gitattributes" or name.endswith("/.gitattributes")


def stage_all(path: Path, base: str) -> list[str] | None:
    """``git add -A`` in the work tree at ``path``, then the staged paths that differ from
    commit ``base`` (``git diff --cached --name-only --no-renames BASE``), in process.

    Returns:
        The changed paths (repository-relative, sorted); None when libgit2 cannot do it like git
        (the module docstring: nothing was written then): run the CLI.
    """
    opened = _kept_opened(path, index=True)
    if opened is None:
        return None
    changed = _stage_all(opened[0], base, opened[2])
    if changed is None:  # its index may hold part of the additions: open it afresh next time
        _forget_kept(path)
    return changed


def _stage_all(repo: Any, base: str, outer: Outer) -> list[str] | None:
    changes = FileStatus.WT_NEW | FileStatus.WT_MODIFIED | FileStatus.WT_DELETED | FileStatus.WT_TYPECHANGE
    try:
        index = repo.index
        found = repo.status(untracked_files="all", ignored=True)
        if _rules_differ(repo, outer, found):
            return None
        for name, flags in found.items():
            flags &= ~FileStatus.IGNORED  # (as in `status`)
            if not flags:
                continue
            if flags & FileStatus.CONFLICTED or _is_attributes(name):
                return None
            if not flags & changes and _maybe_intent_to_add(repo, name, flags):
                return None  # libgit2 would leave the intent-to-add flag that git clears
            if flags & FileStatus.WT_DELETED:
                index.remove(name)
            elif flags & (FileStatus.WT_NEW | FileStatus.WT_MODIFIED | FileStatus.WT_TYPECHANGE):
                if _reencoded(repo, name):
                    return None
                found = Path(repo.workdir) / name
                if not found.is_symlink() and found.is_dir():  # an embedded repository: git's call
                    return None
                if flags & FileStatus.WT_TYPECHANGE and not found.is_symlink():
                    # A symlink or gitlink turned file: libgit2 skips the CRLF normalisation
                    # git applies (it takes a non-file index entry for one holding CRs).
                    return None
                if flags & FileStatus.WT_MODIFIED and _auto_eol(repo, name) \
                        and _cr_rules_differ(repo, index[name].id):
                    return None
                index.add(name)
        tree = index.write_tree()
        diff = repo.get(base).peel(pygit2.Tree).diff_to_tree(repo.get(tree))
        index.write()
    except (pygit2.GitError, OSError, ValueError, KeyError, AttributeError):
        return None
    changed = {delta.old_file.path for delta in diff.deltas} | {delta.new_file.path for delta in diff.deltas}
    return sorted(changed)


def commit(path: Path, *, branch: str, parent: str, message: str, name: str,
           email: str) -> str | None:
    """Commit the index of the work tree at ``path`` on ``branch`` (which must point at
    ``parent``; the worktree's ``HEAD`` names it), author and committer ``name <email>`` now,
    in process; like ``git commit -q --allow-empty --no-verify -F -`` with hooks and signing
    off. ``message`` must be as git would store it (see `_cleaned`), else the CLI cleans it.

    Returns:
        The new commit's id (40 hex digits); None when libgit2 cannot do it like git: run the
        CLI (nothing was written then, except possibly the commit object, which git ignores
        until a ref names it).
    """
    if message != _cleaned(message):  # git would clean it; libgit2 writes it as given
        return None
    repo = _kept_repo(path, index=True)
    if repo is None:
        return None
    try:
        if repo.head.name != f"refs/heads/{branch}" or str(repo.head.target) != parent:
            return None
        tree = repo.index.write_tree()
        who = pygit2.Signature(name, email)
        return str(repo.create_commit(f"refs/heads/{branch}", who, who, message, tree,
                                      [pygit2.Oid(hex=parent)]))
    except (pygit2.GitError, OSError, ValueError, KeyError):
        _forget_kept(path)
        return None


def _cleaned(message: str) -> str:
    """``message`` as ``git commit -F`` stores it (``--cleanup=whitespace``, git's
    ``strbuf_stripspace``): trailing whitespace off each line, runs of blank lines made one,
    no leading or trailing blank line, a final newline. Python's notion of whitespace is wider
    than git's; a message that differs only there goes to the CLI, which is merely slower."""
    lines = [line.rstrip() for line in message.split("\n")]
    kept: list[str] = []
    for line in lines:
        if line or (kept and kept[-1]):
            kept.append(line)
    while kept and not kept[-1]:
        kept.pop()
    return "".join(line + "\n" for line in kept)


def move_ref(repo_path: Path, ref: str, new: str, old: str) -> bool | None:
    """``git update-ref REF NEW OLD`` in process: move ``ref`` (e.g. ``refs/heads/x``) to commit
    ``new`` only if it still points at ``old`` (libgit2 checks that under the ref's lock).

    Returns:
        True when moved; False when ``ref`` no longer points at ``old`` (nothing moved); None
        when libgit2 cannot do it like git: run the CLI.
    """
    repo = _kept_repo(repo_path)
    if repo is None:
        return None
    try:
        current = repo.references.get(ref)
        if current is None or current.type != pygit2.enums.ReferenceType.DIRECT:
            return None
        if str(current.target) != old:
            return False
        current.set_target(pygit2.Oid(hex=new))  # fails if it moved since it was read
        return True
    except pygit2.GitError as error:
        return False if "does not match" in str(error) else None
    except (OSError, ValueError, KeyError):
        return None


def add_worktree(repo_path: Path, *, name: str, path: Path, branch: str, base: str) -> bool:
    """``git worktree add --force -B BRANCH PATH BASE`` in process: (re)point ``branch`` at
    commit ``base`` and check it out in a new worktree at ``path`` (which must not exist),
    administered as ``name``.

    Returns:
        True when the worktree stands; False when libgit2 could not make it like git (``path``
        exists, ``base`` holds a ``.gitattributes``, a record of ``name`` is left; then ``path``
        does not exist and the branch may point at ``base``): run the CLI.
    """
    repo = _open(repo_path)
    if repo is None or path.exists():
        return False
    try:
        if _has_attributes(repo, repo.get(base).peel(pygit2.Tree)):
            return False
        reference = repo.create_reference_direct(f"refs/heads/{branch}", pygit2.Oid(hex=base), True)
        repo.add_worktree(name, str(path), reference)
        return True
    except (pygit2.GitError, OSError, ValueError, KeyError, AttributeError):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return False


def _has_attributes(repo: Any, tree: Any) -> bool:
    """Whether ``tree`` holds a ``.gitattributes`` at any depth. libgit2 checks a new worktree
    out before its index exists, so a file written before the ``.gitattributes`` that governs it
    (the file itself, ``+x`` or ``-x`` in the same folder) misses its eol/ident conversion; git
    reads the attributes of the tree it checks out. About 1 ms for 5,000 files in 500 folders."""
    if ".gitattributes" in tree:
        return True
    return any(entry.type_str == "tree" and _has_attributes(repo, repo[entry.id]) for entry in tree)


def remove_worktree(repo_path: Path, *, name: str, path: Path) -> bool:
    """``git worktree remove --force --force PATH`` in process: delete the worktree at ``path``
    (administered as ``name``) and git's record of it; its branch stays.

    Returns:
        True when neither the folder nor the record is left; False when libgit2 could not do it
        like git (e.g. the record of ``name`` points elsewhere): run the CLI.
    """
    import shutil

    repo = _open(repo_path)
    if repo is None:
        return False
    try:
        try:
            worktree = repo.lookup_worktree(name)
        except (pygit2.GitError, KeyError):
            worktree = None
        if worktree is not None and Path(worktree.path).resolve() != path.resolve():
            return False
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            return False
        if worktree is not None:
            worktree.prune(True)
        return True
    except (pygit2.GitError, OSError, ValueError):
        return False


def ensure_branch(repo_path: Path, branch: str) -> str | None:
    """``git rev-parse --verify refs/heads/BRANCH``, or when it does not exist ``git branch
    --no-track BRANCH HEAD``, in process.

    Returns:
        The commit the branch points at (40 hex digits); None when libgit2 cannot answer like
        git (no commit at ``HEAD``, the branch is symbolic, ...): run the CLI.
    """
    repo = _open(repo_path)
    if repo is None:
        return None
    name = f"refs/heads/{branch}"
    for _ in range(2):  # a concurrent creation between the look-up and ours: look again
        try:
            found = repo.references.get(name)
            if found is not None:
                if found.type != pygit2.enums.ReferenceType.DIRECT:
                    return None
                return str(found.peel(pygit2.Commit).id)
            head = repo.revparse_single("HEAD").peel(pygit2.Commit)
            repo.branches.local.create(branch, head, force=False)
            return str(head.id)
        except pygit2.AlreadyExistsError:
            continue
        except (pygit2.GitError, OSError, ValueError, KeyError, AttributeError):
            return None
    return None


def is_ancestor(repo_path: Path, commit: str, of: str) -> bool | None:
    """``git merge-base --is-ancestor COMMIT OF`` in process (a commit is its own ancestor).

    Returns:
        Whether ``commit`` is ``of`` or one of its ancestors; None when libgit2 cannot answer
        like git: run the CLI.
    """
    repo = _kept_repo(repo_path)
    if repo is None:
        return None
    try:
        return commit == of or bool(repo.descendant_of(pygit2.Oid(hex=of), pygit2.Oid(hex=commit)))
    except (pygit2.GitError, ValueError, KeyError):
        return None


def _side(repo: Any, base: Any, tip: Any) -> set[str] | None:
    """The paths one side of a merge added or modified since ``base``; None when it deleted,
    renamed or retyped anything (then a merge may need rename detection: git's call)."""
    paths: set[str] = set()
    for delta in repo.diff(base, tip).deltas:
        if delta.status not in (pygit2.enums.DeltaStatus.ADDED, pygit2.enums.DeltaStatus.MODIFIED):
            return None
        paths.add(delta.new_file.path)
    return paths


def _parents(path: str) -> set[str]:
    parts = path.split("/")
    return {"/".join(parts[:end]) for end in range(1, len(parts))}


def merge_disjoint(repo_path: Path, *, head: str, task: str, base: str, message: str, name: str,
                   email: str) -> str | None:
    """Merge commit ``task`` (made on ``base``) into ``head`` in process when both sides since
    ``base`` only added or modified files, and no file of one side is a file or a folder of the
    other: the merged tree is then the union of the two sides, which any merge algorithm (git's
    ``ort`` included) gives; like ``git merge-tree --write-tree HEAD TASK`` and ``git commit-tree
    -p HEAD -p TASK``, author and committer ``name <email>``.

    Returns:
        The merge commit's id (parents ``head``, ``task``; no ref moved); None when the change is
        not of that shape or libgit2 fails: run the CLI, which also reports conflicts.
    """
    repo = _open(repo_path)
    if repo is None:
        return None
    try:
        if not repo.descendant_of(pygit2.Oid(hex=head), pygit2.Oid(hex=base)):
            return None  # the branch was moved by hand: ``base`` is not the merge base
        trees = [repo.get(commit).peel(pygit2.Tree) for commit in (base, head, task)]
        ours, theirs = _side(repo, trees[0], trees[1]), _side(repo, trees[0], trees[2])
        if ours is None or theirs is None or ours & theirs:
            return None
        if any(_parents(path) & theirs for path in ours) or any(_parents(path) & ours for path in theirs):
            return None
        index = repo.merge_trees(trees[0], trees[1], trees[2])
        if index.conflicts is not None:
            return None
        who = pygit2.Signature(name, email)
        return str(repo.create_commit(None, who, who, message, index.write_tree(repo),
                                      [pygit2.Oid(hex=head), pygit2.Oid(hex=task)]))
    except (pygit2.GitError, ValueError, KeyError, AttributeError):
        return None


def _short(target: Any) -> str:
    """A HEAD target as git's checkout reflog names it: a branch without ``refs/heads/``, else
    the commit id."""
    text = str(target)
    return text[len("refs/heads/"):] if text.startswith("refs/heads/") else text


def _checked_out_elsewhere(repo: Any, ref: str) -> bool:
    """Whether a work tree of ``repo``'s repository other than ``repo``'s own has ``ref`` as its
    HEAD, read from the HEAD files (the main one and ``worktrees/*/HEAD`` of the common git
    directory), as libgit2's ``git_branch_is_checked_out`` decides it. A HEAD that cannot be
    read counts as a yes: the reset is then declined, and `ftl.vcs.worktrees` asks git."""
    gitdir = os.path.normpath(repo.path)
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as file:
            common = os.path.normpath(os.path.join(gitdir, file.read().strip()))
    except FileNotFoundError:  # the main work tree's git directory is the common one
        common = gitdir
    gitdirs = [common]  # the main work tree's, then each linked work tree's
    try:
        gitdirs += [os.path.join(common, "worktrees", name) for name in os.listdir(os.path.join(common, "worktrees"))]
    except FileNotFoundError:
        pass
    wanted = f"ref: {ref}"
    for directory in gitdirs:
        if directory == gitdir:
            continue
        try:
            with open(os.path.join(directory, "HEAD"), encoding="utf-8") as file:
                if file.read().strip() == wanted:
                    return True
        except OSError:
            return True
    return False


def reset_worktree(path: Path, *, branch: str, base: str) -> bool:
    """``git checkout --force -B BRANCH BASE && git clean -ffdx`` in the existing worktree at
    ``path``, in process: only the files that differ are written, so a worktree reused for the
    next task costs what the two trees differ by, not a checkout of every file.

    Returns:
        True when the worktree is at ``base`` on ``branch`` with nothing else in it (checked
        afterwards: no change, no untracked or ignored file); False when libgit2 could not do
        it like git (``base`` holds a ``.gitattributes``, or something is left): run the CLI.
    """
    repo = _kept_repo(path, index=True)
    if repo is None:
        return False
    ref = f"refs/heads/{branch}"
    try:
        commit = repo.get(base).peel(pygit2.Commit)
        if _has_attributes(repo, commit.tree) or _checked_out_elsewhere(repo, ref):
            return False  # never move another work tree's branch (`Worktrees._reset` then checks too)
        current = repo.references["HEAD"].target
        repo.create_reference_direct(ref, commit.id, True)
        # Always: a status that looks clean can hide what the checkout removes or rewrites (an
        # empty untracked folder, an edit to an assume-unchanged file).
        repo.checkout_tree(commit.tree, strategy=pygit2.enums.CheckoutStrategy.FORCE
                           | pygit2.enums.CheckoutStrategy.REMOVE_UNTRACKED
                           | pygit2.enums.CheckoutStrategy.REMOVE_IGNORED)
        # ``set_head`` less its own "checked out elsewhere" check, done above: libgit2 opens every
        # work tree of the repository as a repository for it (0.6 ms with one, 1.5 with eight).
        repo.create_reference_symbolic("HEAD", ref, True, message=(
            f"checkout: moving from {_short(current)} to {branch}"))
        repo.index.read(True)
        if not repo.status(untracked_files="all", ignored=True) and str(repo.head.target) == base:
            return True
        _forget_kept(path)  # the CLI takes over: open it afresh after
        return False
    except (pygit2.GitError, OSError, ValueError, KeyError, AttributeError):
        _forget_kept(path)
        return False
