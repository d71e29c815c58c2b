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

Outcomes (MangleCP spec 07 §4-5): each tool's ``outcome`` turns a successful result into a
state delta and next steps, in the vocabulary of `DELTA_PREDICATES` (declared in the manifest's
facts profile, so a client may send them back as session facts): a builder's outcome and changed
files (rolled up into one ``bulk_modification_completed`` fact past `FILE_FACTS_CAP` files), the
verifier's pass/fail and the task's new status, a planner's decision, an explorer's status, a
cascade recommendation, an observation count; plus the intent worth evaluating next
(e.g. ``verify_task`` after a completed build) with its continuation facts.

Skills (spec 06 §5): `SKILLS` are the guidance texts the domain rules attach to selected tools
(``needs_skill/2`` in ``rules/ftl_domain.lp``).
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
from ftl.manglecp.messages import PredicateSchema, fact
from ftl.manglecp.definitions import BoundContext, InvocationContext, InvocationOutcome, Skill, ToolDefinition

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
        outcome: ``outcome(args, result, bound) -> InvocationOutcome`` (state delta, next steps).
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
    outcome: Callable[[dict[str, Any], dict[str, Any], BoundContext], InvocationOutcome] | None = None


# ---------------------------------------------------------------------------------------------
# Outcomes: state delta and next steps


def _delta_pred(name: str, types: tuple[str, ...], names: tuple[str, ...], description: str,
                temporal: bool = False) -> PredicateSchema:
    return PredicateSchema(predicate=name, arity=len(types), arg_types=list(types), arg_names=list(names),
                           temporal=temporal, direction="both", description=description)


DELTA_PREDICATES: tuple[PredicateSchema, ...] = (
    _delta_pred("build_outcome", ("string", "string"), ("seq", "status"),
                "A builder finished the task: complete|blocked|failed (at the time of t).", True),
    _delta_pred("file_changed", ("string", "string", "boolean"), ("seq", "path", "in_scope"),
                "A build changed this file; in_scope is false outside the task's delta.", True),
    _delta_pred("bulk_modification_completed", ("string", "number", "number"),
                ("seq", "files", "out_of_scope"),
                "A build changed more files than are listed one by one: the counts.", True),
    _delta_pred("verify_result", ("string", "boolean"), ("seq", "passed"),
                "The task's verify command passed or failed (at the time of t).", True),
    _delta_pred("task_status", ("string", "string"), ("seq", "status"),
                "The task's status as the last tool result implies: complete|blocked."),
    _delta_pred("plan_decision", ("string",), ("decision",),
                "The planner's decision: PROCEED|CLARIFY|CONFIRM|UNKNOWN."),
    _delta_pred("plan_task_count", ("number",), ("count",), "Tasks in the plan the planner returned."),
    _delta_pred("explored", ("string", "string"), ("mode", "status"), "An explorer mode ran: its status."),
    _delta_pred("cascade_recommendation", ("string",), ("recommendation",),
                "Cascade analysis verdict: none|retry|propagate|replan."),
    _delta_pred("unreachable_count", ("number",), ("count",), "Tasks no longer reachable."),
    _delta_pred("observed_campaign", ("string", "number", "number"), ("campaign_id", "failures", "patterns"),
                "A campaign was observed: failure and success patterns extracted."),
)

FILE_FACTS_CAP = 20  # past this many changed files a build reports one rolled-up fact (spec 07 §5.3)


def _pattern(pred: str, *args: Any) -> dict[str, Any]:
    return {"pred": pred, "args": list(args)}


def _bound_task(bound: BoundContext, seq: str | None = None) -> tuple[str | None, str]:
    """The (seq, type) of the task an invocation concerns: ``seq`` from the invocation's
    arguments when given, with the type of the selection's single ``task_kind`` fact (a
    selection shared by every task of a kind); else the single ``task`` fact the tool was
    selected with; else (None, BUILD)."""
    kinds = bound.args_of("task_kind")
    if seq and len(kinds) == 1 and len(kinds[0]) == 1:
        return seq, str(kinds[0][0])
    tasks = bound.args_of("task")
    if len(tasks) == 1 and len(tasks[0]) == 2:
        return seq or str(tasks[0][0]), str(tasks[0][1])
    return seq or None, "BUILD"


