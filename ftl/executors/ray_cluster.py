"""The Ray executor: each task's build and verify run as one Ray task on any node of a cluster.

What stays on the driver (this process): the state machine, the store, the event log, the
retries of the recovery protocol and the integration of results. Task calls run on driver
threads exactly as with `ftl.executors.local.LocalExecutor`; `RayExecutor.run_attempt` is what
such a call uses to send an attempt away and wait for it (`ftl.executors.remote_attempt`).

Ray's own retries are off (``max_retries=0``, ``retry_exceptions=False``): every try is ftl's,
emitted and classified like any other failure. A lost worker or node (`WORKER_LOST_ERRORS`) is
the transient error ``worker_lost``; the recovery protocol retries it once, then the task
blocks. A lost *cluster* is not a task's failure: when the head node no longer accepts
connections (probed every `WATCH_S` while connected, and at once after a lost worker), or when
the head answers but no live node has CPUs while attempts wait for one (the nodes are read
while the head answers), for ``lost_after_s`` (`RayCluster.lost`), the run's ``on_lost`` cancels
every task (they go back to pending) and the runner stops the run resumably: before Ray's
driver, which waits a minute for its head, would end this whole process, and instead of
attempts waiting in Ray's queue forever for a node that never comes. Cancel (Ctrl-C) cancels
the running Ray tasks (politely, so the command's process group is stopped, then by force).
A driver killed outright takes its Ray tasks with it (Ray ends a job's tasks when its driver
goes); a result is only ever read by the call that sent it, and a resume finds what a dead
driver's attempts left as commits (``reuse_commit``). With a ``ray://`` address (Ray Client)
the server may keep a dead client's tasks running for a while: until it ends them, a resumed
attempt of the same task can run beside the old one (the old one's result is never read, so
nothing is integrated twice, but its command runs twice).

The code travels as git bundles: segments of a chain whose first link holds the history and
each next link the commits since the one before, put into Ray's object store once, kept by
each node in a cache it shares between its workers; the result comes back as a bundle of the task commit
(`ftl.vcs.bundles`).
"""

from __future__ import annotations

import errno
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

__all__ = ["RayCluster", "RayExecutor", "remote_attempt", "forget_campaign", "INSTALL_HINT",
           "CANCEL_GRACE_S", "WATCH_S", "LOST_AFTER_S", "NODES_EVERY_S"]

_LOG = logging.getLogger("ftl.executors.ray")
INSTALL_HINT = "pip install 'ftl-runner[ray]'"
_WAIT_SLICE_S = 0.2  # how often a waiting task call looks at its cancel flag, s
#: After a polite cancel (KeyboardInterrupt in the attempt: its command's group is stopped),
#: how long before the attempt's worker is killed, s.
CANCEL_GRACE_S = 5.0
#: Links per segment of the bundle chain (see `RayCluster._chain_to`).
CHAIN_SEGMENT = 32
_DEADLINE_SLACK_S = 120.0  # beyond build + verify limits: checkout, commit, transfer, s
#: How often the driver probes the head while connected, s.
WATCH_S = 1.0
#: Default of ``[executor] lost_after_s``: how long the head must refuse connections, or have
#: no live node with CPUs while attempts wait, before the cluster counts as lost, s. Under
#: Ray's own 60 s (its driver then ends the process), above the 10-30 s a fault-tolerant GCS
#: takes to come back.
LOST_AFTER_S = 15.0
#: How often the watchdog reads the nodes while the head answers, s; every `WATCH_S` instead
#: while the last read found no node with CPUs, so a node that joins stops the clock at once.
NODES_EVERY_S = 10.0
NODE_GONE_WINDOW_S = 2.0  # how long a raylet that still accepts is asked again (s)


