"""Helpers for the MangleCP tests: a small tool catalog, the fixture rules, a fake clock, builders."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ftl.errors import FtlError
from ftl.manglecp.access import BearerAuth
from ftl.manglecp.definitions import (
    BoundContext, InvocationContext, InvocationOutcome, ServerInfo, ServerLimits, Skill, ToolDefinition)
from ftl.manglecp.messages import PredicateSchema, envelope
from ftl.manglecp.server import ManglecpServer
from ftl.server.evaluation.workers import ClingoEvaluator

FIXTURE_RULES = (Path(__file__).with_name("rules") / "fixture.lp",)
FIXTURE_TOOLS = ("mandatory_tool", "prohibited_tool", "pair_a", "pair_b", "dependent_tool", "helper_tool",
                 "enabled_tool", "other_tool", "score80", "score50", "score30", "score10", "echo_tool",
                 "slow_tool", "failing_tool", "crash_tool", "danger_tool", "bad_result_tool", "recent_tool",
                 "ephemeral_tool")
EPHEMERAL_VALIDITY_S = 0.5


class FakeClock:
    """Wall and monotonic clocks that move only when told to."""

    def __init__(self, wall_s: float = 1_771_510_200.0) -> None:
        self.wall_s = wall_s
        self.mono_s = 100.0

    def time(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.mono_s

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.mono_s += seconds


def _echo(args: dict[str, Any], ctx: InvocationContext) -> dict[str, Any]:
    ctx.progress({"message": "echoing", "percent": 50})
    return {"echo": args, "identity": ctx.identity}


def _slow(args: dict[str, Any], ctx: InvocationContext) -> dict[str, Any]:
    ctx.cancel.wait(args.get("seconds", 10))
    return {"finished": not ctx.cancel.is_set()}


def _failing(args: dict[str, Any], ctx: InvocationContext) -> dict[str, Any]:
    raise FtlError("verify_failed", {"seq": "001", "exit_code": 3, "workdir": "/home/secret/repo"})


def _crash(args: dict[str, Any], ctx: InvocationContext) -> dict[str, Any]:
    raise RuntimeError("boom at /home/secret/repo/file.py with token s3cr3t")


def _bad_result(args: dict[str, Any], ctx: InvocationContext) -> Any:
    return ["not", "an", "object"]


def _echo_outcome(args: dict[str, Any], result: dict[str, Any], bound: BoundContext) -> InvocationOutcome:
    text = str(args.get("text", ""))
    return InvocationOutcome(
        asserts=({"pred": "echoed", "args": [text]},
                 {"pred": "echo_count", "args": [len(bound.facts)], "source": {"source_type": "scan"}},
                 {"pred": "undeclared_pred", "args": [1]}),  # dropped: not in the profile
        retracts=({"pred": "echoed", "args": [None]},),
        suggested_intents=({"name": "diag", "description": "Diagnose next."},
                           {"name": "no_such_intent", "description": "dropped"}),
        continuation_facts=({"pred": "enable", "args": ["x"]},),
        events=({"action": "echo", "status": "success"},),
        summary=f"Echoed {len(text)} character(s).")


_OBJECT = {"type": "object", "additionalProperties": True}
_IMPLS: dict[str, Callable[..., Any]] = {"echo_tool": _echo, "slow_tool": _slow, "failing_tool": _failing,
                                         "crash_tool": _crash, "bad_result_tool": _bad_result}


def fixture_catalog() -> dict[str, ToolDefinition]:
    catalog = {}
    for name in FIXTURE_TOOLS:
        schema: dict[str, Any] = dict(_OBJECT)
        if name == "echo_tool":
            schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 20},
                                                       "count": {"type": "integer", "minimum": 0}},
                      "required": ["text"], "additionalProperties": False}
        catalog[name] = ToolDefinition(
            name=name, version="1", description=f"The {name} fixture tool, described at length " * 3,
            summary=f"The {name} fixture tool.", input_schema=schema,
            invoke=_IMPLS.get(name, lambda args, ctx: {"ok": True}),
            side_effects=("payments",) if name == "danger_tool" else ("none",),
            requires_confirmation=name == "danger_tool",
            instructions="Run the diagnosis first." if name == "mandatory_tool" else None,
            validity_s=EPHEMERAL_VALIDITY_S if name == "ephemeral_tool" else None,
            outcome=_echo_outcome if name == "echo_tool" else None)
    return catalog


FIXTURE_SKILLS = {
    "diag_guide": Skill("diag_guide", "Diagnosis guide", "How to read a diagnosis.",
                        "Read the diagnosis top-down; the first failing check is the cause. " * 4),
    "diag_manual": Skill("diag_manual", "Diagnosis manual", "The full diagnosis manual.",
                         "The manual. " * 200, inline=False),
}


FIXTURE_PREDICATES = (
    PredicateSchema(predicate="enable", arity=1, arg_types=["string"], arg_names=["what"], direction="input"),
    PredicateSchema(predicate="block_helper", arity=0, arg_types=[], direction="input"),
    PredicateSchema(predicate="task", arity=2, arg_types=["string", "number"], arg_names=["seq", "size"],
                    direction="input"),
    PredicateSchema(predicate="flag", arity=1, arg_types=["boolean"], direction="input"),
    PredicateSchema(predicate="blob", arity=1, arg_types=["any"], direction="input"),
    PredicateSchema(predicate="seen", arity=1, arg_types=["string"], temporal=True, direction="input"),
    PredicateSchema(predicate="final", arity=2, arg_types=["string", "number"], direction="output"),
    PredicateSchema(predicate="echoed", arity=1, arg_types=["string"], temporal=True, direction="both"),
    PredicateSchema(predicate="echo_count", arity=1, arg_types=["number"], direction="both"),
)

FIXTURE_INFO = ServerInfo(
    server_name="fixture", server_version="0.0.1", domain_id="testing",
    domain_description="Conformance fixture.",
    intents=({"name": "diag", "description": "Diagnostic intent."},
             {"name": "levels", "description": "Adaptive disclosure fixture."},
             {"name": "tools", "description": "Invocation fixture."}),
    predicates=FIXTURE_PREDICATES, temporal=True, conformance_level=2)


def make_evaluator(isolation: str = "thread") -> ClingoEvaluator:
    facts = [("tool", [name]) for name in FIXTURE_TOOLS]
    return ClingoEvaluator(FIXTURE_RULES, facts, isolation=isolation)


def make_server(*, limits: ServerLimits | None = None, auth: BearerAuth | None = None,
                clock: Any = None, status: str = "ready", evaluator: ClingoEvaluator | None = None,
                gate: Any = None, on_error: Any = None, skills: Any = FIXTURE_SKILLS) -> ManglecpServer:
    return ManglecpServer(FIXTURE_INFO, fixture_catalog(), evaluator or make_evaluator(),
                          limits=limits, auth=auth, clock=clock or FakeClock(), status=status,
                          skills=skills, gate=gate, on_error=on_error)


def intent(intent_name: str, facts: list | None = None, *, id: str = "r-1", **payload: Any) -> dict:
    body = {"intent": {"name": intent_name}, "facts": facts or [], **payload}
    body.setdefault("options", {"disclosure_preference": "full"})
    return envelope("intent_request", id, body)


def invoke(macro_id: str, args: dict, *, id: str = "r-2", **payload: Any) -> dict:
    return envelope("invoke_request", id, {"macro_id": macro_id, "args": args, **payload})


def tools_by_name(reply: dict) -> dict[str, dict]:
    assert reply["type"] == "intent_response", reply
    return {t["name"]: t for t in reply["payload"]["macro_tools"]}


def final(replies: list[dict]) -> dict:
    assert replies, "no reply"
    assert all(r["type"] == "progress" for r in replies[:-1])
    return replies[-1]
