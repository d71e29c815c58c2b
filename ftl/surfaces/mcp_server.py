"""MCP server exposing ftl to Claude Code (official ``mcp`` SDK 2.x, low-level ``Server``, stdio).

Tools: ``campaign_run``, ``campaign_resume``, ``campaign_status``, ``ready_tasks``,
``cascade_analysis``, ``replay_log`` and ``intents``. Every result is a response-v2 envelope
(`ftl.surfaces.envelope`), sent both as ``structuredContent`` and as its JSON text.

Error channels (errors-and-gates reference §5 rule 4), all rendered from `ftl.errors`:

* an error the agent should reason about (a registry row with ``as_tool_result``: its plan
  breaks the schema or has a cycle, its work failed verification, an approval timed out) and a
  campaign that returned from ERROR come back as a ``CallToolResult`` with ``isError`` and a
  ``success: false`` envelope;
* protocol, gate and runner faults are JSON-RPC errors (`ftl.surfaces.jsonrpc`): unknown tool or bad
  arguments -32602, gate refusals -32015/-32014/-32003/-32007, ftl's kinds -32060.., anything
  unclassified -32603 with a correlation id (its traceback only in the log). The SDK's own
  protocol errors (unknown method, malformed params) are re-shaped to the same ``data``; on
  stdio, a line that is not JSON gets -32700, JSON that is not JSON-RPC -32600, and a message
  over `MAX_MESSAGE_BYTES` -32600 (the SDK itself drops all three silently).

Why the low-level ``Server`` rather than ``MCPServer``: the high-level class turns unknown tools
and bad arguments into ``isError`` text and hides exception codes from tool results, while the
registry decides the channel here (reference §3.3). Every request passes one middleware that
assigns the correlation id (``_meta.correlation_id`` when the client sends a plain token, else
``<run id>-<n>``) and maps every failure, so no handler can leak ``str(exc)``.

When ``[gates]`` is configured, every tool call passes the four gates (`ftl.gate`, imported on
first use; configured but not importable -> ``configuration_error``) with source ``"mcp"``, and
``tools/list`` shows only the tools gate 1 exposes. Gates come from the server's own
configuration (``--config`` or ``<repo>/ftl.toml`` at start), never from a repository a call
names, so a caller cannot pick a repository without gates to escape them.

Run ``ftl mcp [--repo DIR] [--config FILE]`` (or ``python -m ftl.surfaces.mcp_server``). Logs are JSON
lines on stderr (`ftl.telemetry.logs`); stdout carries only the protocol.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import itertools
import json
import logging
import os
import re
import sqlite3
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping, Sequence

import anyio
import anyio.from_thread
import anyio.lowlevel
import click
import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ftl.surfaces import envelope
from ftl.telemetry import logs
from ftl.config import Config, load_config
from ftl.errors import FtlError
from ftl.surfaces.jsonrpc import (SDK_RESERVED_CODES, STANDARD_KINDS, CorrelationIds, accept_correlation_id,
                         bare_internal_error, error_object, kind_for_code)
from ftl.telemetry.metrics import METRICS, EventMetrics, Metrics

__all__ = ["FtlMcpServer", "TOOLS", "ToolSpec", "Outcome", "CallContext", "MAX_MESSAGE_BYTES", "SOURCE", "mcp"]

SERVER_NAME = "ftl"
SOURCE = "mcp"                      # the call source the gates see (ftl.gate RuleMatch.source)
MAX_MESSAGE_BYTES = 1024 * 1024     # ThoughtGate's body limit (EC-MCP): larger -> -32600
INSTRUCTIONS = (
    "ftl runs coding campaigns: a DAG of tasks driven through a state machine. Start one with "
    "campaign_run (an objective and/or a plan.json path), watch it with campaign_status, "
    "ready_tasks and cascade_analysis, continue an interrupted one with campaign_resume, and "
    "audit a run with replay_log. Every result is a response-v2 envelope: success, data, "
    "error, meta. A result with isError is something to fix (its data.remediation says how).")

log = logging.getLogger("ftl.mcp")
_CORRELATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("ftl_mcp_correlation_id",
                                                                          default=None)
_PARSE_AT = re.compile(r"line (\d+) column (\d+)")


# --------------------------------------------------------------------------- tool arguments

class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: str | None = Field(None, min_length=1, max_length=4096, description=(
        "Repository directory (default: the server's --repo); relative paths resolve against it."))


class _CampaignArgs(_Args):
    campaign_id: str | None = Field(None, min_length=1, max_length=128, description=(
        "Campaign id (default: the active campaign, else the latest)."))


class CampaignRunArgs(_Args):
    objective: str | None = Field(None, min_length=1, max_length=10_000, description=(
        "What the campaign should achieve (default: the plan's objective)."))
    plan: str | None = Field(None, min_length=1, max_length=4096, description=(
        "Path of a plan.json (relative to the repository); validated first."))
    jobs: int | None = Field(None, ge=1, le=256, description="Tasks run at once (default: CPU count).")


class CampaignResumeArgs(_CampaignArgs):
    jobs: int | None = Field(None, ge=1, le=256, description="Tasks run at once (default: CPU count).")


class CampaignStatusArgs(_CampaignArgs):
    pass


class ReadyTasksArgs(_CampaignArgs):
    pass


class CascadeAnalysisArgs(_CampaignArgs):
    replan_threshold: int | None = Field(None, ge=1, le=10_000, description=(
        "Unreachable tasks one blocked root must cause for a re-plan (default: config, FTL 2)."))


class ReplayLogArgs(_Args):
    path: str = Field(min_length=1, max_length=4096, description=(
        "Event log: a path (relative to the repository) or a campaign id "
        "(.ftl/events/<id>.jsonl)."))
    check: bool = Field(False, description="Report whether every invariant holds (data.check).")


class IntentsArgs(_Args):
    pass


# --------------------------------------------------------------------------- tool table

@dataclass(frozen=True)
class CallContext:
    """What a tool run gets besides its arguments.

    Attributes:
        correlation_id: the request's id (also the envelope's ``meta.request_id``).
        report: ``report(progress, total, message)`` sends an MCP progress notification when
            the client asked for them (a no-op otherwise); callable from any thread.
        cancel: set when the client cancels the call (``notifications/cancelled``): a campaign
            run hands it to its `ftl.engine.runner.Runner` as ``interrupt``, so the run stops
            (cancelled, resumable) instead of going on changing the repository unseen.
    """

    correlation_id: str
    report: Callable[[float, float | None, str | None], None] = lambda *_: None
    cancel: threading.Event = field(default_factory=threading.Event)


class _RunProgress:
    """Event-log listener turning state entries and finished tasks into progress notifications
    (the progress value counts notifications, so it always increases, as MCP requires)."""

    def __init__(self, report: Callable[[float, float | None, str | None], None]) -> None:
        self.report = report
        self.steps = 0
        self._lock = threading.Lock()  # tasks end on scheduler threads; keep values in order

    def __call__(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "STATE_ENTRY":
            message = f"state {event.get('state')}"
        elif name == "TASK_END":
            message = f"task {event.get('task_seq')} {event.get('status')}"
        else:
            return
        with self._lock:
            self.steps += 1
            self.report(self.steps, None, message)


@dataclass(frozen=True)
class Outcome:
    """A tool's answer: the response-v2 envelope and whether it is an ``isError`` result."""

    envelope: dict[str, Any]
    is_error: bool = False

    def result(self) -> types.CallToolResult:
        try:
            text = json.dumps(self.envelope, sort_keys=True, default=str, ensure_ascii=False,
                              allow_nan=False)
        except ValueError:  # a NaN or an infinity (a summary's number): JSON has none
            from ftl.postmortem.timeline import json_finite

            text = json.dumps(json_finite(self.envelope), sort_keys=True, default=str,
                              ensure_ascii=False, allow_nan=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=json.loads(text), is_error=self.is_error)


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool.

    Attributes:
        name, title, description: what ``tools/list`` shows.
        args: the pydantic model of the arguments (its JSON Schema is the input schema).
        run: ``run(server, args, call: CallContext) -> Outcome``; runs in a worker thread.
        side_effects: MangleCP spec 06 vocabulary, passed to the gates.
        read_only: the tool changes nothing (``readOnlyHint``).
    """

    name: str
    title: str
    description: str
    args: type[BaseModel]
    run: Callable[["FtlMcpServer", Any, CallContext], Outcome]
    side_effects: tuple[str, ...] = ("none",)
    read_only: bool = True

    def as_tool(self) -> types.Tool:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        return types.Tool(name=self.name, title=self.title, description=self.description,
                          input_schema=schema, annotations=types.ToolAnnotations(
                              read_only_hint=self.read_only, destructive_hint=False,
                              idempotent_hint=self.read_only, open_world_hint=False))


def _run_campaign(server: "FtlMcpServer", args: CampaignRunArgs, call: CallContext) -> Outcome:
    cid = call.correlation_id
    repo = server.resolve_repo(args.repo)
    config = server.config_for(repo, jobs=args.jobs)
    plan_input = None
    if args.plan:
        from ftl.validation import load_plan_file

        plan = load_plan_file(server.resolve_path(repo, args.plan, "/plan"))
        plan_input = plan.model_dump(mode="json", by_alias=True, exclude_none=True)
    objective = args.objective or (plan_input or {}).get("objective")
    if not objective:
        raise FtlError("invalid_params", {"schema_errors": [
            {"path": "/objective", "message": "give an objective or a plan that has one",
             "keyword": "required"}]})
    runner = server.runner_factory(repo, config, on_event=server.listener(call), interrupt=call.cancel)
    try:  # this server outlives the run: its store connection is closed now, not by the collector
        return _run_outcome(runner.start(objective, plan_input=plan_input), cid)
    finally:
        runner.close()


def _resume_campaign(server: "FtlMcpServer", args: CampaignResumeArgs, call: CallContext) -> Outcome:
    cid = call.correlation_id
    repo = server.resolve_repo(args.repo)
    runner = server.runner_factory(repo, server.config_for(repo, jobs=args.jobs),
                                   on_event=server.listener(call), interrupt=call.cancel)
    try:
        return _run_outcome(runner.resume(args.campaign_id), cid)
    finally:
        runner.close()


def _run_outcome(result: Any, cid: str) -> Outcome:
    """The envelope of a finished run (the CLI's `--json` shape): blocked tasks are a
    ``PARTIAL_FAILURE`` warning; a return from ERROR, or a run stopped because its Ray cluster
    was lost (resumable), is an ``isError`` result."""
    summary = result.summary if isinstance(result.summary, dict) else {}
    if result.outcome == "cancelled":
        raise FtlError("cancelled")
    if result.outcome in ("returned", "stopped"):
        error = summary.get("error") or {}
        failed = envelope.failure(FtlError(str(error.get("error_type") or "internal_error"),
                                           error.get("details"), message=error.get("message")),
                                  request_id=cid)
        failed["data"].update(campaign_id=result.campaign_id, summary=summary,
                              exit_code=result.exit_code)
        return Outcome(failed, is_error=True)
    data = {"campaign_id": result.campaign_id, "outcome": result.outcome,
            "exit_code": result.exit_code, "event_log": Path(result.log_path).name,
            "summary": summary}
    warnings = []
    if summary.get("blocked"):
        warnings.append(envelope.Warning(
            "PARTIAL_FAILURE", f"{summary.get('blocked')} of {summary.get('total')} tasks blocked"))
    return Outcome(envelope.success(data, warnings=warnings, request_id=cid))


def _store(server: "FtlMcpServer", repo: Path):
    """The repository's store, or None when it has none yet (a read never creates one)."""
    if not (repo / ".ftl" / "ftl.db").exists():
        return None
    from ftl.store import Store

    return Store.for_repo(repo)


def _campaign(store: Any, campaign_id: str | None) -> dict[str, Any] | None:
    if campaign_id:
        return store.get_campaign(campaign_id)
    return store.active_campaign() or store.latest_campaign()


def _status(server: "FtlMcpServer", args: CampaignStatusArgs, call: CallContext) -> Outcome:
    from ftl.engine.status import campaign_status

    data = campaign_status(server.resolve_repo(args.repo), args.campaign_id)
    return Outcome(envelope.success(data or {"status": "none"}, request_id=call.correlation_id))


def _ready(server: "FtlMcpServer", args: ReadyTasksArgs, call: CallContext) -> Outcome:
    cid = call.correlation_id
    from ftl import dag

    repo = server.resolve_repo(args.repo)
    store = _store(server, repo)
    if store is None:
        return Outcome(envelope.success({"campaign_id": None, "items": []}, request_id=cid))
    with store:
        record = _campaign(store, args.campaign_id)
        tasks = store.tasks(record["id"]) if record else []
    ready = set(dag.ready_set({t["seq"]: t["depends"] for t in tasks},
                              {t["seq"]: t["status"] for t in tasks}))
    return Outcome(envelope.success({"campaign_id": record["id"] if record else None,
                                     "items": [t for t in tasks if t["seq"] in ready]},
                                    request_id=cid))


def _cascade(server: "FtlMcpServer", args: CascadeAnalysisArgs, call: CallContext) -> Outcome:
    cid = call.correlation_id
    from ftl.server.tools.cascade import analyze_tasks

    repo = server.resolve_repo(args.repo)
    config = server.config_for(repo)
    store = _store(server, repo)
    record = None
    if store is not None:
        with store:
            record = _campaign(store, args.campaign_id)
            tasks = store.tasks(record["id"]) if record else []
    if record is None:
        raise FtlError("not_found", {"what": "a campaign to analyse"})
    analysis = analyze_tasks(tasks, args.replan_threshold or config.replan_threshold,
                             config.seconds_per_budget)
    return Outcome(envelope.success({"campaign_id": record["id"], **analysis}, request_id=cid))


def _replay(server: "FtlMcpServer", args: ReplayLogArgs, call: CallContext) -> Outcome:
    cid = call.correlation_id
    from ftl.events import log_path
    from ftl.postmortem.replay import replay

    repo = server.resolve_repo(args.repo)
    path = server.resolve_path(repo, args.path)
    if not path.is_file() and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", args.path):
        path = server.resolve_path(repo, str(log_path(repo, args.path)))  # a campaign id
    if not path.is_file():
        raise FtlError("not_found", {"what": f"event log {Path(args.path).name}"})
    try:
        with replay([path]) as result:  # closing deletes the spool's temporary database now
            data, cut = _capped(result.to_json(lazy=True), REPLAY_LIST_LIMIT)
            if args.check:
                data["check"] = {"passed": not result.violations, "violations": len(result.violations)}
            torn = result.torn_tail
    except sqlite3.Error:
        raise FtlError("not_found", {"what": "a writable temporary directory with free space for "
                                             "the replay's records (set TMPDIR to one)"}) from None
    warnings = [envelope.Warning("LOG_TAIL_REPAIRED", "the last line was torn and skipped")] \
        if torn else []
    if cut:
        data["cut"] = cut
        warnings.append(envelope.Warning("REPLAY_LISTS_CUT", (
            f"lists longer than {REPLAY_LIST_LIMIT} are cut to their first {REPLAY_LIST_LIMIT} "
            "(data.cut gives each total); `ftl replay LOG --format json` lists everything")))
    return Outcome(envelope.success(data, warnings=warnings, request_id=cid))


#: The most items of each list a ``replay_log`` answer carries: the answer is one message in
#: memory on both sides, so a long log is summarised rather than sent whole.
REPLAY_LIST_LIMIT = 2000


def _capped(data: dict[str, Any], limit: int) -> tuple[dict[str, Any], dict[str, int]]:
    """``data`` (`Replay.to_json(lazy=True)`) with each list read up to ``limit`` items, and
    ``{name: total}`` for the lists that were longer."""
    cut: dict[str, int] = {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, list):  # a JsonArray is a list read on demand
            total = len(value)
            out[key] = list(itertools.islice(iter(value), limit))
            if total > limit:
                cut[key] = total
        else:
            out[key] = value
    return out, cut


def _intents(server: "FtlMcpServer", args: IntentsArgs, call: CallContext) -> Outcome:
    cid = call.correlation_id
    from ftl.server.app import build_server
    from ftl.server.catalog import TOOL_SPECS

    repo = server.resolve_repo(args.repo)
    embedded = build_server(repo, server.config_for(repo), isolation="thread")
    try:
        manifest = embedded.manifest_payload()
        available = set(embedded.catalog)
    finally:
        embedded.close()
    tools = [{"name": s.name, "summary": s.summary, "intents": list(s.intents),
              "side_effects": list(s.side_effects), "requires_confirmation": s.requires_confirmation,
              "capability": s.capability, "available": s.name in available} for s in TOOL_SPECS]
    data = {"server": {"name": manifest["server_name"], "version": manifest["server_version"]},
            "status": manifest["status"], "intents": manifest["intents"], "tools": tools}
    return Outcome(envelope.success(data, request_id=cid))


_CAMPAIGN_EFFECTS = ("filesystem", "process", "database")
TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("campaign_run", "Run a campaign", (
        "Run a campaign to its end: explore, plan (or load `plan`), register the task DAG, build "
        "and verify every task, cascade blocks, observe, complete. data: {campaign_id, outcome, "
        "exit_code, event_log, summary}; blocked tasks add a PARTIAL_FAILURE warning. A plan "
        "that breaks the schema or has a cycle, and a campaign that returned from ERROR, come "
        "back with isError and data.details/remediation."), CampaignRunArgs, _run_campaign,
        _CAMPAIGN_EFFECTS, read_only=False),
    ToolSpec("campaign_resume", "Resume a campaign", (
        "Resume an interrupted campaign: completed tasks are kept, in-flight ones re-run fresh. "
        "Same result as campaign_run."), CampaignResumeArgs, _resume_campaign, _CAMPAIGN_EFFECTS,
        read_only=False),
    ToolSpec("campaign_status", "Campaign status", (
        "A campaign's state and tasks. data: {campaign: {id, objective, status, flow, "
        "machine_state, created_at, finished_at, run_pid, message}, tasks: [{seq, slug, status, attempts, "
        "blocked_by, block_reason}], cascade}; {status: 'none'} when there is no campaign. An "
        "active campaign whose run_pid is null was interrupted: resume it with campaign_resume."),
        CampaignStatusArgs, _status),
    ToolSpec("ready_tasks", "Ready tasks", (
        "Tasks that can start now (pending, every dependency complete), in seq order. "
        "data: {campaign_id, items: [task]}."), ReadyTasksArgs, _ready),
    ToolSpec("cascade_analysis", "Cascade analysis", (
        "For each blocked root task: the tasks it makes unreachable, its critical-path impact and "
        "a recommendation (retry, replan, propagate). data: {campaign_id, state, roots, "
        "unreachable_count, recommendation, critical_path, ...}."), CascadeAnalysisArgs, _cascade),
    ToolSpec("replay_log", "Replay an event log", (
        "Rebuild a run from its event log and check the protocol's invariants (emit before "
        "recovery, classify before acting, at most one retry, ...). data: the timeline, "
        "failures, retries and violations; with check, data.check = {passed, violations}."),
        ReplayLogArgs, _replay),
    ToolSpec("intents", "MangleCP intents and tools", (
        "The intents and macro-tools of ftl's embedded MangleCP server (from its manifest and "
        "catalog). data: {server, status, intents: [{name, description, required_facts, "
        "optional_facts}], tools: [{name, summary, intents, side_effects, available, ...}]}."),
        IntentsArgs, _intents),
)