def remote_attempt(request: dict[str, Any], chain: list[tuple[str, Any]]) -> Iterator[dict[str, Any]]:
    """The Ray task: `ftl.executors.remote_attempt.run_attempt` on whichever node Ray picked.
    ``chain``: ``(head, ObjectRef of its bundle link)`` pairs, fetched only where needed."""
    import ray

    from ftl.executors.remote_attempt import run_attempt

    node = ray.get_runtime_context().get_node_id()[:12]
    links = [(head, (lambda ref=ref: ray.get(ref))) for head, ref in chain]
    yield from run_attempt(request, links, node)


def forget_campaign(campaign_id: str) -> int:
    """The Ray task that removes a finished campaign's leftovers on one node."""
    from ftl.executors.remote_attempt import forget

    return forget(campaign_id)


def _killed_by_signal(result: dict[str, Any]) -> bool:
    """Whether the attempt's build or verify command was killed by a signal (a negative exit
    code: ``subprocess`` convention) without a timeout or a cancel that explains it."""
    for step in (result.get("build"), result.get("verify")):
        code = (step or {}).get("exit_code")
        if isinstance(code, int) and code < 0 and not step.get("timed_out") \
                and not step.get("cancelled"):
            return True
    return False


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
        lost_after_s: how long the head must refuse connections, or have no live node with
            CPUs while an attempt is in flight, before the cluster is lost (`lost`), s.
        address: ``"auto"`` (a cluster started on this machine with ``ray start``),
            ``"HOST:PORT"`` of a head node, or ``"ray://HOST:PORT"`` (Ray Client).
        repo: the driver's repository (bundles are made from it).

    Raises:
        FtlError(configuration_error): Ray is not installed (`INSTALL_HINT`), or no cluster
            answers at ``address``.
    """

    def __init__(self, address: str, repo: Path, *, lost_after_s: float = LOST_AFTER_S) -> None:
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
        self._segments: list[list[tuple[str, Any]]] = []
        self._stops: set[tuple[int, bool]] = set()  # (attempt generator id, force) asked
        self._chain_lock = threading.Lock()
        self._largest: float | None = None
        self._nodes_read_at = float("-inf")
        self._inflight: dict[str, Any] = {}  # attempt id -> ObjectRefGenerator
        self._cancelled = False
        from ray import exceptions as rex

        self._lost = tuple(getattr(rex, name) for name in (
            "WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError",
            "ObjectFetchTimedOutError", "ReferenceCountingAssertionError", "LocalRayletDiedError",
            "RaySystemError", "OutOfMemoryError") if hasattr(rex, name))
        self._task_cancelled = rex.TaskCancelledError
        self._node_died = getattr(rex, "NodeDiedError", ())
        # Nodes (12-character id prefixes, as placements name them) whose death an attempt
        # reported: Ray tells the task's owner a second or more before its node table shows
        # the node dead (a health-check period; 15-30 s with Ray's defaults). A node id is
        # never reused (a restarted node gets a new one), so the set only grows by deaths.
        self._dead_nodes: set[str] = set()
        self._task_error = rex.RayTaskError
        # The head's GCS, probed by `_watch`: the driver talks to it directly, so it answers
        # here. Not with Ray Client (``ray://``), where the server talks to it for us.
        self._gcs: str | None = None
        if "://" not in address:
            try:
                self._gcs = ray.get_runtime_context().gcs_address
            except Exception:  # noqa: BLE001 - unknown: a lost worker stays a task's failure
                pass
            if self._gcs and self._probe() is not True:
                self._gcs = None  # not reachable as a plain TCP address from here: no probe
        #: Why the whole cluster is lost (its head refused connections, or no live node had
        #: CPUs while attempts waited, for `lost_after_s`), else None. Once set, no Ray call is
        #: made again except `shutdown`.
        self.lost: str | None = None
        self.lost_after_s = lost_after_s
        self._refused_since: float | None = None  # first refusal of the current run of them
        # The last node read found a live node with CPUs (None: not read yet), and since when
        # none has been seen while attempts were in flight (the no-capacity clock).
        self._capacity: bool | None = None
        self._empty_since: float | None = None
        self._on_lost: Callable[[], None] | None = None
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._read_nodes()  # the head answered just now: the largest node, for run_attempt

    def executor(self, on_lost: Callable[[], None] | None = None) -> RayExecutor:
        """A fresh executor (driver threads) for one scheduler run on this cluster.

        Args:
            on_lost: called once if the whole cluster is lost during this run (`lost`); the
                runner passes its scheduler's cancel, so no task starts and the running ones
                end ``cancelled`` (resumable), not blocked. Cleared by `run_finished`.

        Raises:
            FtlError(cancelled): the cluster is already lost (`lost`).
        """
        with self._lock:
            if self.lost is not None:
                raise FtlError("cancelled", {"what": f"the Ray cluster at {self.address}"})
            self._cancelled = False
            self._on_lost = on_lost
            if self._watchdog is None and self._gcs:
                self._watchdog = threading.Thread(target=self._watch, name="ftl-ray-watch",
                                                  daemon=True)
                self._watchdog.start()
        return RayExecutor(self)

    def run_finished(self) -> None:
        """The scheduler run of the last `executor` ended: its ``on_lost`` is not called again."""
        with self._lock:
            self._on_lost = None

    def _probe(self, timeout_s: float = 1.0) -> bool | None:
        """The head's GCS: True when it accepts a TCP connection, False when it refuses one
        (nothing listens: stopped or crashed, or the host is unreachable), None when the probe
        says nothing (a timeout, no address to probe, a local error such as EMFILE)."""
        if not self._gcs:
            return None
        host, _, port = self._gcs.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return True
        except (ConnectionRefusedError, ConnectionResetError):
            return False
        except OSError as exc:
            return False if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else None
        except ValueError:
            return None

    def _observe(self, answer: bool | None) -> None:
        """Fold one probe into the refusal clock; mark the cluster lost once the head has
        refused for `lost_after_s` (a probe that says nothing keeps the clock running)."""
        now = time.monotonic()
        with self._lock:
            if answer is True:
                self._refused_since = None
                return
            if answer is False and self._refused_since is None:
                self._refused_since = now
            since = self._refused_since
        if since is not None and now - since >= self.lost_after_s:
            self._mark_lost(f"the head at {self._gcs} refused connections for "
                            f"{now - since:.0f} s")

    def _observe_capacity(self, capacity: bool) -> None:
        """Fold one node read into the no-capacity clock: it runs while no live node has CPUs
        and an attempt is in flight (queued, running, or holding after a lost worker), and
        marks the cluster lost after `lost_after_s`. A node with CPUs seen again, or nothing
        in flight, stops it: an autoscaler that replaces a node in time, or a cluster idle
        between executions, does not stop the run.

        Why "a live node with CPUs" and not "a node that fits the waiting attempt": it is a
        fact about the cluster, not about one task's reservation (a reservation larger than
        every live node is refused before sending, as that task's ``configuration_error``),
        and it never stops a run that smaller attempts still move forward."""
        now = time.monotonic()
        with self._lock:
            self._capacity = capacity
            # Without a probed head (Ray Client) there is no watchdog to keep this clock.
            if capacity or not self._inflight or not self._gcs:
                if self._empty_since is not None:
                    _LOG.info("Ray cluster at %s: %s", self.address,
                              "a node with CPUs is back" if capacity else "no attempt waits")
                self._empty_since = None
                return
            if self._empty_since is None:
                self._empty_since = now
                _LOG.warning("Ray cluster at %s: no live node with CPUs; the run stops, "
                             "resumable, in %g s unless one joins", self.address,
                             self.lost_after_s)
            since = self._empty_since
        if now - since >= self.lost_after_s:
            self._mark_lost(f"no live node with CPUs for {now - since:.0f} s")

    def _watch(self) -> None:
        """Probe the head every `WATCH_S` while connected, and read the nodes (only right
        after the head answered: a GCS call waits for a head that went away; every
        `NODES_EVERY_S`, or every `WATCH_S` while none with CPUs was found), so no task thread
        ever waits in a Ray call for a head that went away: Ray's driver waits a minute for
        it and then ends this whole process. A head refusing, or no live node with CPUs
        while attempts wait, for `lost_after_s` marks the cluster lost, well before that, so
        the run can stop resumably and `shutdown` in time."""
        while not self._closed.wait(WATCH_S) and self.lost is None:
            answer = self._probe()
            self._observe(answer)
            if answer is True:
                every = NODES_EVERY_S if self._capacity is not False else WATCH_S
                if time.monotonic() - self._nodes_read_at >= every:
                    self._read_nodes()

    def _hold_for_verdict(self, cancel: threading.Event) -> None:
        """After a lost worker: while the head refuses connections, or answers but no live
        node has CPUs, wait for the verdict, so a task is not failed for a cluster that is
        going away. Returns when the head answers again with a node that has CPUs (the
        worker's loss was the task's), or when a probe says nothing (no Ray call may wait on
        it); raises when the cluster is lost or the task is cancelled meanwhile. At most
        `lost_after_s` plus a probe and a node read: both clocks run while it holds.

        Raises:
            FtlError(cancelled): the cluster was lost (`lost`), or ``cancel`` was set.
        """
        while self.lost is None and not cancel.is_set():
            answer = self._probe()
            self._observe(answer)
            if answer is None:
                return
            if answer is True:
                if time.monotonic() - self._nodes_read_at >= WATCH_S:
                    self._read_nodes()  # the head answers: this GCS call does not wait
                if self._capacity is not False:
                    return
            cancel.wait(WATCH_S)
        raise FtlError("cancelled", {"what": f"the Ray cluster at {self.address}"})

    def _mark_lost(self, why: str) -> None:
        """Record why the cluster is lost, tell the run (once, before any task can see a
        refusal: the run's cancel is what makes a refused attempt ``cancelled``, not blocked),
        then stop sending work."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
            on_lost = self._on_lost
        _LOG.error("Ray cluster at %s lost: %s", self.address, why)
        if on_lost is not None:
            on_lost()
        with self._lock:
            self._cancelled = True

    def cancel(self) -> None:
        """Cancel every attempt in flight (idempotent); their calls end ``cancelled``.

        A polite cancel (Ray raises KeyboardInterrupt in the attempt, whose command runner then
        stops the command's whole process group). Each waiting call sees the cancel too and,
        on its way out, force-cancels its attempt if it has not ended `CANCEL_GRACE_S` later
        (`_stop_and_wait`): no timer thread, so nothing calls Ray after the run shut it down
        (a Ray call after ``ray.shutdown`` would start Ray again).
        """
        with self._lock:
            self._cancelled = True
            running = [] if self.lost is not None else list(self._inflight.values())
        for generator in running:
            self._stop(generator, force=False)

    def _stop(self, generator: Any, *, force: bool) -> None:
        # Each attempt is asked once politely and at most once by force: a repeated cancel of
        # a task that is finishing can race Ray's own completion of it in the driver.
        key = (id(generator), force)
        with self._lock:
            if key in self._stops:
                return
            self._stops.add(key)
        try:
            self._ray.cancel(generator, force=force)
        except Exception:  # noqa: BLE001 - already finished or gone: nothing to stop
            pass

    def _stop_and_wait(self, generator: Any) -> None:
        """Cancel one attempt politely, then by force if it has not ended within the grace."""
        self._stop(generator, force=False)
        try:
            ready, _ = self._ray.wait([generator], timeout=CANCEL_GRACE_S)
        except Exception:  # noqa: BLE001 - ended with an error: it is stopped
            return
        if not ready:
            self._stop(generator, force=True)

    def heartbeat(self) -> Health:
        if self.lost is not None:  # no Ray call: it would wait for the head for a minute
            return Health("ray", False, [], 0, f"Ray cluster at {self.address}: lost ({self.lost})")
        return self._read_nodes()

    def _read_nodes(self) -> Health:
        """Ask Ray for the live nodes (a GCS call: it waits if the head is gone), keep the
        largest node's CPUs for `run_attempt` and fold the read into the no-capacity clock
        (`_observe_capacity`). A failed read says nothing: both are left as they were."""
        try:
            nodes = [{"node": n["NodeID"][:12], "address": n.get("NodeManagerAddress", ""),
                      "cpus": float((n.get("Resources") or {}).get("CPU", 0.0))}
                     for n in self._ray.nodes()
                     if n.get("Alive") and n["NodeID"][:12] not in self._dead_nodes]
        except Exception:  # noqa: BLE001 - the cluster went away
            with self._lock:
                running = len(self._inflight)
            return Health("ray", False, [], running, f"Ray cluster at {self.address}")
        largest = max((n["cpus"] for n in nodes), default=0.0)
        with self._lock:
            running = len(self._inflight)
            self._largest = largest
            self._nodes_read_at = time.monotonic()
        self._observe_capacity(largest > 0)
        detail = f"Ray cluster at {self.address}"
        if nodes and largest <= 0:
            detail += ": no live node with CPUs"
        return Health("ray", bool(nodes), nodes, running, detail)

    def forget(self, campaign_id: str, timeout_s: float = 30.0) -> int:
        """At a campaign's end: remove its history cache and any attempt checkouts a killed
        worker left, on every live node. Returns the entries removed; never raises (a node
        that does not answer keeps its leftovers until its temporary folder is cleaned)."""
        if self.lost is not None or self._probe() is False:  # no Ray call that would wait
            return 0
        try:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            task = self._ray.remote(forget_campaign)
            refs = [task.options(num_cpus=0, max_retries=0,
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(
                                     node["NodeID"], soft=False)).remote(campaign_id)
                    for node in self._ray.nodes() if node.get("Alive")]
            return sum(self._ray.get(refs, timeout=timeout_s))
        except Exception:  # noqa: BLE001 - cleaning up is best effort
            _LOG.warning("campaign %s: node leftovers not removed", campaign_id, exc_info=True)
            return 0

    def shutdown(self) -> None:
        """Disconnect (the cluster keeps running); idempotent. Also what keeps this process
        alive once the cluster is lost: Ray's driver ends it a minute after its head went."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._chain_lock:
            self._segments.clear()
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
            cancel: the task's cancel flag; when set the Ray task is cancelled (politely,
                then by force after `CANCEL_GRACE_S`).
            on_placed: called with the placement (``node``, ``worker``, ``host``) once the
                attempt started on a node.
            num_cpus: CPUs the attempt reserves on its node (the plan's ``resources``).

        Returns:
            The attempt's result dict (``phase``, ``build``, ``verify``, ``commit``,
            ``bundle``, ``node``, ``worker``, ...).

        Raises:
            FtlError(worker_lost): the worker or its node died (also when the result came
                back with its command killed by a signal and the node is gone since), or the
                result was lost.
            FtlError(cancelled): cancelled (Ctrl-C, the campaign's cancel).
            FtlError(timeout): no result within build + verify limits plus a slack, counted
                from the attempt's placement (time queued for a node does not count).
            FtlError(configuration_error): ``num_cpus`` exceeds every live node's CPUs (some
                having CPUs: with none, the attempt waits for a node or the cluster's loss).
            FtlError(internal_error): the attempt raised on the node (e.g. git failed there);
                the node's message goes to this module's log under the correlation id.
        """
        request.setdefault("attempt_id", uuid.uuid4().hex)
        attempt_id = request["attempt_id"]
        if self._cancelled:  # before any Ray call: a lost cluster would hold it for a minute
            raise FtlError("cancelled", {"what": f"task {request['seq']}"})
        largest = self._largest_node_cpus()
        # It would wait in Ray's queue forever. A cluster with no CPUs at all is not this
        # task's mistake but the watchdog's matter: queued, the attempt waits for a node to
        # join or for the cluster's verdict (`_observe_capacity`).
        if largest is not None and num_cpus > largest and (largest > 0 or not self._gcs):
            raise FtlError("configuration_error", {
                "problem": f"task {request['seq']} reserves {num_cpus:g} CPUs but the largest "
                           f"node of the cluster has {largest:g}; lower its resources.num_cpus "
                           "or add a bigger node"})
        chain = self._chain_to(request["base"])
        with self._lock:
            if self._cancelled:
                raise FtlError("cancelled", {"what": f"task {request['seq']}"})
            # Ray's retries off: every try is the recovery protocol's, emitted and classified.
            generator = self._remote.options(
                num_cpus=num_cpus, max_retries=0, retry_exceptions=False,
                num_returns="streaming").remote(request, chain)
            self._inflight[attempt_id] = generator
        result: dict[str, Any] | None = None
        try:
            # Waiting in Ray's queue for a node with room is not the task's time: the limit
            # (build + verify + transfer) starts once the attempt is placed.
            placed = self._next(generator, cancel, None, request)
            deadline = time.monotonic() + float(request["timeout_s"]) + \
                float(request["verify_timeout_s"]) + _DEADLINE_SLACK_S
            on_placed(placed)
            node = placed.get("node")
            answer = self._next(generator, cancel, deadline, request, node)
            if (node and _killed_by_signal(answer) and not (cancel.is_set() or self._cancelled)
                    and self._node_gone(node)):
                # A dying node's worker can outlive the command it ran for a moment (Ray
                # kills a worker's children first): the command's death is the node's.
                self._forget_node(node)
                self._hold_for_verdict(cancel)
                raise FtlError("worker_lost", {"seq": request["seq"], "cause": "its node died "
                                               "while the command ran"})
            result = answer
        finally:
            # Cancelled, timed out, lost, or on_placed raised: stop it (nothing to stop, and
            # no Ray call to make, once the whole cluster is gone).
            if result is None and self.lost is None:
                self._stop_and_wait(generator)
            with self._lock:
                self._inflight.pop(attempt_id, None)
                self._stops.discard((id(generator), False))
                self._stops.discard((id(generator), True))
        return result

    def _forget_node(self, node: str) -> None:
        """An attempt saw ``node`` (a 12-character id prefix) die: it no longer counts as
        capacity, and the next `_hold_for_verdict` reads the other nodes at once."""
        with self._lock:
            self._dead_nodes.add(node)
            self._nodes_read_at = float("-inf")

    def _node_gone(self, node: str) -> bool:
        """Whether ``node`` is gone: the head lists it dead, or its raylet refuses a TCP
        connection (dead, while the head has not noticed yet). A raylet that still accepts is
        asked again for up to `NODE_GONE_WINDOW_S`: a killed raylet's socket closes only once
        its process is torn down, which takes a moment under load, while its worker's report
        of the command's death can arrive first. False when unsure: the head does not answer
        (no Ray call may wait on it), or the node is not listed."""
        deadline = time.monotonic() + NODE_GONE_WINDOW_S
        while True:
            verdict = self._node_state(node)
            if verdict is not None or time.monotonic() >= deadline:
                return bool(verdict)
            time.sleep(0.1)

    def _node_state(self, node: str) -> bool | None:
        """True: ``node`` is gone; None: its raylet accepts a connection now; False: unsure."""
        if node in self._dead_nodes:
            return True
        if self._probe() is not True:
            return False
        try:
            rows = [n for n in self._ray.nodes() if n["NodeID"][:12] == node]
        except Exception:  # noqa: BLE001 - unsure: the result stands
            return False
        if not rows:
            return False
        if not rows[0].get("Alive"):
            return True
        host, port = rows[0].get("NodeManagerAddress"), rows[0].get("NodeManagerPort")
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return None
        except (ConnectionRefusedError, ConnectionResetError):
            return True
        except (OSError, TypeError, ValueError):
            return False

    def _largest_node_cpus(self) -> float | None:
        """CPUs of the cluster's largest live node (0.0: none has CPUs), None if unknown. The
        watchdog keeps it fresh (`_watch`); without one (Ray Client), a task thread reads it,
        at most every `NODES_EVERY_S`."""
        if self._watchdog is None and time.monotonic() - self._nodes_read_at > NODES_EVERY_S:
            self._read_nodes()
        return self._largest

    def _chain_to(self, base: str) -> list[tuple[str, Any]]:
        """The bundle links that bring ``base`` to a node (`ftl.vcs.bundles.NodeCache`).

        Links come in segments: a segment starts with a link holding the whole history, and
        each next link holds only the commits since the one before. A segment ends after
        `CHAIN_SEGMENT` links, so an attempt carries at most that many references and the
        driver bundles the whole history once per segment, not once per head. A base older
        than the last link (lanes read the head in one order and ask in another) is inside
        the history the segment already carries: the segment is sent as it is.

        Own lock (not the one `cancel` takes): a bundle of a long history can take seconds.
        """
        from ftl.vcs.bundles import head_bundle
        from ftl.vcs.git import Git

        with self._chain_lock:
            for segment in reversed(self._segments):
                for index, (head, _) in enumerate(segment):
                    if head == base:
                        return segment[:index + 1]
            segment = self._segments[-1] if self._segments else []
            since = segment[-1][0] if segment else None
            git = Git(self.repo)
            if since is not None and not git.ok("merge-base", "--is-ancestor", since, base):
                if git.ok("merge-base", "--is-ancestor", base, since):
                    return list(segment)
                since = None  # unrelated (the branch was moved by hand): whole history
            if since is None or len(segment) >= CHAIN_SEGMENT:
                segment = []
                self._segments = [*self._segments[-1:], segment]  # the older ones are done
                since = None
            segment.append((base, self._ray.put(head_bundle(self.repo, base, since))))
            return list(segment)

    def _next(self, generator: Any, cancel: threading.Event, deadline: float | None,
              request: dict[str, Any], node: str | None = None) -> dict[str, Any]:
        """The attempt's next yield: its placement, then its result (``node``: where it was
        placed). ``deadline=None`` (queued for a node) waits until the attempt is placed, the
        task's ``cancel`` is set, or the cluster is cancelled or lost (`_mark_lost`): a queue
        that no node will ever serve does not hold the task past the cluster's verdict.

        Raises:
            FtlError: as `run_attempt`.
        """
        ray, seq = self._ray, request["seq"]
        try:
            while True:
                ready, _ = ray.wait([generator], timeout=_WAIT_SLICE_S)
                if ready:
                    return ray.get(next(generator))
                if cancel.is_set() or self._cancelled:
                    raise FtlError("cancelled", {"what": f"task {seq}"})
                if deadline is not None and time.monotonic() > deadline:
                    raise FtlError("timeout", {
                        "seq": seq, "what": f"Ray attempt of task {seq}",
                        "timeout_s": float(request["timeout_s"]) + float(request["verify_timeout_s"])
                        + _DEADLINE_SLACK_S})
        except StopIteration:
            self._hold_for_verdict(cancel)
            raise FtlError("worker_lost", {"seq": seq, "cause": "the attempt ended without a "
                                                                "result"}) from None
        except self._task_cancelled:
            raise FtlError("cancelled", {"what": f"task {seq}"}) from None
        except self._lost as exc:
            if cancel.is_set() or self._cancelled:  # a force-cancel kills the worker: not lost
                raise FtlError("cancelled", {"what": f"task {seq}"}) from None
            if node and isinstance(exc, self._node_died):
                self._forget_node(node)
            self._hold_for_verdict(cancel)
            raise FtlError("worker_lost", {"seq": seq, "cause": type(exc).__name__}) from None
        except self._task_error as exc:
            # The node's message may name its paths: the log gets it, a response never does.
            correlation = uuid.uuid4().hex[:12]
            _LOG.error("task %s: the attempt failed on its node (correlation id %s): %s",
                       seq, correlation, getattr(exc, "cause", None) or exc)
            raise FtlError("internal_error", {"correlation_id": correlation}) from None
