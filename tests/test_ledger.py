"""The ledger of running process groups (`ftl.processes`): one append-only journal per ftl
process, ``.ftl/procs/<pid>-<ticks>.log``; a record and its release are lines, never files, and
readers count only whole lines."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftl import processes
from ftl.processes import reap, record, recorded, release
from ftl.server.tools.proc import run_command


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_record_and_its_release_are_two_lines_of_one_journal(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    first, second = _sleeper(), _sleeper()
    try:
        entry = record(ledger, first.pid, "first " * 100, deadline_s=1234.5)
        (journal,) = ledger.iterdir()
        assert journal.name == f"{os.getpid()}-{processes.start_ticks(os.getpid())}.log"
        (held,) = recorded(ledger)
        assert held["pgid"] == first.pid and held["what"] == ("first " * 100)[:200]
        assert held["deadline_s"] == 1234.5 and held["start_ticks"] == processes.start_ticks(first.pid)
        inode = journal.stat().st_ino
        release(entry)
        assert recorded(ledger) == []

        again = record(ledger, second.pid, "second", deadline_s=time.time() + 60)
        assert [path.name for path in ledger.iterdir()] == [journal.name]
        assert journal.stat().st_ino == inode  # appended to: no file made per command
        assert [held["what"] for held in recorded(ledger)] == ["second"]
        release(again)
        lines = journal.read_bytes().split(b"\n")
        assert lines[0] == b"" and all(line.endswith(b" .") for line in lines[1:])
        assert [line[:1] for line in lines[1:]] == [b"+", b"-", b"+", b"-"]
    finally:
        _stop(first, second)


def test_threads_share_the_journal_and_every_line_stays_whole(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    leaders = [_sleeper() for _ in range(4)]
    kept: list = []
    try:
        def one(proc: subprocess.Popen) -> None:
            for number in range(50):
                entry = record(ledger, proc.pid, f"x {number} \u00e9\u2603", deadline_s=time.time() + 60)
                assert entry is not None
                if number < 49:
                    release(entry)
                else:
                    kept.append(entry)

        threads = [threading.Thread(target=one, args=(proc,)) for proc in leaders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        held = recorded(ledger)
        assert sorted(h["pgid"] for h in held) == sorted(p.pid for p in leaders)
        assert {h["what"] for h in held} == {"x 49 \u00e9\u2603"}
        lines = next(ledger.iterdir()).read_bytes().split(b"\n")[1:]
        assert len(lines) == 4 * 99 and all(line.endswith(b" .") for line in lines)
        for entry in kept:
            release(entry)
        assert recorded(ledger) == []
    finally:
        _stop(*leaders)


def test_a_cut_line_is_skipped_without_swallowing_the_next(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    ledger.mkdir()
    other = ledger / "1-2.log"
    other.write_bytes(b"\n+ 41 7 99.0 \"cut sho"  # a write a kill cut short
                      b"\n+ 42 7 99.0 \"whole\" ."
                      b"\n- 43 7"  # a release cut short: 43 stays open
                      b"\n+ 43 8 99.0 \"open\" ."
                      b"\n+ 44 9 bad \"x\" ."  # not a number
                      b"\n+ 45 9 99.0 \"")
    assert [(h["pgid"], h["what"]) for h in recorded(ledger)] == [(42, "whole"), (43, "open")]


def test_reap_ends_the_groups_of_processes_that_are_gone_and_its_own(tmp_path: Path) -> None:
    """A crashed ftl's journal: its groups are ended and the journal removed. This process's
    own open record (a command an abandoned drain left): ended, the journal kept. Another live
    process's journal (a server on the same repository): left alone."""
    ledger = tmp_path / "procs"
    orphan, mine, theirs, owner = _sleeper(), _sleeper(), _sleeper(), _sleeper()
    try:
        own = record(ledger, mine.pid, "mine", deadline_s=time.time() + 60)
        crashed = ledger / "999999-5.log"  # no such process
        crashed.write_bytes(f"\n+ {orphan.pid} {processes.start_ticks(orphan.pid)} "
                            f"{time.time() + 60!r} \"left behind\" .".encode())
        (ledger / "999999-6.tmp").write_bytes(b"a compaction cut short")
        wrong_ticks = ledger / f"{owner.pid}-1.log"  # the pid lives on in another process
        wrong_ticks.write_bytes(b"\n+ 999999 5 1.0 \"reused pid\" .")
        gone = ledger / "999998-5.log"
        gone.write_bytes(b"\n+ 999999 5 1.0 \"long gone\" .")
        alive = ledger / f"{owner.pid}-{processes.start_ticks(owner.pid)}.log"
        alive.write_bytes(f"\n+ {theirs.pid} {processes.start_ticks(theirs.pid)} "
                          f"{time.time() + 60!r} \"theirs\" .".encode())
        compacting = alive.with_suffix(".tmp")  # its compaction in progress
        compacting.write_bytes(b"")
        reaped = reap(ledger, wait=False)
        assert sorted((r["what"], r["finished"]) for r in reaped) == [("left behind", False), ("mine", False)]
        assert orphan.wait(timeout=5) == -9 and mine.wait(timeout=5) == -9
        assert theirs.poll() is None
        assert sorted(path.name for path in ledger.iterdir()) == sorted(
            [own.journal.path.name, alive.name, compacting.name])
        release(own)
    finally:
        _stop(orphan, mine, theirs, owner)


