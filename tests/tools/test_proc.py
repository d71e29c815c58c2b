"""run_command with real subprocesses: exit status, limits, process-group cleanup, no deadlock;
and the git/tree change detection builders rely on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ftl.errors import FtlError
from ftl.server.tools.proc import (EXIT_NOT_FOUND, changed_paths, git_status, run_command,
                                   snapshot_tree)

from .conftest import git, write


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an unreaped orphan counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def wait_dead(pid: int, limit_s: float = 5.0) -> bool:
    """Poll until ``pid`` is gone (signals are delivered asynchronously); bounded, not timed."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


def wait_file(path: Path, limit_s: float = 10.0) -> str:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def test_exit_code_and_separate_streams(tmp_path):
    result = run_command("echo out; echo err >&2; exit 3", cwd=tmp_path, timeout_s=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert sorted(result.output.splitlines()) == ["err", "out"]
    assert not result.ok and not result.timed_out and not result.cancelled


def test_list_command_runs_without_a_shell(tmp_path):
    result = run_command([sys.executable, "-c", "import sys; print(sys.argv[1])", "$HOME; exit 9"],
                         cwd=tmp_path, timeout_s=10)
    assert result.ok and result.stdout == "$HOME; exit 9\n"


def test_missing_program_is_exit_127_not_an_exception(tmp_path):
    result = run_command(["definitely-not-a-program-xyz"], cwd=tmp_path, timeout_s=10)
    assert result.exit_code == EXIT_NOT_FOUND and "not found" in result.output


def test_env_is_added_to_the_inherited_environment(tmp_path):
    result = run_command('echo "$FTL_X:${PATH:+has-path}"', cwd=tmp_path, timeout_s=10,
                         env={"FTL_X": "42"})
    assert result.stdout == "42:has-path\n"


_TRICKY = "it's \"quoted\" $HOME `id` \\ *\nsecond line"


@pytest.mark.parametrize("env, exported", [
    ({"FTL_TASK_SEQ": "007", "FTL_WORKSPACE_ID": _TRICKY.replace("\n", " ")}, True),  # a build's ids: exported
    ({"FTL_TASK_SEQ": "007", "FTL_WORKSPACE_ID": _TRICKY}, False),  # a newline would move the line numbers
    ({"FTL_TASK_SEQ": "007", "FTL_WORKSPACE_ID": _TRICKY, "FTL_NOTE": "x"}, False),  # any other name
    ({"FTL_TASK_SEQ": "007", "FTL_WORKSPACE_ID": "w" * 5000}, False),  # past the export limit
])
def test_env_reaches_a_shell_command_and_what_it_starts_unchanged(tmp_path, env, exported, monkeypatch):
    # A build's identifiers are exported by its script (no copy of the environment); anything
    # else goes the usual way. Either way the command and its children see the values byte for
    # byte, and the command's own error messages keep their line numbers.
    import ftl.server.tools.proc as proc

    given: list[object] = []
    popen = proc.subprocess.Popen
    monkeypatch.setattr(proc.subprocess, "Popen", lambda *a, **kw: given.append(kw["env"]) or popen(*a, **kw))
    script = ('printf "%s|%s" "$FTL_TASK_SEQ" "$FTL_WORKSPACE_ID"; '
              'sh -c \'printf "|%s" "$FTL_TASK_SEQ"\'')
    result = run_command(script, cwd=tmp_path, timeout_s=10, env=env, ledger=tmp_path / "ledger")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"007|{env['FTL_WORKSPACE_ID']}|007"
    assert (given[0] is None) is exported
    assert "FTL_TASK_SEQ" not in os.environ  # the caller's environment is untouched
    failing = "true\nnosuch_command_q7"
    plain = run_command(failing, cwd=tmp_path, timeout_s=10)
    with_env = run_command(failing, cwd=tmp_path, timeout_s=10, env=env)
    assert with_env.exit_code == plain.exit_code == 127
    assert with_env.stderr == plain.stderr and "2" in plain.stderr  # line 2, as without env


def test_the_ledger_records_the_command_not_the_exports(tmp_path, monkeypatch):
    import ftl.server.tools.proc as proc

    recorded: list[str] = []
    real = proc.record
    monkeypatch.setattr(proc, "record", lambda ledger, pid, what, **kw: recorded.append(what) or real(ledger, pid, what, **kw))
    run_command("true", cwd=tmp_path, timeout_s=10, env={"FTL_TASK_SEQ": "001"}, ledger=tmp_path / "ledger")
    assert recorded == ["true"]


def test_bad_cwd_and_empty_command_are_input_errors(tmp_path):
    with pytest.raises(FtlError) as missing:
        run_command("true", cwd=tmp_path / "nope", timeout_s=1)
    assert missing.value.error_type == "not_found"
    with pytest.raises(FtlError) as empty:
        run_command("   ", cwd=tmp_path, timeout_s=1)
    assert empty.value.error_type == "invalid_params"


def test_timeout_kills_child_and_grandchild(tmp_path):
    script = "sleep 60 & echo $! > grandchild.pid; echo $$ > child.pid; wait"
    result = run_command(script, cwd=tmp_path, timeout_s=0.5)
    assert result.timed_out and result.exit_code is None and not result.ok
    for name in ("child.pid", "grandchild.pid"):
        assert wait_dead(int((tmp_path / name).read_text())), f"{name} survived the timeout"


def test_timeout_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path):
    script = "trap '' TERM; echo $$ > child.pid; while :; do sleep 0.05; done"
    result = run_command(script, cwd=tmp_path, timeout_s=0.5, grace_s=0.2)
    assert result.timed_out
    assert wait_dead(int((tmp_path / "child.pid").read_text()))


