"""ProgressTicker: one thread sends every long invocation's periodic progress (spec 07 §7)."""

from __future__ import annotations

import time

from ftl.manglecp.progress import ProgressTicker


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_each_watched_invocation_gets_its_own_messages_until_unwatched():
    ticker = ProgressTicker(0.02)
    first: list[float] = []
    second: list[float] = []
    try:
        one = ticker.watch(first.append)
        _wait_for(lambda: len(first) >= 2)
        two = ticker.watch(second.append)
        _wait_for(lambda: len(second) >= 2)
        ticker.unwatch(one)
        time.sleep(0.03)  # a message already on its way may still arrive
        count = len(first)
        time.sleep(0.1)
        assert len(first) == count, "an unwatched invocation still got progress"
        assert len(second) >= 4
        assert all(later > earlier for earlier, later in zip(second, second[1:])), second
        assert second[0] >= 0.02 - 0.005  # elapsed seconds since its watch, never before the interval
        ticker.unwatch(two)
    finally:
        ticker.close()
    ticker._thread.join(1.0)
    assert not ticker._thread.is_alive(), "close() did not end the progress thread"


def test_a_failing_sink_does_not_stop_the_others():
    ticker = ProgressTicker(0.01)
    received: list[float] = []

    def broken(_: float) -> None:
        raise RuntimeError("sink gone")

    try:
        ticker.watch(broken)
        ticker.watch(received.append)
        _wait_for(lambda: len(received) >= 3)
    finally:
        ticker.close()


def test_no_thread_until_the_first_watch():
    ticker = ProgressTicker(0.01)
    assert ticker._thread is None
    ticker.close()
    ticker.watch(lambda _: None)  # after close: no thread is started
    assert ticker._thread is None