def builder_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    """Builders: ``build_outcome``, the changed files (or one roll-up), ``task_status`` when
    blocked; next ``verify_task`` after a complete build, ``analyze_cascade`` after a block."""
    workspace = args.get("workspace") if isinstance(args.get("workspace"), dict) else {}
    seq, task_type = _bound_task(bound, str(workspace.get("seq") or "") or None)
    status = str(result.get("status") or "failed")
    changed = [str(p) for p in result.get("files_changed") or []]
    outside = {str(p) for p in result.get("out_of_scope") or []}
    if not seq:
        return InvocationOutcome(summary=f"The build ended {status}; {len(changed)} file(s) changed.")
    asserts = [fact("build_outcome", seq, status)]
    if len(changed) <= FILE_FACTS_CAP:
        asserts += [fact("file_changed", seq, path, path not in outside) for path in changed]
    else:
        asserts.append(fact("bulk_modification_completed", seq, len(changed), len(outside)))
    retracts = [_pattern("build_outcome", seq, None), _pattern("file_changed", seq, None, None),
                _pattern("bulk_modification_completed", seq, None, None)]
    suggested, continuation = [], []
    if status == "blocked":
        asserts.append(fact("task_status", seq, "blocked"))
        retracts.append(_pattern("task_status", seq, None))
        suggested.append({"name": "analyze_cascade",
                          "description": f"Task {seq} is blocked: find what it makes unreachable."})
        continuation.append(fact("blocked", seq))
    elif status == "complete":
        suggested.append({"name": "verify_task", "description": f"Run task {seq}'s verify command."})
        continuation.append(fact("task", seq, task_type))
    return InvocationOutcome(
        asserts=tuple(asserts), retracts=tuple(retracts), suggested_intents=tuple(suggested),
        continuation_facts=tuple(continuation),
        summary=f"The build of task {seq} ended {status}; {len(changed)} file(s) changed, "
                f"{len(outside)} outside the task's scope.")


def verify_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    """Verifier: ``verify_result`` and, when it passed, ``task_status(seq, complete)``; after a
    failure, ``build_task`` again. The seq: the ``seq`` argument, else the single ``task`` fact
    of the evaluation."""
    passed = bool(result.get("passed"))
    verdict = "passed" if passed else f"failed (exit {result.get('exit_code')})"
    seq, task_type = _bound_task(bound, str(args.get("seq") or "") or None)
    if seq is None:
        return InvocationOutcome(summary=f"The verify command {verdict}.")
    asserts = [fact("verify_result", seq, passed)]
    retracts = [_pattern("verify_result", seq, None)]
    suggested, continuation = [], []
    if passed:
        asserts.append(fact("task_status", seq, "complete"))
        retracts.append(_pattern("task_status", seq, None))
    else:
        suggested.append({"name": "build_task", "description": f"Build task {seq} again, then verify it."})
        continuation.append(fact("task", seq, task_type))
    return InvocationOutcome(asserts=tuple(asserts), retracts=tuple(retracts),
                             suggested_intents=tuple(suggested), continuation_facts=tuple(continuation),
                             summary=f"Task {seq}'s verify command {verdict}.")


