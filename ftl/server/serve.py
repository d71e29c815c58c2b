"""``ftl serve``: run ftl's embedded MangleCP server over stdio or HTTP.

stdio (MangleCP spec 02 §5.3): the manifest is the first stdout line (status ``booting`` until the
evaluation worker is warm, then an updated ``ready`` manifest), one JSON message per line in both
directions, requests handled concurrently, ``cancel`` honoured, logs only on stderr (fd 1 is
redirected to stderr for everything but the protocol, so no library or child process can corrupt
the stream), exit on stdin EOF after cancelling running and queued invocations (their
`cancelled` replies still flush).

HTTP (spec 02 §4.2): ``GET /.well-known/manglecp/manifest.json``, ``POST /manglecp/evaluate`` and
``/manglecp/invoke`` (also ``/evaluate`` and ``/invoke``), the spec 09 status code per error,
bearer auth with ``--token-env``, CORS ``*`` only when auth is off. Cancelling over HTTP: a
client that closes its connection cancels its request (the server polls for the disconnect and
signals the invocation, whose tools stop their subprocesses); ``POST /manglecp/cancel`` with a
``cancel`` message does the same for a request sent with the same credentials (``x-http_cancel``
in the HTTP manifest's extensions). Also ``GET /manglecp/skills/{skill_id}`` (the full text of a
referenced skill, ``x-skills``) and ``GET /metrics`` (Prometheus exposition from `ftl.telemetry.metrics`);
both need the bearer token when auth is on.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import sys
import threading
import uuid
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import click

from ftl.errors import FtlError
from ftl.manglecp.messages import ProtocolError, encode, make_error, parse_message
from ftl.manglecp.access import BearerAuth, Principal, Session
from ftl.manglecp.definitions import ServerLimits
from ftl.manglecp.server import ManglecpServer, encode_reply, http_error_status

log = logging.getLogger("ftl.server.serve")

_PEEK_BYTES = 64 * 1024  # lines shorter than this are checked for `cancel` before queueing


# ---------------------------------------------------------------------------------------------
# stdio


def serve_stdio(server: ManglecpServer, stdin: BinaryIO, stdout: BinaryIO, *,
                max_workers: int = 32, warm: Any = None) -> None:
    """Serve one client over a pair of byte streams until ``stdin`` reaches EOF.

    Args:
        server: the server; its manifest is written before anything is read.
        stdin, stdout: binary streams (one message per line each way).
        max_workers: requests processed at the same time; ``cancel`` never waits for a worker.
        warm: optional callable run after the first manifest; the server goes from
            ``booting`` to ``ready`` (``degraded`` if it raises) and the new manifest is pushed.
    """
    out_lock = threading.Lock()
    closed = threading.Event()

    def write(message: dict[str, Any]) -> None:
        data, sent = encode_reply(message)
        if sent is not message and message.get("type") == "progress":
            return  # logged; the request's final message still follows
        data += b"\n"
        with out_lock:
            if closed.is_set():
                return
            try:
                stdout.write(data)
                stdout.flush()
            except (BrokenPipeError, OSError, ValueError):
                closed.set()  # the client went away; keep draining quietly

    session = Session(key="stdio")
    write(server.manifest())
    server.add_manifest_listener(write)
    if warm is not None:
        def boot() -> None:
            try:
                warm()
            except Exception:
                log.exception("server warm-up failed")
                server.set_status("degraded")
                return
            server.set_status("ready")
        threading.Thread(target=boot, name="manglecp-boot", daemon=True).start()

    def run(line: bytes) -> None:
        for reply in server.handle(line, session=session, emit=write):
            write(reply)

    limit = server.limits.max_message_bytes
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="manglecp-req") as pool:
        while True:
            line = stdin.readline(limit + 2)
            if not line:
                break
            ending = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
            if len(line) - ending > limit or (not ending and len(line) == limit + 2):
                size = len(line)
                while line and not line.endswith(b"\n"):  # discard the rest of the oversized line
                    line = stdin.readline(1 << 20)
                    size += len(line)
                write(make_error("message_too_large", f"The message is larger than {limit} bytes.",
                                 {"limit_bytes": limit, "size_bytes": size}))
                continue
            if not line.strip():
                continue
            # The message is the line without its end: a message of exactly `limit` bytes
            # MUST be accepted (spec 02 §3.4), so the newline must not count.
            line = line.rstrip(b"\r\n")
            try:
                if len(line) < _PEEK_BYTES and _is_cancel(line):
                    run(line)  # inline: a cancel must not queue behind the requests it cancels
                else:
                    pool.submit(run, line)
            except Exception:  # one bad line must never end the session (in-flight work lives on)
                correlation_id = uuid.uuid4().hex[:12]
                log.exception("dispatching a stdio line failed (correlation id %s)", correlation_id)
                write(make_error("internal_error",
                                 f"An internal error occurred (correlation id {correlation_id}).",
                                 {"correlation_id": correlation_id}))
        session.cancel_all()  # EOF: stop running invocations; their final replies still flush
    server.remove_manifest_listener(write)


def _is_cancel(line: bytes) -> bool:
    """True when ``line`` is a ``cancel`` message. Anything unreadable (bad UTF-8, invalid JSON,
    nesting deep enough for RecursionError) is False: the worker's `parse_message` answers it."""
    try:
        message = json.loads(line)
    except Exception:
        return False
    return isinstance(message, dict) and message.get("type") == "cancel"


