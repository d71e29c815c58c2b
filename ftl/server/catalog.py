"""ftl's macro-tool catalog: what the embedded MangleCP server offers and how each tool is run.

One `ToolSpec` per tool: name, the intents it serves, the implementation (imported lazily by
dotted name from ``ftl.server.tools``), its pydantic args model (the source of the advertised
``input_schema``), side effects, confirmation, dependencies, conflicts, the server capability it
needs, and the arguments the *server* fills in (``server_bound``).

Server-bound arguments: ``agent_builder`` and ``agent_planner`` run the command configured in
``ftl.toml`` (``agent_command`` / ``planner_command``). That field is removed from the advertised
schema, the schema forbids extra keys (the args models use ``extra="forbid"``), so a client that
sends ``command`` gets ``schema_validation_failed``, and the server adds the configured value after
validation. A client can never choose the command that runs.
"""

from __future__ import annotations

import copy
import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ValidationError

from ftl.config import Config
from ftl.errors import FtlError
from ftl.manglecp.server import InvocationContext, ToolDefinition

log = logging.getLogger("ftl.server.catalog")

TOOLS_PACKAGE = "ftl.server.tools"


@dataclass(frozen=True)
class ToolSpec:
    """A catalog row.

    Attributes:
        name: macro-tool name (also the tool's id in the selection rules).
        module: module under ``ftl.server.tools`` holding the implementation.
        function: implementation ``fn(args: ArgsModel, ctx: ToolContext) -> dict``.
        args_model: name of the pydantic args model in ``module``.
        intents: intents whose selection rules may return the tool.
        summary: one-line description (condensed disclosure).
        description: full description.
        side_effects: MangleCP spec 06 §3 vocabulary (``("none",)`` for pure tools).
        requires_confirmation: whether invoking needs a confirmation token.
        reversible, idempotent: safety flags.
        dependencies: tools that must be selected with it (``tool_requires``).
        conflicts: tools never selected with it (``conflicts_with``).
        capability: server capability it needs (``requires_capability``), e.g. a configured agent.
        server_bound: args model fields the server fills from the configuration.
        version: bump when the tool's contract changes (part of the macro_id).
    """

    name: str
    module: str
    function: str
    args_model: str
    intents: tuple[str, ...]
    summary: str
    description: str
    side_effects: tuple[str, ...] = ("none",)
    requires_confirmation: bool = False
    reversible: bool = False
    idempotent: bool = False
    dependencies: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    capability: str | None = None
    server_bound: tuple[str, ...] = ()
    version: str = "1"


_EXPLORE = ("explore_codebase",)
TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec("explore_structure", "explorers", "explore_structure", "ExploreArgs", _EXPLORE,
             "Map the repository layout: packages, entry points, tests.",
             "Read-only survey of the repository's layout: source and test directories, entry "
             "points and configuration files. Returns an explorer result (mode 'structure').",
             ("filesystem",), idempotent=True),
    ToolSpec("explore_pattern", "explorers", "explore_pattern", "ExploreArgs", _EXPLORE,
             "Detect frameworks, idioms and the test runner.",
             "Read-only scan for frameworks, coding idioms, style and the test command. Returns an "
             "explorer result (mode 'pattern').", ("filesystem",), idempotent=True),
    ToolSpec("explore_memory", "explorers", "explore_memory", "ExploreArgs", _EXPLORE,
             "Recall failures and patterns from earlier campaigns.",
             "Ranks remembered failures and success patterns from ftl's store by relevance to the "
             "objective. Returns an explorer result (mode 'memory').",
             ("filesystem", "database"), idempotent=True),
    ToolSpec("explore_delta", "explorers", "explore_delta", "ExploreArgs", _EXPLORE,
             "Find the files an objective is likely to touch.",
             "Ranks source files and definitions by relevance to the objective. Returns an "
             "explorer result (mode 'delta').", ("filesystem",), idempotent=True),
    ToolSpec("load_plan", "planner", "load_plan", "LoadPlanArgs", ("plan_campaign", "replan_campaign"),
             "Validate a supplied plan.",
             "Validates a plan.json document (schema, seqs, dependencies, cycles) and returns the "
             "normalised plan with decision PROCEED.", ("none",), idempotent=True),
    ToolSpec("agent_planner", "planner", "agent_planner", "AgentPlannerArgs",
             ("plan_campaign", "replan_campaign"),
             "Ask the configured planner agent for a plan.",
             "Runs the planner agent configured in ftl.toml with the objective and exploration "
             "(or the re-plan input) and returns its decision: PROCEED with a plan, CLARIFY with "
             "questions, or CONFIRM.", ("process", "network"),
             capability="agent_planner", server_bound=("command",)),
    ToolSpec("shell_builder", "builders", "shell_builder", "BuildArgs", ("build_task",),
             "Run the task's run command in its workspace.",
             "Runs the workspace's `run` shell command in the repository with the task's time "
             "limit and reports the outcome, the files changed and any change outside the task's "
             "delta.", ("filesystem", "process"), conflicts=("agent_builder",)),
    ToolSpec("agent_builder", "builders", "agent_builder", "BuildArgs", ("build_task",),
             "Run the configured coding agent on the workspace.",
             "Runs the coding agent configured in ftl.toml with the workspace JSON on stdin, reads "
             "its build result and reports the outcome, the files changed and any change outside "
             "the task's delta.", ("filesystem", "process", "network"),
             conflicts=("shell_builder",), capability="agent_builder", server_bound=("command",)),
    ToolSpec("run_verify", "verifier", "run_verify", "VerifyArgs", ("verify_task",),
             "Run a task's verify command.",
             "Runs the verify shell command in the repository with a time limit; passed means "
             "exit status 0.", ("process",), idempotent=True),
    ToolSpec("observer", "observer", "observer", "ObserveArgs", ("observe_outcomes",),
             "Extract failure and success patterns from a campaign.",
             "Reads a finished campaign's tasks and workspaces, extracts failure and success "
             "patterns and records them in ftl's memory.", ("database",)),
    ToolSpec("cascade_analysis", "cascade", "cascade_analysis", "CascadeArgs", ("analyze_cascade",),
             "Find blocked roots and unreachable tasks of a campaign.",
             "Computes the unreachable tasks of a campaign, their blocked roots and whether a "
             "re-plan is warranted.", ("database",), idempotent=True),
)