def plan_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    """Planners: ``plan_decision`` (and ``plan_task_count``); next ``build_task`` after PROCEED,
    planning again after CLARIFY."""
    decision = str(result.get("decision") or "UNKNOWN")
    asserts = [fact("plan_decision", decision)]
    retracts = [_pattern("plan_decision", None), _pattern("plan_task_count", None)]
    plan = result.get("plan")
    tasks = plan.get("tasks") if isinstance(plan, dict) else None
    if isinstance(tasks, list):
        asserts.append(fact("plan_task_count", len(tasks)))
    suggested = []
    if decision == "PROCEED":
        suggested.append({"name": "build_task",
                          "description": "Build the plan's ready tasks: task_kind/1 and run_given "
                                         "describe a kind of task (one selection for all of "
                                         "them), task/2 and task_has_run/1 a single task."})
    elif decision == "CLARIFY":
        suggested.append({"name": bound.intent if bound.intent in ("plan_campaign", "replan_campaign")
                          else "plan_campaign",
                          "description": "Answer the planner's questions in the objective, then plan again."})
    count = f" with {len(tasks)} task(s)" if isinstance(tasks, list) else ""
    return InvocationOutcome(asserts=tuple(asserts), retracts=tuple(retracts),
                             suggested_intents=tuple(suggested),
                             summary=f"The planner decided {decision}{count}.")


def explore_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    """Explorers: ``explored(mode, status)``; next ``plan_campaign``."""
    mode, status = str(result.get("mode") or ""), str(result.get("status") or "ok")
    if not mode:
        return InvocationOutcome()
    return InvocationOutcome(
        asserts=(fact("explored", mode, status),), retracts=(_pattern("explored", mode, None),),
        suggested_intents=({"name": "plan_campaign",
                            "description": "Plan the campaign with the exploration results."},),
        summary=f"The {mode} explorer finished with status {status}.")


def cascade_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    """Cascade analysis: ``cascade_recommendation`` and ``unreachable_count``; next
    ``replan_campaign`` (with the blocked roots) when it recommends a re-plan."""
    recommendation = str(result.get("recommendation") or "none")
    unreachable = int(result.get("unreachable_count") or 0)
    asserts = (fact("cascade_recommendation", recommendation), fact("unreachable_count", unreachable))
    retracts = (_pattern("cascade_recommendation", None), _pattern("unreachable_count", None))
    suggested, continuation = [], []
    if recommendation == "replan":
        suggested.append({"name": "replan_campaign",
                          "description": "Re-plan around the blocked roots that cut off the most tasks."})
        roots = [r.get("seq") for r in result.get("roots") or [] if isinstance(r, dict) and r.get("seq")]
        continuation = [fact("blocked", str(seq)) for seq in roots[:FILE_FACTS_CAP]]
    return InvocationOutcome(asserts=asserts, retracts=retracts, suggested_intents=tuple(suggested),
                             continuation_facts=tuple(continuation),
                             summary=f"Cascade analysis recommends {recommendation}; "
                                     f"{unreachable} task(s) unreachable.")


def observe_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    """Observer: ``observed_campaign(campaign_id, failures, patterns)``."""
    failures = len(result.get("failures_extracted") or [])
    patterns = len(result.get("patterns_extracted") or [])
    campaign_id = str(args.get("campaign_id") or "")
    return InvocationOutcome(
        asserts=(fact("observed_campaign", campaign_id, failures, patterns),),
        retracts=(_pattern("observed_campaign", campaign_id, None, None),),
        summary=f"Observed campaign {campaign_id}: {failures} failure and {patterns} success pattern(s).")


# ---------------------------------------------------------------------------------------------
# Skills (the domain rules decide which selected tool needs which)

SKILLS: tuple[Skill, ...] = (
    Skill("workspace_scope", "Stay inside the workspace scope",
          "A build may change only the task's delta and creates files.",
          "A build may change only the files listed in the workspace's `delta` and `creates`. "
          "The builder compares the work tree before and after the run: every other changed path "
          "is reported in `out_of_scope`, and the runner blocks the task for it. Paths in "
          "`exclude_paths` belong to tasks running at the same time and are not charged."),
    Skill("agent_build_result", "Report an agent build",
          "The agent prints one JSON build result on stdout.",
          "The agent reads the workspace JSON on stdin and ends by printing one JSON object: "
          '`{"status": "complete" | "blocked", "delivered": "...", "reason": "...", '
          '"utilized": [...]}`. Text before it is ignored. A rate-limited agent exits 75 or prints '
          '`{"status": "blocked", "error_type": "rate_limited", "retry_after_ms": N}`.'),
    Skill("verify_semantics", "Read a verify result",
          "Exit status 0 passes; anything else, a timeout or a cancel fails.",
          "The verify command runs through `/bin/sh -c` in the repository with its own time "
          "limit. `passed` is true only for exit status 0 within the limit. `output` holds the tail "
          "of stdout and stderr together. A failing verify is a result, not an error: the runner "
          "retries it as possibly flaky before blocking the task, and only a passed verify "
          "completes a task.", inline=False),
)


