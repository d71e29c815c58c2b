"""Wiring of ftl's embedded MangleCP server: catalog + selection rules + skills + gates + configuration.

`build_server` is what every surface uses: the runner in process (``InProcessTransport``), the
``ftl serve --stdio`` subprocess and ``ftl serve --http``. `connect` gives the runner a client
for whichever server ``config.server`` names. A non-empty ``[gates]`` table puts
``ftl.gate.Gatekeeper`` in front of every invocation of the embedded server; configured gates are
never skipped silently (an unavailable gate module is a ``configuration_error``).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftl.config import Config
from ftl.errors import FtlError
from ftl.manglecp.access import BearerAuth
from ftl.manglecp.definitions import Clock, ServerInfo, ServerLimits
from ftl.manglecp.messages import PredicateSchema
from ftl.manglecp.server import ManglecpServer
from ftl.server.catalog import (
    DELTA_PREDICATES, SKILLS, TOOL_SPECS, build_catalog, catalog_facts, configured_capabilities)
from ftl.server.evaluation.program import RULES_DIR
from ftl.server.evaluation.workers import ClingoEvaluator

if TYPE_CHECKING:  # the client is imported by `connect`, not by a server that boots
    from ftl.manglecp.client import ManglecpClient

log = logging.getLogger("ftl.server.app")

DOMAIN_RULES = (RULES_DIR / "ftl_domain.lp",)


def _intent(name: str, description: str, required: tuple[str, ...] = (),
            optional: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "description": description}
    if required:
        out["required_facts"] = list(required)
    if optional:
        out["optional_facts"] = list(optional)
    return out


_CONTEXT = ("campaign_state", "framework", "exclude_tool")
INTENTS = (
    _intent("explore_codebase", "Explorer tools, one per requested mode (structure, pattern, "
            "memory, delta).", ("explorer_mode",), _CONTEXT),
    _intent("plan_campaign", "Load a given plan, or ask the configured planner agent for one.",
            (), ("plan_given",) + _CONTEXT),
    _intent("replan_campaign", "Load a revised plan, or ask the planner agent to re-plan.",
            (), ("plan_given", "blocked") + _CONTEXT),
    _intent("build_task", "The builder for one task: shell (run command) or agent. Describe "
            "the task by task/2 (one task), or by task_kind/1 (every task of that kind: the "
            "selection is reusable, the seq goes in the workspace argument).", (),
            ("task", "task_has_run", "builder_requested", "task_kind", "run_given",
             "builder_kind") + _CONTEXT),
    _intent("verify_task", "Run a task's verify command.", (),
            ("task", "task_kind") + _CONTEXT),
    _intent("observe_outcomes", "Extract failure and success patterns of a campaign.", (), _CONTEXT),
    _intent("analyze_cascade", "Blocked roots and unreachable tasks of a campaign.", (),
            ("blocked",) + _CONTEXT),
)


def _pred(name: str, types: tuple[str, ...], names: tuple[str, ...], description: str) -> PredicateSchema:
    return PredicateSchema(predicate=name, arity=len(types), arg_types=list(types),
                           arg_names=list(names), direction="input", description=description)


PREDICATES = (
    _pred("explorer_mode", ("string",), ("mode",), "Explorer mode wanted: structure|pattern|memory|delta."),
    _pred("plan_given", (), (), "The caller supplies a plan (load it instead of planning)."),
    _pred("task", ("string", "string"), ("seq", "type"), "The task concerned: seq and SPEC|BUILD|VERIFY."),
    _pred("task_has_run", ("string",), ("seq",), "The task has a `run` command."),
    _pred("builder_requested", ("string", "string"), ("seq", "kind"),
          "The plan asks for a builder: shell|agent."),
    _pred("task_kind", ("string",), ("type",),
          "The kind of task concerned (SPEC|BUILD|VERIFY), without its seq: the selection serves "
          "every task of this kind; the invocation's arguments name the task."),
    _pred("run_given", (), (), "The task concerned (task_kind) has a `run` command."),
    _pred("builder_kind", ("string",), ("kind",),
          "The plan asks for this builder for the task concerned (task_kind): shell|agent|claude."),
    _pred("blocked", ("string",), ("seq",), "A task is blocked."),
    _pred("campaign_state", ("string",), ("state",), "The campaign's current state."),
    _pred("framework", ("string",), ("name",), "The project's framework."),
    _pred("exclude_tool", ("string",), ("name",), "Never return this macro-tool (client restriction)."),
) + DELTA_PREDICATES


def server_info(version: str | None = None) -> ServerInfo:
    """The manifest content of ftl's embedded server."""
    if version is None:
        from importlib.metadata import PackageNotFoundError, version as dist_version
        try:
            version = dist_version("ftl-runner")
        except PackageNotFoundError:
            version = "0.0.0"
    return ServerInfo(
        server_name="ftl", server_version=version, domain_id="workflow_orchestration",
        domain_description="ftl's campaign tools (explorers, planner, builders, verifier, observer, "
                           "cascade analysis) served as macro-tools.",
        categories=("workflow_orchestration", "codebase_analysis", "testing"),
        intents=INTENTS, predicates=PREDICATES, conformance_level=2, temporal=True)


