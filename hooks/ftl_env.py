#!/usr/bin/env python3
"""ftl's Python environment for the Claude Code plugin: prepare it, run programs from it, and
check plans Claude writes. Standard library only, so it runs under any ``python3`` >= 3.8.

Subcommands (wired up in ``plugin.json``):

``session-start``
    SessionStart hook. Makes sure the plugin's venv holds this plugin's ftl (creating the venv
    and running ``pip install`` when it is missing or the package sources changed), writes the
    launchers ``<data>/bin/ftl`` and ``<data>/bin/ftl-python``, and appends
    ``export PATH="<data>/bin:$PATH"`` to ``$CLAUDE_ENV_FILE`` so the session's Bash commands
    find them (only ``ftl`` and ``ftl-python``: the user's own ``python`` is not shadowed).
    Idempotent; when nothing changed it hashes the package sources (a few ms), starts no
    process and prints nothing.
``exec PROGRAM [ARG...]``
    The same preparation, then this process becomes the venv's PROGRAM with ARGs. The MCP server
    entry of the manifest is ``exec ftl mcp``: nothing is printed on stdout before the exec, since
    stdout is the MCP channel.
``post-tool-use``
    PostToolUse hook for Write|Edit|MultiEdit. When the written file is JSON that looks like an ftl
    plan (an object with ``objective`` and a ``tasks`` list, or any ``*plan*.json``), it is
    validated with `ftl.validation.load_plan_file` (the checks behind schemas/plan.schema.json plus
    duplicate seqs, dangling dependencies and cycles); violations go back to Claude (exit 2).
    Other files, and any file while the venv is not ready, pass untouched (exit 0).
``ensure``
    Prepare, then print ``{"venv", "python", "ftl", "bin", "installed", "stale"}`` as JSON (for
    use outside Claude Code, e.g. before configuring ``claude mcp add``).

Locations: the venv is ``$FTL_PLUGIN_VENV`` when set (an existing environment with ftl installed,
used as it is: never created, never installed into), else ``$CLAUDE_PLUGIN_DATA/venv``, else
``${XDG_DATA_HOME:-~/.local/share}/ftl-plugin/venv``; launchers and logs live beside the venv's
data directory. The package installed is the plugin root, the parent of this file's directory
(copied to a temporary directory first, so the build leaves nothing in the plugin). The base
interpreter is ``$FTL_PLUGIN_PYTHON``, else this one when it is >= 3.11, else the first of
python3.13, python3.12, python3.11 on PATH.

Exit codes: 0 ready (or nothing to check); 1 the environment could not be prepared, with the
reason and the fix on stderr (Claude Code shows it and the session goes on); when only an update
failed and an earlier install works, that install stays in use (``stale``: launchers and ``exec``
keep working) and the exit code is still 1 so the message is seen; 2 post-tool-use found an
invalid plan (violations on stderr, which Claude Code hands to Claude).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

PLUGIN_ROOT = Path(__file__).resolve().parent.parent
MIN_PYTHON = (3, 11)  # pyproject.toml requires-python
CANDIDATE_PYTHONS = ("python3.13", "python3.12", "python3.11")
STAMP_NAME = ".ftl-plugin-stamp"
STAMP_FORMAT = 1
SOURCE_DIRS = ("ftl", "states")  # the packages pyproject.toml builds (package-dir mapping)
# Top-level entries that are not part of the distribution; never copied to the build directory.
BUILD_SKIP = {".git", ".venv", "venv", ".ftl", ".ci", ".claude-plugin", "node_modules", "build",
              "dist", "tests", "bench", "examples", "docs", "commands", "agents", "hooks",
              ".pytest_cache", ".hypothesis", "__pycache__"}
PIP_TIMEOUT_S = 900
VALIDATE_TIMEOUT_S = 60
PLAN_FILE_LIMIT_BYTES = 4 * 1024 * 1024
LOG_TAIL_LINES = 15
IS_WINDOWS = os.name == "nt"

# Run by the venv's interpreter: validate one plan file, print the violations as JSON.
VALIDATE_SNIPPET = """
import json, sys
from pathlib import Path
from ftl.errors import FtlError
from ftl.validation import load_plan_file
try:
    load_plan_file(Path(sys.argv[1]))
except FtlError as error:
    details = error.safe_details()
    print(json.dumps({"message": error.message, "violations": details.get("violations", []),
                      "cycle": details.get("cycle")}))
    sys.exit(3)
