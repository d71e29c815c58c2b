"""The Claude Code plugin (issue 6): manifest, commands, agents, hooks and MCP registration.

Four groups:

* files: plugin.json and its copy in .claude-plugin/ are identical and list every command and
  agent file; frontmatter is complete; every JSON example in the agent prompts satisfies the
  contract it documents (plans validate against schemas/plan.schema.json and ftl's validation,
  build results parse as the agent builder parses them, ...).
* hooks/ftl_env.py: plan checking for PostToolUse, the SessionStart wiring (launchers, the
  ``$CLAUDE_ENV_FILE`` line), the install path with a stand-in ``pip`` (the real one needs an
  index), and its failure reporting.
* commands: every ``bash`` line of every commands/*.md runs, placeholders filled in, against a
  scratch repository with ``CLAUDE_PLUGIN_ROOT`` set and the environment the SessionStart hook
  prepared, and prints a successful response-v2 envelope.
* the real Claude Code CLI (``FTL_CLAUDE`` or ``claude`` on PATH; skipped otherwise): ``claude
  plugin validate``, ``claude mcp list`` with ftl's MCP server added by hand and from the
  manifest, agent names as ``claude --agent`` resolves them, and install from the marketplace.
  Every call runs with a throwaway HOME, no credentials and, where user namespaces allow it,
  without network (``unshare -rn``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ftl.models import BuildResult, ExplorerResult, Workspace
from ftl.server.tools.builders import parse_build_result
from ftl.server.tools.planner import parse_planner_output
from ftl.validation import parse_plan

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "hooks" / "ftl_env.py"
MANIFEST = ROOT / "plugin.json"
CLAUDE_MANIFEST = ROOT / ".claude-plugin" / "plugin.json"
MARKETPLACE = ROOT / ".claude-plugin" / "marketplace.json"
COMMANDS = sorted((ROOT / "commands").glob("*.md"))
AGENTS = sorted((ROOT / "agents").glob("*.md"))
CLAUDE_CODE_VERSION = "2.1.329"  # the @anthropic-ai/claude-code release .ci/run installs
VENV = Path(sys.prefix)  # the environment running these tests has ftl installed
COMMAND_ORDER = ("campaign", "status", "cascade", "replay", "task")

_spec = importlib.util.spec_from_file_location("ftl_env_hook", HOOK)
ftl_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ftl_env)


# --------------------------------------------------------------------------- markdown helpers

FENCE_RE = re.compile(r"^```([\w-]*)\s*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
PLACEHOLDER_RE = re.compile(r"<([A-Z][A-Z_]*)>")


def frontmatter(path: Path) -> tuple[dict[str, str], str]:
    """(``key: value`` pairs of the leading --- block, the body). Values are plain one-liners."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n"), f"{path.name}: no frontmatter"
    head, body = text[4:].split("\n---\n", 1)
    fields = {}
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        assert sep, f"{path.name}: frontmatter line {line!r} is not 'key: value'"
        fields[key.strip()] = value.strip().strip('"')
    return fields, body


def fenced(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE_RE.findall(path.read_text(encoding="utf-8"))
            if lang == language]


def shell_lines(path: Path) -> list[str]:
    lines = []
    for block in fenced(path, "bash"):
        for line in block.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                assert not line.rstrip().endswith("\\"), f"{path.name}: keep commands on one line"
                lines.append(line.strip())
    return lines


# --------------------------------------------------------------------------- manifest

def test_claude_manifest_is_an_identical_copy():
    # Claude Code reads .claude-plugin/plugin.json; a copy, not a symlink, because `claude
    # plugin validate` skips the hook checks of a linked manifest.
    assert CLAUDE_MANIFEST.read_bytes() == MANIFEST.read_bytes(), \
        "run: cp plugin.json .claude-plugin/plugin.json"
    assert not CLAUDE_MANIFEST.is_symlink()


