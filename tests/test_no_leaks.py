"""No error envelope leaks internals: every lib/ command, every `ftl ... --json` command and every
MCP tool, driven with bad input that carries planted secrets (``password=hunter2``,
``Authorization: Bearer abc123def456ghi``) and absolute paths of the test's tmp directory.

Each failure envelope (and each JSON-RPC error of the MCP server) is checked: no "Traceback", no
absolute path of tmp_path, no planted secret. The lib/ scripts run in process through their real
entry point (`lib/_common.run`, what ``python lib/<script>.py`` calls) for speed; their commands
and the CLI's are enumerated from the click groups, so a new command is driven automatically
(lib/) or must be added to `FTL_CASES` (the coverage test fails otherwise).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import anyio
import click
import pytest
from click.testing import CliRunner
from mcp import Client, MCPError

from ftl.surfaces.cli import main as ftl_main
from ftl.surfaces.jsonrpc import CorrelationIds
from ftl.surfaces.mcp_server import TOOLS, FtlMcpServer
from ftl.telemetry.metrics import Metrics
from ftl.engine.runner import Runner, connect_in_process

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"
SCRIPTS = ("campaign", "workspace", "plan", "exploration", "orchestration")
SECRETS = ("hunter2", "abc123def456ghi")
PLANTED = "password=hunter2 Authorization: Bearer abc123def456ghi"


def planted(tmp_path: Path) -> str:
    return f"{tmp_path}/nope/x.json {PLANTED}"


def assert_clean(text: str, tmp_path: Path, where: str) -> None:
    assert "Traceback" not in text, where
    assert str(tmp_path) not in text, f"{where}: absolute path leaked: {text[:400]}"
    for secret in SECRETS:
        assert secret not in text, f"{where}: secret {secret} leaked: {text[:400]}"


# --------------------------------------------------------------------------- lib/ scripts

def _load(script: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_ftl_lib_{script}", LIB / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lib_modules() -> dict[str, Any]:
    raise_exceptions = logging.raiseExceptions
    modules = {name: _load(name) for name in SCRIPTS}
    yield modules
    logging.raiseExceptions = raise_exceptions


def run_lib(module: Any, argv: list[str], stdin: bytes, capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        sys.modules["_common"].run(module.cli, argv)  # the scripts' own entry point
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def _variants(command: click.Command, bad: str) -> Iterator[tuple[str, list[str], bytes]]:
    """(label, argv after the command name, stdin) triples of bad input for one command."""
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.is_flag
               and p.name != "help"]
    args = [bad for _ in arguments]
    bad_json = f'{{"tasks": [{{"seq": "{bad}"}}], broken {PLANTED}'.encode()
    shaped = json.dumps({"password": "hunter2", "auth": f"Authorization: Bearer {SECRETS[1]}",
                         "objective": bad, "tasks": bad, "mode": bad, "status": bad,
                         "result": {"path": bad}}).encode()
    with_options = list(args)
    for option in options:
        with_options += [option.opts[0], bad]
    yield "everything-planted", with_options, bad_json
    yield "arguments-planted", args, shaped
    yield "nothing-given", [], b""
    yield "not-utf8", args, b"\xff\xfe" + PLANTED.encode()
    yield "extra-argument", [*args, bad, "--no-such-option"], b""


@pytest.fixture(scope="module")
def repos(tmp_path_factory, lib_modules) -> dict[str, Path]:
    """An empty repository and one with an active campaign and a running task."""
    base = tmp_path_factory.mktemp("leaks")
    empty, active = base / "empty", base / "active"
    empty.mkdir()
    active.mkdir()
    from ftl.store import Store
    from ftl.validation import parse_plan

    plan = parse_plan({"objective": "ship", "framework": "none", "tasks": [
        {"seq": "001", "slug": "one", "verify": "true", "depends": "none"},
        {"seq": "002", "slug": "two", "verify": "true", "depends": ["001"]}]}, source="test")
    with Store.for_repo(active) as store:
        campaign = store.create_campaign("ship")
        store.add_tasks(campaign["campaign_id"], plan)
        store.transition_task(campaign["campaign_id"], "001", "running", worker="w1")
    return {"empty": empty, "active": active, "base": base}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_lib_command_fails_cleanly(script: str, lib_modules, repos, capsys, monkeypatch) -> None:
    module = lib_modules[script]
    tmp_path = repos["base"]
    bad = planted(tmp_path)
    failures_per_command: dict[str, int] = {}
    for name, command in sorted(module.cli.commands.items()):
        failures_per_command[name] = 0
        for repo_name in ("empty", "active"):
            for label, rest, stdin in _variants(command, bad):
                argv = ["--repo", str(repos[repo_name]), name, *rest]
                code, out, err = run_lib(module, argv, stdin, capsys, monkeypatch)
                where = f"{script} {name} [{repo_name}/{label}]"
                lines = out.splitlines()
                assert len(lines) == 1, f"{where}: {out!r} {err!r}"
                envelope = json.loads(lines[0])
                assert envelope["meta"]["version"] == "response-v2", where
                if envelope["success"]:
                    continue
                failures_per_command[name] += 1
                assert code in (1, 2, 130), where
                assert_clean(out + err, tmp_path, where)
    silent = [name for name, count in failures_per_command.items() if count == 0]
    assert not silent, f"{script}: commands that never refused bad input: {silent}"


# --------------------------------------------------------------------------- ftl ... --json

def _json_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _json_commands(command, path + (name,))
        elif any(p.name == "as_json" for p in command.params):
            yield path + (name,)


def _ftl_cases(tmp: Path) -> list[tuple[str, ...]]:
    bad = planted(tmp)
    repo = tmp / "repo"
    return [
        ("campaign", "run", bad, "--plan", str(tmp / "bad.json"), "--repo", str(repo)),
        ("campaign", "run", bad, "--plan", str(tmp / "secret-values.json"), "--repo", str(repo)),
        ("campaign", "run", bad, "--plan", bad, "--repo", str(repo)),
        ("campaign", "run", bad, "--revised-plan", str(tmp / "bad.json"), "--repo", str(repo)),
        ("campaign", "run", bad, "--config", str(tmp / "bad.toml"), "--repo", str(repo)),
        ("campaign", "run", bad, "--config", str(tmp / "bad-values.toml"), "--repo", str(repo)),
        ("campaign", "run", bad, "--repo", bad),
        ("campaign", "run", "--repo", str(repo)),
        ("campaign", "run", bad, "--server", bad, "--repo", str(tmp / "throwaway")),
        ("campaign", "resume", "--campaign", bad, "--repo", str(repo)),
        ("campaign", "resume", "--repo", bad),
        ("campaign", "status", "--campaign", bad, "--repo", str(repo)),
        ("campaign", "land", "--campaign", bad, "--repo", str(repo)),
        ("campaign", "land", "--into", bad, "--repo", str(repo)),
        ("campaign", "land", "--repo", bad),
        ("campaign", "clean", "--campaign", bad, "--repo", str(repo)),
        ("campaign", "clean", "--repo", bad),
        ("task", bad, "--repo", str(repo)),
        ("task", bad, "--plan", str(tmp / "bad.json"), "--repo", str(repo)),
        ("task", bad, "--verify", "true", "--config", str(tmp / "bad.toml"), "--repo", str(repo)),
        ("replay", bad),
        ("replay", str(tmp / "bad.json"), bad),
    ]


def test_ftl_cases_cover_every_json_command(tmp_path: Path) -> None:
    covered = {tuple(a for a in case if not a.startswith(("-", "/")) and " " not in a)[:2]
               for case in _ftl_cases(tmp_path)}
    for path in _json_commands(ftl_main):
        assert any(c[:len(path)] == path for c in covered), f"add bad-input cases for ftl {' '.join(path)}"


def test_every_ftl_json_command_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "throwaway").mkdir()
    (tmp_path / "bad.json").write_text('{"objective": "x", ' + PLANTED + "}")
    (tmp_path / "secret-values.json").write_text(json.dumps({
        "objective": PLANTED, "framework": PLANTED,
        "tasks": [{"seq": "password=hunter2", "slug": f"Authorization: Bearer {SECRETS[1]}",
                   "verify": 7, "depends": [f"{tmp_path}/x"]}]}))
    (tmp_path / "bad.toml").write_text(f'max_iterations = "{PLANTED}"\nbroken = = 1\n')
    (tmp_path / "bad-values.toml").write_text(
        f'max_iterations = "{PLANTED}"\nserver = "{tmp_path}/srv {PLANTED}"\nunknown_key = "{PLANTED}"\n')
    runner = CliRunner()
    for case in _ftl_cases(tmp_path):
        result = runner.invoke(ftl_main, [*case, "--json"])
        where = "ftl " + " ".join(case)
        assert result.exit_code in (1, 2), f"{where}: exit {result.exit_code}: {result.output[:300]}"
        envelope = json.loads(result.stdout)
        assert envelope["success"] is False and envelope["meta"]["version"] == "response-v2", where
        assert_clean(result.stdout + result.stderr, tmp_path, where)


def test_ftl_usage_errors_under_json_are_clean_envelopes(tmp_path: Path) -> None:
    runner = CliRunner()
    for case in (("replay", str(tmp_path), "--json"),
                 ("campaign", "run", "x", "--jobs", PLANTED, "--repo", str(tmp_path), "--json")):
        result = runner.invoke(ftl_main, list(case))
        assert_clean(result.stdout + result.stderr, tmp_path, "ftl " + " ".join(case))
        assert json.loads(result.stdout)["success"] is False


# --------------------------------------------------------------------------- MCP tools

def _tool_variants(spec: Any, bad: str) -> Iterator[dict[str, Any]]:
    properties = spec.args.model_json_schema()["properties"]
    yield {name: bad for name in properties}                      # wrong types too
    yield {name: bad for name, schema in properties.items()
           if "string" in json.dumps(schema) and name != "repo"}  # well-typed, bad values
    yield {"unexpected": bad, "repo": bad}


def test_every_mcp_tool_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    server = FtlMcpServer(tmp_path / "repo", metrics=Metrics(), correlation=CorrelationIds("leak"),
                          runner_factory=functools.partial(Runner, client_factory=connect_in_process))
    bad = planted(tmp_path)
    answers: list[tuple[str, Any]] = []

    async def main() -> None:
        async with Client(server.server, mode="legacy") as client:
            for spec in TOOLS:
                for arguments in _tool_variants(spec, bad):
                    try:
                        answers.append((spec.name, await client.call_tool(spec.name, arguments)))
                    except MCPError as error:
                        answers.append((spec.name, error))

    anyio.run(main)
    refused = set()
    for name, answer in answers:
        if isinstance(answer, MCPError):
            text = json.dumps({"code": answer.code, "message": answer.message, "data": answer.data})
        elif answer.is_error:
            text = answer.content[0].text
        else:
            continue
        refused.add(name)
        assert_clean(text, tmp_path, f"mcp {name}")
    assert refused == {spec.name for spec in TOOLS}