"""


class EnvError(Exception):
    """The environment cannot be prepared; the message says why and how to fix it."""


class Layout:
    """Where the environment lives, computed from the process environment ``env``."""

    def __init__(self, env: dict) -> None:
        data = env.get("CLAUDE_PLUGIN_DATA")
        if data:
            self.data = Path(data)
        else:
            base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
            self.data = Path(base) / "ftl-plugin"
        external = env.get("FTL_PLUGIN_VENV")
        self.external = bool(external)
        self.venv = Path(external) if external else self.data / "venv"
        self.bin = self.data / "bin"
        scripts = self.venv / ("Scripts" if IS_WINDOWS else "bin")
        suffix = ".exe" if IS_WINDOWS else ""
        self.scripts = scripts
        self.python = scripts / ("python" + suffix)
        self.ftl = scripts / ("ftl" + suffix)
        self.stamp = self.venv / STAMP_NAME
        self.lock = self.data / ".install.lock"
        self.log = self.data / "install.log"

    def program(self, name: str) -> Path:
        return self.scripts / (name + (".exe" if IS_WINDOWS else ""))


# --------------------------------------------------------------------------- readiness

def source_hash(root: Path = PLUGIN_ROOT) -> str:
    """sha256 over pyproject.toml and every file of the package directories (path and bytes), so
    any change to what ``pip install`` would install triggers a reinstall."""
    digest = hashlib.sha256()
    files = [root / "pyproject.toml"]
    for name in SOURCE_DIRS:
        folder = root / name
        if folder.is_dir():
            files.extend(p for p in folder.rglob("*")
                         if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
        digest.update(b"\0")
    return digest.hexdigest()


def read_stamp(layout: Layout) -> dict:
    try:
        value = json.loads(layout.stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def is_ready(layout: Layout, sources: str) -> bool:
    """Files-only check (no process started): the venv's python and ftl exist and, for the
    plugin's own venv, the stamp names the current sources."""
    if not (layout.python.exists() and layout.ftl.exists()):
        return False
    if layout.external:
        return True
    stamp = read_stamp(layout)
    return stamp.get("format") == STAMP_FORMAT and stamp.get("sources") == sources


# --------------------------------------------------------------------------- installation

@contextmanager
def install_lock(layout: Layout):
    """An exclusive lock on ``<data>/.install.lock``: the SessionStart hook and the MCP launcher
    start together and must not both install."""
    layout.data.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; installs are rare enough
        yield
        return
    with open(layout.lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def python_version(python: str) -> tuple:
    """(major, minor) of an interpreter, or () when it does not run."""
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ()
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) != 2:
        return ()
    return int(parts[0]), int(parts[1])


def find_base_python(env: dict) -> str:
    """The interpreter that creates the venv (see the module docstring for the order).

    Raises: EnvError when none is >= 3.11.
    """
    wanted = ".".join(map(str, MIN_PYTHON))
    override = env.get("FTL_PLUGIN_PYTHON")
    if override:
        if python_version(override) >= MIN_PYTHON:
            return override
        raise EnvError(f"FTL_PLUGIN_PYTHON={override} is not a Python >= {wanted}; "
                       f"point it at one (e.g. /usr/bin/python3.11)")
    if sys.version_info[:2] >= MIN_PYTHON:
        return sys.executable
    for name in CANDIDATE_PYTHONS:
        found = shutil.which(name, path=env.get("PATH"))
        if found and python_version(found) >= MIN_PYTHON:
            return found
    raise EnvError(f"ftl needs Python >= {wanted}, and neither this python3 "
                   f"({sys.version.split()[0]}) nor {', '.join(CANDIDATE_PYTHONS)} on PATH is one; "
                   f"install one, or set FTL_PLUGIN_PYTHON to its path")


