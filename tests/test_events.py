"""Tests for ftl.events: the appending writer, torn-tail repair, the tolerant reader, and a real
kill -9 of a writing process (design.md §6)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl import events as ev
from ftl.sanitize import REDACTED, scrub_value

REPO_ROOT = Path(__file__).resolve().parents[1]
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _record(seq: int, event: str = ev.TOOL_CALL) -> bytes:
    return (json.dumps({"ts": "2026-01-01T00:00:00.000Z", "seq": seq, "campaign_id": "c1",
                        "event": event, "state": "EXECUTE"}) + "\n").encode()


# --------------------------------------------------------------------------- writer

def test_emit_writes_the_envelope_and_fields(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "c1.jsonl"
    with ev.EventLog(path, "c1") as log:
        log.state = "EXPLORE"
        first = log.emit(ev.STATE_ENTRY, mode="structure", count=3)
        second = log.emit(ev.TOOL_CALL, state="PLAN", tool="planner")
        third = log.emit(ev.RUN_END, state=None, outcome="complete")
    records = _lines(path)
    assert records == [first, second, third]
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert all(r["campaign_id"] == "c1" and TS_RE.match(r["ts"]) for r in records)
    assert first["state"] == "EXPLORE" and first["mode"] == "structure" and first["count"] == 3
    assert second["state"] == "PLAN"  # explicit state wins over the log's current one
    assert third["state"] == "EXPLORE"  # state=None means "the current state"


def test_every_line_is_flushed_before_emit_returns(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    log = ev.EventLog(path, "c1")
    try:
        for number in range(1, 4):
            log.emit(ev.TOOL_CALL, tool="t", n=number)
            # A second reader (another process would see the same) gets every line whole.
            raw = path.read_bytes()
            assert raw.endswith(b"\n")
            assert [json.loads(line)["n"] for line in raw.splitlines()] == list(range(1, number + 1))
    finally:
        log.close()


def test_seq_continues_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    with ev.EventLog(path, "c1") as log:
        log.emit(ev.RUN_START)
        log.emit(ev.STATE_ENTRY, state="INIT")
    with ev.EventLog(path, "c1") as log:
        record = log.emit(ev.RUN_START, resume=True)
    assert record["seq"] == 3
    assert [r["seq"] for r in _lines(path)] == [1, 2, 3]
    assert not any(r["event"] == ev.LOG_REPAIRED for r in _lines(path))


def test_seq_continues_from_the_highest_seq_not_the_line_count(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(5) + _record(9))
    with ev.EventLog(path, "c1") as log:
        assert log.emit(ev.TOOL_CALL)["seq"] == 10


@pytest.mark.parametrize("reserved", ["ts", "seq", "campaign_id"])
def test_reserved_field_clash_raises_and_writes_nothing(tmp_path: Path, reserved: str) -> None:
    path = tmp_path / "c1.jsonl"
    with ev.EventLog(path, "c1") as log:
        with pytest.raises(ValueError, match=reserved):
            log.emit(ev.TASK_START, **{reserved: "001"})
        after = log.emit(ev.TASK_START, task_seq="001")
    assert after["seq"] == 1  # the refused event used no seq
    assert len(_lines(path)) == 1


def test_secrets_are_scrubbed_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    with ev.EventLog(path, "c1") as log:
        record = log.emit(ev.TOOL_FAILURE, message="auth failed for token=abc123secret",
                          details={"url": "https://bob:pw9876@host/x", "argv": ["--api_key=k5555k"],
                                   "password": "plain-key-names-are-kept"})
    raw = path.read_text(encoding="utf-8")
    for secret in ("abc123secret", "pw9876", "k5555k"):
        assert secret not in raw
        assert secret not in json.dumps(record)
    assert raw.count(REDACTED) == 3
    assert '"password"' in raw  # keys are kept


def test_listeners_see_every_event_and_a_broken_one_is_ignored(tmp_path: Path) -> None:
    seen: list[int] = []

    def broken(_event: dict) -> None:
        raise RuntimeError("progress view crashed")

    with ev.EventLog(tmp_path / "c1.jsonl", "c1") as log:
        log.subscribe(broken)
        log.subscribe(lambda event: seen.append(event["seq"]))
        log.emit(ev.TOOL_CALL)
        log.emit(ev.TOOL_CALL)
    assert seen == [1, 2]


def test_concurrent_emits_get_unique_seqs_and_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    with ev.EventLog(path, "c1") as log:
        def worker(name: str) -> None:
            for index in range(50):
                log.emit(ev.TOOL_CALL, worker=name, index=index, pad="x" * 300)

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    report = ev.ReadReport()
    records = list(ev.read_events(path, report))
    assert report.invalid_lines == [] and not report.torn_tail
    assert [r["seq"] for r in records] == list(range(1, 201))  # file order == seq order


def test_log_path_layout(tmp_path: Path) -> None:
    assert ev.log_path(tmp_path, "c42") == tmp_path / ".ftl" / "events" / "c42.jsonl"
    assert ev.events_dir(tmp_path) == tmp_path / ".ftl" / "events"


def test_utc_now_is_rfc3339_utc() -> None:
    assert TS_RE.match(ev.utc_now())


def test_action_events_exclude_run_and_state_markers() -> None:
    for marker in (ev.RUN_START, ev.RUN_END, ev.RESUME, ev.LOG_REPAIRED, ev.STATE_ENTRY,
                   ev.PHASE_TRANSITION):
        assert marker not in ev.ACTION_EVENTS
    assert {ev.TOOL_FAILURE, ev.FAILURE_CLASSIFIED, ev.RETRY, ev.RECOVERY_ATTEMPT} <= ev.ACTION_EVENTS


# --------------------------------------------------------------------------- repair_tail

def test_repair_tail_leaves_absent_empty_and_whole_files_alone(tmp_path: Path) -> None:
    assert ev.repair_tail(tmp_path / "missing.jsonl") == 0
    empty = tmp_path / "empty.jsonl"
    _write_bytes(empty, b"")
    assert ev.repair_tail(empty) == 0
    whole = tmp_path / "whole.jsonl"
    _write_bytes(whole, _record(1) + _record(2))
    assert ev.repair_tail(whole) == 0
    assert whole.read_bytes() == _record(1) + _record(2)


def test_repair_tail_cuts_back_to_the_last_newline(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    torn = b'{"ts": "2026-01-01T00:00:00.000Z", "seq": 3, "camp'
    _write_bytes(path, _record(1) + _record(2) + torn)
    assert ev.repair_tail(path) == len(torn)
    assert path.read_bytes() == _record(1) + _record(2)


def test_repair_tail_of_a_single_torn_line_empties_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, b'{"seq": 1, "ev')
    assert ev.repair_tail(path) == 14
    assert path.read_bytes() == b""


def test_repair_tail_walks_back_over_a_torn_line_longer_than_a_block(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    torn = b'{"seq": 2, "output": "' + b"y" * 10_000
    _write_bytes(path, _record(1) + torn)
    assert ev.repair_tail(path) == len(torn)
    assert path.read_bytes() == _record(1)


def test_reopen_after_a_torn_tail_emits_log_repaired(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    torn = b'{"ts": "2026-01-01T00:00:00.000Z", "seq": 3, "event": "TOOL_'
    _write_bytes(path, _record(1) + _record(2) + torn)
    with ev.EventLog(path, "c1") as log:
        log.emit(ev.RUN_START, resume=True)
    records = _lines(path)
    assert [r["event"] for r in records] == [ev.TOOL_CALL, ev.TOOL_CALL, ev.LOG_REPAIRED, ev.RUN_START]
    assert records[2]["truncated_bytes"] == len(torn)
    assert [r["seq"] for r in records] == [1, 2, 3, 4]


def test_appending_after_a_torn_line_does_not_lose_the_next_record(tmp_path: Path) -> None:
    """The jsonlines pitfall: without repair, the next record is glued onto the torn line."""
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + b'{"seq": 2, "event": "TASK_ST')
    with ev.EventLog(path, "c1") as log:
        log.emit(ev.TASK_END, task_seq="001", status="complete")
    report = ev.ReadReport()
    records = list(ev.read_events(path, report))
    assert report.invalid_lines == [] and not report.torn_tail
    assert records[-1]["event"] == ev.TASK_END and records[-1]["task_seq"] == "001"


# --------------------------------------------------------------------------- read_events

def test_torn_last_line_is_reported_and_good_lines_kept(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + _record(2) + _record(3) + b'{"seq": 4, "eve')
    report = ev.ReadReport()
    records = list(ev.read_events(path, report))
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert report.torn_tail and report.invalid_lines == [] and report.lines == 4


def test_bad_middle_line_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + b"{not json}\n" + _record(3) + b"[1, 2]\n" + _record(5))
    report = ev.ReadReport()
    records = list(ev.read_events(path, report))
    assert [r["seq"] for r in records] == [1, 3, 5]
    assert report.invalid_lines == [2, 4]
    assert not report.torn_tail


def test_invalid_last_line_with_its_newline_is_invalid_not_torn(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + b"garbage\n")
    report = ev.ReadReport()
    assert [r["seq"] for r in ev.read_events(path, report)] == [1]
    assert report.invalid_lines == [2] and not report.torn_tail


def test_blank_lines_and_invalid_utf8_do_not_stop_the_read(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + b"\n" + b"\xff\xfe\n" + _record(4))
    report = ev.ReadReport()
    assert [r["seq"] for r in ev.read_events(path, report)] == [1, 4]
    assert report.invalid_lines == [3]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + _record(2).rstrip(b"\n"))
    report = ev.ReadReport()
    assert [r["seq"] for r in ev.read_events(path, report)] == [1, 2]
    assert not report.torn_tail


def test_reopen_keeps_a_complete_record_that_lacks_its_newline(tmp_path: Path) -> None:
    # jsonlines writes the record and its newline in two calls, so kill -9 can land between them.
    path = tmp_path / "c1.jsonl"
    _write_bytes(path, _record(1) + _record(2, ev.TASK_END).rstrip(b"\n"))
    before = list(ev.read_events(path))
    assert [r["event"] for r in before] == [ev.TOOL_CALL, ev.TASK_END]
    with ev.EventLog(path, "c1") as log:
        log.emit(ev.RUN_START, resume=True)
    records = list(ev.read_events(path))
    assert records[: len(before)] == before  # what a postmortem saw before reopen is still there


def test_iter_many_streams_logs_in_order(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_bytes(first, _record(1) + _record(2))
    _write_bytes(second, _record(3) + b"{torn")
    report = ev.ReadReport()
    assert [r["seq"] for r in ev.iter_many([first, second], report)] == [1, 2, 3]
    assert report.torn_tail


# --------------------------------------------------------------------------- properties

_JSON_SCALARS = st.none() | st.booleans() | st.integers() | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30)
_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_FIELD_NAMES = st.text(min_size=1, max_size=12).filter(
    lambda name: name not in {"ts", "seq", "campaign_id", "event", "state", "self"})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(ev.ACTION_EVENTS)) | st.text(min_size=1, max_size=20),
                          st.dictionaries(_FIELD_NAMES, _JSON, max_size=5)), min_size=1, max_size=5))
def test_random_events_round_trip(batch: list[tuple[str, dict]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "c1.jsonl"
        with ev.EventLog(path, "c1") as log:
            written = [log.emit(name, **fields) for name, fields in batch]
        report = ev.ReadReport()
        records = list(ev.read_events(path, report))
    assert report.invalid_lines == [] and not report.torn_tail
    assert records == written
    for record, (name, fields) in zip(records, batch):
        expected = {"ts": record["ts"], "seq": record["seq"], "campaign_id": "c1", "event": name,
                    "state": None, **scrub_value(fields)}
        assert record == expected


# --------------------------------------------------------------------------- kill -9

_CHILD = r"""
import random, sys
from pathlib import Path
from ftl.events import EventLog
log = EventLog(Path(sys.argv[1]), "c-kill")
rng = random.Random(7)
n = 0
while True:
    n += 1
    # Lines of up to 1.5 MB: the kernel may stop a write this long part-way when SIGKILL
    # arrives, so about half of the runs leave a torn last line to repair.
    log.emit("TOOL_CALL", n=n, pad="p" * rng.randrange(1, 1_500_000))
