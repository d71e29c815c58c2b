"""The four explorer tools (structure, pattern, memory, delta): what EXPLORE learns about a repo.

Each tool is ``fn(args: ExploreArgs, ctx: ToolContext) -> dict`` and returns an FTL explorer
result (``shared/reference/ftl-behaviour.md`` §5.5) with the documented key names: ``mode``,
``status`` (``ok`` | ``partial`` | ``error``), ``error`` when status is error, and the mode's
findings. A tool that runs out of time or is cancelled returns what it found so far with status
``partial`` and ``stopped`` (``"timeout"`` | ``"cancelled"``); an unexpected failure (an unreadable
tree, a broken store) is status ``error`` with ``error`` and ``error_type``, never an exception,
so EXPLORE's quorum can count it; unexpected exceptions are logged server-side with the
correlation id and reported as ``internal_error`` without internals.

Unlike FTL's explorers (an LLM running shell commands with a tool budget), these are plain code:
deterministic for a given tree, store and objective.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import json
import logging
import os
import re
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from ftl.errors import FtlError
from ftl.server.tools.context import ToolContext
from ftl.server.tools.proc import SKIP_DIRS, git_status

log = logging.getLogger("ftl.server.tools.explorers")

__all__ = ["ExploreArgs", "explore_structure", "explore_pattern", "explore_memory",
           "explore_delta", "keywords", "relevance", "detect_frameworks", "declared_packages",
           "parse_readme_idioms", "score_candidate", "FRAMEWORKS"]


class ExploreArgs(BaseModel):
    """Arguments of every explorer tool."""

    model_config = ConfigDict(extra="forbid")
    objective: str = Field("", description="The campaign objective; memory and delta rank by it.")
    campaign_id: str | None = Field(None, description="The campaign being explored, if any.")
    timeout_s: float = Field(300.0, gt=0, description="Time limit, s; past it the result is partial.")


# --------------------------------------------------------------------------- shared helpers

class _Limits:
    """A deadline plus the invocation's cancel flag; `stop` says why work must end, if it must."""

    def __init__(self, timeout_s: float, cancel: threading.Event,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.deadline = clock() + timeout_s
        self.cancel = cancel
        self.stopped: str | None = None

    def stop(self) -> bool:
        if self.stopped is None:
            if self.cancel.is_set():
                self.stopped = "cancelled"
            elif self.clock() >= self.deadline:
                self.stopped = "timeout"
        return self.stopped is not None

    def remaining_s(self) -> float:
        return max(0.001, self.deadline - self.clock())


def _finish(mode: str, limits: _Limits, findings: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": mode, "status": "partial" if limits.stopped else "ok"}
    if limits.stopped:
        result["stopped"] = limits.stopped
    result.update(findings)
    return result


def _guarded(mode: str, args: ExploreArgs, ctx: ToolContext,
             body: Callable[[_Limits], dict[str, Any]]) -> dict[str, Any]:
    """Run an explorer body; any failure becomes an FTL error result (``{mode, status, error}``)."""
    limits = _Limits(args.timeout_s, ctx.cancel)
    ctx.progress({"message": f"explorer {mode} started", "percent": None})
    try:
        findings = body(limits)
    except FtlError as exc:  # registry messages are safe to show
        return {"mode": mode, "status": "error", "error": exc.message, "error_type": exc.error_type}
    except Exception as exc:  # an explorer reports, EXPLORE's quorum decides
        # Details (paths, traces) stay in the server log, keyed by the correlation id.
        log.exception("explorer %s failed (correlation id %s)", mode, ctx.correlation_id)
        return {"mode": mode, "status": "error", "error_type": "internal_error",
                "error": f"{type(exc).__name__} in the {mode} explorer "
                         f"(correlation id {ctx.correlation_id or 'none'})"}
    return _finish(mode, limits, findings)


def _is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").exists()


def _inside(root: str, path: Path) -> bool:
    """Whether ``path``, its symbolic links followed, is inside ``root`` (a `os.path.realpath`):
    a link out of the repository (``creds.py -> ../outside/creds.py``) is not the repository's
    to read."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _iter_files(repo: Path, limits: _Limits) -> Iterator[Path]:
    """Repository files (relative paths) in sorted order, skipping `SKIP_DIRS`, virtualenvs,
    ``*.egg-info`` and symbolic links that lead out of the repository (`_inside`; os.walk does
    not enter linked directories); stops early when `limits` say so."""
    root_real = os.path.realpath(repo)
    for root, dirs, names in os.walk(repo):
        if limits.stop():
            return
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")
                         and not _is_venv(Path(root, d)))
        base = Path(root).relative_to(repo)
        for name in sorted(names):
            if limits.stop():
                return
            full = Path(root, name)
            if os.path.islink(full) and not _inside(root_real, full):
                continue
            yield base / name


READ_LIMIT_BYTES = 512 * 1024  # larger files are not read (generated code, data, lock files)


def _read_text(repo: Path, path: Path | str, limit_bytes: int = READ_LIMIT_BYTES) -> str | None:
    """The text of ``path`` (relative to ``repo``, or under it), UTF-8 with replacement, or None
    when it is not a regular file inside the repository (`_inside`: no link out of it, no FIFO,
    device or directory), is larger than ``limit_bytes``, looks binary (a NUL in its first
    8 KiB) or cannot be read.

    The file is opened without blocking (a FIFO would wait for a writer) and checked on the
    open descriptor (``fstat``), so what is measured is what is read.
    """
    full = repo / path
    if not _inside(os.path.realpath(repo), full):
        return None
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > limit_bytes:
                return None
            data = handle.read(limit_bytes + 1)
    except OSError:
        return None
    if len(data) > limit_bytes or b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


_STOPWORDS = frozenset("""
a an and are as at be been but by can do does for from has have how if in into is it its make
makes making new not of on or our should so than that the their them then there these this those
to use used uses using via was we were what when where which while will with without would you
your add adds added update updates updated implement implements implemented fix fixes fixed
support supports change changes file files code task tasks ensure all any each also more some
""".split())
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_CAMEL_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def keywords(text: str) -> list[str]:
    """Search terms in ``text``: words of 3+ letters, lower-cased, without stop words.

    ``camelCase`` and ``snake_case`` identifiers are split into their words, and a plural ``s``
    is dropped from words longer than 4 letters (``tokens`` and ``token`` match). Order of first
    appearance, no duplicates.
    """
    seen: dict[str, None] = {}
    for word in _WORD_RE.findall(text):
        for part in _CAMEL_RE.findall(word):
            term = part.lower()
            if len(term) > 4 and term.endswith("s") and not term.endswith("ss"):
                term = term[:-1]
            if len(term) >= 3 and term not in _STOPWORDS and not term.isdigit():
                seen.setdefault(term, None)
    return list(seen)


# --------------------------------------------------------------------------- structure

LANGUAGES = {
    ".py": "python", ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".go": "go", ".rs": "rust", ".java": "java",
    ".kt": "kotlin", ".rb": "ruby", ".php": "php", ".c": "c", ".h": "c", ".cc": "cpp",
    ".cpp": "cpp", ".hpp": "cpp", ".cs": "csharp", ".swift": "swift", ".scala": "scala",
    ".sh": "shell", ".lua": "lua", ".ex": "elixir", ".exs": "elixir", ".hs": "haskell",
}
WELL_KNOWN_DIRS = ("src", "lib", "tests", "test", "docs", "scripts", "examples")
CONFIG_FILES = frozenset({
    "pyproject.toml", "setup.cfg", "setup.py", "tox.ini", "pytest.ini", "noxfile.py", "mypy.ini",
    ".flake8", "ruff.toml", ".ruff.toml", "Pipfile", "environment.yml", "package.json",
    "tsconfig.json", "Cargo.toml", "go.mod", "Makefile", "Dockerfile", "docker-compose.yml",
    "compose.yaml", ".pre-commit-config.yaml", "ftl.toml", "pom.xml", "build.gradle", "Gemfile",
    "composer.json", "CMakeLists.txt", ".editorconfig",
})
CONFIG_GLOBS = ("requirements*.txt", "constraints*.txt")
ENTRY_POINT_NAMES = frozenset({"__main__.py", "main.py", "cli.py", "app.py", "manage.py",
                               "wsgi.py", "asgi.py", "server.py", "main.go", "main.rs",
                               "index.js", "index.ts", "server.js", "app.js"})
TEST_GLOBS = ("test_*.py", "*_test.py", "*.test.js", "*.test.ts", "*.test.tsx", "*.spec.js",
              "*.spec.ts", "*_test.go", "*Test.java", "*_spec.rb", "*_test.rb")


def _test_pattern(test_files: list[Path]) -> str | None:
    """The glob most test files match, anchored at their common top directory when they share one."""
    if not test_files:
        return None
    by_glob: dict[str, list[Path]] = {}
    for path in test_files:
        glob = next(g for g in TEST_GLOBS if fnmatch.fnmatchcase(path.name, g))
        by_glob.setdefault(glob, []).append(path)
    glob, paths = max(sorted(by_glob.items()), key=lambda item: len(item[1]))
    tops = {p.parts[0] if len(p.parts) > 1 else "" for p in paths}
    if tops == {""}:
        return glob
    if len(tops) == 1:
        top = tops.pop()
        if all(len(p.parts) == 2 for p in paths):
            return f"{top}/{glob}"
        return f"{top}/**/{glob}"
    return f"**/{glob}"


def _pyproject(repo: Path) -> dict[str, Any]:
    """``pyproject.toml`` parsed, or {} (absent, unreadable by `_read_text`, or not TOML)."""
    import tomllib  # at the first exploration, not at the server's start

    try:
        return tomllib.loads(_read_text(repo, "pyproject.toml") or "")
    except (tomllib.TOMLDecodeError, RecursionError):
        return {}


def _script_entry_points(repo: Path, pyproject: dict[str, Any]) -> list[str]:
    """Files behind pyproject ``[project.scripts]`` (``pkg.cli:main`` -> ``pkg/cli.py``), if present."""
    found = []
    scripts = pyproject.get("project", {}).get("scripts", {})
    scripts = scripts if isinstance(scripts, dict) else {}
    poetry = pyproject.get("tool", {}).get("poetry", {}).get("scripts", {})
    targets = list(scripts.values()) + (list(poetry.values()) if isinstance(poetry, dict) else [])
    for target in targets:
        if not isinstance(target, str):
            continue
        module = target.split(":")[0].strip().replace(".", "/")
        for base in ("", "src/"):
            for candidate in (f"{base}{module}.py", f"{base}{module}/__main__.py",
                              f"{base}{module}/__init__.py"):
                path = repo / candidate
                if path.is_file() and _inside(os.path.realpath(repo), path):
                    found.append(candidate)
                    break
            else:
                continue
            break
    return found


def explore_structure(args: ExploreArgs, ctx: ToolContext) -> dict[str, Any]:
    """Map the repository's layout (FTL structure explorer, §5.5).

    Returns:
        ``{mode: "structure", status, directories: {name: bool}, entry_points: [path],
        config_files: [path], test_pattern: str | None, file_count: int, language: str | None,
        languages: {language: file count}}``. ``directories`` has every top-level directory
        (true) and the well-known names src/lib/tests/test/docs/scripts/examples (true or false);
        ``entry_points`` are pyproject scripts' files, then files named like entry points
        (``__main__.py``, ``main.py``, ``cli.py``, ``app.py``, ``index.js``, ...) at most two
        directories deep; ``config_files`` are top-level only.
        Paths are repository-relative with ``/``. ``.git``, ``.ftl``, virtualenvs,
        ``node_modules`` and caches are skipped.
    """
    repo = ctx.repo

    def body(limits: _Limits) -> dict[str, Any]:
        pyproject = _pyproject(repo)
        file_count = 0
        languages: Counter[str] = Counter()
        test_files: list[Path] = []
        entry_points: list[str] = []
        config_files: list[str] = []
        for path in _iter_files(repo, limits):
            file_count += 1
            language = LANGUAGES.get(path.suffix)
            if language:
                languages[language] += 1
            if any(fnmatch.fnmatchcase(path.name, g) for g in TEST_GLOBS):
                test_files.append(path)
            elif path.name in ENTRY_POINT_NAMES and len(path.parts) <= 3:
                entry_points.append(path.as_posix())
            if len(path.parts) == 1 and (path.name in CONFIG_FILES or any(
                    fnmatch.fnmatchcase(path.name, g) for g in CONFIG_GLOBS)):
                config_files.append(path.as_posix())
        directories = {name: False for name in WELL_KNOWN_DIRS}
        try:
            root_real = os.path.realpath(repo)
            for entry in sorted(repo.iterdir()):
                if entry.is_dir() and entry.name not in SKIP_DIRS and not _is_venv(entry) \
                        and not entry.name.endswith(".egg-info") and _inside(root_real, entry):
                    directories[entry.name] = True
        except OSError:
            pass
        for script in _script_entry_points(repo, pyproject):
            if script not in entry_points:
                entry_points.insert(0, script)
        language = None
        if languages:
            language = max(sorted(languages), key=lambda name: languages[name])
        return {
            "directories": directories,
            "entry_points": entry_points,
            "config_files": config_files,
            "test_pattern": _test_pattern(test_files),
            "file_count": file_count,
            "language": language,
            "languages": dict(sorted(languages.items())),
        }

    return _guarded("structure", args, ctx, body)


# --------------------------------------------------------------------------- pattern

@dataclass(frozen=True)
class Framework:
    """A Python framework the pattern explorer recognises, with the idioms builders follow.

    ``imports`` are top-level module names; ``packages`` are normalised distribution names.
    """

    name: str
    imports: tuple[str, ...]
    packages: tuple[str, ...]
    required: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    aliases: tuple[str, ...] = field(default=())


# Most specific first: a project on FastHTML or FastAPI also imports Starlette.
FRAMEWORKS: tuple[Framework, ...] = (
    Framework("fasthtml", ("fasthtml",), ("python-fasthtml",),
              ("Route handlers return FT components (Div, Form, ...)", "Declare routes with @rt"),
              ("HTML assembled from strings", "Jinja or other text templates"),
              aliases=("FastHTML",)),
    Framework("fastapi", ("fastapi",), ("fastapi",),
              ("Request and response bodies are pydantic models", "Shared resources come from Depends()"),
              ("Blocking I/O inside async path operations", "Parsing request JSON by hand"),
              aliases=("FastAPI",)),
    Framework("django", ("django",), ("django",),
              ("Database access goes through models and QuerySets", "Configuration lives in settings"),
              ("SQL built by string formatting", "Business logic in templates"), aliases=("Django",)),
    Framework("flask", ("flask",), ("flask",),
              ("Views are registered on the app or a Blueprint", "Settings are read from app.config"),
              ("Mutable module-level state shared between requests",), aliases=("Flask",)),
    Framework("starlette", ("starlette",), ("starlette",),
              ("Routes are declared in a Route/Mount table",),
              ("Blocking I/O inside async endpoints",), aliases=("Starlette",)),
    Framework("aiohttp", ("aiohttp",), ("aiohttp",),
              ("Handlers are async and return web.Response",), ("Blocking I/O inside handlers",)),
    Framework("tornado", ("tornado",), ("tornado",),
              ("Handlers subclass RequestHandler",), ("Blocking calls on the IOLoop",)),
    Framework("streamlit", ("streamlit",), ("streamlit",),
              ("Expensive work is cached with st.cache_data or st.cache_resource",),
              ("Long loops that block reruns",)),
    Framework("typer", ("typer",), ("typer",),
              ("CLI parameters are declared with type hints",), ("Parsing sys.argv by hand",)),
    Framework("click", ("click",), ("click",),
              ("Options and arguments are declared with decorators", "Commands are tested with CliRunner"),
              ("Parsing sys.argv by hand",)),
    Framework("sqlalchemy", ("sqlalchemy",), ("sqlalchemy",),
              ("Sessions are used as context managers", "Queries bind parameters"),
              ("SQL built with f-strings",), aliases=("SQLAlchemy",)),
)

# FTL framework registry confidence tiers (§5.5).
TIER_README = 0.95
TIER_MAJORITY_IMPORT = 0.85
TIER_ANY_IMPORT = 0.75
TIER_DECLARED = 0.65

_IMPORT_RE = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b|import[ \t]+([^\n#;]+))",
                        re.MULTILINE)
_REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_BULLET_RE = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(.*\S)\s*$")
_FORBID_WORDS = re.compile(
    r"\b(forbidden|avoid|never|don'?t|do not|must not|not allowed|anti-?patterns?)\b|❌|✗", re.I)
_REQUIRE_WORDS = re.compile(r"\b(required|must|always|do|use|prefer|conventions?)\b|✅|✓", re.I)


def _module_roots(text: str) -> set[str]:
    """Top-level module names a Python source imports (absolute imports only)."""
    roots = set()
    for match in _IMPORT_RE.finditer(text):
        if match.group(1):
            roots.add(match.group(1))
        else:
            for part in match.group(2).split(","):
                name = part.strip().split(" ")[0].split(".")[0]
                if name.isidentifier():
                    roots.add(name)
    return roots


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_packages(repo: Path, pyproject: dict[str, Any] | None = None) -> set[str]:
    """Normalised distribution names the project depends on, from pyproject.toml (PEP 621,
    optional dependencies, dependency groups, Poetry), setup.cfg and requirements*.txt.

    Every file is read through `_read_text` (regular files inside the repository, at most
    `READ_LIMIT_BYTES`); one it refuses, or cannot parse, declares nothing."""
    pyproject = _pyproject(repo) if pyproject is None else pyproject
    specs: list[str] = []
    project = pyproject.get("project", {})
    specs += [s for s in project.get("dependencies", []) if isinstance(s, str)]
    for group in (project.get("optional-dependencies", {}) or {}).values():
        specs += [s for s in group if isinstance(s, str)]
    for group in (pyproject.get("dependency-groups", {}) or {}).values():
        specs += [s for s in group if isinstance(s, str)]
    poetry = pyproject.get("tool", {}).get("poetry", {})
    for key in ("dependencies", "dev-dependencies"):
        specs += [k for k in (poetry.get(key, {}) or {}) if isinstance(k, str)]
    for group in (poetry.get("group", {}) or {}).values():
        if isinstance(group, dict):
            specs += [k for k in (group.get("dependencies", {}) or {}) if isinstance(k, str)]
    cfg = configparser.ConfigParser()
    try:
        cfg.read_string(_read_text(repo, "setup.cfg") or "", source="setup.cfg")
        for option in ("install_requires", "tests_require"):
            if cfg.has_option("options", option):
                specs += cfg.get("options", option).splitlines()
        if cfg.has_section("options.extras_require"):
            for _, value in cfg.items("options.extras_require"):
                specs += value.splitlines()
    except configparser.Error:
        pass
    try:
        requirements = sorted(repo.glob("requirements*.txt"))
    except OSError:
        requirements = []
    for req in requirements:
        specs += (_read_text(repo, req.name) or "").splitlines()
    names = set()
    for spec in specs:
        match = _REQ_NAME_RE.match(spec)
        if match and not spec.lstrip().startswith(("-", "#")):
            names.add(_canonical(match.group(1)))
    return names


def _readme(repo: Path) -> str:
    try:
        entries = sorted(repo.iterdir())
    except OSError:
        return ""
    for entry in entries:
        if entry.is_file() and entry.name.lower() in ("readme.md", "readme.markdown", "readme.rst",
                                                      "readme.txt", "readme"):
            return _read_text(repo, entry.name) or ""
    return ""


def _headings(text: str) -> list[tuple[int, int, str]]:
    """Markdown headings as ``(line index, level, title)``; ATX (``## x``) and setext (underlined)."""
    lines = text.splitlines()
    found = []
    in_fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        match = _HEADING_RE.match(line)
        if match:
            found.append((i, len(match.group(1)), match.group(2).strip()))
        elif i + 1 < len(lines) and line.strip() and re.fullmatch(r"\s*(=+|-+)\s*", lines[i + 1]) \
                and not _BULLET_RE.match(line):
            found.append((i, 1 if "=" in lines[i + 1] else 2, line.strip()))
    return found


def parse_readme_idioms(text: str) -> dict[str, Any] | None:
    """Read a README's "Framework Idioms" section (FTL registry tier 1, §5.5).

    The section runs from a heading containing "framework idioms" (any level, any case) to the
    next heading of the same or a higher level. Its bullet and numbered items are idioms: an item
    is forbidden when it, or the sub-heading or label line above it, says forbidden / avoid /
    never / don't / must not (or carries ✗ ❌); otherwise it is required. A label line is a line
    outside the list that ends in ":" (emphasis aside: ``**Avoid:**``); other prose, such as
    "Builders must always follow these; never skip them.", switches nothing.

    Returns:
        ``{"required": [str], "forbidden": [str], "text": section text}``, or None when the README
        has no such section.
    """
    lines = text.splitlines()
    heads = _headings(text)
    for index, (start, level, title) in enumerate(heads):
        if "framework idioms" not in title.lower():
            continue
        end = len(lines)
        for line_no, other_level, _ in heads[index + 1:]:
            if other_level <= level:
                end = line_no
                break
        sub_heads = {line_no for line_no, _, _ in heads}
        required: list[str] = []
        forbidden: list[str] = []
        mode = "required"
        for i in range(start + 1, end):
            line = lines[i]
            bullet = _BULLET_RE.match(line)
            if i in sub_heads or (not bullet and line.strip()):
                label = line.strip()
                if i in sub_heads or label.rstrip("*_ ").endswith(":"):
                    if _FORBID_WORDS.search(label):
                        mode = "forbidden"
                    elif _REQUIRE_WORDS.search(label):
                        mode = "required"
                continue
            if not bullet:
                continue
            item = bullet.group(1).strip()
            label, sep, rest = item.partition(":")
            if sep and len(label) <= 20 and rest.strip():
                if _FORBID_WORDS.search(label):
                    forbidden.append(rest.strip())
                    continue
                if _REQUIRE_WORDS.search(label):
                    required.append(rest.strip())
                    continue
            starts_forbidden = re.match(r"\s*(?:❌|✗|never\b|don'?t\b|do not\b|avoid\b|no\s)", item, re.I)
            (forbidden if starts_forbidden or mode == "forbidden" else required).append(item)
        return {"required": required, "forbidden": forbidden,
                "text": "\n".join(lines[start:end])}
    return None


def detect_frameworks(py_sources: dict[str, str], declared: set[str],
                      readme_idioms: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Rank known frameworks by FTL's registry tiers (§5.5); pure.

    Args:
        py_sources: ``{path: source}`` of the project's Python files.
        declared: normalised distribution names from `declared_packages`.
        readme_idioms: the `parse_readme_idioms` result, or None.

    Tiers: named in the README's "Framework Idioms" section 0.95 (when the section names no known
    framework, the best framework found by the other tiers is raised to 0.95); imported by more
    than half of the Python files 0.85; imported anywhere 0.75; only declared as a dependency
    0.65. Frameworks with no evidence are left out.

    Returns:
        ``[{"name", "confidence", "evidence": [str], "import_fraction"}]``, highest confidence
        first; ties keep the `FRAMEWORKS` order (more specific frameworks first).
    """
    total = len(py_sources)
    importers: Counter[str] = Counter()
    for source in py_sources.values():
        for root in _module_roots(source):
            importers[root] += 1
    section = (readme_idioms or {}).get("text", "").lower()
    found = []
    for fw in FRAMEWORKS:
        count = max((importers[m] for m in fw.imports), default=0)
        fraction = count / total if total else 0.0
        evidence = []
        confidence = 0.0
        names = (fw.name, *fw.aliases)
        if section and any(re.search(rf"\b{re.escape(n.lower())}\b", section) for n in names):
            confidence = TIER_README
            evidence.append("named in README Framework Idioms")
        if count:
            evidence.append(f"imported by {count} of {total} Python files")
            confidence = max(confidence, TIER_MAJORITY_IMPORT if fraction > 0.5 else TIER_ANY_IMPORT)
        if any(p in declared for p in fw.packages):
            evidence.append("declared dependency")
            confidence = max(confidence, TIER_DECLARED)
        if confidence:
            found.append({"name": fw.name, "confidence": confidence, "evidence": evidence,
                          "import_fraction": round(fraction, 3)})
    found.sort(key=lambda item: -item["confidence"])  # stable: FRAMEWORKS order on ties
    if readme_idioms is not None and found and found[0]["confidence"] < TIER_README:
        found[0]["confidence"] = TIER_README
        found[0]["evidence"].append("README has a Framework Idioms section")
    return found


def _style(py_sources: dict[str, str]) -> dict[str, Any]:
    """Type-hint and docstring habits of the code (FTL pattern ``style``).

    A file that cannot be parsed is left out of the ratios, whatever the reason: a syntax error,
    a NUL byte (ValueError), or nesting deeper than the parser's stack (RecursionError, e.g. a
    generated ``x = 1+1+...`` of 100 KB; MemoryError likewise), so one odd file never fails the
    whole pattern explorer.
    """
    functions = hinted = documented = definitions = 0
    for source in py_sources.values():
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                params = [a for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                          if a.arg not in ("self", "cls")]
                if node.returns is not None or any(a.annotation is not None for a in params):
                    hinted += 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                definitions += 1
                if ast.get_docstring(node):
                    documented += 1
    hint_ratio = hinted / functions if functions else 0.0
    doc_ratio = documented / definitions if definitions else 0.0
    docstrings = "none" if documented == 0 else ("thorough" if doc_ratio >= 0.5 else "sparse")
    return {"type_hints": hint_ratio >= 0.5, "docstrings": docstrings,
            "type_hint_ratio": round(hint_ratio, 3), "docstring_ratio": round(doc_ratio, 3)}


def _test_runner(repo: Path, pyproject: dict[str, Any], declared: set[str],
                 py_sources: dict[str, str]) -> tuple[str | None, str | None]:
    """(runner name, command) for the project's tests, from its configuration and imports."""
    imports = set()
    for source in py_sources.values():
        imports |= _module_roots(source)
    pytest_config = ("pytest" in pyproject.get("tool", {}) or (repo / "pytest.ini").exists()
                     or (repo / "conftest.py").exists() or any(name in declared for name in ("pytest",)))
    for cfg_name, section in (("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]")):
        text = _read_text(repo, cfg_name) or ""
        pytest_config = pytest_config or section in text
    if py_sources and (pytest_config or "pytest" in imports
                       or any(p.endswith("conftest.py") for p in py_sources)):
        return "pytest", "python -m pytest"
    if py_sources and "unittest" in imports:
        return "unittest", "python -m unittest"
    package = _read_text(repo, "package.json")
    if package:
        try:
            data = json.loads(package)
        except ValueError:
            data = {}
        if isinstance(data, dict) and isinstance(data.get("scripts"), dict) and "test" in data["scripts"]:
            deps = {**(data.get("devDependencies") or {}), **(data.get("dependencies") or {})}
            name = next((r for r in ("vitest", "jest", "mocha", "ava") if r in deps), "npm")
            return name, "npm test"
    if (repo / "go.mod").exists():
        return "go", "go test ./..."
    if (repo / "Cargo.toml").exists():
        return "cargo", "cargo test"
    return None, None


def explore_pattern(args: ExploreArgs, ctx: ToolContext) -> dict[str, Any]:
    """Detect the project's framework, idioms, code style and test runner (FTL pattern explorer).

    Returns:
        ``{mode: "pattern", status, framework: str | None, confidence: float in [0, 1],
        frameworks: [{name, confidence, evidence, import_fraction}], idioms: {required,
        forbidden}, idioms_source: "readme" | "registry" | None, style: {type_hints: bool,
        docstrings: "none" | "sparse" | "thorough", type_hint_ratio, docstring_ratio},
        readme_sections: [str], test_runner: str | None, test_command: str | None,
        python_files: int}``. Confidence tiers as in `detect_frameworks`; 0.0 with framework None
        when nothing is found. Idioms come from the README section when there is one, else from
        the framework's registry entry; builders enforce them only at confidence >= 0.6 (FTL).
    """
    repo = ctx.repo

    def body(limits: _Limits) -> dict[str, Any]:
        pyproject = _pyproject(repo)
        declared = declared_packages(repo, pyproject)
        readme = _readme(repo)
        readme_idioms = parse_readme_idioms(readme) if readme else None
        py_sources: dict[str, str] = {}
        for path in _iter_files(repo, limits):
            if path.suffix == ".py":
                text = _read_text(repo, path)
                if text is not None:
                    py_sources[path.as_posix()] = text
        frameworks = detect_frameworks(py_sources, declared, readme_idioms)
        top = frameworks[0] if frameworks else None
        idioms: dict[str, list[str]] = {"required": [], "forbidden": []}
        idioms_source = None
        if readme_idioms and (readme_idioms["required"] or readme_idioms["forbidden"]):
            idioms = {"required": readme_idioms["required"], "forbidden": readme_idioms["forbidden"]}
            idioms_source = "readme"
        elif top:
            entry = next(fw for fw in FRAMEWORKS if fw.name == top["name"])
            idioms = {"required": list(entry.required), "forbidden": list(entry.forbidden)}
            idioms_source = "registry"
        runner, command = _test_runner(repo, pyproject, declared, py_sources)
        return {
            "framework": top["name"] if top else None,
            "confidence": top["confidence"] if top else 0.0,
            "frameworks": frameworks,
            "idioms": idioms,
            "idioms_source": idioms_source,
            "style": _style(py_sources),
            "readme_sections": [title for _, _, title in _headings(readme)],
            "test_runner": runner,
            "test_command": command,
            "python_files": len(py_sources),
        }

    return _guarded("pattern", args, ctx, body)


# --------------------------------------------------------------------------- memory

MEMORY_MAX_FAILURES = 10  # FTL explorer contract: memory context --max-failures 10
MEMORY_MAX_PATTERNS = 5   # ... --max-patterns 5
RELEVANCE_FLOOR = 0.25    # FTL relevance tiers: below 0.25 an entry is not injected


def relevance(objective_terms: list[str], text: str) -> float:
    """Share of the objective's search terms that occur in ``text``'s terms, in [0, 1]."""
    if not objective_terms:
        return 0.0
    terms = set(keywords(text))
    return sum(1 for term in objective_terms if term in terms) / len(objective_terms)


SIMILARITY_FLOOR = 0.5    # FTL find-similar --threshold 0.5
MAX_SIMILAR = 3           # ... --max 3


def _outcome(campaign: dict[str, Any]) -> str:
    """complete | partial | blocked, from a finished campaign's summary counts."""
    summary = campaign.get("summary") if isinstance(campaign.get("summary"), dict) else {}
    complete, blocked = summary.get("complete") or 0, summary.get("blocked") or 0
    if campaign.get("status") == "complete" and not blocked and not summary.get("pending"):
        return "complete"
    return "partial" if complete else "blocked"


def _similar_campaigns(campaigns: list[dict[str, Any]], patterns: list[dict[str, Any]],
                       terms: list[str], current: str | None) -> list[dict[str, Any]]:
    """Finished campaigns whose objective shares at least half the search terms, best first."""
    found = []
    for campaign in campaigns:
        if campaign.get("status") == "active" or campaign.get("campaign_id") == current:
            continue
        similarity = relevance(terms, str(campaign.get("objective") or ""))
        if similarity >= SIMILARITY_FLOOR:
            found.append({
                "campaign_id": campaign.get("campaign_id"), "objective": campaign.get("objective"),
                "similarity": round(similarity, 3), "outcome": _outcome(campaign),
                "patterns_from": [p["name"] for p in patterns
                                  if p.get("campaign_id") == campaign.get("campaign_id")]})
    found.sort(key=lambda item: -item["similarity"])  # stable: newest first on ties
    return found[:MAX_SIMILAR]


def explore_memory(args: ExploreArgs, ctx: ToolContext) -> dict[str, Any]:
    """Prior failures, success patterns and similar campaigns (FTL memory explorer).

    Reads the store's memory (`ftl.memory.MemoryStore.context`: FTS5 bm25 relevance to the
    objective blended with importance, feedback and age decay, FTL's ranking) without counting
    the reads as injections, and ``list_campaigns()``. Entries under relevance 0.25 are left out
    (FTL relevance tiers) except the single most valuable one; campaigns need a 0.5 keyword
    overlap (FTL find-similar). When the store module or the database file does not exist yet,
    the result is ``ok`` with empty lists: a first campaign has no memory, which is not an
    error. The database is never created here.

    Returns:
        ``{mode: "memory", status, failures: [{name, trigger, fix, cost, importance,
        times_helped, ..., _relevance, _score}], patterns: [{name, trigger, insight, saved, ...,
        _relevance, _score}], similar_campaigns: [{campaign_id, objective, similarity, outcome:
        complete | partial | blocked, patterns_from: [name]}], total_in_memory: {failures,
        patterns}}``; at most 10 failures, 5 patterns and 3 campaigns (FTL explorer contract).
    """
    def body(limits: _Limits) -> dict[str, Any]:
        empty = {"failures": [], "patterns": [], "similar_campaigns": [],
                 "total_in_memory": {"failures": 0, "patterns": 0}}
        if not ctx.store_path.exists():
            return empty
        try:
            from ftl.memory import MemoryStore
            from ftl.store import Store
        except ImportError:
            return empty
        with Store(ctx.store_path) as store:
            memory = MemoryStore(store)
            counts = {k: v["count"] for k, v in memory.stats().items()}
            found = memory.context(objective=args.objective or None, max_failures=MEMORY_MAX_FAILURES,
                                   max_patterns=MEMORY_MAX_PATTERNS, relevance_threshold=RELEVANCE_FLOOR,
                                   track_access=False)
            if limits.stop():
                return {**empty, "total_in_memory": counts}
            patterns = memory.entries("pattern")
            campaigns = store.list_campaigns()
        if not args.objective:
            for entry in found["failures"] + found["patterns"]:
                entry.setdefault("_relevance", 0.0)
                entry.setdefault("_score", 0.0)
        return {
            "failures": found["failures"], "patterns": found["patterns"],
            "similar_campaigns": _similar_campaigns(campaigns, patterns, keywords(args.objective),
                                                    args.campaign_id),
            "total_in_memory": counts,
        }

    return _guarded("memory", args, ctx, body)


# --------------------------------------------------------------------------- delta

CODE_EXTENSIONS = frozenset(LANGUAGES)
MAX_CANDIDATES = 25
MAX_FUNCTIONS = 15
_DEF_RE = re.compile(
    r"^[ \t]*(?:export[ \t]+)?(?:default[ \t]+)?(?:pub(?:\([^)\n]*\))?[ \t]+)?(?:async[ \t]+)?"
    r"(?:def|class|function|func|fn|interface|struct|trait|impl)[ \t]+(?:\([^)\n]*\)[ \t]*)?"
    r"([A-Za-z_]\w*)", re.MULTILINE)


def _definitions(text: str) -> list[tuple[str, int]]:
    """``(name, 1-based line)`` of def/class/function-like declarations in source text."""
    found = []
    for match in _DEF_RE.finditer(text):
        found.append((match.group(1), text.count("\n", 0, match.start()) + 1))
    return found


def score_candidate(terms: list[str], path: str, text: str | None, changed: bool) -> dict[str, Any] | None:
    """Relevance of one file to the search terms; pure. None when nothing links it to them.

    Rules: a term in the file's path counts as a name hit, a def/class whose name holds a term as
    a definition hit, a term anywhere in the text as a text hit; a file with uncommitted changes
    (``git status``) is always a candidate. ``relevance`` is ``high`` with name and definition
    hits, two or more definition hits, or a change plus any name/definition hit; ``medium`` with
    any name or definition hit or a change; ``low`` with text hits only. ``confidence`` is
    ``0.35 + 0.2 x min(name hits, 2) + 0.1 x min(definition hits, 3) + 0.05 x min(text hits, 3)
    + 0.1 if changed``, capped at 0.95.
    """
    term_set = set(terms)
    name_hits = len(term_set & set(keywords(path)))
    definitions = _definitions(text) if text else []
    matching = [(n, line) for n, line in definitions if term_set & set(keywords(n))]
    text_hits = len(term_set & set(keywords(text))) if text else 0
    def_hits = len(matching)
    if not (name_hits or def_hits or text_hits or changed):
        return None
    if (name_hits and def_hits) or def_hits >= 2 or (changed and (name_hits or def_hits)):
        rel = "high"
    elif name_hits or def_hits or changed:
        rel = "medium"
    else:
        rel = "low"
    confidence = min(0.95, 0.35 + 0.2 * min(name_hits, 2) + 0.1 * min(def_hits, 3)
                     + 0.05 * min(text_hits, 3) + (0.1 if changed else 0.0))
    shown = matching if matching else (definitions if name_hits else [])
    return {
        "path": path,
        "lines": (text.count("\n") + (0 if text.endswith("\n") else 1)) if text else 0,
        "functions": [{"name": n, "line": line} for n, line in shown[:MAX_FUNCTIONS]],
        "relevance": rel,
        "confidence": round(confidence, 3),
        "changed": changed,
    }


_RELEVANCE_ORDER = {"high": 0, "medium": 1, "low": 2}


def explore_delta(args: ExploreArgs, ctx: ToolContext) -> dict[str, Any]:
    """Files the objective is likely to touch (FTL delta explorer).

    Search terms are the objective's `keywords`. Candidates are files with uncommitted changes
    (``git status --porcelain``, when the repo is a git work tree) and files whose path, def/class
    names or text hold a term; code files (by extension) are read, other files match by path only.
    Scoring: `score_candidate`.

    Returns:
        ``{mode: "delta", status, search_terms: [str], candidates: [{path, lines, functions:
        [{name, line}], relevance: "high" | "medium" | "low", confidence, changed}],
        changed_files: [path], files_scanned: int}``; at most 25 candidates, best first.
    """
    repo = ctx.repo

    def body(limits: _Limits) -> dict[str, Any]:
        terms = keywords(args.objective)
        status = git_status(repo, cancel=ctx.cancel, timeout_s=min(30.0, limits.remaining_s()))
        changed = {path for path, code in (status or {}).items()
                   if "D" not in code and not path.startswith(".ftl/")}
        candidates = []
        scanned = 0
        for path in _iter_files(repo, limits):
            rel = path.as_posix()
            is_changed = rel in changed
            if not terms and not is_changed:
                continue
            scanned += 1
            text = _read_text(repo, path) if path.suffix in CODE_EXTENSIONS else None
            found = score_candidate(terms, rel, text, is_changed)
            if found:
                candidates.append(found)
        candidates.sort(key=lambda c: (_RELEVANCE_ORDER[c["relevance"]], -c["confidence"], c["path"]))
        return {"search_terms": terms, "candidates": candidates[:MAX_CANDIDATES],
                "changed_files": sorted(changed), "files_scanned": scanned}

    return _guarded("delta", args, ctx, body)
