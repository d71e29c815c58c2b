"""The local executor: a fixed pool of threads on the driver, fed by one FIFO inbox.

Used instead of ``concurrent.futures.ThreadPoolExecutor`` because ``submit`` there can start a
thread, and a KeyboardInterrupt landing inside that start leaves a running thread the executor
no longer joins, so a drain could return while a task still runs. Here every thread exists
before the first call, ``SimpleQueue.put`` is atomic, and `close` queues one stop marker per
thread behind any call already queued, then joins: after it returns, every call ever handed in
has run and its `Finished` is queued.
"""

from __future__ import annotations

import os
import queue
import socket
import threading

from ftl.executors.base import Execute, Finished, Health

__all__ = ["LocalExecutor"]


class LocalExecutor:
    """Task calls on driver threads (`ftl.executors.base.Executor`).

    Args:
        name: thread name prefix (threads are ``<name>-1`` .. ``<name>-<slots>``).
    """

    kind = "local"

    def __init__(self, name: str = "ftl-task") -> None:
        self._name = name
        self._execute: Execute | None = None
        self._inbox: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._lock = threading.Lock()

    def start(self, slots: int, execute: Execute) -> None:
        """Start ``slots`` threads (>= 1) running ``execute``; call once."""
        self._execute = execute
        for number in range(1, max(1, slots) + 1):
            thread = threading.Thread(target=self._work, name=f"{self._name}-{number}", daemon=False)
            self._threads.append(thread)  # before start(): an interrupt in start() keeps it joinable
            thread.start()

    def submit(self, seq: str, worker: str) -> None:
        with self._lock:
            self._running += 1
        self._inbox.put((seq, worker))

    def next_finished(self, timeout_s: float | None) -> Finished | None:
        try:
            if timeout_s is not None and timeout_s <= 0:
                return self._finished.get_nowait()
            return self._finished.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def cancel(self) -> None:
        """Nothing to do here: local calls watch the scheduler's cancel token themselves."""

    def heartbeat(self) -> Health:
        with self._lock:
            running = self._running
        return Health("local", True, [{"node": "driver", "address": socket.gethostname(),
                                       "cpus": float(os.cpu_count() or 1)}], running,
                      f"{len(self._threads)} thread(s) on this machine")

    def close(self) -> None:
        """Stop the threads once the queued calls ran; idempotent."""
        for _ in self._threads:
            self._inbox.put(None)
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def _work(self) -> None:
        assert self._execute is not None
        while (item := self._inbox.get()) is not None:
            seq, worker = item
            outcome = self._execute(seq, worker)  # never raises: the scheduler's fence
            self._finished.put(Finished(seq, worker, outcome))
            with self._lock:
                self._running -= 1
