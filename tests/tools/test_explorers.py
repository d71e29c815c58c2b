"""Explorers on small synthetic repositories: layout, framework tiers, memory ranking, delta."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.models import ExplorerResult
from ftl.server.tools.explorers import (ExploreArgs, detect_frameworks, explore_delta,
                                        explore_memory, explore_pattern, explore_structure,
                                        keywords, parse_readme_idioms)
from ftl.store import Store
from ftl.memory import MemoryStore

from .conftest import git, write

FLASK_APP = "from flask import Flask\napp = Flask(__name__)\n"
PLAIN = "import os\n\ndef helper(x: int) -> int:\n    return x\n"


def explore(fn, repo, ctx_for, objective="", **kwargs):
    result = fn(ExploreArgs(objective=objective, **kwargs), ctx_for(repo))
    ExplorerResult.model_validate(result)  # every result has the documented common shape
    return result


# --------------------------------------------------------------------------- structure

def test_structure_maps_layout_and_skips_tool_directories(tmp_path, ctx_for):
    write(tmp_path, {
        "pyproject.toml": '[project]\nname = "demo"\n[project.scripts]\ndemo = "demo.cli:main"\n',
        "requirements-dev.txt": "pytest\n",
        "demo/__init__.py": "", "demo/cli.py": "def main(): pass\n", "demo/core.py": PLAIN,
        "tests/test_core.py": "def test_x(): pass\n", "tests/test_cli.py": "def test_y(): pass\n",
        "web/index.js": "console.log(1)\n",
        ".venv/pyvenv.cfg": "home = /usr\n", ".venv/lib/x.py": "",
        "node_modules/pkg/index.js": "", ".git/config": "", "__pycache__/x.pyc": "",
        "env2/pyvenv.cfg": "", "env2/lib/site.py": "",
    })
    result = explore(explore_structure, tmp_path, ctx_for)
    assert result["status"] == "ok" and result["mode"] == "structure"
    assert result["directories"]["tests"] is True and result["directories"]["src"] is False
    assert result["directories"]["demo"] is True
    assert not {".venv", "node_modules", ".git", "__pycache__", "env2"} & set(result["directories"])
    assert result["entry_points"][0] == "demo/cli.py" and "web/index.js" in result["entry_points"]
    assert result["config_files"] == ["pyproject.toml", "requirements-dev.txt"]
    assert result["test_pattern"] == "tests/test_*.py"
    assert result["file_count"] == 8
    assert result["language"] == "python" and result["languages"] == {"javascript": 1, "python": 5}


def test_structure_of_an_empty_repo(tmp_path, ctx_for):
    result = explore(explore_structure, tmp_path, ctx_for)
    assert result["status"] == "ok" and result["file_count"] == 0
    assert result["language"] is None and result["test_pattern"] is None


def test_cancelled_explorer_is_partial(tmp_path, ctx_for):
    write(tmp_path, {f"m{i}.py": PLAIN for i in range(5)})
    cancel = threading.Event()
    cancel.set()
    result = explore_structure(ExploreArgs(), ctx_for(tmp_path, cancel=cancel))
    assert result["status"] == "partial" and result["stopped"] == "cancelled"
    assert result["file_count"] < 5


def test_explorer_out_of_time_is_partial(tmp_path, ctx_for):
    write(tmp_path, {f"d{i}/m.py": PLAIN for i in range(20)})
    result = explore(explore_delta, tmp_path, ctx_for, objective="helper", timeout_s=1e-9)
    assert result["status"] == "partial" and result["stopped"] == "timeout"


# --------------------------------------------------------------------------- pattern tiers

def test_tier_readme_framework_idioms_section(tmp_path, ctx_for):
    write(tmp_path, {
        "README.md": "# App\n\n## Framework Idioms\n\nWe use FastHTML.\n\n### Required\n"
                     "- Return FT components\n\n### Forbidden\n- Raw HTML strings\n"
                     "- Never use Jinja\n\n## Install\n- pip install?\n",
        "app.py": PLAIN,
    })
    result = explore(explore_pattern, tmp_path, ctx_for)
    assert (result["framework"], result["confidence"]) == ("fasthtml", 0.95)
    assert result["idioms"] == {"required": ["Return FT components"],
                                "forbidden": ["Raw HTML strings", "Never use Jinja"]}
    assert result["idioms_source"] == "readme"
    assert result["readme_sections"] == ["App", "Framework Idioms", "Required", "Forbidden", "Install"]


def test_tier_import_in_most_files(tmp_path, ctx_for):
    write(tmp_path, {"a.py": FLASK_APP, "b.py": FLASK_APP, "c.py": PLAIN})
    result = explore(explore_pattern, tmp_path, ctx_for)
    assert (result["framework"], result["confidence"]) == ("flask", 0.85)
    assert result["idioms_source"] == "registry" and result["idioms"]["required"]


def test_tier_any_import(tmp_path, ctx_for):
    write(tmp_path, {"a.py": FLASK_APP, "b.py": PLAIN, "c.py": PLAIN})
    assert explore(explore_pattern, tmp_path, ctx_for)["confidence"] == 0.75


def test_tier_declared_dependency_only(tmp_path, ctx_for):
    write(tmp_path, {"pyproject.toml": '[project]\nname = "x"\ndependencies = ["Django>=4"]\n',
                     "a.py": PLAIN})
    result = explore(explore_pattern, tmp_path, ctx_for)
    assert (result["framework"], result["confidence"]) == ("django", 0.65)


def test_tier_declared_in_setup_cfg_and_requirements(tmp_path, ctx_for):
    write(tmp_path, {"setup.cfg": "[options]\ninstall_requires =\n    aiohttp>=3\n",
                     "requirements.txt": "# comment\n-e .\nSQLAlchemy==2.0\n"})
    names = {f["name"] for f in explore(explore_pattern, tmp_path, ctx_for)["frameworks"]}
    assert names == {"aiohttp", "sqlalchemy"}


def test_tier_none(tmp_path, ctx_for):
    write(tmp_path, {"a.py": PLAIN})
    result = explore(explore_pattern, tmp_path, ctx_for)
    assert (result["framework"], result["confidence"], result["frameworks"]) == (None, 0.0, [])
    assert result["idioms"] == {"required": [], "forbidden": []}


def test_more_specific_framework_wins_a_tie():
    sources = {"a.py": "from fastapi import FastAPI\nfrom starlette.requests import Request\n"}
    ranked = detect_frameworks(sources, set(), None)
    assert [f["name"] for f in ranked] == ["fastapi", "starlette"]


def test_readme_section_without_a_name_raises_the_detected_framework():
    idioms = parse_readme_idioms("## Framework idioms\n- Always use blueprints\n")
    ranked = detect_frameworks({"a.py": "import flask\n", "b.py": PLAIN, "c.py": PLAIN}, set(), idioms)
    assert ranked[0]["name"] == "flask" and ranked[0]["confidence"] == 0.95


def test_style_and_test_runner(tmp_path, ctx_for):
    write(tmp_path, {
        "a.py": '"""m."""\n\ndef f(x: int) -> int:\n    """Doc."""\n    return x\n\n'
                'def g(y: str) -> str:\n    """Doc."""\n    return y\n',
        "tests/conftest.py": "", "pytest.ini": "[pytest]\n", "broken.py": "def (:\n",
    })
    result = explore(explore_pattern, tmp_path, ctx_for)
    assert result["style"]["type_hints"] is True and result["style"]["docstrings"] == "thorough"
    assert (result["test_runner"], result["test_command"]) == ("pytest", "python -m pytest")


def test_test_runner_outside_python(tmp_path, ctx_for):
    write(tmp_path, {"package.json": '{"scripts": {"test": "vitest"}, "devDependencies": {"vitest": "1"}}'})
    result = explore(explore_pattern, tmp_path, ctx_for)
    assert (result["test_runner"], result["test_command"]) == ("vitest", "npm test")
    assert result["style"]["docstrings"] == "none"


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("#-*: \nabcAvoidNeverFramework Idioms?✗1."), max_size=300))
def test_readme_idiom_parser_never_raises(text):
    found = parse_readme_idioms(text)
    assert found is None or set(found) == {"required", "forbidden", "text"}


# --------------------------------------------------------------------------- memory

def test_memory_without_a_store_is_ok_and_creates_nothing(tmp_path, ctx_for):
    result = explore(explore_memory, tmp_path, ctx_for, objective="anything")
    assert result["status"] == "ok" and result["failures"] == [] and result["patterns"] == []
    assert not (tmp_path / ".ftl").exists()


def test_memory_unreadable_store_is_an_error_result(tmp_path, ctx_for):
    write(tmp_path, {".ftl/ftl.db": "this is not sqlite" * 100})
    result = explore(explore_memory, tmp_path, ctx_for)
    assert result["status"] == "error" and result["error_type"] == "conflict" and result["error"]


def test_unexpected_failure_is_an_error_result_without_internals(tmp_path, ctx_for, monkeypatch):
    def boom(text):
        raise RuntimeError(f"secret path {tmp_path}")

    monkeypatch.setattr("ftl.server.tools.explorers.keywords", boom)
    result = explore_delta(ExploreArgs(objective="x"), ctx_for(tmp_path, correlation_id="cid-7"))
    assert result == {"mode": "delta", "status": "error", "error_type": "internal_error",
                      "error": "RuntimeError in the delta explorer (correlation id cid-7)"}


def test_memory_ranks_by_objective_overlap_and_finds_similar_campaigns(tmp_path, ctx_for):
    with Store.for_repo(tmp_path) as store:
        MemoryStore(store).record({"name": "auth-token-expiry", "type": "failure",
                          "trigger": "JWT token expired during login test", "fix": "freeze time"})
        MemoryStore(store).record({"name": "css-grid", "type": "failure", "trigger": "layout broke",
                          "fix": "use flex"})
        MemoryStore(store).record({"name": "login-form", "type": "pattern", "trigger": "login form",
                          "insight": "validate the token server side"})
        old = store.create_campaign("Add login with token refresh")
        store.finish_campaign(old["campaign_id"], "complete", {"complete": 2, "blocked": 0})
        store.create_campaign("Unrelated styling work")
    result = explore(explore_memory, tmp_path, ctx_for, objective="Fix login token refresh")
    assert [f["name"] for f in result["failures"]] == ["auth-token-expiry"]
    # bm25 relevance: best failure match x share of the objective's words it matches (login, token)
    assert result["failures"][0]["_relevance"] == pytest.approx(2 / 4, abs=1e-3)
    assert [p["name"] for p in result["patterns"]] == ["login-form"]
    assert result["total_in_memory"] == {"failures": 2, "patterns": 1}
    assert [c["objective"] for c in result["similar_campaigns"]] == ["Add login with token refresh"]
    assert result["similar_campaigns"][0]["outcome"] == "complete"


def test_keywords_split_identifiers_and_drop_noise():
    assert keywords("Add parseTokens to the user_session module (2 files)") == [
        "parse", "token", "user", "session", "module"]


# --------------------------------------------------------------------------- delta

def test_delta_finds_definitions_and_changed_files(git_repo, ctx_for):
    write(git_repo, {
        "auth/session.py": "class Session:\n    pass\n\n\ndef refresh_token(s):\n    return s\n",
        "auth/views.py": "def index():\n    return 'token'\n",
        "util.py": "def unrelated():\n    pass\n",
    })
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-q", "-m", "more")
    write(git_repo, {"b.py": "B = 2\n"})  # uncommitted change
    result = explore(explore_delta, git_repo, ctx_for, objective="Refresh the session token")
    assert result["search_terms"] == ["refresh", "session", "token"]
    by_path = {c["path"]: c for c in result["candidates"]}
    top = result["candidates"][0]
    assert top["path"] == "auth/session.py" and top["relevance"] == "high"
    assert top["functions"] == [{"name": "Session", "line": 1}, {"name": "refresh_token", "line": 5}]
    assert top["lines"] == 6 and 0 < top["confidence"] <= 0.95
    assert by_path["auth/views.py"]["relevance"] == "low"
    assert by_path["b.py"]["changed"] and by_path["b.py"]["relevance"] == "medium"
    assert "util.py" not in by_path
    assert result["changed_files"] == ["b.py"]


def test_delta_without_objective_lists_only_changes(tmp_path, ctx_for):
    write(tmp_path, {"a.py": PLAIN})
    result = explore(explore_delta, tmp_path, ctx_for)
    assert result["status"] == "ok" and result["candidates"] == [] and result["changed_files"] == []
