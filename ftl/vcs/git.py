"""Run git: one small wrapper, so every git call ftl makes has the same environment and errors.

ftl's own git calls never prompt (``GIT_TERMINAL_PROMPT=0``), never run the user's hooks
(``core.hooksPath=/dev/null``: a pre-commit hook is the user's gate for the user's commits, not
for ftl's bookkeeping commits), never start an automatic gc in the middle of a campaign
(``gc.auto=0``) and never sign (``commit.gpgsign=false``: signing may ask for a passphrase).
Output is read in the C locale so messages parse the same everywhere.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["Git", "GitError", "GIT_OPTIONS"]

GIT_OPTIONS: tuple[str, ...] = ("-c", "core.hooksPath=/dev/null", "-c", "gc.auto=0",
                                "-c", "commit.gpgsign=false", "-c", "advice.detachedHead=false")
_TIMEOUT_S = 120.0  # one git call; a hung call (a lock held by a dead process) must not hang ftl


class GitError(Exception):
    """A git command failed.

    Attributes:
        args_: the git arguments (without the global options).
        returncode: git's exit status (None when it timed out or could not start).
        stderr: git's message, trimmed to 2,000 characters (may hold paths: log it, never put
            it in a response).
    """

    def __init__(self, args: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.args_ = list(args)
        self.returncode = returncode
        self.stderr = stderr.strip()[-2000:]
        super().__init__(f"git {' '.join(self.args_[:3])} exited {returncode}: {self.stderr[:200]}")

    def __reduce__(self) -> tuple:  # picklable: it crosses process boundaries (Ray workers)
        return (GitError, (self.args_, self.returncode, self.stderr))


class Git:
    """git in one directory (a work tree or a repository).

    Args:
        cwd: the directory git runs in.
        env: extra environment (e.g. author and committer identity).
    """

    def __init__(self, cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self.cwd = cwd
        self._env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", **(env or {})}
        self._env.pop("GIT_DIR", None)  # a hook's environment must not redirect ftl's calls
        self._env.pop("GIT_WORK_TREE", None)
        self._env.pop("GIT_INDEX_FILE", None)

    def run(self, *args: str, ok_codes: tuple[int, ...] = (0,), input: str | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``git ARGS``; return the completed process (text stdout/stderr).

        Raises:
            GitError: the exit status is not in ``ok_codes``, git is missing, or the call ran
                past 120 s.
        """
        try:
            done = subprocess.run(["git", *GIT_OPTIONS, *args], cwd=self.cwd, input=input,
                                  capture_output=True, text=True, timeout=_TIMEOUT_S,
                                  env={**self._env, **(env or {})}, check=False)
        except FileNotFoundError:
            raise GitError(args, None, "git is not installed") from None
        except subprocess.TimeoutExpired:
            raise GitError(args, None, f"timed out after {_TIMEOUT_S:g} s") from None
        if done.returncode not in ok_codes:
            raise GitError(args, done.returncode, done.stderr or done.stdout)
        return done

    def out(self, *args: str, input: str | None = None) -> str:
        """``git ARGS``'s stdout without the trailing newline. Raises GitError on failure."""
        return self.run(*args, input=input).stdout.rstrip("\n")

    def ok(self, *args: str) -> bool:
        """True when ``git ARGS`` exits 0 (a question such as ``merge-base --is-ancestor``)."""
        try:
            return self.run(*args).returncode == 0
        except GitError:
            return False