def test_manifest_names_every_component():
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert manifest["name"] == "ftl"
    assert manifest["version"] == project["version"]
    assert manifest["description"] and manifest["author"]["name"]
    assert sorted(manifest["commands"]) == [f"./commands/{p.name}" for p in COMMANDS]
    assert sorted(manifest["agents"]) == [f"./agents/{p.name}" for p in AGENTS]
    assert {p.stem for p in AGENTS} == {"explorer", "planner", "builder", "observer"}
    for entry in manifest["commands"] + manifest["agents"]:
        assert (ROOT / entry).is_file(), entry

    hooks = manifest["hooks"]
    assert set(hooks) == {"SessionStart", "PostToolUse"}
    start = hooks["SessionStart"][0]["hooks"][0]["command"]
    post = hooks["PostToolUse"][0]
    assert start.endswith('"${CLAUDE_PLUGIN_ROOT}/hooks/ftl_env.py" session-start')
    assert post["matcher"] == "Write|Edit|MultiEdit"
    assert post["hooks"][0]["command"].endswith("hooks/ftl_env.py\" post-tool-use")

    server = manifest["mcpServers"]["ftl"]
    assert server["args"] == ["${CLAUDE_PLUGIN_ROOT}/hooks/ftl_env.py", "exec", "ftl", "mcp"]


def test_marketplace_lists_the_plugin_at_the_root():
    market = json.loads(MARKETPLACE.read_text(encoding="utf-8"))
    assert [p["name"] for p in market["plugins"]] == ["ftl"]
    assert market["plugins"][0]["source"] == "./"


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p.stem)
def test_command_frontmatter(path: Path):
    fields, body = frontmatter(path)
    assert fields.get("description") and fields.get("argument-hint")
    assert "Bash(ftl:*)" in fields.get("allowed-tools", "")
    assert "$ARGUMENTS" in body
    assert "response-v2" in body, "each command tells Claude how to read the envelope"
    assert shell_lines(path), "each command runs ftl"


