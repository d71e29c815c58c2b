"""`ftl campaign status` says why a task is blocked: the stored reason, or the tasks it waits on."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from ftl.engine.status import campaign_status
from ftl.models import Plan
from ftl.store import Store
from ftl.surfaces.cli import main

TOKEN = "ghp_" + "a1B2" * 9  # a GitHub token shape the scrubber knows


def _blocked_campaign(repo: Path) -> str:
    plan = Plan.model_validate({"objective": "ship it", "tasks": [
        {"seq": "001", "slug": "parser", "verify": "true", "depends": []},
        {"seq": "002", "slug": "lexer", "verify": "true", "depends": []},
        {"seq": "003", "slug": "cli", "verify": "true", "depends": ["002"]}]})
    with Store.for_repo(repo) as store:
        cid = store.create_campaign("ship it", plan=plan)["campaign_id"]
        store.add_tasks(cid, plan)
        for seq in ("001", "002"):
            store.transition_task(cid, seq, "running", worker="w1")
        store.transition_task(cid, "001", "complete", delivered="done")
        store.transition_task(cid, "002", "blocked",
                              reason=f"verify_failed: exit 1\nAuthorization: token {TOKEN}")
        store.transition_task(cid, "003", "blocked", blocked_by=["002"], reason="cascade")
    return cid


def test_status_gives_each_blocked_tasks_reason_scrubbed(tmp_path: Path) -> None:
    _blocked_campaign(tmp_path)
    tasks = {t["seq"]: t for t in campaign_status(tmp_path)["tasks"]}
    assert tasks["001"]["block_reason"] is None and tasks["001"]["blocked_by"] == []
    assert tasks["002"]["block_reason"].startswith("verify_failed: exit 1")
    assert TOKEN not in tasks["002"]["block_reason"] and "[REDACTED]" in tasks["002"]["block_reason"]
    assert tasks["003"]["blocked_by"] == ["002"]


def test_the_status_text_puts_the_reason_on_the_tasks_own_line(tmp_path: Path) -> None:
    _blocked_campaign(tmp_path)
    result = CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.startswith("  0")}
    assert rows["001"].rstrip().endswith("complete")
    assert "(verify_failed: exit 1 Authorization: token [REDACTED])" in rows["002"]
    assert "after 002" in rows["003"] and TOKEN not in result.output
    data = json.loads(CliRunner().invoke(main, ["campaign", "status", "--repo", str(tmp_path),
                                                "--json"]).output)["data"]
    assert [t["block_reason"] is not None for t in data["tasks"]] == [False, True, True]