def copy_sources(root: Path, target: Path) -> Path:
    """Copy what ``pip install`` needs to ``target/src`` (see BUILD_SKIP); returns that path."""
    dest = target / "src"
    dest.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".ftl")
    for entry in sorted(root.iterdir()):
        if entry.name in BUILD_SKIP or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=ignore)
        elif entry.is_file():
            shutil.copy2(entry, dest / entry.name)
    return dest


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run_logged(layout: Layout, argv: list, what: str, env: dict) -> None:
    """Run ``argv`` with its output appended to ``<data>/install.log``.

    Raises: EnvError naming the step, its exit status and the log's tail.
    """
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                                env=env, stdin=subprocess.DEVNULL)
        output, code = (result.stdout or "") + (result.stderr or ""), result.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = str(exc.output or ""), f"timeout after {PIP_TIMEOUT_S} s"
    except OSError as exc:
        output, code = str(exc), "not startable"
    with open(layout.log, "a", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(map(str, argv))}\n{output}\n[exit {code}]\n")
    if code != 0:
        raise EnvError(f"{what} failed ({code}); last lines:\n{_tail(output)}\n"
                       f"Full log: {layout.log}. Fix the cause (often: no network for pip, or a "
                       f"missing compiler), then start a new session or run "
                       f"`python3 {PLUGIN_ROOT / 'hooks' / 'ftl_env.py'} ensure`")


def install(layout: Layout, env: dict, sources: str) -> None:
    """Create the venv when it is missing or broken, install the plugin's package into it, and
    write the stamp last (an interrupted install is retried next time).

    Raises: EnvError.
    """
    child_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if python_version(str(layout.python)) < MIN_PYTHON:
        base = find_base_python(env)
        if layout.venv.exists():
            shutil.rmtree(layout.venv)
        _run_logged(layout, [base, "-m", "venv", str(layout.venv)], "creating the venv", child_env)
    with tempfile.TemporaryDirectory(prefix="ftl-plugin-build-") as tmp:
        src = copy_sources(PLUGIN_ROOT, Path(tmp))
        _run_logged(layout, [str(layout.python), "-m", "pip", "install", "--quiet",
                             "--disable-pip-version-check", "--no-input", str(src)],
                    "pip install of ftl", child_env)
    if not layout.ftl.exists():
        raise EnvError(f"pip reported success but {layout.ftl} does not exist; see {layout.log}")
    layout.stamp.write_text(json.dumps({"format": STAMP_FORMAT, "sources": sources,
                                        "plugin_root": str(PLUGIN_ROOT)}) + "\n", encoding="utf-8")


def ensure(layout: Layout, env: dict) -> bool:
    """Make the environment ready; True when something was installed.

    Raises: EnvError (for ``$FTL_PLUGIN_VENV``: when it has no ftl, since it is never installed
        into).
    """
    sources = source_hash()
    if is_ready(layout, sources):
        return False
    if layout.external:
        raise EnvError(f"FTL_PLUGIN_VENV={layout.venv} has no {layout.ftl.name} in "
                       f"{layout.scripts}; install ftl there (pip install {PLUGIN_ROOT}) or unset "
                       f"FTL_PLUGIN_VENV to let the plugin manage its own venv")
    with install_lock(layout):
        if is_ready(layout, sources):  # another process finished while we waited
            return False
        install(layout, env, sources)
    return True


# --------------------------------------------------------------------------- session wiring

def _write_if_changed(path: Path, text: str, mode: int | None = None) -> None:
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    if mode is not None:
        os.chmod(temporary, mode)
    os.replace(temporary, path)


def write_launchers(layout: Layout) -> None:
    """``<data>/bin/ftl`` and ``<data>/bin/ftl-python``: tiny sh scripts that exec the venv's
    programs (wrappers rather than symlinks: a symlinked venv python would not find its venv)."""
    if IS_WINDOWS:
        return
    for name, target in (("ftl", layout.ftl), ("ftl-python", layout.python)):
        _write_if_changed(layout.bin / name,
                          "#!/bin/sh\n# Written by the ftl Claude Code plugin (hooks/ftl_env.py).\n"
                          f"exec {shlex.quote(str(target))} \"$@\"\n", 0o755)


def export_path(layout: Layout, env: dict) -> None:
    """Append the PATH line to ``$CLAUDE_ENV_FILE`` once (Claude Code sources that file before
    each Bash command of the session)."""
    target = env.get("CLAUDE_ENV_FILE")
    if not target or IS_WINDOWS:
        return
    line = f"export PATH={shlex.quote(str(layout.bin))}:\"$PATH\""
    path = Path(target)
    try:
        current = path.read_text(encoding="utf-8")
    except OSError:
        current = ""
    if line in current.splitlines():
        return
    with open(path, "a", encoding="utf-8") as handle:
        if current and not current.endswith("\n"):
            handle.write("\n")
        handle.write(line + "\n")


# --------------------------------------------------------------------------- plan checking

