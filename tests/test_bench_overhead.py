"""The overhead benchmark's in-task git timer (bench/bench_overhead.py `git_timed_per_task`):
it charges each task the git work done for it, once, and leaves `Worktrees` as it found it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_overhead  # noqa: E402
from ftl.vcs.worktrees import Worktrees  # noqa: E402


def test_git_work_is_charged_to_its_task_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(10_000))
    monkeypatch.setattr(bench_overhead, "_clock", lambda: float(next(ticks)))  # 1 s per read
    before = {step: Worktrees.__dict__[step] for step in bench_overhead.GIT_STEPS}
    trees = Worktrees(bench_overhead.git_repo(tmp_path / "repo"), "bench")
    trees.ensure_integration()
    with bench_overhead.git_timed_per_task() as spent:
        first = trees.prepare("001-a")
        trees.stage(first)
        made = trees.commit(first, seq="001", slug="a", attempt=1, spec={})
        trees.integrate(made, name="001-a")
        trees.release(first)
        second = trees.prepare("002-b")
        trees.release(second)
        # Not held any more: renew falls back to release + prepare, both timed methods too.
        trees.renew(second)
    # An outer call reads the clock at its start and end: one tick, plus one per timed call
    # inside it (which reads only at its start). 001-a: five calls of one tick. 002-b: prepare
    # and release, one tick each; renew three (its release and prepare inside), charged once:
    # charged again, the inner two would add two ticks and renew two more.
    assert spent == {"001-a": 5000.0, "002-b": 5000.0}
    assert {step: Worktrees.__dict__[step] for step in bench_overhead.GIT_STEPS} == before