# --------------------------------------------------------------------------- the server

class FtlMcpServer:
    """ftl's MCP server: the tool table, the gates, the error middleware and the transport.

    Args:
        repo: default repository of every tool (must exist).
        config_path: ``--config`` file (default: each repository's ``ftl.toml``); its ``[gates]``
            gate every call.
        metrics: counters (default: the process-wide `ftl.telemetry.metrics.METRICS`).
        runner_factory: ``factory(repo, config, on_event=..., interrupt=...) -> Runner`` (default
            `ftl.engine.runner.Runner`; tests pass one with an in-process tool server).
        gatekeeper: an object with ``visible(tool) -> bool`` and ``check(call)`` to use instead
            of building `ftl.gate.Gatekeeper` from ``[gates]``.
        correlation: correlation id source (default: a fresh `CorrelationIds`).
        max_message_bytes: stdio messages above this get -32600 ``message_too_large``.
        allowed_roots: directories besides ``repo`` whose insides a call may name (``--allow-root``).
    Paths: every ``repo``, ``plan`` and ``path`` argument must lie inside ``repo`` or one of
    ``allowed_roots`` once symlinks are resolved; anything else is ``invalid_params`` and is
    never opened (a client's agent gets the directories the user served, not the machine:
    the least privilege of MCP's roots).
    Raises:
        FtlError(not_found): ``repo`` is not a directory; FtlError(configuration_error): the
            configuration file is invalid.
    """

    def __init__(self, repo: Path, *, config_path: Path | None = None, metrics: Metrics | None = None,
                 runner_factory: Callable[..., Any] | None = None, gatekeeper: Any = None,
                 correlation: CorrelationIds | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 allowed_roots: Sequence[Path] = ()) -> None:
        repo = Path(repo)
        if not repo.is_dir():
            raise FtlError("not_found", {"what": "the repository directory given by --repo"})
        self.repo = repo.resolve()
        for root in allowed_roots:
            if not Path(root).is_dir():
                raise FtlError("not_found", {"what": "a directory given by --allow-root"})
        self.roots: tuple[Path, ...] = (self.repo, *(Path(root).resolve() for root in allowed_roots))
        self.config_path = config_path
        self.config: Config = load_config(config_path, self.repo)
        self.metrics = metrics if metrics is not None else METRICS
        if runner_factory is None:
            from ftl.engine.runner import Runner

            runner_factory = Runner
        self.runner_factory = runner_factory
        self.ids = correlation or CorrelationIds()
        self.max_message_bytes = max_message_bytes
        self.tools: dict[str, ToolSpec] = {spec.name: spec for spec in TOOLS}
        self._gatekeeper = gatekeeper
        self._gate_lock = threading.Lock()
        from importlib.metadata import PackageNotFoundError, version

        try:
            server_version = version("ftl-runner")
        except PackageNotFoundError:
            server_version = "0.0.0"
        self.server: Server[Any] = Server(SERVER_NAME, version=server_version,
                                          instructions=INSTRUCTIONS,
                                          on_list_tools=self._list_tools,
                                          on_call_tool=self._call_tool)
        self.server.middleware.append(self._middleware)

    # -- paths and configuration -------------------------------------------------------------

    def resolve_repo(self, value: str | None) -> Path:
        """The repository a call names (relative to the server's), or the server's own.

        Raises: FtlError(invalid_params) when it lies outside the server's roots, FtlError
        (not_found) when it is not a directory (neither echoes the path).
        """
        if value is None:
            return self.repo
        path = self._confined(self.repo, value, "/repo")
        if not path.is_dir():
            raise FtlError("not_found", {"what": "the repository directory given by repo"})
        self._confine_state(path)
        return path

    def _confine_state(self, repo: Path) -> None:
        """Refuse ``repo`` when its ``.ftl`` folder, or an entry directly in it (``ftl.db``, the
        events, checkpoints and worktrees folders, ...), links out of the roots: ftl's writes
        would follow the link. Raises: FtlError(invalid_params, keyword x-root)."""
        state = repo / ".ftl"
        if not os.path.lexists(state):
            return
        self._confined(repo, ".ftl", "/repo")
        try:
            entries = os.listdir(state)
        except OSError:  # not a folder: the store reports it when it opens
            return
        for name in entries:
            if os.path.islink(state / name):
                self._confined(state, name, "/repo")

    def resolve_path(self, repo: Path, value: str, field: str = "/path") -> Path:
        """``value`` (relative to ``repo``) as a resolved path inside the server's roots.

        Raises: FtlError(invalid_params) when it lies outside them (``field``: the argument's
        JSON pointer, named in the error).
        """
        return self._confined(repo, value, field)

    def _confined(self, base: Path, value: str, field: str) -> Path:
        try:
            path = Path(value).expanduser()
            path = (path if path.is_absolute() else base / path).resolve()
        except (RuntimeError, OSError):  # a symlink loop, an unknown ~user: it leads nowhere
            path = None
        if path is None or not any(path == root or path.is_relative_to(root) for root in self.roots):
            raise FtlError("invalid_params", {"schema_errors": [{
                "path": field, "keyword": "x-root",
                "message": "names a place outside the directories this server may use (its "
                           "--repo and --allow-root directories); start `ftl mcp` with "
                           "--allow-root for it, or name a path inside them"}]},
                message="A path argument lies outside the directories this server may use.")
        return path

    def config_for(self, repo: Path, **overrides: Any) -> Config:
        """``--config`` (or ``<repo>/ftl.toml``) for ``repo``, with the call's overrides."""
        if repo == self.repo and not overrides:
            return self.config
        return load_config(self.config_path, repo, **overrides)

    def listener(self, call: CallContext) -> EventMetrics:
        """The event listener of one run: the counters, then progress notifications."""
        return EventMetrics(self.metrics, then=_RunProgress(call.report))

    # -- gates -------------------------------------------------------------------------------

    def gatekeeper(self) -> Any:
        """The gates of the server's configuration, or None when ``[gates]`` is empty.

        Raises:
            FtlError(configuration_error): ``[gates]`` is set but ``ftl.gate`` cannot be
                imported, or the gate configuration is invalid.
        """
        if self._gatekeeper is not None or not self.config.gates:
            return self._gatekeeper
        with self._gate_lock:
            if self._gatekeeper is None:
                try:
                    from ftl.gate import Gatekeeper
                except ImportError:
                    raise FtlError("configuration_error", {
                        "problem": "[gates] is configured but the gate module (ftl.gate) "
                                   "cannot be imported"}) from None
                self._gatekeeper = Gatekeeper.from_config(self.config.gates, repo=self.repo)
        return self._gatekeeper

    # -- handlers ----------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        gates = self.gatekeeper()
        return types.ListToolsResult(tools=[spec.as_tool() for spec in TOOLS
                                            if gates is None or gates.visible(spec.name)])

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        cid = _CORRELATION.get() or self.ids.next()
        gates = self.gatekeeper()
        spec = self.tools.get(params.name)
        if spec is None:
            if gates is not None:  # do not tell a hidden tool from a missing one
                raise FtlError("tool_not_exposed", {"tool": params.name})
            raise FtlError("invalid_params", {"schema_errors": [
                {"path": "/name", "message": "no such tool; call one listed by tools/list",
                 "keyword": "enum"}]}, message="Unknown tool; call one listed by tools/list.")
        arguments = dict(params.arguments or {})
        try:
            if gates is not None:
                call = {"tool": spec.name, "args": arguments, "side_effects": list(spec.side_effects),
                        "source": SOURCE}
                await anyio.to_thread.run_sync(gates.check, call)
            args = _validate(spec, arguments)
            call_context = CallContext(cid, _progress_reporter(ctx))
            try:
                # abandon_on_cancel: a cancelled call returns at once; the thread goes on until
                # the run has seen its cancel (the interrupt) and ended resumable.
                outcome = await anyio.to_thread.run_sync(spec.run, self, args, call_context,
                                                         abandon_on_cancel=True)
            except anyio.get_cancelled_exc_class():
                call_context.cancel.set()
                raise
        except FtlError as error:
            if not error.kind.as_tool_result:
                raise
            logs.log_error(error, correlation_id=cid, tool=spec.name, logger=log,
                           surface="tool_result")
            self.metrics.count_error(error.error_type)
            outcome = Outcome(envelope.failure(error, request_id=cid), is_error=True)
        return outcome.result()

    async def _middleware(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        """Correlation id for the request, and every failure mapped to a registry error."""
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        meta = params.get("_meta")
        cid = (accept_correlation_id(meta.get("correlation_id")) if isinstance(meta, Mapping)
               else None) or self.ids.next()
        name = params.get("name")
        tool = name if ctx.method == "tools/call" and isinstance(name, str) else None
        token = _CORRELATION.set(cid)
        try:
            return await call_next(ctx)
        except MCPError as exc:
            raise self._reshape(exc, ctx.method, cid, tool) from None
        except ValidationError:  # the SDK's params validation; pydantic text never leaves
            raise self.mcp_error(FtlError("invalid_params"), cid, tool) from None
        except Exception as exc:  # noqa: BLE001 - fail closed: a registry error, never str(exc)
            raise self.mcp_error(exc, cid, tool) from None
        finally:
            _CORRELATION.reset(token)

    def _reshape(self, exc: MCPError, method: str, cid: str, tool: str | None) -> MCPError:
        """An SDK-raised protocol error in the registry's shape (negotiation codes pass as sent)."""
        code = exc.error.code
        if code in SDK_RESERVED_CODES or code not in STANDARD_KINDS:
            return exc
        name = kind_for_code(code)
        details = {"method": method} if name == "method_not_found" else {}
        return self.mcp_error(FtlError(name, details), cid, tool)

    def mcp_error(self, exc: BaseException, cid: str, tool: str | None = None) -> MCPError:
        """``exc`` as an ``MCPError`` built by `ftl.surfaces.jsonrpc.error_object` (counted, logged)."""
        obj = error_object(exc, cid, tool=tool, logger=log)
        try:
            self.metrics.count_error(obj["data"]["error_type"])
        except Exception:  # noqa: BLE001 - a metrics failure must not change the reply
            log.warning("counting an error failed", exc_info=True)
        return MCPError(obj["code"], obj["message"], obj["data"])

    # -- transport ---------------------------------------------------------------------------

    async def serve(self, read_stream: Any, write_stream: Any, early_replies: Any = None) -> None:
        """Serve one connection over SDK streams (``SessionMessage | Exception`` in,
        ``SessionMessage`` out), answering the protocol faults the SDK drops.

        Args:
            early_replies: optional receive stream of ``SessionMessage`` replies made before
                the SDK parsed a line (`serve_stdio`'s raw-line screen); forwarded to
                ``write_stream``.
        """
        send, receive = anyio.create_memory_object_stream[Any](0)
        async with anyio.create_task_group() as group:
            group.start_soon(self._screen, read_stream, send, write_stream)
            if early_replies is not None:
                group.start_soon(self._forward, early_replies, write_stream)
            await self.server.run(receive, write_stream, self.server.create_initialization_options())
            group.cancel_scope.cancel()

    async def serve_stdio(self) -> None:
        """Serve MCP on this process's stdin/stdout until stdin closes.

        Each stdin line is screened before the SDK parses it (`screen_line`): the SDK reads a
        request whose id is null, a boolean or a fraction as a notification and would never
        answer it. fd 0 reads the null device meanwhile (`_private_stdin`), as the SDK does.
        """
        from mcp.server.stdio import stdio_server

        early_send, early_receive = anyio.create_memory_object_stream[SessionMessage](64)
        with _private_stdin() as raw:
            lines = _ScreenedLines(anyio.wrap_file(io.TextIOWrapper(raw, encoding="utf-8", errors="replace")),
                                   self.screen_line, early_send)
            async with stdio_server(stdin=lines) as (read_stream, write_stream):
                await self.serve(read_stream, write_stream, early_receive)

    def screen_line(self, line: str) -> types.JSONRPCError | None:
        """The -32600 reply (id null) for a raw stdio line that is a request with an id MCP
        forbids (null, a boolean, a fraction, an object...: MCP wants a string or an integer,
        JSON-RPC 2.0 §5 wants id null when the id cannot be used); None to pass the line on.
        Lines that are not JSON objects are left to the SDK (its faults are answered in
        `_screen_one`). Never raises."""
        try:
            message = json.loads(line)
            if not (isinstance(message, dict) and "method" in message and "id" in message):
                return None
            request_id = message["id"]
            if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
                return None
            return self._error_reply(FtlError("invalid_request", message=(
                "A request id must be a string or an integer; null, booleans and fractions are "
                "refused.")), None)
        except Exception:  # noqa: BLE001 - unreadable here (deep nesting...): the SDK answers it
            return None

    @staticmethod
    async def _forward(replies: Any, outbound: Any) -> None:
        async with replies:
            async for reply in replies:
                try:
                    await outbound.send(reply)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def _screen(self, inbound: Any, forward: Any, outbound: Any) -> None:
        async with forward:
            async for item in inbound:
                passed, reply = self._screen_one(item)
                if passed is not None:
                    await forward.send(passed)
                if reply is not None:
                    try:
                        await outbound.send(SessionMessage(reply))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

    def _screen_one(self, item: Any) -> tuple[Any, types.JSONRPCError | None]:
        """``(message to pass on, error reply)`` for one inbound item; never raises."""
        try:
            if isinstance(item, Exception):
                return None, self._fault_reply(item)
            message = item.message
            if isinstance(message, (types.JSONRPCRequest, types.JSONRPCNotification)):
                size = len(message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8"))
                if size > self.max_message_bytes:
                    error = FtlError("message_too_large", {"limit_bytes": self.max_message_bytes,
                                                           "size_bytes": size})
                    if isinstance(message, types.JSONRPCNotification):
                        self.mcp_error(error, self.ids.next())  # logged and counted; no reply
                        return None, None
                    return None, self._error_reply(error, message.id)
            return item, None
        except Exception as exc:  # noqa: BLE001 - EC-ERR-001: answer bare, keep serving
            log.error("screening an inbound message failed", exc_info=exc)
            bare = bare_internal_error()
            return None, types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(**bare))

    def _fault_reply(self, exc: Exception) -> types.JSONRPCError | None:
        request_id = None
        if isinstance(exc, ValidationError):
            problems = exc.errors(include_url=False)
            invalid_json = next((p for p in problems if p.get("type") == "json_invalid"), None)
            if invalid_json is not None:
                where = _PARSE_AT.search(str((invalid_json.get("ctx") or {}).get("error", "")))
                details = {"line": int(where.group(1)), "column": int(where.group(2))} if where else {}
                return self._error_reply(FtlError("parse_error", details), None)
            raw = next((p.get("input") for p in problems if isinstance(p.get("input"), Mapping)), None)
            if isinstance(raw, Mapping):
                if "method" in raw and "id" not in raw:  # a malformed notification: no reply
                    self.mcp_error(FtlError("invalid_request"), self.ids.next())
                    return None
                candidate = raw.get("id")
                if isinstance(candidate, (str, int)) and not isinstance(candidate, bool):
                    request_id = candidate
            elif any(isinstance(p.get("input"), list) for p in problems):
                return self._error_reply(FtlError("invalid_request", message=(
                    "Batches are not supported; send one JSON-RPC message per line.")), None)
        return self._error_reply(FtlError("invalid_request"), request_id)

    def _error_reply(self, error: FtlError, request_id: Any) -> types.JSONRPCError:
        failure = self.mcp_error(error, self.ids.next())
        return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=failure.error)