def load_gate(repo: Path, config: Config, *, count: bool = True) -> Any:
    """The gatekeeper for ``config.gates``, or None when the table is empty; ``count``: whether
    it counts its decisions in `ftl.telemetry.metrics` (`ftl.gate.Gatekeeper.from_config`).

    Raises:
        FtlError(configuration_error): gates are configured but ``ftl.gate`` cannot be imported
            (configured gates are never skipped); any error ``Gatekeeper.from_config`` raises
            for a bad table passes through.
    """
    if not config.gates:
        return None
    try:
        module = importlib.import_module("ftl.gate")
        factory = module.Gatekeeper.from_config
    except (ImportError, AttributeError) as exc:
        problem = f"[gates] is configured but the gate module is unavailable ({type(exc).__name__})"
        raise FtlError("configuration_error", {"problem": problem}) from None
    return factory(config.gates, repo=Path(repo).resolve(), count=count)


def _count_error_hook() -> Any:
    """`ftl.telemetry.metrics.count_error` as the server's ``on_error`` hook, when that module exists.

    ``ftl.telemetry.metrics`` (and prometheus_client, ~40 ms) is imported at the first error, not at
    server start (boot time, issue 11 item 2); without the module errors are not counted.
    """
    if importlib.util.find_spec("ftl.telemetry.metrics") is None:
        return None

    def on_error(error_type: str, gate: str | None) -> None:
        try:
            count_error = importlib.import_module("ftl.telemetry.metrics").count_error
        except (ImportError, AttributeError):
            return
        count_error(error_type, gate=gate)

    return on_error


def build_server(repo: Path, config: Config, *, isolation: str = "process",
                 limits: ServerLimits | None = None, auth: BearerAuth | None = None,
                 clock: Clock | None = None, status: str = "ready", gate: Any = None,
                 count: bool = True) -> ManglecpServer:
    """The embedded server for ``repo``.

    Args:
        repo: repository the tools work on.
        config: ftl configuration; ``agent_command`` / ``planner_command`` become the server
            facts ``configured("agent_builder")`` / ``configured("agent_planner")`` and the
            server-bound ``command`` argument of those tools; a non-empty ``gates`` table
            becomes the server's gate (see `load_gate`).
        isolation: evaluator isolation, ``"process"`` (killable workers) or ``"thread"``.
        limits, auth, clock, status: see `ManglecpServer` (``status="booting"`` for a server
            that warms its evaluator first and then announces ``ready``).
        gate: a gate object (``visible(name)``, ``check(call)``) to use instead of the one
            ``config.gates`` describes.
        count: count errors and gate decisions in ``ftl.telemetry.metrics``. Off for a campaign's
            in-process server (`connect` ``in_process``): the campaign counts them from its own
            events (``TOOL_FAILURE``, ``GATE_DECISION``), and one process counts each once.
    Returns:
        a `ManglecpServer` advertising conformance level 2, whose errors are counted in
        ``ftl.telemetry.metrics`` (``ftl_errors_total``) when ``count``; each successful invocation's
        gate decision travels in its response as ``x-gate_decision``; call ``close()`` to stop
        its evaluation workers.
    Raises:
        FtlError(configuration_error): gates configured but unavailable (`load_gate`).
    """
    repo = Path(repo).resolve()
    if gate is None:
        gate = load_gate(repo, config, count=count)
    catalog, _unavailable = build_catalog(repo, config)
    facts = catalog_facts(TOOL_SPECS, catalog)
    facts += [("configured", [c]) for c in configured_capabilities(config)]
    evaluator = ClingoEvaluator(DOMAIN_RULES, facts, isolation=isolation)
    return ManglecpServer(server_info(), catalog, evaluator, limits=limits, auth=auth, clock=clock,
                          status=status, skills={s.skill_id: s for s in SKILLS}, gate=gate,
                          on_error=_count_error_hook() if count else None)


