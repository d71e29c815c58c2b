"""Fixtures for the tool tests: throw-away repositories (plain and git) and tool contexts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ftl.server.tools.context import ToolContext

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")


def agent(mode: str) -> list[str]:
    """Command line of the stand-in agent in ``mode``."""
    return [sys.executable, str(FAKE_AGENT), mode]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t",
                    "-c", "commit.gpgsign=false", *args], cwd=repo, check=True,
                   capture_output=True)


def write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A git repository with one commit holding a.py, b.py and README.md."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write(repo, {"a.py": "A = 1\n", "b.py": "B = 1\n", "README.md": "# demo\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    return repo


@pytest.fixture
def ctx_for():
    def make(repo: Path, **kwargs) -> ToolContext:
        return ToolContext(repo=repo, **kwargs)
    return make


def make_campaign(repo: Path, tasks: list[dict], objective: str = "demo objective"):
    """A store under ``repo/.ftl`` with an active campaign whose plan has ``tasks``."""
    from ftl.models import Plan
    from ftl.store import Store

    store = Store.for_repo(repo)
    plan = Plan.model_validate({"objective": objective, "tasks": [
        {"verify": "true", "delta": [f"{t['slug']}.py"], **t} for t in tasks]})
    campaign_id = store.create_campaign(objective, plan=plan)["campaign_id"]
    store.add_tasks(campaign_id, plan)
    return store, campaign_id


def attempt(store, campaign_id: str, seq: str, outcome: str, *, reason: str = "",
            delivered: str = "") -> None:
    """Run one recorded attempt of task ``seq`` ending ``complete`` or ``blocked`` (as BUILD does:
    start the task, record the workspace, finish it with a result, move the task)."""
    row = store.task(campaign_id, seq)
    if row["status"] == "blocked":
        store.transition_task(campaign_id, seq, "pending", reason="replan")
    row = store.transition_task(campaign_id, seq, "running")
    workspace_id = f"{row['seq']}-{row['slug']}"
    store.record_workspace(campaign_id, {"workspace_id": workspace_id, "seq": row["seq"],
                                         "attempt": row["attempts"], "delta": row["spec"]["delta"]})
    if outcome == "complete":
        result = {"build": {"status": "complete", "delivered": delivered}, "verify": {"passed": True}}
        store.finish_workspace(campaign_id, workspace_id, row["attempts"], "complete", result)
        store.transition_task(campaign_id, seq, "complete", delivered=delivered)
    else:
        error_type = reason.split(":", 1)[0] if ":" in reason else None
        store.finish_workspace(campaign_id, workspace_id, row["attempts"], "blocked",
                               {"error_type": error_type, "reason": reason})
        store.transition_task(campaign_id, seq, "blocked", reason=reason)