def _click_command(tokens: list[str]):
    """(click command, its option names) that ``tokens`` (``ftl ...`` or ``ftl-python
    "${CLAUDE_PLUGIN_ROOT}/lib/X.py" ...``) invoke; flags of enclosing groups count too."""
    import click

    if tokens[0] == "ftl":
        from ftl.surfaces.cli import main as command
        rest = tokens[1:]
    else:
        script = ROOT / "lib" / Path(tokens[1]).name
        spec = importlib.util.spec_from_file_location(f"lib_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        command, rest = module.cli, tokens[2:]
    options = set()
    while True:
        options |= {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        # get_command, not .commands: a lazy subcommand is imported on first use.
        sub = (command.get_command(click.Context(command), rest[0])
               if isinstance(command, click.Group) and rest else None)
        if sub is None:
            return command, options
        command, rest = sub, rest[1:]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p.stem)
def test_command_files_name_only_existing_commands_and_flags(path: Path):
    import shlex

    fields, _ = frontmatter(path)
    prose = FENCE_RE.sub("", path.read_text(encoding="utf-8"))
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    calls = [s for s in spans + shell_lines(path) if s.startswith(("ftl ", "ftl-python "))]
    assert calls
    known: set[str] = set()
    for call in calls:
        tokens = shlex.split(call.replace("*", ""))
        command, options = _click_command(tokens)
        assert not hasattr(command, "commands"), f"{path.name}: {call!r} names no command"
        flags = {t.split("=")[0] for t in tokens if t.startswith("--")}
        assert flags <= options | {"--help"}, f"{path.name}: {call!r} uses {flags - options}"
        known |= options
    # Flags mentioned on their own (`--jobs N`, the argument hint) belong to a command used here.
    loose = {t for s in spans + [fields["argument-hint"]] for t in re.findall(r"--[a-z][a-z-]*", s)}
    assert loose <= known, f"{path.name}: {sorted(loose - known)} belong to no command it runs"


@pytest.mark.parametrize("path", AGENTS, ids=lambda p: p.stem)
def test_agent_frontmatter(path: Path):
    fields, body = frontmatter(path)
    assert fields["name"] == path.stem
    assert len(fields["description"]) > 40 and fields["tools"]
    assert fenced(path, "json"), "each agent shows the JSON it answers with"


# --------------------------------------------------------------------------- agent contracts

PLAN_SCHEMA = json.loads((ROOT / "schemas" / "plan.schema.json").read_text(encoding="utf-8"))


def test_planner_examples_validate():
    plans, decisions = [], []
    for block in fenced(ROOT / "agents" / "planner.md", "json"):
        value = json.loads(block)
        (plans if "tasks" in value else decisions).append((block, value))
    assert len(plans) == 2 and len(decisions) == 1
    (first_text, first), (revision_text, revision) = plans
    jsonschema.validate(first, PLAN_SCHEMA)
    plan = parse_plan(first, source="planner.md")
    answer = parse_planner_output(first_text)
    assert answer["decision"] == "PROCEED" and answer["plan"] == first
    # The revision may depend on the campaign's existing seqs (ftl merge-revised-plan rules).
    jsonschema.validate(revision, PLAN_SCHEMA)
    parse_plan(revision, source="planner.md revision", known_seqs={t.seq for t in plan.tasks})
    assert parse_planner_output(decisions[0][0])["decision"] == "CLARIFY"
    assert parse_planner_output(decisions[0][0])["questions"]


def test_builder_examples_match_the_agent_builder_contract():
    blocks = [json.loads(b) for b in fenced(ROOT / "agents" / "builder.md", "json")]
    workspaces = [b for b in blocks if "workspace_id" in b]
    results = [b for b in blocks if "workspace_id" not in b]
    assert len(workspaces) == 1 and len(results) == 3
    Workspace.model_validate(workspaces[0])
    statuses = []
    for result in results:
        # As the agent builder reads it: log text first, the result object last.
        raw, build, problem = parse_build_result("editing files...\n" + json.dumps(result))
        assert problem is None and isinstance(build, BuildResult), problem
        statuses.append(build.status)
    assert statuses == ["complete", "blocked", "blocked"]
    assert results[2]["error_type"] == "rate_limited" and results[2]["retry_after_ms"] > 0


def test_explorer_examples_are_explorer_results():
    blocks = [json.loads(b) for b in fenced(ROOT / "agents" / "explorer.md", "json")]
    assert {b["mode"] for b in blocks} == {"delta", "pattern"}
    for block in blocks:
        ExplorerResult.model_validate(block)
    delta = next(b for b in blocks if b["mode"] == "delta")
    assert all({"path", "relevance", "confidence"} <= set(c) for c in delta["candidates"])


def test_observer_entries_have_the_memory_shape():
    (block,) = fenced(ROOT / "agents" / "observer.md", "json")
    entries = json.loads(block)["entries"]
    for entry in entries:
        text_key = "fix" if entry["type"] == "failure" else "insight"
        assert entry["type"] in ("failure", "pattern")
        assert entry["name"] and entry["trigger"] and isinstance(entry[text_key], str)
        assert all(s.count("/") == 2 for s in entry["source"])


# --------------------------------------------------------------------------- hook: plans

def _event(path: Path, cwd: Path) -> dict[str, Any]:
    return {"hook_event_name": "PostToolUse", "tool_name": "Write", "cwd": str(cwd),
            "tool_input": {"file_path": str(path)}}


def test_plan_candidate_picks_only_plan_like_json(tmp_path: Path):
    (tmp_path / "notes.md").write_text("# notes")
    (tmp_path / "package.json").write_text('{"name": "x"}')
    (tmp_path / "steps.json").write_text('{"objective": "x", "tasks": []}')
    (tmp_path / "broken-plan.json").write_text('{"objective": ')
    (tmp_path / "broken.json").write_text('{"objective": ')
    pick = lambda name: ftl_env.plan_candidate(_event(Path(name), tmp_path))  # noqa: E731
    assert pick("notes.md") is None
    assert pick("package.json") is None
    assert pick("steps.json") == tmp_path / "steps.json"  # relative paths resolve against cwd
    assert pick("broken-plan.json") == tmp_path / "broken-plan.json"
    assert pick("broken.json") is None
    assert pick("missing.json") is None
    assert ftl_env.plan_candidate({"tool_input": "nonsense"}) is None


def _hook(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HOOK), *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)


def _base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLAUDE_", "FTL_PLUGIN_", "PYTHON"))}
    env.update(CLAUDE_PLUGIN_DATA=str(tmp_path / "data"), **extra)
    return env


