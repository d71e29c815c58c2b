"""Wiring of ftl's embedded MangleCP server: catalog + selection rules + configuration.

`build_server` is what every surface uses: the runner in process (``InProcessTransport``), the
``ftl serve --stdio`` subprocess and ``ftl serve --http``. `connect` gives the runner a client
for whichever server ``config.server`` names.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ftl.config import Config
from ftl.errors import FtlError
from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import PredicateSchema
from ftl.manglecp.server import BearerAuth, Clock, ManglecpServer, ServerInfo, ServerLimits
from ftl.manglecp.transport import HttpTransport, InProcessTransport, StdioTransport
from ftl.server.catalog import TOOL_SPECS, build_catalog, catalog_facts, configured_capabilities
from ftl.server.evaluator import RULES_DIR, ClingoEvaluator

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
    _intent("build_task", "The builder for one task: shell (run command) or agent.",
            ("task",), ("task_has_run", "builder_requested") + _CONTEXT),
    _intent("verify_task", "Run a task's verify command.", (), ("task",) + _CONTEXT),
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
    _pred("blocked", ("string",), ("seq",), "A task is blocked."),
    _pred("campaign_state", ("string",), ("state",), "The campaign's current state."),
    _pred("framework", ("string",), ("name",), "The project's framework."),
    _pred("exclude_tool", ("string",), ("name",), "Never return this macro-tool (client restriction)."),
)


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
        intents=INTENTS, predicates=PREDICATES, conformance_level=1)


def build_server(repo: Path, config: Config, *, isolation: str = "process",
                 limits: ServerLimits | None = None, auth: BearerAuth | None = None,
                 clock: Clock | None = None, status: str = "ready") -> ManglecpServer:
    """The embedded server for ``repo``.

    Args:
        repo: repository the tools work on.
        config: ftl configuration; ``agent_command`` / ``planner_command`` become the server
            facts ``configured("agent_builder")`` / ``configured("agent_planner")`` and the
            server-bound ``command`` argument of those tools.
        isolation: evaluator isolation, ``"process"`` (killable workers) or ``"thread"``.
        limits, auth, clock, status: see `ManglecpServer` (``status="booting"`` for a server
            that warms its evaluator first and then announces ``ready``).
    Returns:
        a ready `ManglecpServer`; call ``close()`` to stop its evaluation workers.
    """
    repo = Path(repo).resolve()
    catalog, _unavailable = build_catalog(repo, config)
    facts = catalog_facts(TOOL_SPECS, catalog)
    facts += [("configured", [c]) for c in configured_capabilities(config)]
    evaluator = ClingoEvaluator(DOMAIN_RULES, facts, isolation=isolation)
    return ManglecpServer(server_info(), catalog, evaluator, limits=limits, auth=auth, clock=clock,
                          status=status)


def connect(repo: Path, config: Config, *, server: str | None = None, in_process: bool = False,
            token: str | None = None) -> ManglecpClient:
    """A `ManglecpClient` for the server named by ``server`` (``config.server`` when None).

    Args:
        repo: repository the tools work on.
        config: ftl configuration (passed whole to an embedded server).
        server: ``None`` / ``"embedded"``: ftl's own server, as a ``python -m ftl.server.serve
            --stdio`` subprocess (or in this process when ``in_process``); ``"stdio:CMD"``:
            another stdio server (CMD split like a shell); ``http://...`` / ``https://...``: an
            HTTP server.
        in_process: run the embedded server in this process (tests, single-shot tools).
        token: bearer token for HTTP servers (default: env ``FTL_MANGLECP_TOKEN``).
    Raises:
        FtlError(configuration_error): an unknown server spec; FtlError(network_error): the
            server could not be started or reached.
    """
    spec = server if server is not None else config.server
    if spec in (None, "", "embedded"):
        if in_process:
            return ManglecpClient(InProcessTransport(build_server(repo, config), close_server=True))
        command = [sys.executable, "-m", "ftl.server.serve", "--stdio", "--repo", str(Path(repo).resolve()),
                   "--config-json", config.model_dump_json()]
        return ManglecpClient(StdioTransport(command))
    if spec.startswith("stdio:"):
        command = shlex.split(spec[len("stdio:"):])
        if not command:
            raise FtlError("configuration_error", {"problem": "server 'stdio:' needs a command"})
        return ManglecpClient(StdioTransport(command, cwd=str(repo)))
    if spec.startswith(("http://", "https://")):
        return ManglecpClient(HttpTransport(spec, token=token or os.environ.get("FTL_MANGLECP_TOKEN")))
    raise FtlError("configuration_error",
                   {"problem": f"server must be 'embedded', 'stdio:CMD' or an http(s) URL, got {spec!r}"})