class _ScreenedLines:
    """The stdin lines the SDK's stdio reader iterates, minus the requests `screen_line`
    answers itself (their replies go to ``replies``, a stream `FtlMcpServer.serve` forwards)."""

    def __init__(self, source: Any, screen: Callable[[str], Any], replies: Any) -> None:
        self._source, self._screen, self._replies = source, screen, replies

    def __aiter__(self) -> "_ScreenedLines":
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._source.readline()
            if not line:
                await self._replies.aclose()
                raise StopAsyncIteration
            reply = self._screen(line)
            if reply is None:
                return line
            await self._replies.send(SessionMessage(reply))


@contextlib.contextmanager
def _private_stdin() -> Iterator[BinaryIO]:
    """The protocol's stdin on a private descriptor, while fd 0 reads the null device (so no
    library or child process can read a protocol line); fd 0 is restored on exit. The private
    descriptor is left open: a worker thread may still be blocked reading it (as in the SDK)."""
    private = os.dup(0)  # not inherited by children (PEP 446)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        yield os.fdopen(private, "rb", closefd=False)
    finally:
        os.dup2(private, 0)


def _progress_reporter(ctx: Any) -> Callable[[float, float | None, str | None], None]:
    """``report(progress, total, message)`` for worker threads (any thread: the event loop is
    reached through its token); failures are logged at DEBUG, never raised."""
    token = anyio.lowlevel.current_token()

    def report(progress: float, total: float | None = None, message: str | None = None) -> None:
        try:
            anyio.from_thread.run(ctx.session.report_progress, progress, total, message, token=token)
        except Exception:  # noqa: BLE001 - progress is best effort (client gone, no token...)
            log.debug("progress notification not sent", exc_info=True)

    return report