def server_bound_values(config: Config) -> dict[str, dict[str, Any]]:
    """Per tool, the values the server binds from the configuration."""
    return {"agent_builder": {"command": config.agent_command},
            "agent_planner": {"command": config.planner_command}}


def configured_capabilities(config: Config) -> list[str]:
    """Capabilities the configuration provides (``configured(C)`` server facts)."""
    capabilities = []
    if config.agent_command:
        capabilities.append("agent_builder")
    if config.planner_command:
        capabilities.append("agent_planner")
    return capabilities


def advertised_schema(model: type[BaseModel], server_bound: tuple[str, ...]) -> dict[str, Any]:
    """The model's JSON Schema (2020-12) without the server-bound fields."""
    schema = copy.deepcopy(model.model_json_schema())
    for name in server_bound:
        schema.get("properties", {}).pop(name, None)
        if name in schema.get("required", []):
            schema["required"] = [r for r in schema["required"] if r != name]
    if not schema.get("required"):
        schema.pop("required", None)
    schema.setdefault("additionalProperties", False)
    return schema


def _adapter(spec: ToolSpec, function: Callable[..., Any], model: type[BaseModel],
             bound: Mapping[str, Any], repo: Path, output_limit_bytes: int
             ) -> Callable[[dict[str, Any], InvocationContext], Any]:
    from ftl.server.tools.context import ToolContext

    def invoke(args: dict[str, Any], inv: InvocationContext) -> Any:
        values = {**args, **bound}
        if any(values.get(name) is None for name in spec.server_bound):
            raise FtlError("configuration_error",
                           {"problem": f"{spec.name} needs {'/'.join(spec.server_bound)} in ftl.toml"})
        try:
            parsed = model.model_validate(values)
        except ValidationError as exc:
            errors = [{"path": "/" + "/".join(str(p) for p in e["loc"]), "message": e["msg"],
                       "keyword": e["type"]} for e in exc.errors(include_url=False)]
            raise FtlError("invalid_params", {"schema_errors": errors}) from None
        ctx = ToolContext(repo=repo, cancel=inv.cancel, progress=inv.progress,
                          correlation_id=inv.correlation_id, output_limit_bytes=output_limit_bytes)
        return function(parsed, ctx)

    return invoke


def build_catalog(repo: Path, config: Config, specs: tuple[ToolSpec, ...] = TOOL_SPECS
                  ) -> tuple[dict[str, ToolDefinition], dict[str, str]]:
    """Import every tool and build its `ToolDefinition`.

    Returns:
        (catalog by name, unavailable tools by name -> reason). A tool whose module cannot be
        imported is left out (and logged); the rules then exclude it (``tool(T)`` is missing).
    """
    bound_by_tool = server_bound_values(config)
    catalog: dict[str, ToolDefinition] = {}
    unavailable: dict[str, str] = {}
    for spec in specs:
        try:
            module = importlib.import_module(f"{TOOLS_PACKAGE}.{spec.module}")
            function = getattr(module, spec.function)
            model = getattr(module, spec.args_model)
        except (ImportError, AttributeError) as exc:
            unavailable[spec.name] = f"{type(exc).__name__}: {exc}"
            log.warning("tool %s is unavailable: %s", spec.name, exc)
            continue
        bound = {k: v for k, v in bound_by_tool.get(spec.name, {}).items() if k in spec.server_bound}
        catalog[spec.name] = ToolDefinition(
            name=spec.name, version=spec.version, description=spec.description, summary=spec.summary,
            input_schema=advertised_schema(model, spec.server_bound),
            invoke=_adapter(spec, function, model, bound, repo, config.output_limit_bytes),
            side_effects=spec.side_effects, requires_confirmation=spec.requires_confirmation,
            reversible=spec.reversible, idempotent=spec.idempotent)
    return catalog, unavailable


def catalog_facts(specs: tuple[ToolSpec, ...], available: Mapping[str, Any]
                  ) -> list[tuple[str, list[Any]]]:
    """Server base facts describing the catalog: ``tool/1`` (available tools only),
    ``tool_requires/2``, ``conflicts_with/2``, ``requires_capability/2``, ``side_effect/2``."""
    facts: list[tuple[str, list[Any]]] = []
    for spec in specs:
        if spec.name in available:
            facts.append(("tool", [spec.name]))
        facts += [("tool_requires", [spec.name, d]) for d in spec.dependencies]
        facts += [("conflicts_with", [spec.name, c]) for c in spec.conflicts]
        facts += [("side_effect", [spec.name, e]) for e in spec.side_effects]
        if spec.capability:
            facts.append(("requires_capability", [spec.name, spec.capability]))
    return facts
