"""Logs that once crashed or fooled the postmortem: every odd shape is a warning or a finding,
never a traceback, and the renderings stay bounded and valid."""

from __future__ import annotations

import io
import json
from pathlib import Path

from ftl import events as ev
from ftl.postmortem.diff import decisions
from ftl.postmortem.html import render_html
from ftl.postmortem.replay import replay
from ftl.postmortem.timeline import write_json

DRILL = Path(__file__).parent / "logs" / "drill.jsonl"


def _drill(tmp_path: Path, edit) -> Path:
    """The drill log with each event passed through ``edit`` (None drops the line)."""
    out = []
    for line in DRILL.read_text().splitlines():
        event = edit(json.loads(line))
        if event is not None:
            out.append(json.dumps(event, sort_keys=True, separators=(",", ":")))
    path = tmp_path / "drill.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_retry_limit_of_zero_is_a_limit(tmp_path: Path) -> None:
    def no_retries(event: dict) -> dict:
        if event["event"] == "RUN_START":
            event["config"] = {**event["config"], "flaky_verify_retries": 0, "transient_retries": 0}
        return event

    with replay([_drill(tmp_path, no_retries)]) as story:
        assert [v.rule for v in story.violations] == ["retry_limit"]
    with replay([DRILL]) as story:
        assert story.violations == []


def test_odd_values_and_shapes_do_not_crash_the_replay_or_the_diff(tmp_path: Path) -> None:
    def odd(event: dict) -> dict:
        if event["event"] == "TASK_END":  # a recovered end with a span past any calendar
            event.update(recovered=True, duration_ms=10 ** 18)
        if event["event"] == "TOOL_CALL":
            event["event"] = ["TOOL_CALL"]  # not a name
        return event

    path = _drill(tmp_path, odd)
    with replay([path]) as story:
        assert story.attempts  # read to the end
    assert list(decisions([path]))  # --against reads it too


def test_a_line_nested_past_pythons_limit_is_an_invalid_line_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    with ev.EventLog(path, "c") as log:
        log.emit("RUN_START")
    deep = "[" * 100_000 + "]" * 100_000
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(deep + "\n" + '{"event":"TASK_END","task_seq":"001"}' + "\n" + deep)
    assert [e["event"] for e in ev.read_events(path)] == ["RUN_START", "TASK_END"]
    assert ev.unended_task_starts(path) == {}
    with ev.EventLog(path, "c") as log:  # a resume opens it: the torn deep tail is cut
        log.emit("RUN_START")


def test_the_html_draws_at_most_limit_violations_and_json_stays_json(tmp_path: Path) -> None:
    def broken(event: dict) -> dict | None:
        return None if event["event"] == "TASK_START" else event  # every end without a start

    with replay([_drill(tmp_path, broken)]) as story:
        assert len(story.violations) > 2
        page = render_html(story, limit=2)
        assert page.count("task_transitions") == 2 and "invariant violations (" in page
        handle = io.StringIO()
        write_json({"summary": {"cost": float("nan"), "spans": [float("inf")]},
                    "tasks": story.to_json(lazy=True)["tasks"]}, handle)
    data = json.loads(handle.getvalue(), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert data["summary"] == {"cost": "nan", "spans": ["inf"]}