def test_cancel_stops_the_group(tmp_path):
    cancel = threading.Event()
    pid_file = tmp_path / "child.pid"

    def cancel_when_started():
        wait_file(pid_file)
        cancel.set()

    helper = threading.Thread(target=cancel_when_started)
    helper.start()
    result = run_command("echo $$ > child.pid; sleep 60", cwd=tmp_path, timeout_s=60, cancel=cancel)
    helper.join()
    assert result.cancelled and not result.timed_out and result.exit_code is None
    assert wait_dead(int(pid_file.read_text()))


def test_cancel_set_before_start_does_not_run_the_command(tmp_path):
    cancel = threading.Event()
    cancel.set()
    result = run_command("touch ran", cwd=tmp_path, timeout_s=10, cancel=cancel)
    assert result.cancelled and not (tmp_path / "ran").exists()


def test_background_process_left_behind_is_stopped_when_the_command_exits(tmp_path):
    result = run_command("sleep 60 >/dev/null 2>&1 & echo $! > bg.pid", cwd=tmp_path, timeout_s=10)
    assert result.ok
    assert wait_dead(int((tmp_path / "bg.pid").read_text()))


def test_large_output_on_both_streams_does_not_deadlock_and_keeps_the_tail(tmp_path):
    code = ("import sys; sys.stdout.write('a' * 3_000_000 + 'END-OUT'); sys.stdout.flush(); "
            "sys.stderr.write('b' * 3_000_000 + 'END-ERR')")
    result = run_command([sys.executable, "-c", code], cwd=tmp_path, timeout_s=30,
                         output_limit_bytes=1000)
    assert result.ok and result.truncated
    assert result.stdout.endswith("END-OUT") and len(result.stdout) == 1000
    assert result.stderr.endswith("END-ERR") and len(result.stderr) == 1000
    assert len(result.output) == 1000 and result.output.endswith("END-ERR")


def test_large_stdin_and_large_output_at_once(tmp_path):
    payload = os.urandom(1_500_000).hex().encode()  # 3 MB
    result = run_command(["cat"], cwd=tmp_path, timeout_s=30, stdin=payload, output_limit_bytes=64)
    assert result.ok and result.stdout.encode() == payload[-64:]


