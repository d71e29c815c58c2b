"""The Ray executor: each task's build and verify run as one Ray task on any node of a cluster.

What stays on the driver (this process): the state machine, the store, the event log, the
retries of the recovery protocol and the integration of results. Task calls run on driver
threads exactly as with `ftl.executors.local.LocalExecutor`; `RayExecutor.run_attempt` is what
such a call uses to send an attempt away and wait for it (`ftl.executors.remote_attempt`).

Ray's own retries are off (``max_retries=0``, ``retry_exceptions=False``): every try is ftl's,
emitted and classified like any other failure. A lost worker or node (`WORKER_LOST_ERRORS`) is
the transient error ``worker_lost``; the recovery protocol retries it once, then the task
blocks. Cancel (Ctrl-C) force-cancels the running Ray tasks; they are the driver's, so a dead
driver's tasks die with it (Ray ends a job's tasks when its driver goes), and an attempt's
result is accepted only under the attempt id it was sent with.

The code travels as git bundles: a chain whose first link holds the history and each next link
the commits since the one before, put into Ray's object store once, kept by each node in a
cache it shares between its workers; the result comes back as a bundle of the task commit
(`ftl.vcs.bundles`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from ftl.errors import FtlError
from ftl.executors.base import Health
from ftl.executors.local import LocalExecutor

__all__ = ["RayCluster", "RayExecutor", "remote_attempt", "INSTALL_HINT"]

_LOG = logging.getLogger("ftl.executors.ray")
INSTALL_HINT = "pip install 'ftl-runner[ray]'"
_WAIT_SLICE_S = 0.2  # how often a waiting task call looks at its cancel flag, s
_DEADLINE_SLACK_S = 120.0  # beyond build + verify limits: checkout, commit, transfer, s


def remote_attempt(request: dict[str, Any], chain: list[tuple[str, Any]]) -> Iterator[dict[str, Any]]:
    """The Ray task: `ftl.executors.remote_attempt.run_attempt` on whichever node Ray picked.
    ``chain``: ``(head, ObjectRef of its bundle link)`` pairs, fetched only where needed."""
    import ray

    from ftl.executors.remote_attempt import run_attempt

    node = ray.get_runtime_context().get_node_id()[:12]
    links = [(head, (lambda ref=ref: ray.get(ref))) for head, ref in chain]
    yield from run_attempt(request, links, node)


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` nobody listens on before ``ray.init``, which would wait minutes
    for it. ``auto`` and ``ray://`` addresses are left to Ray (it fails fast on those).

    Raises:
        FtlError(configuration_error): nothing accepts a TCP connection there.
    """
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError):
        raise FtlError("configuration_error", {
            "problem": f"no Ray cluster answers at {address!r}; start one with `ray start "
                       "--head` or fix [executor] address (auto, HOST:PORT or ray://HOST:PORT)"},
                       ) from None


class RayExecutor(LocalExecutor):
    """Task calls on driver threads whose attempts run on ``cluster`` (one scheduler run)."""

    kind = "ray"

    def __init__(self, cluster: "RayCluster") -> None:
        super().__init__(name="ftl-ray")
        self.cluster = cluster

    def cancel(self) -> None:
        self.cluster.cancel()

    def heartbeat(self) -> Health:
        health = self.cluster.heartbeat()
        local = super().heartbeat()
        return Health(health.kind, health.alive, health.nodes, local.running, health.detail)


