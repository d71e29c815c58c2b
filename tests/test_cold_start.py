"""The light commands import only what they use (issue 11 item 1: fast start).

Each command runs in a fresh interpreter, exactly as a user runs it; the test then reads the
modules that interpreter loaded. It guards the import set, not the time (time is measured by
``bench/run_all.py``): a heavy library imported at module level by a light command fails here.
"""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftl.store import Store
from module_probe import run_script

# Libraries a light command must never load (each costs 20-400 ms at start), and ftl's heavy rooms.
HEAVY = ("pydantic", "pydantic_core", "clingo", "mcp", "starlette", "uvicorn", "cedarpy", "rich",
         "httpx", "prometheus_client", "jsonschema", "jsonschema_rs", "transitions", "jsonlines", "tenacity",
         "ftl.models", "ftl.manglecp", "ftl.server", "ftl.engine.runner", "ftl.surfaces.mcp_server", "ftl.postmortem.replay")

_PROBE = """
import json, sys
from ftl.surfaces.cli import main
code = 0
try:
    main.main(sys.argv[2:], prog_name="ftl", standalone_mode=True)
except SystemExit as stop:
    code = stop.code
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def _modules_after(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    report = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", _PROBE, str(report), *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert report.exists(), done.stderr[-2000:]
    data = json.loads(report.read_text())
    return data["code"], set(data["modules"])


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cold")
    with Store.for_repo(path) as store:
        store.create_campaign("cold start")
    return path


@pytest.mark.parametrize("argv", [("--help",), ("campaign", "status"), ("campaign", "status", "--json"),
                                  ("campaign", "--help")])
def test_light_commands_import_no_heavy_module(repo: Path, argv: tuple[str, ...]):
    code, modules = _modules_after(repo, *argv)
    assert code == 0
    assert "ftl.surfaces.cli" in modules
    assert _heavy(modules) == []


def test_the_guard_sees_a_heavy_import(repo: Path):
    # the same probe on a command that needs the server's modules reports them (the test can fail)
    code, modules = _modules_after(repo, "serve", "--help")
    assert code == 0
    assert "ftl.server.serve" in modules and "ftl.manglecp.server" in _heavy(modules)


def test_lazy_command_summaries_match_their_help():
    from ftl.surfaces.cli import main

    for name, (path, summary) in main.lazy_commands.items():
        module, _, attribute = path.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert command.name == name
        assert command.help.split("\n\n")[0].strip() == summary
        listed = __import__("click").Command(name, help=summary)
        for limit in (30, 45, 80):
            assert listed.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_indexing_the_command_table_loads_a_lazy_command():
    from ftl.surfaces.clickutil import LazyGroup

    group = LazyGroup("g")
    group.add_lazy_command("serve", "ftl.server.serve:serve", "Run ftl's embedded MangleCP server.")
    group.add_lazy_command("gone", "ftl.no_such_module:command", "An extra that is not installed.")
    assert "serve" not in group.commands  # nothing imported yet
    assert group.commands["serve"].name == "serve"
    assert "serve" in group.commands
    with pytest.raises(KeyError):
        group.commands["gone"]
    with pytest.raises(KeyError):
        group.commands["unknown"]


@pytest.mark.parametrize("command", ["status", "ready-tasks", "cascade-status", "next-task"])
def test_light_lib_campaign_commands_import_neither_heavy_modules_nor_logging(repo: Path, command: str):
    # lib/campaign.py's read-only commands: no pydantic, clingo, ... and no logging either (it is
    # set up only when a command needs it or fails; lib/_common.py `command(light=True)`)
    script = Path(__file__).resolve().parent.parent / "lib" / "campaign.py"
    _, data = run_script(script, command, cwd=repo)
    assert data["code"] == 0
    assert "_campaign" in data["modules"]
    assert _heavy(set(data["modules"])) == [] and "logging" not in data["modules"]


_SERVER_PROBE = """
import json, runpy, sys
report = sys.argv.pop(1)
code = 0
try:
    runpy.run_module("ftl.server.serve", run_name="__main__")
except SystemExit as stop:
    code = stop.code