def test_invalid_utf8_is_replaced_not_raised(tmp_path):
    result = run_command("printf 'ok\\377\\376'", cwd=tmp_path, timeout_s=10)
    assert result.ok and result.stdout.startswith("ok") and "\ufffd" in result.stdout


def test_child_dies_when_the_spawning_process_is_sigkilled(tmp_path):
    """PR_SET_PDEATHSIG: a SIGKILL of ftl takes its direct child down with it."""
    parent_code = textwrap.dedent(f"""
        from pathlib import Path
        from ftl.server.tools.proc import run_command
        run_command("echo $$ > child.pid; exec sleep 60", cwd=Path({str(tmp_path)!r}), timeout_s=60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        child = int(wait_file(tmp_path / "child.pid"))
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_dead(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# --------------------------------------------------------------------------- change detection

def test_git_status_lists_changes_relative_to_the_repo(git_repo):
    write(git_repo, {"a.py": "A = 2\n", "new dir/n.py": "N = 1\n"})
    (git_repo / "b.py").unlink()
    assert git_status(git_repo) == {"a.py": " M", "b.py": " D", "new dir/n.py": "??"}
    sub = git_repo / "new dir"
    assert git_status(sub) == {"n.py": "??"}


def test_git_status_is_none_outside_a_work_tree(tmp_path):
    assert git_status(tmp_path) is None


def test_snapshot_sees_a_second_edit_of_an_already_dirty_file(git_repo):
    write(git_repo, {"a.py": "A = 2\n"})
    method, before = snapshot_tree(git_repo)
    write(git_repo, {"a.py": "A = 3\n", ".ftl/ftl.db": "x"})
    _, after = snapshot_tree(git_repo, method)
    assert method == "git" and changed_paths(before, after) == ["a.py"]


def test_snapshot_sees_a_revert_to_head(git_repo):
    write(git_repo, {"a.py": "A = 2\n"})
    _, before = snapshot_tree(git_repo)
    git(git_repo, "checkout", "--", "a.py")
    _, after = snapshot_tree(git_repo, "git")
    assert changed_paths(before, after) == ["a.py"]


def test_snapshot_without_git_walks_the_tree(tmp_path):
    write(tmp_path, {"a.py": "1", "node_modules/x.js": "1"})
    method, before = snapshot_tree(tmp_path)
    write(tmp_path, {"a.py": "22", "c.py": "1", "node_modules/x.js": "22"})
    _, after = snapshot_tree(tmp_path, method)
    assert method == "walk" and changed_paths(before, after) == ["a.py", "c.py"]


def test_pid_window_covers_the_pids_allocated_after_the_leader():
    from ftl.server.tools.proc import pid_window

    before = (1_000, 200)  # pids allocated since boot, threads alive, before the leader started
    window = pid_window(5_000, before, 1_050, 5_040, 32_768)
    assert window is not None
    assert [pid for pid in (4_999, 5_000, 5_020, 5_040, 5_041, 301) if window(pid)] == [5_000, 5_020, 5_040]
    wrapped = pid_window(32_700, before, 1_200, 400, 32_768)  # the cursor passed pid_max
    assert wrapped is not None
    assert [pid for pid in (32_699, 32_700, 32_767, 300, 400, 401) if wrapped(pid)] == [32_700, 32_767, 300, 400]
    # too many allocations since (the cursor may have gone round): every pid is a candidate
    assert pid_window(5_000, before, 1_000 + 9_000, 5_040, 32_768) is None
    assert pid_window(5_000, (1_000, 20_000), 1_001, 5_001, 32_768) is None


def test_the_latest_pid_comes_from_loadavg_as_ns_last_pid_gives_it():
    # the window's upper end is read with the counters (one read fewer per command); it is the
    # kernel's ns_last_pid: equal whenever no pid was allocated between the three reads
    from ftl.server.tools import proc

    for _ in range(50):
        before = int(open("/proc/sys/kernel/ns_last_pid").read())
        counters = proc._counters()
        after = int(open("/proc/sys/kernel/ns_last_pid").read())
        if before == after:
            assert counters is not None and counters[2] == before
            return
    pytest.fail("pids were allocated between every pair of reads (a very busy machine)")


def test_a_placeholder_proc_and_a_refused_getpgid_fall_back_to_reading_every_member(tmp_path, monkeypatch):
    # gVisor's /proc/loadavg ends in a fixed 0 and a security module may refuse getpgid: neither
    # may narrow the scan so that a member of the group is missed and left running.
    from ftl.server.tools import proc

    real_counters = proc._counters
    before = proc.pid_counters()  # just now: few pids allocated since, a window is possible
    monkeypatch.setattr(proc, "_counters", lambda: (lambda c: c and (c[0], c[1], 0))(real_counters()))
    assert proc._window(os.getpid(), before) == (None, None)

    def refused(pid):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(proc.os, "getpgid", refused)
    result = run_command("sleep 60 >/dev/null 2>&1 & echo $! > bg.pid", cwd=tmp_path, timeout_s=10)
    assert result.ok
    assert wait_dead(int((tmp_path / "bg.pid").read_text()))  # found through /proc, and stopped


def test_background_process_left_behind_is_found_through_the_pid_window(tmp_path):
    from ftl.server.tools import proc

    windows = []
    real = proc._window
    proc._window = lambda pgid, before: windows.append(real(pgid, before)) or windows[-1]
    try:
        result = run_command("sleep 60 >/dev/null 2>&1 & echo $! > bg.pid", cwd=tmp_path, timeout_s=10)
    finally:
        proc._window = real
    assert result.ok
    window, span = windows[0]
    assert window is not None  # /proc/stat and /proc/loadavg were readable here
    background = int((tmp_path / "bg.pid").read_text())
    assert window(background)
    assert span is not None and background in span  # a few pids: read one by one, no listdir
    assert wait_dead(background)  # found in the window and stopped


@pytest.mark.parametrize("size", [0, 5, 16, 17, 100])
def test_proc_files_are_read_whole_whatever_their_size(tmp_path: Path, monkeypatch, size: int) -> None:
    """`_read_proc` reads into a reused per-thread buffer; a file that fills it is read on."""
    from ftl.server.tools import proc

    monkeypatch.setattr(proc, "_PROC_CHUNK", 16)
    monkeypatch.setattr(proc, "_PROC_BUFFER", threading.local())
    content = bytes(range(size))
    (tmp_path / "f").write_bytes(content)
    assert proc._read_proc(str(tmp_path / "f")) == content
    assert proc._read_proc(str(tmp_path / "f")) == content  # the buffer again: nothing left over
    assert proc._read_proc(str(tmp_path / "missing")) is None


def test_run_command_leaves_no_descriptor_open_whatever_the_outcome(tmp_path: Path) -> None:
    """The pipes are plain descriptors (no file objects to close them when collected): every
    path closes its own, the child's ends included."""
    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    cases = [dict(command="echo out; echo err >&2"), dict(command="cat", stdin=b"x" * 200_000),
             dict(command="cat", stdin=b"short"), dict(command=["no-such-program-zz"]),
             dict(command=[str(script)]), dict(command="sleep 5", timeout_s=0.2),
             dict(command="exec 1>&-; exec 2>&-; sleep 0.1")]
    run_command("true", cwd=tmp_path, timeout_s=10)  # warm: lazily opened descriptors
    before = open_fds()
    for case in cases:
        result = run_command(cwd=tmp_path, **{"timeout_s": 10, **case})
        assert result is not None
    with pytest.raises(TypeError):  # a caller's bug: found before anything is made or started
        run_command("sleep 1", cwd=tmp_path, timeout_s=10, stdin="not bytes")  # type: ignore[arg-type]
    assert open_fds() == before
