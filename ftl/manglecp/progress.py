"""The periodic "still running" progress of long invocations (MangleCP spec 07 §7).

One daemon thread per server sends it for every invocation that has run past the interval,
instead of a thread started and joined per invocation: those two cost more than a short tool
itself (issue 11 item 3, 0.3-1 ms per call under load).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

__all__ = ["ProgressTicker"]

log = logging.getLogger("ftl.manglecp.progress")


class ProgressTicker:
    """Calls each watched invocation's ``send(elapsed_s)`` every ``interval_s`` seconds while it
    runs. Thread-safe; the thread starts on the first `watch` and ends with `close`.

    Args:
        interval_s: seconds between two progress messages of one invocation (> 0).
        clock: monotonic seconds (injected in tests).
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._watched: dict[int, list] = {}  # key -> [next due (s), began (s), send]
        self._keys = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, send: Callable[[float], None]) -> int:
        """Start sending ``send(elapsed_s)`` every interval; return the key for `unwatch`."""
        now = self._clock()
        with self._cond:
            key = next(self._keys)
            self._watched[key] = [now + self.interval_s, now, send]
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="manglecp-progress", daemon=True)
                self._thread.start()
            # No notify: the thread wakes at least every interval, and a new entry is never due
            # sooner than that (a wake-up per call costs a thread switch).
        return key

    def unwatch(self, key: int) -> None:
        """Stop the invocation's messages (a message being sent right now may still arrive)."""
        with self._cond:
            self._watched.pop(key, None)

    def close(self) -> None:
        """End the thread (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = self._clock()
                    due = [entry for entry in self._watched.values() if entry[0] <= now]
                    if due:
                        break
                    soonest = min((entry[0] for entry in self._watched.values()),
                                  default=now + self.interval_s)
                    self._cond.wait(soonest - now)
                if self._closed:
                    return
                for entry in due:
                    entry[0] = now + self.interval_s
            for _, began, send in due:
                try:
                    send(now - began)
                except Exception:  # noqa: BLE001 - one broken sink must not end everyone's progress
                    log.exception("a progress message could not be sent")
