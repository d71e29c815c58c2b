"""The ledger of running process groups (`ftl.processes`): entries are whole JSON files named
``<pid>.json``; a released entry's file is kept under a spare name for its thread's next command
(rewritten in place instead of created), and readers never take a spare for an entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ftl.processes import ENTRY_BYTES, reap, record, release
from ftl.server.tools.proc import run_command


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)


def test_a_released_entry_is_rewritten_in_place_for_the_next_command(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    first, second = _sleeper(), _sleeper()
    try:
        entry = record(ledger, first.pid, "first " * 100, deadline_s=time.time() + 60)
        assert entry == ledger / f"{first.pid}.json"
        data = json.loads(entry.read_text())
        assert data["pgid"] == first.pid and data["what"] == ("first " * 100)[:200]
        assert entry.stat().st_size == ENTRY_BYTES
        release(entry)
        assert not entry.exists()
        spares = [path for path in ledger.iterdir()]
        assert len(spares) == 1 and spares[0].name.startswith("spare-")
        inode = spares[0].stat().st_ino

        again = record(ledger, second.pid, "second", deadline_s=time.time() + 60)
        assert again is not None and sorted(path.name for path in ledger.iterdir()) == [again.name]
        assert again.stat().st_ino == inode  # the same file, renamed: no create, no .tmp
        data = json.loads(again.read_text())  # the longer first record left nothing behind
        assert data == {"pgid": second.pid, "start_ticks": data["start_ticks"], "what": "second",
                        "deadline_s": data["deadline_s"]}
        release(again)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


def test_threads_keep_their_own_spares(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    ledger.mkdir()
    leaders = [_sleeper(), _sleeper()]
    entries: list[Path | None] = []
    try:
        def one(proc: subprocess.Popen) -> None:
            entry = record(ledger, proc.pid, "x", deadline_s=time.time() + 60)
            release(entry)
            entries.append(record(ledger, proc.pid, "y", deadline_s=time.time() + 60))

        threads = [threading.Thread(target=one, args=(proc,)) for proc in leaders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(path.name for path in ledger.iterdir()) == sorted(f"{p.pid}.json" for p in leaders)
        assert all(json.loads(entry.read_text())["what"] == "y" for entry in entries if entry)
    finally:
        for proc in leaders:
            proc.kill()
            proc.wait()


def test_reap_reads_no_spare_as_an_entry_and_drops_other_processes_spares(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    ledger.mkdir()
    # a spare left by a process that is gone, holding a live group's record: not an entry
    live = _sleeper()
    try:
        stale = ledger / "spare-1-2"
        stale.write_text(json.dumps({"pgid": live.pid, "start_ticks": 0, "what": "old"}))
        result = run_command(["sleep", "0.1"], cwd=tmp_path, timeout_s=10, ledger=ledger)
        assert result.ok
        mine = [path.name for path in ledger.iterdir() if path != stale]
        assert len(mine) == 1 and mine[0].startswith(f"spare-{os.getpid()}-")
        assert reap(ledger, wait=False) == []
        assert live.poll() is None  # never taken for a recorded group
        assert [path.name for path in ledger.iterdir()] == mine
    finally:
        live.kill()
        live.wait()


def test_run_command_records_its_group_while_it_runs(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    seen: list[list[str]] = []

    def look(line: bytes) -> None:
        seen.append(sorted(path.name for path in ledger.glob("*.json")))

    for _ in range(2):  # the second command reuses the first one's file
        result = run_command(["sh", "-c", "sleep 0.2; echo $$"], cwd=tmp_path, timeout_s=10, ledger=ledger,
                             on_stdout_line=look)
        assert result.ok
        assert seen[-1] == [f"{result.stdout.strip()}.json"]
        assert not list(ledger.glob("*.json"))


def test_an_entry_always_fits_its_size_so_a_rewrite_leaves_no_tail(tmp_path: Path) -> None:
    ledger = tmp_path / "procs"
    leader = _sleeper()
    try:
        wide = "\U0001f600" * 300  # 12 bytes each as JSON: 200 of them would not fit
        entry = record(ledger, leader.pid, wide, deadline_s=time.time() + 60)
        assert entry is not None and entry.stat().st_size == ENTRY_BYTES
        kept = json.loads(entry.read_text())["what"]
        assert kept and wide.startswith(kept)
        release(entry)
        again = record(ledger, leader.pid, "short", deadline_s=time.time() + 60)
        assert json.loads(again.read_text())["what"] == "short"
    finally:
        leader.kill()
        leader.wait()


def test_a_spare_that_vanishes_before_its_rename_falls_back_to_a_new_file(tmp_path: Path, monkeypatch) -> None:
    import ftl.processes as processes

    ledger = tmp_path / "procs"
    leader = _sleeper()
    try:
        release(record(ledger, leader.pid, "first", deadline_s=time.time() + 60))
        real_replace = os.replace

        def spare_gone(source, target):  # another process's reap removed the spare meanwhile
            if Path(source).name.startswith("spare-"):
                os.unlink(source)
            return real_replace(source, target)

        monkeypatch.setattr(processes.os, "replace", spare_gone)
        entry = record(ledger, leader.pid, "second", deadline_s=time.time() + 60)
        assert entry is not None and json.loads(entry.read_text())["what"] == "second"
    finally:
        leader.kill()
        leader.wait()