def _validate(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    """The arguments as ``spec.args``; every violation named by path (input values never echoed).

    Raises: FtlError(invalid_params) with ``details.schema_errors = [{path, message, keyword}]``.
    """
    try:
        return spec.args.model_validate(arguments)
    except ValidationError as exc:
        problems = [{"path": "/" + "/".join(str(part) for part in e["loc"]), "message": e["msg"],
                     "keyword": e["type"]} for e in exc.errors(include_url=False, include_input=False)]
        raise FtlError("invalid_params", {"schema_errors": problems},
                       message=f"The arguments of {spec.name} do not match its input schema "
                               f"({len(problems)} problem(s)).") from None


# --------------------------------------------------------------------------- command line

@click.command("mcp")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Default repository of every tool.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="ftl.toml to use (default: <repo>/ftl.toml); its [gates] gate every call.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON log lines here instead of stderr.")
@click.option("--allow-root", "allowed_roots", multiple=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Another directory whose repositories, plans and logs calls may name "
                   "(repeatable; default: only --repo).")
def mcp(repo: Path, config_path: Path | None, log_level: str, log_file: Path | None,
        allowed_roots: tuple[Path, ...]) -> None:
    """Serve ftl to MCP clients (Claude Code) over stdio.

    Tools: campaign_run, campaign_resume, campaign_status, ready_tasks, cascade_analysis,
    replay_log, intents; each returns a response-v2 envelope. Calls may name repositories,
    plans and logs inside --repo and the --allow-root directories only. stdout carries only the
    protocol; logs are JSON lines on stderr (or --log-file). Exit 0 when the client closes
    stdin; 2 when the repository or the configuration is invalid (the error envelope is
    printed on stderr).
    """
    logs.configure(log_level, log_file)
    try:
        server = FtlMcpServer(repo, config_path=config_path, allowed_roots=allowed_roots)
    except FtlError as error:
        logs.log_error(error, correlation_id="startup", logger=log, surface="startup")
        click.echo(json.dumps(envelope.failure(error), sort_keys=True), err=True)
        sys.exit(2)
    anyio.run(server.serve_stdio)


if __name__ == "__main__":  # pragma: no cover - `python -m ftl.surfaces.mcp_server`
    mcp()