"""


def test_kill_9_while_appending_loses_at_most_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events" / "c-kill.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], cwd=REPO_ROOT, env=env)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # wait for real progress, not for a fixed time
            if path.exists() and path.stat().st_size >= 4_000_000:
                break
            assert child.poll() is None, "the writer died on its own"
            time.sleep(0.002)
        else:
            pytest.fail("the child wrote less than 4 MB in 15 s")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    raw_lines = path.read_bytes().split(b"\n")
    body, tail = raw_lines[:-1], raw_lines[-1]  # tail is b"" when the kill fell between lines
    seqs = [json.loads(line)["seq"] for line in body]  # every newline-ended line is whole
    assert len(seqs) >= 2
    assert seqs == list(range(1, len(seqs) + 1))

    with ev.EventLog(path, "c-kill") as log:
        resumed = log.emit(ev.RUN_START, resume=True)
    report = ev.ReadReport()
    records = list(ev.read_events(path, report))
    assert report.invalid_lines == [] and not report.torn_tail
    after = [r["seq"] for r in records]
    assert all(a < b for a, b in zip(after, after[1:]))
    assert after[: len(seqs)] == seqs
    repaired = [r for r in records if r["event"] == ev.LOG_REPAIRED]
    try:  # the kill fell between a record and its newline (jsonlines writes them apart)
        whole = json.loads(tail) if tail else None
    except ValueError:
        whole = None
    if tail and whole is None:
        assert repaired and repaired[0]["truncated_bytes"] == len(tail)
    else:  # nothing torn: a whole last record is kept and terminated, not cut
        assert not repaired
        if whole is not None:
            assert after[len(seqs)] == whole["seq"] == len(seqs) + 1
    assert records[-1] == resumed


def test_unended_task_starts_are_the_last_runs_cut_attempts(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    assert ev.unended_task_starts(path) == {}
    with ev.EventLog(path, "c") as log:
        log.emit("RUN_START")
        log.emit("TASK_START", task_seq="001")  # cut by the first crash, then run again
        log.emit("RUN_START")
        log.emit("TASK_START", task_seq="001", worker="w1")
        log.emit("TASK_START", task_seq="002")
        log.emit("TASK_END", task_seq="002", status="complete")
        log.emit("TOOL_CALL", tool="x", note='"event":"TASK_END"')  # a value that quotes a marker
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"event":"TASK_END","task_seq":"001"')  # a torn last line ends nothing
    cut = ev.unended_task_starts(path)
    assert list(cut) == ["001"] and cut["001"]["worker"] == "w1"


def test_earlier_planner_spend_sums_the_planners_of_runs_before_the_last(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    assert ev.earlier_planner_spend_usd(path) == 0.0
    with ev.EventLog(path, "c") as log:
        log.emit("RUN_START")
        log.emit("PLAN_DECISION", decision="CLARIFY", tool="claude_planner", total_cost_usd=0.25)
        log.emit("TOOL_FAILURE", tool="claude_planner", error_type="stalled",
                 details={"agent_cost": {"total_cost_usd": 0.5}})  # paid, no answer
        log.emit("TOOL_FAILURE", tool="claude_builder", error_type="task_failed",
                 details={"agent_cost": {"total_cost_usd": 9.0}})  # a build: its workspace row counts it
        log.emit("PLAN_DECISION", decision="PROCEED", tool="load_plan")  # no cost
        log.emit("RUN_START")
        log.emit("PLAN_DECISION", state="CASCADE", decision="PROCEED", tool="claude_planner",
                 total_cost_usd=0.125)
        log.emit("RUN_START")  # the current run: what it spends is added as it happens
        log.emit("PLAN_DECISION", decision="PROCEED", tool="claude_planner", total_cost_usd=7.0)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"event":"PLAN_DECISION","total_cost_usd":1e308}\n')  # not an event's shape: a torn
        handle.write('{"event":"PLAN_DECISION","total_cost_usd":')          # last line and garbage count 0
    assert ev.earlier_planner_spend_usd(path) == 0.875


def test_a_run_that_wrote_its_end_cut_nothing_and_odd_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    with ev.EventLog(path, "c") as log:
        log.emit("RUN_START")
        log.emit("TASK_START", task_seq="001")
    with open(path, "a", encoding="utf-8") as handle:  # valid JSON, not an event: skipped
        handle.write('[{"event":"TASK_END","task_seq":"001"}]\n"event":"TASK_START"\n')
    assert list(ev.unended_task_starts(path)) == ["001"]
    with ev.EventLog(path, "c") as log:
        log.emit("RUN_END", outcome="cancelled")  # a Ctrl-C: the run settled its attempts itself
    assert ev.unended_task_starts(path) == {}


def test_a_timestamp_without_its_offset_is_not_read_as_one() -> None:
    assert ev.parse_ts("2026-01-01T00:00:01") is None
    assert ev.ms_between("2026-01-01T00:00:01", "2026-01-01T00:00:02Z") is None
    assert ev.ms_between("2026-01-01T00:00:01Z", "2026-01-01T00:00:02.5+00:00") == 1500


_FULL_DISK = r"""
import resource, signal, sys
from pathlib import Path
from ftl.events import EventLog, read_events, ReadReport
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = Path(sys.argv[1])
log = EventLog(path, "c")
log.emit("RUN_START")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 100, hard))  # a full disk
try:
    log.emit("TOOL_CALL", blob="x" * 10000)
except OSError:
    print("refused")
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
log.emit("TASK_END", task_seq="001")
log.emit("TASK_END", task_seq="002")
log.close()
report = ReadReport()
print([(e["seq"], e["event"], e.get("task_seq")) for e in read_events(path, report)], report.invalid_lines)
"""


def test_a_failed_write_loses_no_later_event(tmp_path: Path) -> None:
    # Half a line used to stay in the file: the next event was glued to it and lost with it.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path / "c.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "refused", "[(1, 'RUN_START', None), (2, 'TASK_END', '001'), (3, 'TASK_END', '002')] []"]