#: `connect`'s server address for ftl's own server in a subprocess over stdio (the default,
#: ``"embedded"``, runs it in the calling process).
EMBEDDED_STDIO = "embedded:stdio"


def _server_env() -> dict[str, str]:
    """The embedded stdio server's environment: ours, with pydantic's plugin discovery off
    unless the user set ``PYDANTIC_DISABLE_PLUGINS`` (the server uses no pydantic plugin, and
    discovering them scans every installed distribution's metadata: 15-35 ms of each boot)."""
    env = dict(os.environ)
    env.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    return env


def connect(repo: Path, config: Config, *, server: str | None = None, in_process: bool = False,
            token: str | None = None, gate: Any = None, max_retries: int | None = None) -> ManglecpClient:
    """A `ManglecpClient` for the server named by ``server`` (``config.server`` when None).

    Args:
        repo: repository the tools work on.
        config: ftl configuration (passed whole to an embedded server, ``gates`` included).
        server: ``None`` / ``"embedded"``: ftl's own server, in this process (the default:
            no interpreter to start and no module to import twice, about 0.2 s less per
            campaign start, and no pipe round trip per call, issue 11 item 2);
            ``"embedded:stdio"``: ftl's own server as a ``python -m ftl.server.serve --stdio``
            subprocess (its own process, over the MangleCP wire); ``"stdio:CMD"``: another
            stdio server (CMD split like a shell); ``http://...`` / ``https://...``: an HTTP
            server. Either way ftl's server evaluates its rules in the calling thread
            (``isolation="thread"``).
        in_process: run ftl's server in this process even when ``server`` is
            ``"embedded:stdio"`` (tests, single-shot tools).
        token: bearer token for HTTP servers (default: env ``FTL_MANGLECP_TOKEN``).
        gate: a gate object for an in-process embedded server (instead of ``config.gates``).
        max_retries: the client's own retries of retryable protocol errors (None: the client's
            default, at most 5 per MangleCP spec 09 §7). The runner passes 0: its recovery
            protocol does every retry, each one logged (``TOOL_FAILURE`` -> ``RETRY``).
    Gates: for the embedded server, ``config.gates`` is checked here (so a missing gate module
    fails before a subprocess starts) and applied by that server. Another server applies its own
    gates: a local ``[gates]`` table cannot reach it, which is logged as a warning.
    Raises:
        FtlError(configuration_error): an unknown server spec, or gates configured but
            unavailable; FtlError(network_error): the server could not be started or reached.
    """
    from ftl.manglecp.client import ManglecpClient
    from ftl.manglecp.transport import HttpTransport, InProcessTransport, StdioTransport

    spec = server if server is not None else config.server
    options: dict[str, Any] = {} if max_retries is None else {"max_retries": max_retries}
    if spec in (None, "", "embedded", EMBEDDED_STDIO):
        if in_process or spec != EMBEDDED_STDIO:
            server_ = build_server(repo, config, gate=gate, count=False,  # the caller counts
                                   isolation="thread")
            return ManglecpClient(InProcessTransport(server_, close_server=True), **options)
        load_gate(repo, config)  # fail here, not inside the subprocess
        command = [sys.executable, "-m", "ftl.server.serve", "--stdio", "--repo", str(Path(repo).resolve()),
                   "--config-json", config.model_dump_json()]
        return ManglecpClient(StdioTransport(command, env=_server_env()), **options)
    if config.gates:
        log.warning("the [gates] table applies to ftl's embedded server only; %s applies its own gates",
                    spec.split("://")[0] if "://" in spec else "the stdio server")
    if spec.startswith("stdio:"):
        command = shlex.split(spec[len("stdio:"):])
        if not command:
            raise FtlError("configuration_error", {"problem": "server 'stdio:' needs a command"})
        return ManglecpClient(StdioTransport(command, cwd=str(repo)), **options)
    if spec.startswith(("http://", "https://")):
        return ManglecpClient(HttpTransport(spec, token=token or os.environ.get("FTL_MANGLECP_TOKEN")),
                              **options)
    raise FtlError("configuration_error", {"problem": (
        f"server must be 'embedded', '{EMBEDDED_STDIO}', 'stdio:CMD' or an http(s) URL, got {spec!r}")})
