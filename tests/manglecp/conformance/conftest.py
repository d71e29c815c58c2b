"""Fixtures of the conformance suite (reference §9): the fixture server as real processes over
stdio and over HTTP, and one small `Conn` interface that sends raw messages to either.

Every test that takes ``conn`` runs once per transport. Servers are started once per session,
all at the same time, so their start-up costs overlap.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftl.manglecp.messages import code_row, encode
from ftl.manglecp.transport import WELL_KNOWN_PATH

SERVER = Path(__file__).with_name("fixture_server.py")
WAIT_S = 60.0
ERRORS_SEEN: list[tuple[str, dict, int | None]] = []  # (transport, error payload, HTTP status)


@dataclass
class Reply:
    """The final message for one request, its HTTP status (None on stdio) and the progress
    messages that came before it."""

    message: dict[str, Any]
    status: int | None = None
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.message["type"]

    @property
    def payload(self) -> dict[str, Any]:
        return self.message["payload"]


def _record(transport: str, reply: Reply) -> Reply:
    if reply.message.get("type") == "error":
        ERRORS_SEEN.append((transport, reply.message.get("payload", {}), reply.status))
    return reply


class StdioConn:
    """A raw line client for ``fixture_server.py --stdio``: a reader thread files every stdout
    line (kept raw in ``lines``) by id; manifests and id-less errors have their own queues."""

    transport = "stdio"

    def __init__(self, *args: str) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, str(SERVER), "--stdio", *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr)
        self.lines: list[bytes] = []
        self.manifests: "queue.Queue[dict]" = queue.Queue()
        self.latest_manifest: dict | None = None
        self.uncorrelated: "queue.Queue[dict]" = queue.Queue()
        self.boxes: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()
        self.written = threading.Event()  # set once the test wrote anything (item 12)
        self.first_line_before_write: bool | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in iter(self.process.stdout.readline, b""):
            if self.first_line_before_write is None:
                self.first_line_before_write = not self.written.is_set()
            self.lines.append(line)
            message = json.loads(line)
            if message["type"] == "manifest":
                self.latest_manifest = message
                self.manifests.put(message)
                continue
            with self.lock:
                box = self.boxes.get(message["id"])
            (box or self.uncorrelated).put(message)

    def wait_manifest(self, status: str | None = None, timeout_s: float = WAIT_S) -> dict:
        """The next pushed manifest (with ``status``, when given)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if status is not None and self.latest_manifest and self.latest_manifest["payload"]["status"] == status:
                return self.latest_manifest
            message = self.manifests.get(timeout=max(0.01, deadline - time.monotonic()))
            if status is None or message["payload"]["status"] == status:
                return message

    def manifest(self) -> dict:
        return self.latest_manifest or self.wait_manifest()

    def write(self, data: bytes) -> None:
        self.written.set()
        self.process.stdin.write(data if data.endswith(b"\n") else data + b"\n")
        self.process.stdin.flush()

    def open_box(self, request_id: str) -> queue.Queue:
        with self.lock:
            box = self.boxes[request_id] = queue.Queue()
        return box

    def collect(self, request_id: str | None, box: queue.Queue | None = None) -> Reply:
        progress = []
        while True:
            message = (box or self.uncorrelated).get(timeout=WAIT_S)
            if message["type"] == "progress":
                progress.append(message)
                continue
            with self.lock:
                self.boxes.pop(request_id, None)
            return _record(self.transport, Reply(message, None, progress))

    def send(self, message: dict | bytes, *, reply_id: str | None = "auto", path: str | None = None) -> Reply:
        """Send one message (a dict, or raw bytes) and return its final reply. ``reply_id`` is
        the id the reply carries (default: the message's own id; None for uncorrelated ones)."""
        if reply_id == "auto":
            reply_id = message.get("id") if isinstance(message, dict) else None
        box = self.open_box(reply_id) if reply_id is not None else None
        self.write(message if isinstance(message, bytes) else encode(message))
        return self.collect(reply_id, box)

    def send_many(self, messages: list[dict]) -> list[Reply]:
        """Pipeline ``messages`` (distinct ids) and return their replies in the same order."""
        boxes = [self.open_box(m["id"]) for m in messages]
        self.write(b"".join(encode(m) + b"\n" for m in messages))
        return [self.collect(m["id"], box) for m, box in zip(messages, boxes)]

    def close(self) -> int:
        if not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=20)
        finally:
            self.reader.join(5)
            self.process.stdout.close()
            self.stderr.close()


