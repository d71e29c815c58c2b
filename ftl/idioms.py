"""Idioms checked by code: the files a task changed against its plan's and framework's idioms.

FTL only asked builders to respect ``idioms.required`` / ``idioms.forbidden`` (QUALITY step,
enforced strictly at framework confidence >= 0.6; ``shared/reference/ftl-behaviour.md`` §5.5,
§7). ftl checks them after a task's build and before its verify (issue 15):

* a plan entry that is a plain string stays guidance for agents and is not checked;
* a plan entry ``{"text", "pattern", "language"}`` is an ast-grep pattern (``ast-grep-py``, no
  home-made parser) matched in the changed files of that language; ``{"text", "regex"}`` is a
  Python regular expression matched line by line in every changed text file;
* frameworks detected by the pattern explorer at confidence >= `FRAMEWORK_MIN_CONFIDENCE` bring
  their own rules from `FRAMEWORK_IDIOMS` (FastAPI, Flask, pytest); the plan's rules are added.

A forbidden rule that matches is a violation at ``file:line``; a required rule that matches in
none of the changed files of its language is a violation naming those files (a task that
changed no file of the rule's language is not held to it). `violation_error` turns violations
into the registry's ``idiom_violation`` (structural, route block_task).

Pure apart from reading the changed files; imports only ftl's models and errors.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Literal, Mapping, Sequence

from ftl.errors import FtlError
from ftl.models import IDIOM_LANGUAGES, IdiomRule, Idioms

log = logging.getLogger("ftl.idioms")

__all__ = ["CodeIdiom", "Violation", "FRAMEWORK_IDIOMS", "FRAMEWORK_MIN_CONFIDENCE",
           "check_idioms", "code_idioms", "detected_frameworks", "violation_error"]

#: FTL applies framework idioms strictly only from this detection confidence on (§5.5).
FRAMEWORK_MIN_CONFIDENCE = 0.6
#: Confidence given to pytest when the pattern explorer reports it as the test runner: FTL's
#: registry tier for a framework known from the project's configuration only (§5.5).
TEST_RUNNER_CONFIDENCE = 0.65
#: Files larger than this are not parsed (generated or vendored code), in bytes.
MAX_FILE_BYTES = 2 * 1024 * 1024
#: Violations reported at most, so a reason stays readable.
MAX_VIOLATIONS = 50

Kind = Literal["required", "forbidden"]


@dataclass(frozen=True)
class CodeIdiom:
    """One idiom that code checks.

    Attributes:
        text: the idiom as agents read it (named in a violation).
        kind: ``required`` (must match somewhere) or ``forbidden`` (must match nowhere).
        source: ``plan`` or ``framework:<name>``.
        rule: an ast-grep rule config for ``SgNode.find_all`` (``{"rule": {...},
            "constraints": {...}}``), or None for a regex idiom.
        language: the ast-grep language of ``rule`` (a key of `ftl.models.IDIOM_LANGUAGES`).
        regex: a Python regular expression matched per line (when ``rule`` is None).
        paths: basename globs of the files the idiom applies to (empty: every file of its
            language), e.g. ``("test_*.py", "*_test.py")``.
    """

    text: str
    kind: Kind
    source: str
    rule: Mapping[str, Any] | None = None
    language: str | None = None
    regex: str | None = None
    paths: tuple[str, ...] = ()

    def applies_to(self, path: str) -> bool:
        """Whether the file ``path`` (POSIX, relative) is one this idiom looks at."""
        pure = PurePosixPath(path)
        if self.rule is not None and pure.suffix not in IDIOM_LANGUAGES[self.language or "python"]:
            return False
        return not self.paths or any(fnmatch.fnmatchcase(pure.name, glob) for glob in self.paths)


@dataclass(frozen=True)
class Violation:
    """A broken idiom.

    Attributes:
        idiom: the idiom's text.
        kind: ``forbidden`` (it matched) or ``required`` (it matched nowhere).
        source: ``plan`` or ``framework:<name>``.
        file: the file where a forbidden idiom matched (relative POSIX path), else None.
        line: 1-based line of the match, else None.
        files: for a required idiom, the changed files it was looked for in.
    """

    idiom: str
    kind: Kind
    source: str
    file: str | None = None
    line: int | None = None
    files: tuple[str, ...] = field(default=())

    @property
    def where(self) -> str:
        """``file:line`` for a forbidden match; ``none of a.py, b.py`` for a missing required."""
        if self.file is not None:
            return f"{self.file}:{self.line}"
        return "none of " + ", ".join(self.files[:5]) + (" ..." if len(self.files) > 5 else "")

    def describe(self) -> str:
        """One line for a block reason, e.g. ``forbidden 'No print calls' at app.py:3``."""
        verb = "at" if self.kind == "forbidden" else "missing in"
        where = self.where if self.kind == "forbidden" else self.where.removeprefix("none of ")
        return f"{self.kind} idiom {self.idiom!r} {verb} {where}"

    def to_dict(self) -> dict[str, Any]:
        return {"idiom": self.idiom, "kind": self.kind, "source": self.source, "file": self.file,
                "line": self.line, "files": list(self.files)}


# --------------------------------------------------------------------------------------------
# The framework registry shipped with ftl


def _inside_async_def(pattern: str) -> dict[str, Any]:
    return {"rule": {"pattern": pattern,
                     "inside": {"kind": "function_definition", "regex": r"^async\s", "stopBy": "end"}}}


_TEST_FILES = ("test_*.py", "*_test.py", "conftest.py")

#: Idioms that ftl checks for a detected framework (keys: the pattern explorer's framework
#: names). Each rule follows the framework's own documentation: FastAPI "Concurrency and
#: async / await" and "Request Body"; Flask "Debug Mode" and "Configuration Handling"
#: (SECRET_KEY); pytest "Asserting with the assert statement" and "tmp_path".
FRAMEWORK_IDIOMS: Mapping[str, tuple[CodeIdiom, ...]] = {
    "fastapi": (
        CodeIdiom("No blocking time.sleep() inside async path operations (await asyncio.sleep)",
                  "forbidden", "framework:fastapi", _inside_async_def("time.sleep($$$)"), "python"),
        CodeIdiom("No blocking requests calls inside async path operations (use httpx.AsyncClient)",
                  "forbidden", "framework:fastapi", _inside_async_def("requests.$METHOD($$$)"),
                  "python"),
        CodeIdiom("Request bodies are pydantic model parameters, not parsed by hand with "
                  "await request.json()", "forbidden", "framework:fastapi",
                  {"rule": {"pattern": "await $REQUEST.json()"},
                   "constraints": {"REQUEST": {"regex": "^(request|req)$"}}}, "python"),
    ),
    "flask": (
        CodeIdiom("Debug mode is not switched on in code: no app.run(debug=True) (use FLASK_DEBUG)",
                  "forbidden", "framework:flask",
                  {"rule": {"pattern": "$APP.run($$$)",
                            "has": {"kind": "keyword_argument", "regex": r"^debug\s*=\s*True$",
                                    "stopBy": "end"}}}, "python"),
        CodeIdiom("The secret key is not hard-coded (read SECRET_KEY from the environment or the "
                  "instance config)", "forbidden", "framework:flask",
                  {"rule": {"any": [{"pattern": "$APP.secret_key = $VALUE"},
                                    {"pattern": "$APP.config[$KEY] = $VALUE"}]},
                   "constraints": {"VALUE": {"kind": "string"},
                                   "KEY": {"regex": "^['\"]SECRET_KEY['\"]$"}}}, "python"),
    ),
    "pytest": (
        CodeIdiom("Tests use plain assert, not unittest's self.assert* methods", "forbidden",
                  "framework:pytest",
                  {"rule": {"pattern": "self.$METHOD($$$)"},
                   "constraints": {"METHOD": {"regex": "^assert"}}}, "python", paths=_TEST_FILES),
        CodeIdiom("Temporary directories come from the tmp_path fixture, not tempfile.mkdtemp()",
                  "forbidden", "framework:pytest",
                  {"rule": {"pattern": "tempfile.mkdtemp($$$)"}}, "python", paths=_TEST_FILES),
    ),
}


# --------------------------------------------------------------------------------------------
# Assembling the rules


def _plan_idiom(entry: IdiomRule, kind: Kind) -> CodeIdiom:
    if entry.pattern is not None:
        return CodeIdiom(entry.text, kind, "plan", {"rule": {"pattern": entry.pattern}}, entry.lang)
    return CodeIdiom(entry.text, kind, "plan", regex=entry.regex)


def code_idioms(idioms: Idioms | Mapping[str, Any] | None,
                frameworks: Mapping[str, float] | None = None) -> list[CodeIdiom]:
    """The idioms to check: registry rules of every framework detected at confidence >=
    `FRAMEWORK_MIN_CONFIDENCE`, then the plan's own object entries (plain strings are skipped).

    Args:
        idioms: the plan's ``idioms`` (`Idioms` or its JSON form).
        frameworks: framework name (case-insensitive) -> detection confidence in [0, 1].
    Raises:
        pydantic.ValidationError: ``idioms`` in JSON form does not match `Idioms`.
    """
    parsed = idioms if isinstance(idioms, Idioms) else Idioms.model_validate(idioms or {})
    rules: list[CodeIdiom] = []
    for name, confidence in sorted((frameworks or {}).items()):
        if confidence is not None and confidence >= FRAMEWORK_MIN_CONFIDENCE:
            rules.extend(FRAMEWORK_IDIOMS.get(name.lower(), ()))
    for kind in ("required", "forbidden"):
        for entry in getattr(parsed, kind):
            if isinstance(entry, IdiomRule):
                rules.append(_plan_idiom(entry, kind))
    return rules


def detected_frameworks(pattern: Mapping[str, Any] | None, *, plan_framework: str | None = None,
                        plan_confidence: float | None = None) -> dict[str, float]:
    """Framework name -> confidence from the pattern explorer's result (and the plan).

    Args:
        pattern: the exploration's ``pattern`` section (`explore_pattern`): its ``frameworks``
            list ``[{name, confidence}]``, its top ``framework``/``confidence``, and
            ``test_runner`` (``pytest`` counts at `TEST_RUNNER_CONFIDENCE`).
        plan_framework, plan_confidence: the plan's ``framework`` / ``framework_confidence``
            (FTL's default confidence 0.5 when the plan gives none, i.e. not applied).
    Returns:
        ``{name: confidence}`` with lower-case names; the highest confidence per name wins.
    """
    found: dict[str, float] = {}

    def add(name: Any, confidence: Any) -> None:
        if not isinstance(name, str) or not name or name.lower() == "none":
            return
        try:
            value = float(confidence)
        except (TypeError, ValueError):
            value = 0.5  # FTL's default confidence
        found[name.lower()] = max(found.get(name.lower(), 0.0), value)

    pattern = pattern or {}
    for entry in pattern.get("frameworks") or ():
        if isinstance(entry, Mapping):
            add(entry.get("name"), entry.get("confidence"))
    add(pattern.get("framework"), pattern.get("confidence"))
    if pattern.get("test_runner") == "pytest":
        add("pytest", TEST_RUNNER_CONFIDENCE)
    add(plan_framework, plan_confidence)
    return found


# --------------------------------------------------------------------------------------------
# Checking


def _safe_relative(root: Path, name: str) -> str | None:
    """``name`` as a POSIX path relative to ``root``, or None when it leaves ``root``."""
    pure = PurePosixPath(str(name).replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        return None
    return pure.as_posix()


def _read(root: Path, relative: str) -> str | None:
    path = root / relative
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None  # binary
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _matches(idiom: CodeIdiom, text: str, roots: dict[str, Any]) -> list[int]:
    """1-based lines where ``idiom`` matches ``text``."""
    if idiom.rule is None:
        compiled = re.compile(idiom.regex or "")
        return [number for number, line in enumerate(text.splitlines(), 1) if compiled.search(line)]
    language = idiom.language or "python"
    root = roots.get(language)
    if root is None:
        from ast_grep_py import SgRoot  # a native module: loaded only when a rule needs it

        root = roots[language] = SgRoot(text, language).root()
    return sorted({node.range().start.line + 1 for node in root.find_all(dict(idiom.rule))})


def check_idioms(root: Path | str, changed_files: Iterable[str],
                 idioms: Idioms | Mapping[str, Any] | None,
                 frameworks: Mapping[str, float] | None = None) -> list[Violation]:
    """Check the files a task changed against its idioms (issue 15 item 1).

    Args:
        root: the directory the paths are relative to (the task's worktree or the repository).
        changed_files: relative POSIX paths the task changed (the builder's
            ``files_changed``); deleted, binary, non-UTF-8 and larger than `MAX_FILE_BYTES`
            files are not read, paths that leave ``root`` are ignored.
        idioms: the plan's idioms; plain-string entries are guidance and are not checked.
        frameworks: ``{name: confidence}`` (see `detected_frameworks`); registry rules apply
            at confidence >= `FRAMEWORK_MIN_CONFIDENCE`.
    Returns:
        the violations, forbidden matches first in file and line order, then missing required
        idioms; at most `MAX_VIOLATIONS`. Empty when every checked idiom holds.
    Raises:
        pydantic.ValidationError: ``idioms`` in JSON form does not match `ftl.models.Idioms`.
    """
    base = Path(root)
    rules = code_idioms(idioms, frameworks)
    if not rules:
        return []
    texts: dict[str, str] = {}
    for name in dict.fromkeys(changed_files):
        relative = _safe_relative(base, name)
        if relative is None:
            log.warning("idiom check: ignoring path outside the root: %r", name)
            continue
        text = _read(base, relative)
        if text is not None:
            texts[relative] = text
    parsed: dict[str, dict[str, Any]] = {path: {} for path in texts}
    forbidden: list[Violation] = []
    required: list[Violation] = []
    for idiom in rules:
        files = [path for path in texts if idiom.applies_to(path)]
        if not files:
            continue
        hits = [(path, line) for path in files for line in _matches(idiom, texts[path], parsed[path])]
        if idiom.kind == "forbidden":
            forbidden += [Violation(idiom.text, "forbidden", idiom.source, path, line)
                          for path, line in hits]
        elif not hits:
            required.append(Violation(idiom.text, "required", idiom.source, files=tuple(files)))
    forbidden.sort(key=lambda v: (v.file or "", v.line or 0, v.idiom))
    return (forbidden + required)[:MAX_VIOLATIONS]


def violation_error(seq: str, violations: Sequence[Violation]) -> FtlError:
    """The registry's ``idiom_violation`` for task ``seq`` (structural; route block_task).

    The message names the first violation's idiom text and ``file:line`` and counts the rest;
    ``details`` carry ``seq``, ``idiom`` (first idiom's text) and ``violations`` (each
    `Violation.to_dict`, relative paths only).

    Raises:
        ValueError: ``violations`` is empty.
    """
    if not violations:
        raise ValueError("violation_error needs at least one violation")
    first = violations[0]
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    message = f"Task {seq} breaks a project idiom: {first.describe()}{more}."
    return FtlError("idiom_violation",
                    {"seq": seq, "idiom": first.idiom, "where": first.where,
                     "violations": [v.to_dict() for v in violations]},
                    message=message)