@contextlib.contextmanager
def _protocol_stdout():
    """Yield a private binary stream on the real stdout; point fd 1 and sys.stdout at stderr."""
    sys.stdout.flush()
    proto_fd = os.dup(1)  # not inherited by children
    os.dup2(2, 1)
    saved = sys.stdout
    sys.stdout = sys.stderr
    stream = os.fdopen(proto_fd, "wb", buffering=0)
    try:
        yield stream
    finally:
        sys.stdout = saved
        try:
            stream.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# HTTP


CANCEL_PATH = "/manglecp/cancel"
SKILLS_PATH = "/manglecp/skills/"


def create_app(server: ManglecpServer, *, cors_origins: Sequence[str] = (),
               disconnect_poll_s: float = 0.1) -> Any:
    """The Starlette app serving ``server`` over HTTP (module doc lists the routes).

    Args:
        server: the MangleCP server.
        cors_origins: allowed browser origins when auth is on (never ``*``, spec 08 §5); with
            auth off, any origin.
        disconnect_poll_s: how often a running request checks that its client is still
            connected, s.
    """
    import asyncio

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    running: dict[tuple[str, str], Session] = {}
    running_lock = threading.Lock()

    def reply(message: dict[str, Any], status: int | None = None, headers: dict | None = None) -> Response:
        data, sent = encode_reply(message)
        return Response(data, status_code=status or http_error_status(sent),
                        media_type="application/json", headers=headers)

    def credentials_of(request: Request) -> str | None:
        authorization = request.headers.get("authorization")
        if authorization is None:
            return None
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""

    def auth_error(request: Request) -> Response | None:
        """Bearer check for the routes that carry no MangleCP message."""
        if server.auth is None:
            return None
        credentials = credentials_of(request)
        if credentials is None:
            return reply(make_error("auth_required", "Authentication is required: send a bearer token."))
        if server.auth.verify(credentials) is None:
            return reply(make_error("auth_invalid", "The credentials are invalid or expired."))
        return None

    async def manifest(request: Request) -> Response:
        message = server.manifest()
        message["payload"]["extensions"] = {**message["payload"].get("extensions", {}),
                                            "x-http_cancel": CANCEL_PATH, "x-skills": SKILLS_PATH}
        body = encode(message)
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag, "Cache-Control": "no-cache"})
        return Response(body, media_type="application/json",
                        headers={"ETag": etag, "Cache-Control": "no-cache"})

    async def read_message(request: Request, expected: str) -> Any:
        """The parsed envelope of the POST body, or the error `Response` to send."""
        limit = server.limits.max_message_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return reply(make_error("message_too_large", f"The message is larger than {limit} bytes.",
                                    {"limit_bytes": limit, "size_bytes": int(declared)}))
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in ("application/json", "application/manglecp+json"):
            return reply(make_error("malformed_message", "Send the message as application/json.",
                                    {"violations": [{"path": "/", "message": f"content type {media!r}"}]}))
        # Read at most limit + 1 bytes: a body sent without Content-Length (chunked) is refused
        # as soon as it passes the limit, never buffered whole.
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return reply(make_error("message_too_large", f"The message is larger than {limit} bytes.",
                                        {"limit_bytes": limit, "size_bytes": size}))
        body = b"".join(chunks)
        try:
            env = parse_message(body, max_bytes=limit)
        except ProtocolError as exc:
            return reply(exc.envelope())
        if env.type != expected:
            return reply(make_error("invalid_type", f"This endpoint takes {expected} messages.",
                                    {"type": env.type, "accepted_types": [expected]}, id=env.id or None))
        return env

    def endpoint(expected: str):
        async def handle(request: Request) -> Response:
            env = await read_message(request, expected)
            if isinstance(env, Response):
                return env
            credentials = credentials_of(request)
            session = Session(credentials=credentials)
            key = (credentials or "", env.id or "")
            with running_lock:
                running.setdefault(key, session)
            task = asyncio.ensure_future(run_in_threadpool(server.handle, env.model_dump(), session=session))
            disconnected = False
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=disconnect_poll_s)
                    if done:
                        break
                    if disconnected or await request.is_disconnected():
                        if not disconnected:
                            log.info("client of %s %s disconnected; cancelling it", env.type, env.id)
                        disconnected = True
                        session.cancel_all()  # repeated: the request may register its flag late
                replies = task.result()
            finally:
                with running_lock:
                    if running.get(key) is session:
                        del running[key]
            return reply(replies[-1])  # HTTP carries no progress (spec 07 §7)
        return handle

    async def cancel(request: Request) -> Response:
        env = await read_message(request, "cancel")
        if isinstance(env, Response):
            return env
        credentials = credentials_of(request)
        problems = server.handle(env.model_dump(), session=Session(credentials=credentials))
        if problems:  # auth or payload errors; a valid cancel has no reply
            return reply(problems[-1])
        target = str(env.payload.get("request_id"))
        with running_lock:
            session = running.get((credentials or "", target))
        if session is not None:
            session.cancel_all()
        return Response(status_code=204)

    async def skill(request: Request) -> Response:
        denied = auth_error(request)
        if denied is not None:
            return denied
        found = server.skills.get(request.path_params["skill_id"])
        if found is None:
            return Response(json.dumps({"error": "no such skill"}), status_code=404,
                            media_type="application/json")
        return Response(json.dumps({"skill_id": found.skill_id, "name": found.name,
                                    "description": found.description, "content": found.content,
                                    "content_type": found.content_type}, ensure_ascii=False),
                        media_type="application/json")

    async def metrics(request: Request) -> Response:
        denied = auth_error(request)
        if denied is not None:
            return denied
        try:
            render = importlib.import_module("ftl.telemetry.metrics").render
        except (ImportError, AttributeError):
            return Response("metrics are not available in this installation\n", status_code=404,
                            media_type="text/plain")
        body, content_type = await run_in_threadpool(render)
        return Response(body, media_type=content_type)

    middleware = []
    origins = list(cors_origins) if server.auth is not None else ["*"]
    origins = [o for o in origins if o != "*"] if server.auth is not None else origins
    if origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                                     allow_headers=["Content-Type", "Accept", "Authorization"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        yield
        server.set_status("draining")
        await run_in_threadpool(server.close)

    routes = [Route("/.well-known/manglecp/manifest.json", manifest, methods=["GET"]),
              Route(CANCEL_PATH, cancel, methods=["POST"]),
              Route(SKILLS_PATH + "{skill_id}", skill, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    for prefix in ("/manglecp", ""):
        routes.append(Route(f"{prefix}/evaluate", endpoint("intent_request"), methods=["POST"]))
        routes.append(Route(f"{prefix}/invoke", endpoint("invoke_request"), methods=["POST"]))
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise click.BadParameter("expected HOST:PORT, e.g. 127.0.0.1:8765", param_hint="--http")
    return host.strip("[]"), int(port)


# ---------------------------------------------------------------------------------------------
# CLI


@click.command("serve")
@click.option("--stdio", "use_stdio", is_flag=True, help="Serve one client on stdin/stdout (default).")
@click.option("--http", "http_addr", metavar="HOST:PORT", help="Serve HTTP on HOST:PORT instead.")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=".",
              show_default=True, help="Repository the tools work on.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="ftl.toml to use (default: <repo>/ftl.toml when present).")
@click.option("--config-json", hidden=True,
              help="The whole configuration as JSON (used by the runner to start its server).")
@click.option("--token-env", metavar="NAME",
              help="Require `Authorization: Bearer <token>`, the token read from env var NAME.")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="Allowed browser origin when auth is on (repeatable; '*' is refused).")
@click.option("--isolation", type=click.Choice(["thread", "process"]),
              help="Where selection rules run: 'thread' (in the server process; default with --stdio) "
                   "or 'process' (killable worker processes with a memory cap; default with --http).")
@click.option("--rule-coverage", is_flag=True,
              help="Dev mode: answer `options[\"x-rule_coverage\"]` with diagnostics.rule_coverage.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="warning", show_default=True, help="Log level (logs go to stderr).")
def serve(use_stdio: bool, http_addr: str | None, repo: Path, config_path: Path | None,
          config_json: str | None, token_env: str | None, cors_origins: tuple[str, ...],
          isolation: str | None, rule_coverage: bool, log_level: str) -> None:
    """Run ftl's embedded MangleCP server (protocol 2026-02-draft).

    stdio: prints the manifest as the first stdout line, then one JSON reply per line; logs go to
    stderr; exits 0 on stdin EOF. HTTP: serves the well-known manifest and the evaluate/invoke
    endpoints until SIGINT/SIGTERM, then finishes in-flight requests and exits (uvicorn
    re-raises the signal). Exit code 2: bad usage or configuration (including a [gates] table
    whose gate module is unavailable).

    Isolation: the stdio server serves one client, the runner that started it, with ftl's own
    stratified rules over at most ``max_facts_per_request`` facts, so it evaluates in a thread
    of its own process: it is ready as soon as the rules are parsed (tens of ms) and no request
    is pickled to a worker. An HTTP server faces network clients and keeps killable worker
    processes with a memory cap (started at the first request). ``--stdio --isolation process``
    announces ``booting`` until its first worker is up, then ``ready``.
    """
    from pydantic import ValidationError

    from ftl.config import Config, load_config
    from ftl.server.app import build_server

    logging.basicConfig(stream=sys.stderr, level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if use_stdio and http_addr:
        raise click.UsageError("choose one of --stdio and --http")
    auth = None
    if token_env:
        token = os.environ.get(token_env, "")
        if not token:
            raise click.UsageError(f"environment variable {token_env} is empty or not set")
        auth = BearerAuth({token: Principal("operator")})
    try:
        config = (Config.model_validate_json(config_json) if config_json is not None
                  else load_config(config_path, repo))
    except FtlError as exc:
        raise click.UsageError(exc.message) from None
    except ValidationError as exc:
        raise click.UsageError(f"--config-json: {exc.error_count()} invalid field(s)") from None
    limits = replace(ServerLimits(), rule_coverage=True) if rule_coverage else None
    isolation = isolation or ("process" if http_addr else "thread")
    booting = isolation == "process" and not http_addr  # a worker to start before `ready`
    try:
        server = build_server(repo, config, auth=auth, limits=limits, isolation=isolation,
                              status="booting" if booting else "ready")
    except FtlError as exc:
        raise click.UsageError(exc.message) from None
    if http_addr:
        import uvicorn
        host, port = _host_port(http_addr)
        if auth is None and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("serving without authentication on %s; use --token-env on a network", host)
        uvicorn.Server(uvicorn.Config(create_app(server, cors_origins=cors_origins), host=host, port=port,
                                      log_level=log_level, access_log=False)).run()
        return
    with _protocol_stdout() as proto:
        try:
            serve_stdio(server, sys.stdin.buffer, proto, warm=server.evaluator.warm if booting else None)
        finally:
            server.close()


if __name__ == "__main__":
    serve()