class RayCluster:
    """The driver's connection to a Ray cluster, for the whole run (closed with `shutdown`).

    Args:
        address: ``"auto"`` (a cluster started on this machine with ``ray start``),
            ``"HOST:PORT"`` of a head node, or ``"ray://HOST:PORT"`` (Ray Client).
        repo: the driver's repository (bundles are made from it).

    Raises:
        FtlError(configuration_error): Ray is not installed (`INSTALL_HINT`), or no cluster
            answers at ``address``.
    """

    def __init__(self, address: str, repo: Path) -> None:
        try:
            import ray
        except ImportError:
            raise FtlError("configuration_error", {
                "problem": f"executor kind = \"ray\" needs Ray: {INSTALL_HINT}"}) from None
        self._ray = ray
        self.address = address
        self.repo = repo
        _reachable(address)
        try:
            if not ray.is_initialized():
                ray.init(address=address, namespace="ftl", log_to_driver=False,
                         logging_level=logging.ERROR, configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise FtlError("configuration_error", {
                "problem": f"no Ray cluster answers at {address!r}: "
                           f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}; "
                           "start one with `ray start --head` or fix [executor] address"}) from None
        self._remote = ray.remote(remote_attempt)
        self._lock = threading.Lock()
        # The integration heads sent so far, each with its bundle link (`ftl.vcs.bundles`).
        self._chain: list[tuple[str, Any]] = []
        self._inflight: dict[str, Any] = {}  # attempt id -> ObjectRefGenerator
        self._cancelled = False
        from ray import exceptions as rex

        self._lost = tuple(getattr(rex, name) for name in (
            "WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError",
            "ObjectFetchTimedOutError", "ReferenceCountingAssertionError", "LocalRayletDiedError",
            "RaySystemError", "OutOfMemoryError") if hasattr(rex, name))
        self._task_cancelled = rex.TaskCancelledError
        self._task_error = rex.RayTaskError

    def executor(self) -> RayExecutor:
        """A fresh executor (driver threads) for one scheduler run on this cluster."""
        with self._lock:
            self._cancelled = False
        return RayExecutor(self)

    def cancel(self) -> None:
        """Force-cancel every attempt in flight (idempotent); their calls end ``cancelled``."""
        with self._lock:
            self._cancelled = True
            running = list(self._inflight.values())
        for generator in running:
            try:
                self._ray.cancel(generator, force=True)
            except Exception:  # noqa: BLE001 - already finished or gone: nothing to stop
                pass

    def heartbeat(self) -> Health:
        try:
            nodes = [{"node": n["NodeID"][:12], "address": n.get("NodeManagerAddress", ""),
                      "cpus": float((n.get("Resources") or {}).get("CPU", 0.0))}
                     for n in self._ray.nodes() if n.get("Alive")]
            alive = bool(nodes)
        except Exception:  # noqa: BLE001 - the cluster went away
            nodes, alive = [], False
        with self._lock:
            running = len(self._inflight)
        return Health("ray", alive, nodes, running, f"Ray cluster at {self.address}")

    def shutdown(self) -> None:
        """Disconnect (the cluster keeps running); idempotent."""
        with self._lock:
            self._chain.clear()
        try:
            self._ray.shutdown()
        except Exception:  # noqa: BLE001 - shutting down a broken connection
            _LOG.debug("ray.shutdown failed", exc_info=True)

    # --- what a task call uses ---
    def run_attempt(self, request: dict[str, Any], *, cancel: threading.Event,
                    on_placed: Callable[[dict[str, Any]], None],
                    num_cpus: float = 1.0) -> dict[str, Any]:
        """Send one attempt to the cluster and wait for its result.

        Args:
            request: `ftl.executors.remote_attempt.run_attempt`'s request (``attempt_id`` is
                set here when missing).
            cancel: the task's cancel flag; when set the Ray task is force-cancelled.
            on_placed: called with the placement (``node``, ``worker``, ``host``) once the
                attempt started on a node.
            num_cpus: CPUs the attempt reserves on its node (the plan's ``resources``).

        Returns:
            The attempt's result dict (``phase``, ``build``, ``verify``, ``commit``,
            ``bundle``, ``node``, ``worker``, ...).

        Raises:
            FtlError(worker_lost): the worker or its node died, or the result was lost.
            FtlError(cancelled): cancelled (Ctrl-C, the campaign's cancel).
            FtlError(timeout): no result within the attempt's limits plus a slack.
            FtlError(internal_error): the attempt raised on the node (e.g. git failed there);
                the node's message goes to this module's log under the correlation id.
        """
        request.setdefault("attempt_id", uuid.uuid4().hex)
        attempt_id = request["attempt_id"]
        deadline = time.monotonic() + float(request["timeout_s"]) + \
            float(request["verify_timeout_s"]) + _DEADLINE_SLACK_S
        chain = self._chain_to(request["base"])
        with self._lock:
            if self._cancelled:
                raise FtlError("cancelled", {"what": f"task {request['seq']}"})
            # Ray's retries off: every try is the recovery protocol's, emitted and classified.
            generator = self._remote.options(
                num_cpus=num_cpus, max_retries=0, retry_exceptions=False,
                num_returns="streaming").remote(request, chain)
            self._inflight[attempt_id] = generator
        try:
            placed = self._next(generator, cancel, deadline, request)
            on_placed(placed)
            result = self._next(generator, cancel, deadline, request)
        finally:
            with self._lock:
                self._inflight.pop(attempt_id, None)
        if result.get("attempt_id") != attempt_id:  # never another try's result
            raise FtlError("worker_lost", {"seq": request["seq"], "cause": "a stale result"})
        return result

    def _chain_to(self, base: str) -> list[tuple[str, Any]]:
        """The chain of bundle links ending at ``base``: a new link holds only the commits
        since the last one, so the driver's cost per head stays flat as history grows."""
        from ftl.vcs.bundles import head_bundle
        from ftl.vcs.git import GitError

        with self._lock:
            for index, (head, _) in enumerate(self._chain):
                if head == base:
                    return self._chain[:index + 1]
            since = self._chain[-1][0] if self._chain else None
            try:
                data = head_bundle(self.repo, base, since)
            except GitError:  # base is not after the last link (a race between lanes): whole
                data = head_bundle(self.repo, base)
            self._chain.append((base, self._ray.put(data)))
            return list(self._chain)

    def _next(self, generator: Any, cancel: threading.Event, deadline: float,
              request: dict[str, Any]) -> dict[str, Any]:
        ray, seq = self._ray, request["seq"]
        try:
            while True:
                ready, _ = ray.wait([generator], timeout=_WAIT_SLICE_S)
                if ready:
                    return ray.get(next(generator))
                if cancel.is_set() or time.monotonic() > deadline:
                    ray.cancel(generator, force=True)
                    if cancel.is_set():
                        raise FtlError("cancelled", {"what": f"task {seq}"})
                    raise FtlError("timeout", {"seq": seq, "what": f"Ray attempt of task {seq}",
                                               "timeout_s": request["timeout_s"]})
        except StopIteration:
            raise FtlError("worker_lost", {"seq": seq, "cause": "the attempt ended without a "
                                                                "result"}) from None
        except self._task_cancelled:
            raise FtlError("cancelled", {"what": f"task {seq}"}) from None
        except self._lost as exc:
            raise FtlError("worker_lost", {"seq": seq, "cause": type(exc).__name__}) from None
        except self._task_error as exc:
            # The node's message may name its paths: the log gets it, a response never does.
            correlation = uuid.uuid4().hex[:12]
            _LOG.error("task %s: the attempt failed on its node (correlation id %s): %s",
                       seq, correlation, getattr(exc, "cause", None) or exc)
            raise FtlError("internal_error", {"correlation_id": correlation}) from None