def test_post_tool_use_sends_violations_back(tmp_path: Path):
    env = _base_env(tmp_path, FTL_PLUGIN_VENV=str(VENV))
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"objective": "x", "tasks": [
        {"seq": "001", "slug": "Not Kebab", "verify": "true", "delta": ["src/*.py"]},
        {"seq": "002", "slug": "b", "verify": "true", "depends": "009"}]}))
    proc = _hook("post-tool-use", env=env, stdin=json.dumps(_event(bad, tmp_path)))
    assert proc.returncode == 2, proc.stderr
    assert "$.tasks[0].slug" in proc.stderr and "$.tasks[0].delta" in proc.stderr
    assert "009" in proc.stderr and "fix:" in proc.stderr

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"objective": "x", "tasks": [{"seq": 1, "slug": "a", "verify": "true"}]}))
    assert _hook("post-tool-use", env=env, stdin=json.dumps(_event(good, tmp_path))).returncode == 0
    other = tmp_path / "other.txt"
    other.write_text("{}")
    assert _hook("post-tool-use", env=env, stdin=json.dumps(_event(other, tmp_path))).returncode == 0
    assert _hook("post-tool-use", env=env, stdin="not json").returncode == 0


def test_format_violations_names_path_line_and_fix():
    text = ftl_env.format_violations(Path("p.json"), {"message": "Invalid plan", "violations": [
        {"path": "$", "line": 3, "column": 7, "message": "bad JSON", "fix": "fix the syntax"}]})
    assert "$ (line 3, column 7): bad JSON (fix: fix the syntax)" in text


# --------------------------------------------------------------------------- hook: environment

