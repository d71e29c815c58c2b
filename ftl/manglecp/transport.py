"""MangleCP client transports: one small interface, three implementations (in-process, stdio, HTTP).

A `Transport` delivers one request and returns its final message (``*_response`` or ``error``),
passing ``progress`` messages to a callback on the way, and exposes the newest manifest. All
transports are safe to use from several threads at once: the stdio transport has a reader thread
that dispatches replies by ``id`` (MangleCP spec 02 §6.1 pipelining), the HTTP transport uses one
request per call, the in-process one calls the server directly.

Transport failures (the server process exited, the connection broke, a reply that is not a
MangleCP message) raise `FtlError` ``network_error`` (transient).
"""

from __future__ import annotations

import json
import logging
import queue
import os
import subprocess
import threading
import time
import urllib.parse
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ftl.errors import FtlError
from ftl.processes import parent_death_setup
from ftl.manglecp.messages import PROTOCOL_VERSION, encode, envelope, make_error, to_ftl_error
from ftl.manglecp.access import Session
from ftl.manglecp.server import ManglecpServer

if TYPE_CHECKING:  # httpx (and the rich/pygments it pulls in) loads only for HttpTransport
    import httpx

log = logging.getLogger("ftl.manglecp.transport")

OnMessage = Callable[[dict[str, Any]], None]
_POLL_S = 0.05
WELL_KNOWN_PATH = "/.well-known/manglecp/manifest.json"


def cancel_message(request_id: str) -> dict[str, Any]:
    """A ``cancel`` for ``request_id`` (spec 02 §6.2); our own id is not null (reference §11 item 2)."""
    return envelope("cancel", f"cancel-{request_id}", {"request_id": request_id})


def _cancelled(request_id: str) -> dict[str, Any]:
    return make_error("cancelled", "The request was cancelled by the client.", id=request_id)