_EXPLORE = ("explore_codebase",)
TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec("explore_structure", "explorers", "explore_structure", "ExploreArgs", _EXPLORE,
             "Map the repository layout: packages, entry points, tests.",
             "Read-only survey of the repository's layout: source and test directories, entry "
             "points and configuration files. Returns an explorer result (mode 'structure').",
             ("filesystem",), idempotent=True, outcome=explore_outcome),
    ToolSpec("explore_pattern", "explorers", "explore_pattern", "ExploreArgs", _EXPLORE,
             "Detect frameworks, idioms and the test runner.",
             "Read-only scan for frameworks, coding idioms, style and the test command. Returns an "
             "explorer result (mode 'pattern').", ("filesystem",), idempotent=True, outcome=explore_outcome),
    ToolSpec("explore_memory", "explorers", "explore_memory", "ExploreArgs", _EXPLORE,
             "Recall failures and patterns from earlier campaigns.",
             "Ranks remembered failures and success patterns from ftl's store by relevance to the "
             "objective. Returns an explorer result (mode 'memory').",
             ("filesystem", "database"), idempotent=True, outcome=explore_outcome),
    ToolSpec("explore_delta", "explorers", "explore_delta", "ExploreArgs", _EXPLORE,
             "Find the files an objective is likely to touch.",
             "Ranks source files and definitions by relevance to the objective. Returns an "
             "explorer result (mode 'delta').", ("filesystem",), idempotent=True, outcome=explore_outcome),
    ToolSpec("load_plan", "planner", "load_plan", "LoadPlanArgs", ("plan_campaign", "replan_campaign"),
             "Validate a supplied plan.",
             "Validates a plan.json document (schema, seqs, dependencies, cycles) and returns the "
             "normalised plan with decision PROCEED.", ("none",), idempotent=True, outcome=plan_outcome),
    ToolSpec("agent_planner", "planner", "agent_planner", "AgentPlannerArgs",
             ("plan_campaign", "replan_campaign"),
             "Ask the configured planner agent for a plan.",
             "Runs the planner agent configured in ftl.toml with the objective and exploration "
             "(or the re-plan input) and returns its decision: PROCEED with a plan, CLARIFY with "
             "questions, or CONFIRM.", ("process", "network"),
             capability="agent_planner", server_bound=("command",), outcome=plan_outcome),
    ToolSpec("claude_planner", "claude", "claude_planner", "ClaudePlannerArgs",
             ("plan_campaign", "replan_campaign"),
             "Ask Claude Code for a plan.",
             "Runs `claude -p --output-format stream-json` with the ftl:planner agent on the "
             "objective and exploration (or the re-plan input) and returns its decision: PROCEED "
             "with a plan, CLARIFY with questions, or CONFIRM; with its cost.",
             ("process", "network"), conflicts=("agent_planner",),
             capability="claude_planner", server_bound=("claude",), outcome=plan_outcome),
    ToolSpec("shell_builder", "builders", "shell_builder", "BuildArgs", ("build_task",),
             "Run the task's run command in its workspace.",
             "Runs the workspace's `run` shell command in the repository with the task's time "
             "limit and reports the outcome, the files changed and any change outside the task's "
             "delta.", ("filesystem", "process"), conflicts=("agent_builder",), outcome=builder_outcome),
    ToolSpec("agent_builder", "builders", "agent_builder", "BuildArgs", ("build_task",),
             "Run the configured coding agent on the workspace.",
             "Runs the coding agent configured in ftl.toml with the workspace JSON on stdin, reads "
             "its build result and reports the outcome, the files changed and any change outside "
             "the task's delta.", ("filesystem", "process", "network"),
             conflicts=("shell_builder",), capability="agent_builder", server_bound=("command",),
             outcome=builder_outcome),
    ToolSpec("claude_builder", "claude", "claude_builder", "ClaudeBuildArgs", ("build_task",),
             "Run Claude Code on the workspace and read its event stream.",
             "Runs `claude -p --output-format stream-json` in the task's directory with the "
             "workspace as the prompt and --max-turns from the task's budget; reports the "
             "outcome, cost, turns, tokens, session id, rate or usage limits, a stall, the files "
             "changed and any change outside the task's delta.",
             ("filesystem", "process", "network"), conflicts=("shell_builder", "agent_builder"),
             capability="claude_builder", server_bound=("claude",), outcome=builder_outcome),
    ToolSpec("run_verify", "verifier", "run_verify", "VerifyArgs", ("verify_task",),
             "Run a task's verify command.",
             "Runs the verify shell command in the repository with a time limit; passed means "
             "exit status 0.", ("process",), idempotent=True, outcome=verify_outcome),
    ToolSpec("observer", "observer", "observer", "ObserveArgs", ("observe_outcomes",),
             "Extract failure and success patterns from a campaign.",
             "Reads a finished campaign's tasks and workspaces, extracts failure and success "
             "patterns and records them in ftl's memory.", ("database",), outcome=observe_outcome),
    ToolSpec("cascade_analysis", "cascade", "cascade_analysis", "CascadeArgs", ("analyze_cascade",),
             "Find blocked roots and unreachable tasks of a campaign.",
             "Computes the unreachable tasks of a campaign, their blocked roots and whether a "
             "re-plan is warranted.", ("database",), idempotent=True,
             outcome=cascade_outcome),
)