with open(report, "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def test_the_embedded_server_boots_without_the_plan_models_or_a_client(tmp_path: Path):
    # issue 11 item 2: what the stdio server loads before its `ready` manifest is paid by every
    # campaign before EXPLORE; the plan models and the validation behind them load at the first
    # build or plan, the MangleCP client never (it is the runner's side)
    report = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", _SERVER_PROBE, str(report), "--stdio", "--repo", str(tmp_path)],
                          cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert report.exists(), done.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["code"] in (0, None) and '"status":"ready"' in done.stdout.splitlines()[0]
    modules = set(data["modules"])
    assert "ftl.manglecp.server" in modules and "ftl.server.tools.builders" in modules  # it did boot
    assert {"ftl.models", "ftl.validation", "ftl.manglecp.client", "ftl.manglecp.transport"} & modules == set()


_BOOT_PROBE = """
import json, sys
from pathlib import Path
from ftl.config import Config
from ftl.server.app import build_server
import ftl.events as ev

server = build_server(Path(sys.argv[2]), Config(), isolation="thread")
built = {m.__name__: bool(m.__pydantic_complete__) for m in (*ev.EVENT_FIELDS.values(), ev.EventRecord)}
schemas = {name: repr(tool.input_schema) for name, tool in server.catalog.items()}
server.close()
with open(sys.argv[1], "w") as out:
    json.dump({"modules": sorted(sys.modules), "built": built, "schemas": schemas}, out)
"""


def test_the_embedded_server_boots_without_what_it_needs_only_later(tmp_path: Path):
    # The server imports ftl.events for its helpers and never writes a log: the writer's
    # library (jsonlines, and attrs under it) and the event-field models' validators wait for
    # first use; so do the tools' JSON schemas (made when a tool is first selected) and the
    # TOML reader (the runner passes the configuration as JSON). Issue 11 item 2, boot time.
    report = tmp_path / "boot.json"
    done = subprocess.run([sys.executable, "-c", _BOOT_PROBE, str(report), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert report.exists(), done.stderr[-2000:]
    data = json.loads(report.read_text())
    assert "ftl.events" in data["modules"] and "ftl.server.tools.cascade" in data["modules"]
    assert not {"jsonlines", "attr", "tomllib"} & set(data["modules"])
    assert not any(data["built"].values()), data["built"]
    assert len(data["schemas"]) >= 10
    assert all("not made yet" in text for text in data["schemas"].values()), data["schemas"]


def test_a_tool_schema_made_late_is_the_advertised_schema(tmp_path: Path):
    import importlib

    from ftl.config import Config
    from ftl.server.catalog import TOOL_SPECS, TOOLS_PACKAGE, advertised_schema, build_catalog

    catalog, _ = build_catalog(tmp_path, Config())
    for spec in TOOL_SPECS:
        model = getattr(importlib.import_module(f"{TOOLS_PACKAGE}.{spec.module}"), spec.args_model)
        schema = catalog[spec.name].input_schema
        assert dict(schema) == advertised_schema(model, spec.server_bound) == schema
        assert "made" in repr(schema) and "not made" not in repr(schema)


def test_the_event_models_still_validate_and_describe_events():
    import ftl.events as ev

    fields = ev.TaskCommitFields.model_validate({"task_seq": "001", "attempt": 1, "commit": "a" * 40,
                                                 "base": "b" * 40, "file_count": 0, "files": []})
    assert fields.attempt == 1
    schema = ev.add_event_fields(ev.EventRecord.model_json_schema())
    assert set(schema["$defs"]) >= {m.__name__ for m in ev.EVENT_FIELDS.values()}


_LOADED = """
import json, sys
import ftl, ftl.states, ftl.surfaces.cli
print(json.dumps({"modules": sorted(sys.modules), "ftl": ftl.__file__, "states": ftl.states.__file__,
                  "path": sys.path}))
"""


def test_the_benchmarks_regular_install_starts_without_the_editable_hook(tmp_path: Path):
    """bench/run_all.py's reference rows compare with the bare start of a regular install: its
    interpreter must load no import hook at start, find ftl (``ftl.states`` mapped to
    ``states/`` as the wheel maps it) and the dependencies, and run the console script."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        import run_all
    finally:
        sys.path.pop(0)
    regular = run_all.regular_install(tmp_path)
    root = Path(__file__).resolve().parent.parent
    bare = subprocess.run([regular.python, "-c", "import json, sys; print(json.dumps(sorted(sys.modules)))"],
                          env=regular.env, capture_output=True, text=True, timeout=60, check=True)
    assert not [m for m in json.loads(bare.stdout) if "editable" in m or m in ("pathlib", "importlib.util")]
    loaded = json.loads(subprocess.run([regular.python, "-c", _LOADED], env=regular.env, cwd=tmp_path,
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    assert Path(loaded["ftl"]).resolve() == (root / "ftl" / "__init__.py").resolve()
    assert Path(loaded["states"]).resolve() == (root / "states" / "__init__.py").resolve()
    assert str(root) not in loaded["path"]  # found through the layout, not the checkout
    helped = subprocess.run([regular.ftl, "--help"], env=regular.env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "campaign" in helped.stdout, helped.stderr[-2000:]


_FROZEN_AT_EXIT = """
import atexit, gc, runpy, sys
report, sys.argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(report, "w").write(str(gc.get_freeze_count())))  # runs after the command
if sys.argv[0] == "ftl":
    from ftl.surfaces.entry import console
    sys.exit(console())
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("argv", [("ftl", "--help"), ("ftl", "campaign", "status"),
                                  ("lib/campaign.py", "status"), ("lib/memory.py", "stats")])
def test_the_entry_points_exit_without_the_last_collection(repo: Path, tmp_path: Path, argv: tuple[str, ...]):
    """The console script and the lib scripts freeze what is alive when the command ends, so the
    interpreter's last collection at exit skips it (10-20 ms of every command); the exit code is
    the command's own."""
    root = Path(__file__).resolve().parent.parent
    script = argv[0] if argv[0] == "ftl" else str(root / argv[0])
    report = tmp_path / "frozen"
    done = subprocess.run([sys.executable, "-c", _FROZEN_AT_EXIT, str(report), script, *argv[1:]], cwd=repo,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(report.read_text()) > 1000  # the modules and objects of the command, not a handful


_COLLECTIONS_BEFORE_THE_COMMAND = """
import gc, os, sys
report, sys.argv = sys.argv[1], sys.argv[2:]
runs, freeze = [], gc.freeze
gc.callbacks.append(lambda phase, info: runs.append(info["generation"]) if phase == "start" else None)
def first_freeze():  # the entry point's freeze before the command: report the collections so far
    if not first_freeze.done:
        first_freeze.done = True
        open(report, "w").write(repr((len(runs), gc.isenabled(), gc.get_count()[0])))
    freeze()
first_freeze.done = False
gc.freeze = first_freeze
# What runs before the pause is loaded first (compiling a module without a cached .pyc allocates
# enough to trigger a collection), then the young generation is emptied: from here on, only
# what the entry point loads counts.
if sys.argv[0] == "ftl":
    from ftl.surfaces.entry import console
    gc.collect()
    runs.clear()
    sys.exit(console())
code = compile(open(sys.argv[0]).read(), sys.argv[0], "exec")
sys.path.insert(0, os.path.dirname(os.path.realpath(sys.argv[0])))
import _launch
gc.collect()
runs.clear()
exec(code, {"__name__": "__main__", "__file__": sys.argv[0]})
"""


@pytest.mark.parametrize("argv", [("ftl", "--help"), ("lib/campaign.py", "status"), ("lib/plan.py", "--help"),
                                  ("lib/workspace.py", "--help")])
def test_the_entry_points_load_their_modules_without_a_collection(repo: Path, tmp_path: Path,
                                                                    argv: tuple[str, ...]):
    """The console script and the lib scripts (`lib/_launch.py`) import with the cyclic
    collector paused (it would only re-scan the objects the imports build, which live as long as
    the process), then freeze them and resume it before the command runs."""
    root = Path(__file__).resolve().parent.parent
    script = argv[0] if argv[0] == "ftl" else str(root / argv[0])
    report = tmp_path / "collections"
    done = subprocess.run([sys.executable, "-c", _COLLECTIONS_BEFORE_THE_COMMAND, str(report), script,
                           *argv[1:]], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    collections, enabled, young = eval(report.read_text())  # noqa: S307 - our own repr of ints
    assert collections == 0
    assert young > 700  # objects were allocated meanwhile: without the pause, collections would have run
    assert enabled is False  # resumed by the entry point right after this freeze
    assert gc.isenabled()  # (this process: untouched)


@pytest.mark.parametrize("enabled", [True, False])
def test_importing_a_lib_script_leaves_collection_as_it_was(enabled: bool):
    """Imported rather than run (runpy, tests), a lib script gives its click group and leaves the
    collector as it found it."""
    import runpy

    root = Path(__file__).resolve().parent.parent
    if not enabled:
        gc.disable()
    try:
        loaded = runpy.run_path(str(root / "lib" / "campaign.py"), run_name="lib_campaign_imported")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert "ready-tasks" in loaded["cli"].commands


@pytest.mark.parametrize("argv", [("exploration.py", "--help"), ("exploration.py", "read"),
                                  ("exploration.py", "get-structure"), ("exploration.py", "aggregate-session"),
                                  ("exploration.py", "session-status"), ("orchestration.py", "check-explorers")])
def test_exploration_commands_that_need_no_model_load_no_heavy_module(repo: Path, argv: tuple[str, ...]):
    """exploration.py names the four explorer modes at import; they and the quorum rule live in
    `ftl.explore_rules`, so its reads and aggregation start without pydantic (it loaded
    `ftl.models` at import before: 310 ms a call, 3x its neighbours). write-result still
    validates with the model. The explorer progress polls read the quorum without the config's
    model when the repository has no ftl.toml (`Env.explorer_settings`)."""
    script = Path(__file__).resolve().parent.parent / "lib" / argv[0]
    polls = ("aggregate-session", "session-status", "check-explorers")
    session = ["--session", Store.for_repo(repo).active_campaign()["campaign_id"]] if argv[1] in polls else []
    _, data = run_script(script, *argv[1:], *session, cwd=repo)
    assert data["code"] == 0
    assert "ftl.explore_rules" in data["modules"]
    assert _heavy(set(data["modules"])) == []


@pytest.mark.parametrize("toml, quorum", [(None, 3), ("explorer_quorum = 2\n", 2), ("[ftl]\nexplorer_quorum = 4\n", 4)])
def test_explorer_polls_take_the_quorum_of_ftl_toml_or_its_default(tmp_path: Path, toml: str | None, quorum: int):
    """With ftl.toml the polls read the quorum through the config's model; without it, the
    model's default (single-sourced in `ftl.explore_rules`)."""
    from ftl.config import Config

    assert Config().explorer_quorum == 3 and Config().explorer_timeout_s == 300.0
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("quorum")["campaign_id"]
    if toml is not None:
        (tmp_path / "ftl.toml").write_text(toml)
    script = Path(__file__).resolve().parent.parent / "lib" / "orchestration.py"
    done, data = run_script(script, "check-explorers", "--session", cid, cwd=tmp_path)
    assert data["code"] == 0, done.stdout
    assert json.loads(done.stdout)["data"]["quorum_required"] == quorum
    assert ("pydantic" in data["modules"]) is (toml is not None)


def test_an_invalid_ftl_toml_still_fails_an_explorer_poll(tmp_path: Path):
    with Store.for_repo(tmp_path) as store:
        cid = store.create_campaign("quorum")["campaign_id"]
    (tmp_path / "ftl.toml").write_text("explorer_quorum = 9\n")
    script = Path(__file__).resolve().parent.parent / "lib" / "orchestration.py"
    done, data = run_script(script, "check-explorers", "--session", cid, cwd=tmp_path)
    assert data["code"] == 2
    failure = json.loads(done.stdout)
    assert failure["data"]["ftl_error_type"] == "configuration_error"
    assert failure["data"]["details"]["violations"][0]["path"] == "explorer_quorum"