class Transport(ABC):
    """One connection to a MangleCP server.

    ``supports_progress`` and ``supports_cancel`` say whether the server can stream progress and
    honour a ``cancel`` message (session transports) or not (HTTP: progress is dropped, a cancel
    only stops waiting).
    """

    supports_progress = False
    supports_cancel = False

    @abstractmethod
    def manifest(self, *, refresh: bool = False, timeout_s: float = 60.0) -> dict[str, Any]:
        """The newest manifest envelope; waits up to ``timeout_s`` for the first one.

        ``refresh`` re-reads it where that means a new round trip (HTTP); session transports
        always hold the newest pushed manifest.

        Raises:
            FtlError(network_error): no manifest arrived in time, or the server is gone.
        """

    @abstractmethod
    def request(self, message: Mapping[str, Any], *, on_message: OnMessage | None = None,
                cancel: threading.Event | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """Send ``message`` and return its final reply (response or ``error``).

        Args:
            message: a request envelope with a non-empty ``id``.
            on_message: gets each ``progress`` message for this id (session transports only).
            cancel: when set, a ``cancel`` is sent (session transports) and the reply to wait for
                is then either the normal response or a ``cancelled`` error.
            timeout_s: overall wait, s (None: no limit).
        Raises:
            FtlError(network_error): the transport failed; FtlError(timeout): no reply in time.
        """

    supports_push = False

    def wait_manifest(self, seen: Mapping[str, Any], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until the newest manifest is not ``seen`` (a manifest
        envelope this transport returned). Only for ``supports_push`` transports; others return
        False at once and the caller sleeps and re-reads."""
        return False

    def close(self) -> None:
        """Release the connection (idempotent)."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _network_error(problem: str) -> FtlError:
    return FtlError("network_error", {"tool": "manglecp", "problem": problem},
                    message=f"The MangleCP transport failed: {problem}.")


def _reply_timeout(timeout_s: float) -> FtlError:
    return FtlError("timeout", {"what": "MangleCP reply", "timeout_s": timeout_s})


# ---------------------------------------------------------------------------------------------


class InProcessTransport(Transport):
    """Calls a `ManglecpServer` in this process (one session per transport).

    The request runs in the calling thread (so tool subprocesses are started from a long-lived
    thread). The caller's ``cancel`` event is the invocation's own cancel flag
    (`Session.give_cancel`): no cancel message, no relay thread (a thread per call cost more
    than a short tool).
    """

    supports_progress = True
    supports_cancel = True

    def __init__(self, server: ManglecpServer, *, close_server: bool = False) -> None:
        self.server = server
        self.session = Session(key=f"inproc-{id(self):x}")
        self._close_server = close_server
        self._manifest: dict[str, Any] | None = None
        self._manifest_status: str | None = None

    def manifest(self, *, refresh: bool = False, timeout_s: float = 60.0) -> dict[str, Any]:
        """The server's manifest; the same object while its status is unchanged (the client
        parses a manifest once per object)."""
        status = self.server.status
        if self._manifest is None or self._manifest_status != status:
            self._manifest, self._manifest_status = self.server.manifest(), status
        return self._manifest

    def request(self, message: Mapping[str, Any], *, on_message: OnMessage | None = None,
                cancel: threading.Event | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        request_id = str(message.get("id"))
        if cancel is not None:
            self.session.give_cancel(request_id, cancel)
        emit = (lambda m: on_message(m) if on_message and m.get("type") == "progress" else None)
        try:
            replies = self.server.handle(dict(message), session=self.session, emit=emit)
        finally:
            if cancel is not None:
                self.session.give_cancel(request_id, None)
        if not replies:
            raise _network_error("the server sent no reply")
        return replies[-1]

    def close(self) -> None:
        self.session.cancel_all()
        if self._close_server:
            self.server.close()


# ---------------------------------------------------------------------------------------------


class _Mailboxes:
    """Reply queues by request id, filled by a reader thread."""

    def __init__(self) -> None:
        self._boxes: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self.closed_reason: str | None = None

    def open(self, request_id: str) -> queue.Queue:
        with self._lock:
            if request_id in self._boxes:
                raise ValueError(f"request id {request_id!r} is already in flight")
            box: queue.Queue = queue.Queue()
            self._boxes[request_id] = box
            if self.closed_reason is not None:
                box.put(None)
            return box

    def release(self, request_id: str) -> None:
        with self._lock:
            self._boxes.pop(request_id, None)

    def deliver(self, message: dict[str, Any]) -> bool:
        """Queue ``message`` for its request; False when no request waits for its id (ids that
        are not strings, e.g. an unhashable list, never match: spec 02 §2.1)."""
        request_id = message.get("id")
        if not isinstance(request_id, str):
            return False
        with self._lock:
            box = self._boxes.get(request_id)
        if box is None:
            return False
        box.put(message)
        return True

    def close(self, reason: str) -> None:
        with self._lock:
            self.closed_reason = reason
            boxes = list(self._boxes.values())
        for box in boxes:
            box.put(None)


class StdioTransport(Transport):
    """Runs a MangleCP server as a subprocess and talks line-delimited JSON (spec 02 §5.3).

    Args:
        command: argv of the server (e.g. ``[sys.executable, "-m", "ftl.server.serve", "--stdio"]``).
        cwd, env: for the subprocess.
        manifest_timeout_s: how long to wait for the first manifest line, s.
        close_timeout_s: how long `close` waits for the server to exit after EOF before killing
            it, s.
    The server's stderr is passed through to ours. The manifest must be the first stdout line;
    later manifests (status changes) replace it. Replies with unknown ids are ignored
    (conformance C-6).
    """

    supports_progress = True
    supports_cancel = True
    supports_push = True

    def __init__(self, command: Sequence[str], *, cwd: str | None = None,
                 env: Mapping[str, str] | None = None, manifest_timeout_s: float = 60.0,
                 close_timeout_s: float = 10.0) -> None:
        self.command = list(command)
        self.close_timeout_s = close_timeout_s
        try:
            # A stdio server lives for its client only: the kernel kills it when the thread
            # that started it dies, so a kill -9 of ftl leaves no server changing the repo.
            self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=None, cwd=cwd, env=dict(env) if env else None,
                                            preexec_fn=parent_death_setup(os.getpid()))
        except OSError as exc:
            raise _network_error(f"cannot start the server ({exc.strerror or exc})") from None
        self._boxes = _Mailboxes()
        self._write_lock = threading.Lock()
        self._manifest: dict[str, Any] | None = None
        self._manifest_cond = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, name="manglecp-stdio-reader", daemon=True)
        self._reader.start()
        try:
            self.manifest(timeout_s=manifest_timeout_s)
        except FtlError:
            self.close()
            raise

    def _read_loop(self) -> None:
        """Dispatch the server's lines until its stdout closes. One bad line (not JSON, nested
        too deep, an id that is not a string) is logged and skipped; whatever ends the loop,
        every waiting request is woken with the reason (never left waiting for ever)."""
        stdout = self.process.stdout
        assert stdout is not None
        reason = "the server closed its output"
        try:
            for line in iter(stdout.readline, b""):
                if line.strip():
                    try:
                        self._dispatch(line)
                    except Exception as exc:  # noqa: BLE001 - a bad line must not stop the reader
                        log.warning("ignoring a line from the MangleCP server that cannot be read "
                                    "(%d bytes, %s)", len(line), type(exc).__name__)
        except (OSError, ValueError) as exc:
            reason = f"reading from the server failed ({exc})"
        except BaseException as exc:
            reason = f"the reader stopped ({type(exc).__name__})"
            raise
        finally:
            self._boxes.close(reason)
            with self._manifest_cond:
                self._manifest_cond.notify_all()

    def _dispatch(self, line: bytes) -> None:
        """Route one server line: a manifest replaces the current one, anything else goes to
        the request its id names (unknown ids are ignored, conformance C-6)."""
        message = json.loads(line)
        if not isinstance(message, dict):
            return
        if message.get("type") == "manifest":
            with self._manifest_cond:
                self._manifest = message
                self._manifest_cond.notify_all()
        elif not self._boxes.deliver(message) and message.get("type") == "error":
            payload = message.get("payload")
            log.warning("uncorrelated error from the MangleCP server: %s",
                        payload.get("code") if isinstance(payload, dict) else None)

    def manifest(self, *, refresh: bool = False, timeout_s: float = 60.0) -> dict[str, Any]:
        with self._manifest_cond:
            if self._manifest is None:
                self._manifest_cond.wait_for(
                    lambda: self._manifest is not None or self._boxes.closed_reason is not None,
                    timeout=timeout_s)
            if self._manifest is None:
                raise _network_error(self._boxes.closed_reason or "no manifest from the server in time")
            return self._manifest

    def wait_manifest(self, seen: Mapping[str, Any], timeout_s: float) -> bool:
        with self._manifest_cond:
            return self._manifest_cond.wait_for(
                lambda: self._manifest is not seen or self._boxes.closed_reason is not None,
                timeout=timeout_s) and self._manifest is not seen

    def send(self, message: Mapping[str, Any]) -> None:
        """Write one message line.

        Raises:
            FtlError(network_error): the server's stdin is closed.
        """
        data = encode(message) + b"\n"
        stdin = self.process.stdin
        assert stdin is not None
        with self._write_lock:
            try:
                stdin.write(data)
                stdin.flush()
            except (OSError, ValueError):
                raise _network_error("the server stopped reading its input") from None

    def request(self, message: Mapping[str, Any], *, on_message: OnMessage | None = None,
                cancel: threading.Event | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        request_id = str(message.get("id"))
        box = self._boxes.open(request_id)
        # A monotonic deadline, not a count of empty polls: a server that keeps sending
        # progress must still time out.
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        cancel_sent = False
        try:
            self.send(message)
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _reply_timeout(timeout_s)
                try:
                    reply = box.get(timeout=_POLL_S)
                except queue.Empty:
                    if cancel is not None and cancel.is_set() and not cancel_sent:
                        cancel_sent = True
                        self.send(cancel_message(request_id))
                    continue
                if reply is None:
                    raise _network_error(self._boxes.closed_reason or "the server went away")
                if reply.get("type") == "progress":
                    if on_message is not None:
                        on_message(reply)
                    continue
                return reply
        finally:
            self._boxes.release(request_id)

    def close(self) -> None:
        """Close the server's stdin (it exits on EOF), wait for it, kill it if it does not."""
        if self.process.stdin and not self.process.stdin.closed:
            with self._write_lock:
                try:
                    self.process.stdin.close()
                except OSError:
                    pass
        try:
            self.process.wait(timeout=self.close_timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=5)
        if self.process.stdout:
            self.process.stdout.close()


# ---------------------------------------------------------------------------------------------


class HttpTransport(Transport):
    """MangleCP over HTTP (spec 02 §4.2): GET the well-known manifest, POST to its endpoints.

    Args:
        base_url: server origin, e.g. ``http://127.0.0.1:8765``.
        token: bearer token sent on every request (never logged).
        timeout_s: per-request timeout, s.
        client: an `httpx.Client` to use (tests, custom TLS); one is created otherwise.
    Endpoint URIs come from the manifest (relative ones resolved against the manifest URL).
    Progress is not available over HTTP. A cancel sends the ``cancel`` message to the
    manifest's ``x-http_cancel`` endpoint when the server has one, then closes the connection
    (which a server that watches disconnects also takes as a cancel) and stops waiting.
    """

    def __init__(self, base_url: str, token: str | None = None, *, timeout_s: float = 600.0,
                 client: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.manifest_url = self.base_url + WELL_KNOWN_PATH
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._headers = headers
        self._timeout_s = timeout_s
        import httpx

        self._httpx = httpx
        self._client = client or httpx.Client(timeout=timeout_s)
        self._own_client = client is None
        self._manifest: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _get_manifest(self) -> dict[str, Any]:
        try:
            response = self._client.get(self.manifest_url, headers=self._headers)
        except self._httpx.HTTPError as exc:
            raise _network_error(f"GET manifest failed ({type(exc).__name__})") from None
        if response.status_code == 404:
            raise _network_error(f"{self.base_url} does not serve a MangleCP manifest (404)")
        body = self._json(response)
        if body.get("type") == "error":
            return body
        if "type" not in body:  # tolerate a bare payload (reference §11 item 32)
            body = {"type": "manifest", "id": None, "manglecp": PROTOCOL_VERSION, "payload": body}
        return body

    def manifest(self, *, refresh: bool = False, timeout_s: float = 60.0) -> dict[str, Any]:
        with self._lock:
            if self._manifest is None or refresh:
                manifest = self._get_manifest()
                if manifest.get("type") == "error":
                    raise to_ftl_error(manifest.get("payload", {}))
                self._manifest = manifest
            return self._manifest

    def _endpoint(self, message_type: str) -> str:
        endpoints = self.manifest().get("payload", {}).get("endpoints", {})
        key, default = (("intent_eval", "/manglecp/evaluate") if message_type == "intent_request"
                        else ("macro_invoke", "/manglecp/invoke"))
        return urllib.parse.urljoin(self.manifest_url, endpoints.get(key) or default)

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            raise _network_error(f"HTTP {response.status_code} without a JSON body") from None
        if not isinstance(body, dict):
            raise _network_error(f"HTTP {response.status_code} with a non-object body")
        return body

    def _post(self, url: str, message: Mapping[str, Any], client: httpx.Client,
              timeout_s: float | None) -> dict[str, Any]:
        try:
            response = client.post(url, content=encode(message),
                                   headers={**self._headers, "Content-Type": "application/json"},
                                   timeout=timeout_s if timeout_s is not None else self._timeout_s)
        except self._httpx.TimeoutException:
            raise _reply_timeout(timeout_s or self._timeout_s) from None
        except self._httpx.HTTPError as exc:
            raise _network_error(f"POST failed ({type(exc).__name__})") from None
        return self._json(response)

    def request(self, message: Mapping[str, Any], *, on_message: OnMessage | None = None,
                cancel: threading.Event | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        message_type = str(message.get("type"))
        if message_type not in ("intent_request", "invoke_request"):
            raise _network_error(f"{message_type} is not carried over HTTP")
        url = self._endpoint(message_type)
        if cancel is None:
            return self._post(url, message, self._client, timeout_s)
        # Cancellable: the POST runs on its own client in a helper thread; a cancel closes it.
        client = self._httpx.Client(timeout=self._timeout_s)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["reply"] = self._post(url, message, client, timeout_s)
            except FtlError as exc:
                box["error"] = exc

        worker = threading.Thread(target=run, name="manglecp-http", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(_POLL_S)
            if cancel.is_set() and worker.is_alive():
                self._send_cancel(str(message.get("id")))
                client.close()
                return _cancelled(str(message.get("id")))
        client.close()
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def _send_cancel(self, request_id: str) -> None:
        """POST a ``cancel`` to the server's ``x-http_cancel`` endpoint, if any (best effort)."""
        path = self.manifest().get("payload", {}).get("extensions", {}).get("x-http_cancel")
        if not isinstance(path, str) or not path:
            return
        try:
            self._client.post(urllib.parse.urljoin(self.manifest_url, path),
                              content=encode(cancel_message(request_id)),
                              headers={**self._headers, "Content-Type": "application/json"}, timeout=5.0)
        except self._httpx.HTTPError as exc:
            log.info("cancel of %s not delivered (%s)", request_id, type(exc).__name__)

    def close(self) -> None:
        if self._own_client:
            self._client.close()