def _read_event(stream) -> dict:
    try:
        value = json.loads(stream.read() or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def plan_candidate(event: dict) -> Path | None:
    """The file a Write/Edit/MultiEdit event touched when it may be an ftl plan, else None."""
    tool_input = event.get("tool_input")
    if not isinstance(tool_input, dict):
        return None
    name = tool_input.get("file_path")
    if not isinstance(name, str) or not name.lower().endswith(".json"):
        return None
    path = Path(name)
    if not path.is_absolute():
        path = Path(str(event.get("cwd") or ".")) / path
    try:
        if not path.is_file() or path.stat().st_size > PLAN_FILE_LIMIT_BYTES:
            return None
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        # Broken JSON is only ours to report when the file is named as a plan.
        return path if "plan" in path.name.lower() else None
    if isinstance(value, dict) and isinstance(value.get("tasks"), list) and "objective" in value:
        return path
    return None


def format_violations(path: Path, report: dict) -> str:
    lines = [f"ftl: {path} is not a valid ftl plan: {report.get('message') or 'invalid plan'}"]
    for item in report.get("violations") or []:
        if not isinstance(item, dict):
            continue
        where = item.get("path", "$")
        if item.get("line"):
            where += f" (line {item['line']}, column {item.get('column', '?')})"
        text = f"  - {where}: {item.get('message', '')}"
        if item.get("fix"):
            text += f" (fix: {item['fix']})"
        lines.append(text)
    if report.get("cycle"):
        lines.append(f"  cycle: {report['cycle']}")
    lines.append("Fix the file so it validates against schemas/plan.schema.json "
                 "(see agents/planner.md), then write it again.")
    return "\n".join(lines)


def check_plan(layout: Layout, path: Path) -> int:
    """Validate ``path`` with the venv's ftl: 0 valid (or cannot check), 2 invalid."""
    if not layout.python.exists():
        return 0
    try:
        result = subprocess.run([str(layout.python), "-c", VALIDATE_SNIPPET, str(path)],
                                capture_output=True, text=True, timeout=VALIDATE_TIMEOUT_S,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return 0
    if result.returncode != 3:
        return 0  # valid, or ftl itself failed: a hook must not block on its own breakage
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report = {"message": _tail(result.stdout)}
    sys.stderr.write(format_violations(path, report) + "\n")
    return 2


# --------------------------------------------------------------------------- entry point

USAGE = "usage: ftl_env.py session-start | ensure | post-tool-use | exec PROGRAM [ARG...]"


def main(argv: list, env: dict) -> int:
    """Run one subcommand (module docstring); returns the exit code."""
    if not argv:
        sys.stderr.write(USAGE + "\n")
        return 1
    command, rest = argv[0], argv[1:]
    layout = Layout(env)
    if command == "post-tool-use":
        path = plan_candidate(_read_event(sys.stdin))
        return check_plan(layout, path) if path is not None else 0
    if command not in ("session-start", "ensure", "exec"):
        sys.stderr.write(USAGE + "\n")
        return 1
    if command == "exec" and (not rest or "/" in rest[0] or "\\" in rest[0]):
        sys.stderr.write("ftl plugin: exec needs a program name from the venv, e.g. `exec ftl mcp`\n")
        return 1
    failed = False
    try:
        installed = ensure(layout, env)
    except (EnvError, OSError) as error:
        text = str(error) if isinstance(error, EnvError) else f"cannot prepare {layout.venv}: {error}"
        if not (layout.python.exists() and layout.ftl.exists()):
            sys.stderr.write(f"ftl plugin: {text}\n")
            return 1
        # An update failed but an earlier install works: keep serving it, and say so.
        sys.stderr.write(f"ftl plugin: {text}\nftl plugin: using the ftl installed earlier in "
                         f"{layout.venv} meanwhile\n")
        failed, installed = True, False
    if command == "exec":
        target = layout.program(rest[0])
        if not target.exists():
            sys.stderr.write(f"ftl plugin: {target} does not exist\n")
            return 1
        sys.stdout.flush()
        os.execv(str(target), [str(target), *rest[1:]])  # argv[0] = full path: venv detection
    write_launchers(layout)
    if command == "session-start":
        export_path(layout, env)
        return 1 if failed else 0
    print(json.dumps({"venv": str(layout.venv), "python": str(layout.python), "ftl": str(layout.ftl),
                      "bin": str(layout.bin), "installed": installed, "stale": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], dict(os.environ)))
