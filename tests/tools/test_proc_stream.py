"""`run_command`'s line callback and idle timeout (used by the Claude builder's stream reader)."""

from __future__ import annotations

import sys

from ftl.server.tools.proc import run_command


def test_stdout_lines_arrive_one_by_one_with_a_last_unterminated_line(tmp_path) -> None:
    lines: list[bytes] = []
    script = "import sys; sys.stdout.write('a\\nbb\\n'); sys.stdout.flush(); sys.stdout.write('c')"
    result = run_command([sys.executable, "-c", script], cwd=tmp_path, timeout_s=20,
                         on_stdout_line=lines.append, idle_timeout_s=10)
    assert lines == [b"a", b"bb", b"c"]
    assert result.ok and not result.idle_timed_out and result.stdout == "a\nbb\nc"


def test_a_silent_command_is_stopped_after_the_idle_timeout(tmp_path) -> None:
    script = "import time; print('started', flush=True); time.sleep(60)"
    result = run_command([sys.executable, "-c", script], cwd=tmp_path, timeout_s=30,
                         idle_timeout_s=0.5, grace_s=0.2)
    assert result.idle_timed_out and not result.timed_out and result.exit_code is None
    assert result.stdout == "started\n" and result.duration_ms < 10000


def test_a_chatty_command_is_not_idle(tmp_path) -> None:
    script = "import time\nfor i in range(6):\n    print(i, flush=True); time.sleep(0.15)"
    result = run_command([sys.executable, "-c", script], cwd=tmp_path, timeout_s=30,
                         idle_timeout_s=0.6)
    assert result.ok and not result.idle_timed_out
