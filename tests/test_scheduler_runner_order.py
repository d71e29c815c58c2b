"""The runner's start order in a real campaign: the scheduler ranks tasks by their budgets (the
planner's duration estimate), not by their timeouts (a limit, often the same for every task)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ftl.config import Config
from ftl.events import read_events
from ftl.engine.runner import Runner, connect_in_process


def _repo(path: Path) -> Path:
    path.mkdir()
    (path / ".gitignore").write_text(".ftl/\n")
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=path, check=True)
    return path


def test_one_lane_starts_the_biggest_budget_first_when_timeouts_are_equal(tmp_path: Path) -> None:
    budgets = {"001": 1, "002": 3, "003": 2}
    plan = {"objective": "start order", "tasks": [
        {"seq": seq, "slug": f"task-{seq}", "type": "BUILD", "delta": [], "run": "true",
         "verify": "true", "budget": budget, "timeout_s": 60, "depends": "none"}
        for seq, budget in budgets.items()]}
    repo = _repo(tmp_path / "repo")
    with Runner(repo, Config(jobs=1, isolation="shared"), client_factory=connect_in_process) as runner:
        result = runner.start(plan["objective"], plan_input=plan)
    assert result.exit_code == 0, result.summary
    starts = [e["task_seq"] for e in read_events(result.log_path) if e["event"] == "TASK_START"]
    assert starts == ["002", "003", "001"]