def test_session_start_wires_launchers_and_path_once(tmp_path: Path):
    env_file = tmp_path / "session.env"
    env = _base_env(tmp_path, FTL_PLUGIN_VENV=str(VENV), CLAUDE_ENV_FILE=str(env_file))
    for _ in range(2):  # idempotent
        proc = _hook("session-start", env=env)
        assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    lines = env_file.read_text().splitlines()
    assert lines == [f"export PATH={tmp_path / 'data' / 'bin'}:\"$PATH\""]
    check = subprocess.run(["bash", "-c", f". {env_file} && ftl --version && ftl-python -c "
                                          "'import ftl.validation; print(\"ok\")'"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "version" in check.stdout and check.stdout.strip().endswith("ok")


def test_external_venv_without_ftl_is_refused_with_a_fix(tmp_path: Path):
    (tmp_path / "empty" / "bin").mkdir(parents=True)
    proc = _hook("ensure", env=_base_env(tmp_path, FTL_PLUGIN_VENV=str(tmp_path / "empty")))
    assert proc.returncode == 1
    assert "FTL_PLUGIN_VENV" in proc.stderr and "pip install" in proc.stderr


def test_exec_refuses_paths(tmp_path: Path):
    proc = _hook("exec", "/bin/sh", env=_base_env(tmp_path, FTL_PLUGIN_VENV=str(VENV)))
    assert proc.returncode == 1 and "program name" in proc.stderr


FAKE_PIP = '''
"""Stand-in for `python -m pip install ... SRC`: checks the build copy, records the call and
"installs" ftl as a launcher into the tests' environment."""
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
src = Path(args[-1])
assert args[0] == "install" and (src / "pyproject.toml").is_file() and (src / "ftl").is_dir()
assert not any((src / name).exists() for name in (".git", ".venv", "tests", "hooks"))
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
launcher = Path(sys.prefix) / "bin" / "ftl"
launcher.write_text("#!/bin/sh\\nexec %s -m ftl \\"$@\\"\\n" % os.environ["REAL_PYTHON"])
launcher.chmod(0o755)
'''


def _venv_with_fake_pip(tmp_path: Path) -> Path:
    """A venv (no pip of its own) whose `python -m pip` is FAKE_PIP and which sees the tests'
    site-packages, so nothing is downloaded."""
    venv = tmp_path / "data" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fake = tmp_path / "fakepip" / "pip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_PIP)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "fake_pip.pth").write_text(str(fake.parent) + "\n")
    return venv


@pytest.mark.skipif(os.name == "nt", reason="POSIX venv layout")
def test_install_runs_pip_once_and_reinstalls_when_sources_change(tmp_path: Path):
    venv = _venv_with_fake_pip(tmp_path)
    log = tmp_path / "pip.log"
    env = _base_env(tmp_path, FAKE_PIP_LOG=str(log), REAL_PYTHON=sys.executable)

    first = _hook("ensure", env=env)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["installed"] is True and report["venv"] == str(venv)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1 and calls[0][0] == "install"
    stamp = json.loads((venv / ftl_env.STAMP_NAME).read_text())
    assert stamp["sources"] == ftl_env.source_hash(ROOT)

    # Prepared: no pip call (the stand-in is gone, so a call would fail).
    (next((venv / "lib").glob("python3*/site-packages")) / "fake_pip.pth").unlink()
    again = _hook("ensure", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["installed"] is False

    # Sources changed: pip runs again; it fails now, the earlier install stays in use.
    (venv / ftl_env.STAMP_NAME).write_text(json.dumps({"format": 1, "sources": "old"}))
    stale = _hook("ensure", env=env)
    assert stale.returncode == 1
    assert "pip install of ftl failed" in stale.stderr and "install.log" in stale.stderr
    assert json.loads(stale.stdout)["stale"] is True
    assert "No module named pip" in (tmp_path / "data" / "install.log").read_text()


def test_missing_venv_is_created_then_installed_and_a_failure_leaves_no_stamp(tmp_path, monkeypatch):
    # The steps, in process: `python -m venv` and pip themselves are exercised above and in CI.
    calls = []

    def step(layout, argv, what, env):
        calls.append((what, argv))
        if what.startswith("pip"):
            raise ftl_env.EnvError("pip install of ftl failed (1)")

    monkeypatch.setattr(ftl_env, "_run_logged", step)
    layout = ftl_env.Layout({"CLAUDE_PLUGIN_DATA": str(tmp_path / "data")})
    (layout.venv / "bin").mkdir(parents=True)  # a broken venv: no python in it
    with pytest.raises(ftl_env.EnvError, match="pip install"):
        ftl_env.ensure(layout, {"FTL_PLUGIN_PYTHON": sys.executable, "PATH": os.environ["PATH"]})
    (create, venv_argv), (install, pip_argv) = calls
    assert venv_argv == [sys.executable, "-m", "venv", str(layout.venv)]
    assert not layout.venv.exists()  # the broken one was removed before creating
    assert pip_argv[:4] == [str(layout.python), "-m", "pip", "install"]
    assert Path(pip_argv[-1]).name == "src" and not layout.stamp.exists()


def test_a_too_old_interpreter_is_refused(tmp_path: Path):
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3 9\n")
    old.chmod(0o755)
    with pytest.raises(ftl_env.EnvError, match="FTL_PLUGIN_PYTHON"):
        ftl_env.find_base_python({"FTL_PLUGIN_PYTHON": str(old)})


def test_source_hash_tracks_package_files(tmp_path: Path):
    for name in ("pyproject.toml", "ftl/a.py", "states/b.py", "tests/c.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    before = ftl_env.source_hash(tmp_path)
    (tmp_path / "tests" / "c.py").write_text("changed")  # not installed: no reinstall
    assert ftl_env.source_hash(tmp_path) == before
    (tmp_path / "states" / "b.py").write_text("changed")
    assert ftl_env.source_hash(tmp_path) != before


# --------------------------------------------------------------------------- command lines

GREET_PLAN = {"objective": "write the greeting files", "campaign": "greet", "tasks": [
    {"seq": "001", "slug": "greet", "delta": ["hello.txt"], "creates": ["hello.txt"],
     "run": "echo hi > hello.txt", "verify": "test -f hello.txt"},
    {"seq": "002", "slug": "shout", "depends": "001", "delta": ["loud.txt"], "creates": ["loud.txt"],
     "run": "tr a-z A-Z < hello.txt > loud.txt", "verify": "grep -q HI loud.txt"}]}

# The first attempt marks itself started and waits to be interrupted; the resumed one finishes.
RESUMABLE_PLAN = {"objective": "an interrupted campaign", "tasks": [
    {"seq": "001", "slug": "slow", "delta": ["slow.txt"], "creates": ["slow.txt"],
     "run": "if [ -f \"$FTL_TEST_MARKER\" ]; then echo done > slow.txt; "
            "else touch \"$FTL_TEST_MARKER\"; sleep 60; fi",
     "verify": "test -f slow.txt"}]}

FAKE_AGENT = '''
import json, sys
from pathlib import Path
workspace = json.load(sys.stdin)
for name in workspace["delta"] + workspace["creates"]:
    Path(name).write_text("built by %s\\n" % workspace["workspace_id"])
print("agent log line")
print(json.dumps({"status": "complete", "delivered": "wrote " + ", ".join(workspace["delta"]),
                  "reason": None, "utilized": []}))
'''


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _envelope(proc: subprocess.CompletedProcess, what: str) -> dict[str, Any]:
    try:
        payload = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"{what}: stdout is not one JSON envelope: {proc.stdout[-500:]!r} {proc.stderr[-800:]}")
    assert payload["meta"]["version"] == "response-v2", what
    return payload


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A git repository, the session environment the SessionStart hook prepared (launchers on
    PATH through $CLAUDE_ENV_FILE), plans, an agent_command stand-in, and an interrupted
    campaign to resume."""
    base = tmp_path_factory.mktemp("plugin-commands")
    repo = base / "repo"
    repo.mkdir()
    env_file = base / "session.env"
    hook_env = _base_env(base, FTL_PLUGIN_VENV=str(VENV), CLAUDE_ENV_FILE=str(env_file))
    started = _hook("session-start", env=hook_env)
    assert started.returncode == 0, started.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAUDE_", "PYTHON"))}
    env.update(CLAUDE_PLUGIN_ROOT=str(ROOT), GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid",
               FTL_TEST_MARKER=str(base / "test-started"))
    plans = base / "plans"
    plans.mkdir()
    (plans / "greet.json").write_text(json.dumps(GREET_PLAN))
    (plans / "resumable.json").write_text(json.dumps(RESUMABLE_PLAN))
    agent = base / "fake_agent.py"
    agent.write_text(FAKE_AGENT)
    (repo / "README.md").write_text("scratch\n")
    (repo / ".gitignore").write_text(".ftl/\n")
    (repo / "ftl.toml").write_text(f"agent_command = {json.dumps([sys.executable, str(agent)])}\n")
    for argv in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=repo, env=env, check=True, timeout=60)

    shell = lambda line: ["bash", "-c", f". {env_file} && {line}"]  # noqa: E731
    # An interrupted campaign, as after Ctrl-C: SIGTERM once its task has started.
    runner = subprocess.Popen(shell(f"exec ftl campaign run --plan {plans / 'resumable.json'} --json"),
                              cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    marker = Path(env["FTL_TEST_MARKER"])
    deadline = time.monotonic() + 90
    while not marker.exists() and runner.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), runner.communicate(timeout=30)
    runner.send_signal(signal.SIGTERM)
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 130, (out[-500:], err[-800:])
    return {"repo": repo, "env": env, "shell": shell, "plans": plans}


def _values(scratch: dict[str, Any], seen: dict[str, str] | None = None) -> dict[str, Any]:
    """Placeholder -> value. ``seen["campaign_id"]`` is the campaign the last envelope named
    (as Claude reads it from the status line before); without one, ask ftl."""
    seen = seen if seen is not None else {}

    def campaign_id() -> str:
        if "campaign_id" not in seen:
            proc = _run(scratch["shell"]("ftl campaign status --json"), scratch["repo"], scratch["env"])
            seen["campaign_id"] = _envelope(proc, "status")["data"]["campaign"]["id"]
        return seen["campaign_id"]

    return {
        "OBJECTIVE": lambda: "write the greeting files",
        "PLAN_FILE": lambda: str(scratch["plans"] / "greet.json"),
        "RUN_COMMAND": lambda: "echo done > task-out.txt",
        "VERIFY_COMMAND": lambda: "test -f task-out.txt",
        "FILE": lambda: "task-out.txt",
        "CAMPAIGN_ID": campaign_id,
        "LOG_FILE": lambda: f".ftl/events/{campaign_id()}.jsonl",
    }


def test_every_placeholder_is_known():
    known = set(_values({"plans": Path("."), "shell": None, "repo": None, "env": None}))
    for path in COMMANDS:
        for line in shell_lines(path):
            unknown = set(PLACEHOLDER_RE.findall(line)) - known
            assert not unknown, f"{path.name}: unknown placeholder(s) {sorted(unknown)} in {line}"


def test_command_shell_lines_run(scratch: dict[str, Any]):
    """Each command file's lines in file order, the files in COMMAND_ORDER, against one history:
    campaign (status, resume of the interrupted campaign, a new run), status, cascade, replay,
    task (shell builder, agent builder through agent_command, plan)."""
    assert sorted(p.stem for p in COMMANDS) == sorted(COMMAND_ORDER)
    seen: dict[str, str] = {}
    values = _values(scratch, seen)
    ran = []
    for stem in COMMAND_ORDER:
        for line in shell_lines(ROOT / "commands" / f"{stem}.md"):
            filled = PLACEHOLDER_RE.sub(lambda m: values[m.group(1)](), line)
            proc = _run(scratch["shell"](filled), scratch["repo"], scratch["env"])
            where = f"{stem}.md: {filled}"
            payload = _envelope(proc, where)
            assert proc.returncode == 0 and payload["success"], (where, payload, proc.stderr[-800:])
            data = payload["data"]
            named = (data.get("campaign") or {}).get("id") or data.get("campaign_id")
            if named:
                seen["campaign_id"] = named
            ran.append((stem, line, data))

    by_line = {line: data for _, line, data in ran}
    resumed = by_line["ftl campaign resume --json"]
    assert resumed["outcome"] == "complete" and resumed["summary"]["tasks"][0]["attempts"] == 2
    assert _integrated(scratch, resumed, "slow.txt") == "done\n"
    landed = [d for s, line, d in ran if "campaign land" in line]
    assert [d["how"] for d in landed] == ["fast-forward", "fast-forward"]
    assert (scratch["repo"] / "hello.txt").read_text() == "hi\n"  # the greet campaign, landed
    analysis = next(d for s, _, d in ran if s == "cascade" and "roots" in d)
    assert analysis["recommendation"] == "none"
    replays = [d for s, _, d in ran if s == "replay" and "violations" in d]
    assert len(replays) == 2 and all(r["violations"] == [] for r in replays)
    agent_task = next(d for s, line, d in ran if s == "task" and "--run" not in line and "--plan" not in line)
    assert agent_task["outcome"] == "complete"
    assert _integrated(scratch, agent_task, "task-out.txt").startswith("built by 001-task")


def _integrated(scratch: dict[str, Any], data: dict[str, Any], path: str) -> str:
    """``path`` as the campaign of ``data`` left it on its integration branch."""
    branch = data["summary"]["integration_branch"]
    return subprocess.run(["git", "show", f"{branch}:{path}"], cwd=scratch["repo"],
                          capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------- Claude Code CLI

def _claude_binary() -> str | None:
    return os.environ.get("FTL_CLAUDE") or shutil.which("claude")


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory):
    """Run the Claude Code CLI with a throwaway HOME, no credentials, no telemetry and, when
    user namespaces allow, no network at all."""
    binary = _claude_binary()
    if binary is None:
        pytest.skip("Claude Code CLI not installed: `npm install -g "
                    f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}` (or set FTL_CLAUDE)")
    home = tmp_path_factory.mktemp("claude-home")
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local" / "share"), XDG_CACHE_HOME=str(home / ".cache"),
               DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", FTL_PLUGIN_VENV=str(VENV))
    prefix: list[str] = []
    if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"],
                                                  capture_output=True).returncode == 0:
        prefix = ["unshare", "-rn"]

    def run(*args: str, cwd: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, binary, *args], cwd=cwd or home, env=env, input=stdin,
                              capture_output=True, text=True, timeout=180)

    version = run("--version")
    assert version.returncode == 0, version.stderr
    run.version = version.stdout.strip()
    run.home = home
    return run


def test_claude_plugin_validate_passes(claude):
    for target in (ROOT, CLAUDE_MANIFEST):
        plain = claude("plugin", "validate", str(target))
        assert plain.returncode == 0, plain.stdout + plain.stderr
        assert "Validation passed" in plain.stdout
        strict = claude("plugin", "validate", "--strict", "--json", str(target))
        report = json.loads(strict.stdout)
        assert strict.returncode == 0 and report["success"], strict.stdout
        assert report["manifest"]["errors"] == [] and report["manifest"]["warnings"] == []
        provides = report["provides"]
        assert sorted(provides["commands"]) == sorted(f"ftl:{s}" for s in COMMAND_ORDER)
        assert sorted(provides["agents"]) == ["ftl:builder", "ftl:explorer", "ftl:observer", "ftl:planner"]
        assert [s["name"] for s in provides["mcpServers"]] == ["ftl"]
        assert sorted(h["event"] for h in provides["hooks"]) == ["PostToolUse", "SessionStart"]


def _connected(listing: str, name: str) -> bool:
    line = next((l for l in listing.splitlines() if l.startswith(f"{name}: ")), "")
    return "Connected" in line and "Failed" not in line


def test_claude_mcp_list_reports_ftl_connected(claude, tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    added = claude("mcp", "add", "ftl", "--", sys.executable, str(HOOK), "exec", "ftl", "mcp",
                   cwd=project)
    assert added.returncode == 0, added.stdout + added.stderr
    listing = claude("mcp", "list", cwd=project)
    assert _connected(listing.stdout, "ftl"), listing.stdout + listing.stderr
    # The same server as the manifest registers it (python3 on PATH runs the launcher).
    from_manifest = claude("--plugin-dir", str(ROOT), "mcp", "list", cwd=project)
    assert _connected(from_manifest.stdout, "plugin:ftl:ftl"), from_manifest.stdout + from_manifest.stderr


def test_every_documented_ftl_toml_block_is_a_valid_configuration(tmp_path: Path):
    """Each ```toml block of docs/claude-code.md loads as an ftl.toml (no unknown keys)."""
    from ftl.config import load_config

    blocks = fenced(ROOT / "docs" / "claude-code.md", "toml")
    assert len(blocks) >= 2
    for block in blocks:
        (tmp_path / "ftl.toml").write_text(block, encoding="utf-8")
        load_config(None, tmp_path)


def test_claude_accepts_the_documented_command_templates(claude, tmp_path: Path):
    """agent_command and planner_command exactly as docs/claude-code.md gives them, with the
    agent swapped for a missing one: the CLI parses every flag (an unknown one is refused with
    "unknown option") and refuses the agent before any model call, listing the agents that
    exist, which must include the documented one."""
    (toml_block,) = [block for block in fenced(ROOT / "docs" / "claude-code.md", "toml")
                     if "agent_command" in block]
    templates = tomllib.loads(toml_block)
    assert set(templates) == {"agent_command", "planner_command"}
    for key, argv in templates.items():
        assert argv[:2] == ["claude", "-p"], key
        agent = argv[argv.index("--agent") + 1]
        assert agent in ("ftl:builder", "ftl:planner"), key
        probe = [a if a != agent else "ftl:no-such-agent" for a in argv[1:]]
        proc = claude(*probe[:1], "--plugin-dir", str(ROOT), *probe[1:], cwd=tmp_path, stdin="{}")
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "ftl:no-such-agent' not found" in output, (key, output)
        assert "unknown option" not in output, (key, output)
        listed = output.split("Available agents:", 1)[1]
        for name in ("explorer", "planner", "builder", "observer"):
            assert f"ftl:{name}" in listed, output


def test_claude_installs_the_plugin_from_its_marketplace(claude, tmp_path: Path):
    market = tmp_path / "ftl"
    ignore = shutil.ignore_patterns(".git", ".venv", ".ftl", "__pycache__", ".pytest_cache",
                                    ".hypothesis", "*.egg-info", "examples", "bench", "tests")
    shutil.copytree(ROOT, market, ignore=ignore)
    added = claude("plugin", "marketplace", "add", str(market))
    assert added.returncode == 0, added.stdout + added.stderr
    installed = claude("plugin", "install", "ftl@ftl")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    listing = claude("plugin", "list")
    assert "ftl@ftl" in listing.stdout and "enabled" in listing.stdout, listing.stdout