def test_reap_reads_an_earlier_ftls_json_entries(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    ledger.mkdir()
    live = _sleeper()
    try:
        (ledger / f"{live.pid}.json").write_text(
            f'{{"pgid": {live.pid}, "start_ticks": {processes.start_ticks(live.pid)}, '
            f'"what": "old ftl", "deadline_s": {time.time() + 60}}}')
        (ledger / "spare-1-2").write_text("{}")
        (ledger / "9.json").write_text("not json")
        reaped = reap(ledger, wait=False)
        assert [(r["pgid"], r["what"]) for r in reaped] == [(live.pid, "old ftl")]
        assert list(ledger.iterdir()) == []
    finally:
        _stop(live)


def test_past_its_size_a_journal_starts_again_with_its_open_records(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(processes, "COMPACT_BYTES", 200)
    ledger = tmp_path / "procs"
    long, short = _sleeper(), _sleeper()
    try:
        outer = record(ledger, long.pid, "outer", deadline_s=time.time() + 60)
        journal = outer.journal.path
        first = journal.stat().st_ino
        for _ in range(5):  # past the size while "outer" is open: replaced by a file holding it
            release(record(ledger, short.pid, "inner", deadline_s=time.time() + 60))
        assert journal.stat().st_ino != first and not journal.with_suffix(".tmp").exists()
        assert journal.stat().st_size < 200
        assert [h["what"] for h in recorded(ledger)] == ["outer"]
        for _ in range(5):
            release(record(ledger, short.pid, "inner", deadline_s=time.time() + 60))
        assert [h["what"] for h in recorded(ledger)] == ["outer"]
        release(outer)
        for _ in range(5):  # nothing open: emptied in place
            release(record(ledger, short.pid, "inner", deadline_s=time.time() + 60))
        assert recorded(ledger) == [] and journal.stat().st_size < 200
    finally:
        _stop(long, short)


def test_a_journal_removed_under_its_writer_is_made_again_with_its_open_records(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    first, second = _sleeper(), _sleeper()
    try:
        held = record(ledger, first.pid, "first", deadline_s=time.time() + 60)
        (journal,) = ledger.iterdir()
        journal.unlink()  # by hand, or a reap that could not see this process alive
        entry = record(ledger, second.pid, "second", deadline_s=time.time() + 60)
        assert sorted(h["what"] for h in recorded(ledger)) == ["first", "second"]
        release(entry)
        release(held)
        assert recorded(ledger) == []
    finally:
        _stop(first, second)


def test_a_journal_made_again_after_a_failed_write_still_holds_every_open_record(
        tmp_path: Path, monkeypatch) -> None:
    ledger = tmp_path / "procs"
    first, second = _sleeper(), _sleeper()
    try:
        held = record(ledger, first.pid, "build A", deadline_s=time.time() + 60)
        held.journal.path.unlink()
        real, failed = processes._Journal._write, []

        def disk_full_once(self, fd: int, data: bytes) -> None:
            if not failed and b"build A" in data:
                failed.append(True)
                raise OSError(errno.ENOSPC, "No space left on device")
            real(self, fd, data)

        monkeypatch.setattr(processes._Journal, "_write", disk_full_once)
        assert record(ledger, second.pid, "build B", deadline_s=time.time() + 60) is None
        again = record(ledger, second.pid, "build B", deadline_s=time.time() + 60)  # room again
        assert sorted(h["what"] for h in recorded(ledger)) == ["build A", "build B"]
        release(again)
        release(held)
    finally:
        _stop(first, second)


def test_a_record_that_cannot_be_written_leaves_the_command_running_unrecorded(tmp_path: Path) -> None:
    blocker = tmp_path / "procs"
    blocker.write_text("a file where the ledger folder should be")
    result = run_command("echo ran", cwd=tmp_path, timeout_s=10, ledger=blocker)
    assert result.ok and result.stdout == "ran\n"


def test_run_command_records_its_group_while_it_runs(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    seen: list[list[int]] = []

    def look(line: bytes) -> None:
        seen.append([h["pgid"] for h in recorded(ledger)])

    result = run_command("echo $$; sleep 0.1", cwd=tmp_path, timeout_s=10, ledger=ledger,
                         on_stdout_line=look)
    assert result.ok
    assert seen[-1] == [int(result.stdout.strip())]
    assert recorded(ledger) == []


def test_past_the_few_kept_open_an_idle_journal_closes_its_descriptor_and_stays_one(tmp_path: Path) -> None:
    leader, other = _sleeper(), _sleeper()
    try:
        ledgers = [tmp_path / f"repo{n}" / "procs" for n in range(processes._KEEP_OPEN + 3)]
        held = record(ledgers[0], other.pid, "held", deadline_s=time.time() + 60)
        for ledger in ledgers:
            release(record(ledger, leader.pid, "x", deadline_s=time.time() + 60))
        journals = [processes._journals[ledger] for ledger in ledgers]
        assert journals[0].fd is not None  # it holds an open record
        assert sum(j.fd is not None for j in journals) == processes._KEEP_OPEN + 1
        again = record(ledgers[1], leader.pid, "y", deadline_s=time.time() + 60)
        assert again.journal is journals[1] and journals[1].fd is not None
        assert [h["what"] for h in recorded(ledgers[1])] == ["y"]
        release(again)
        release(held)
    finally:
        _stop(leader, other)