class HttpConn:
    """POSTs raw messages to ``fixture_server.py --http PORT`` (intents to the evaluate endpoint,
    everything else to invoke unless ``path`` says otherwise)."""

    transport = "http"

    def __init__(self, *args: str) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port), *args],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(timeout=WAIT_S)
        self.headers: dict[str, str] = {"Accept": "application/json"}
        self.bodies: list[bytes] = []

    def wait_up(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                self.client.get(self.url + WELL_KNOWN_PATH)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def manifest(self) -> dict:
        response = self.client.get(self.url + WELL_KNOWN_PATH)
        self.bodies.append(response.content)
        return response.json()

    def send(self, message: dict | bytes, *, reply_id: Any = None, path: str | None = None,
             headers: dict[str, str] | None = None) -> Reply:
        if path is None:
            kind = message.get("type") if isinstance(message, dict) else "intent_request"
            path = "/manglecp/evaluate" if kind in ("intent_request", "frobnicate") else "/manglecp/invoke"
            if kind == "cancel":
                path = "/manglecp/cancel"
        body = message if isinstance(message, bytes) else encode(message)
        response = self.client.post(self.url + path, content=body,
                                    headers={**self.headers, "Content-Type": "application/json", **(headers or {})})
        self.bodies.append(response.content)
        return _record(self.transport, Reply(response.json(), response.status_code))

    def send_many(self, messages: list[dict]) -> list[Reply]:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(self.send, messages))

    def close(self) -> int:
        self.client.close()
        self.process.terminate()
        return self.process.wait(timeout=20)


class Servers:
    """The session's fixture servers: ``open`` and ``locked`` (bearer auth), each over stdio and
    HTTP, started together."""

    def __init__(self) -> None:
        self.conns = {("open", "stdio"): StdioConn(), ("open", "http"): HttpConn(),
                      ("locked", "stdio"): StdioConn("--locked"), ("locked", "http"): HttpConn("--locked")}
        for conn in self.conns.values():
            if isinstance(conn, HttpConn):
                conn.wait_up()
            else:
                conn.wait_manifest()

    def __getitem__(self, key: tuple[str, str]) -> Any:
        return self.conns[key]

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


@pytest.fixture(scope="session")
def servers():
    started = Servers()
    yield started
    started.close()


@pytest.fixture(params=["stdio", "http"])
def conn(request, servers) -> Any:
    return servers["open", request.param]


@pytest.fixture(params=["stdio", "http"])
def locked(request, servers) -> Any:
    return servers["locked", request.param]


@pytest.fixture(params=["stdio", "http"])
def booting(request, tmp_path):
    """A fresh server that stays ``booting`` until ``tmp_path/ready`` exists (and goes
    ``draining`` once ``tmp_path/drain`` exists)."""
    conn = (StdioConn if request.param == "stdio" else HttpConn)("--gate-dir", str(tmp_path))
    if isinstance(conn, HttpConn):
        conn.wait_up()
    conn.gate_dir = tmp_path
    yield conn
    conn.close()


def expect_error(reply: Reply, code: str) -> dict[str, Any]:
    """Assert ``reply`` is an ``error`` with ``code``, the right shape, ``recoverable`` flag and
    HTTP status (conformance item 26); return its payload."""
    assert reply.type == "error", reply.message
    payload = reply.payload
    assert payload["code"] == code, payload
    assert isinstance(payload["message"], str) and payload["message"]
    status, recoverable = code_row(code)
    assert payload["recoverable"] is recoverable
    if reply.status is not None:
        assert reply.status == status
    return payload


def tools(reply: Reply) -> dict[str, dict[str, Any]]:
    assert reply.type == "intent_response", reply.message
    return {t["name"]: t for t in reply.payload["macro_tools"]}