def server_bound_values(config: Config) -> dict[str, dict[str, Any]]:
    """Per tool, the values the server binds from the configuration."""
    return {"agent_builder": {"command": config.agent_command},
            "claude_builder": {"claude": config.claude},
            "claude_planner": {"claude": config.claude},
            "agent_planner": {"command": config.planner_command}}


def configured_capabilities(config: Config) -> list[str]:
    """Capabilities the configuration provides (``configured(C)`` server facts)."""
    capabilities = []
    if config.agent_command:
        capabilities.append("agent_builder")
    if config.planner_command:
        capabilities.append("agent_planner")
    if config.builder == "claude":
        capabilities.append("claude_builder")
    if config.planner == "claude":
        capabilities.append("claude_planner")
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


class AdvertisedSchema(Mapping[str, Any]):
    """`advertised_schema` of a tool's args model, made when first read (a macro-tool sent to
    a client, the first invocation's validation). pydantic took 12-14 ms to write the 13 tools'
    schemas at every server start, before ``ready`` (issue 11 item 2); a campaign reads a
    tool's schema when it first selects the tool. A read-only mapping; two threads reading it
    first at once both make it, equal, and one is kept."""

    __slots__ = ("_model", "_server_bound", "_schema")

    def __init__(self, model: type[BaseModel], server_bound: tuple[str, ...]) -> None:
        self._model = model
        self._server_bound = server_bound
        self._schema: dict[str, Any] | None = None

    def _made(self) -> dict[str, Any]:
        schema = self._schema
        if schema is None:
            schema = self._schema = advertised_schema(self._model, self._server_bound)
        return schema

    def __getitem__(self, key: str) -> Any:
        return self._made()[key]

    def __iter__(self) -> Any:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())

    def __repr__(self) -> str:
        state = "made" if self._schema is not None else "not made yet"
        return f"<AdvertisedSchema of {self._model.__name__} ({state})>"


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
            input_schema=AdvertisedSchema(model, spec.server_bound),
            invoke=_adapter(spec, function, model, bound, repo, config.output_limit_bytes),
            side_effects=spec.side_effects, requires_confirmation=spec.requires_confirmation,
            reversible=spec.reversible, idempotent=spec.idempotent, outcome=spec.outcome)
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
