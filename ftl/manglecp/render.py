"""Rendering selected macro-tools onto the wire (pure functions, no I/O and no clock).

Deterministic macro ids (`macro_id_for`, reference §10.4 and §11 item 23), the disclosure levels
and the field whitelist of each (`LEVELS`, `RenderChoice`, `render_tool`: MangleCP spec 06 §4,
spec 05 §5), the token estimate the budget fitter works with (`estimate_tokens`, spec 05 §5.3,
reference §11 item 14), and facts back in wire form for proof hints (`wire_fact`, spec 03 §3.2).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping

from ftl.manglecp.definitions import Selection, Skill, ToolDefinition, canonical_json
from ftl.manglecp.facts import INT53_MAX, NormalFact, format_time

LEVELS = ("full", "condensed", "minimal")


def macro_id_for(tool: ToolDefinition, intent: str, binding: str = "") -> str:
    """Deterministic macro id: ``"m-" + sha256(canonical [name, version, intent, binding])[:16]``.

    ``binding`` is `BoundContext.digest` (sorted facts and params), so two evaluations with
    different facts never share an id, while the same tool, version, intent and facts give the
    same id in every process (no salted `hash()`; reference §10.4, §11 item 23).
    """
    digest = hashlib.sha256(canonical_json([tool.name, tool.version, intent, binding]).encode("utf-8"))
    return "m-" + digest.hexdigest()[:16]


def estimate_tokens(rendered: Mapping[str, Any]) -> int:
    """Token estimate of a rendered tool: ceil(canonical JSON length / 4) (reference §11 item 14)."""
    return math.ceil(len(canonical_json(rendered)) / 4)


@dataclass
class RenderChoice:
    """How one selected tool is rendered; the token-budget fitter edits these.

    Attributes:
        selection, tool, macro_id: what is rendered.
        level: ``full`` | ``condensed`` | ``minimal``.
        inline_skills: inline skills go out with their content (else as references).
        resources: the context resources still sent, highest priority first.
        validity: the ``validity`` object (full level only), or None.
    """

    selection: Selection
    tool: ToolDefinition
    macro_id: str
    level: str
    inline_skills: bool = True
    resources: tuple[tuple[str, int], ...] = ()
    validity: Mapping[str, Any] | None = None


def render_tool(choice: RenderChoice, skills: Mapping[str, Skill] | None = None) -> dict[str, Any]:
    """A MacroTool dict (spec 06 §4 field whitelist: minimal never carries a description or
    metadata; only full carries schemas, safety, context injection and validity).

    Skills: inline ones as ``{"skill_id", "inline": true, "content"}``, referenced ones as
    ``{"skill_id", "inline": false, "description"}``; ids missing from ``skills`` are skipped.
    """
    tool, selection, level = choice.tool, choice.selection, choice.level
    out: dict[str, Any] = {"macro_id": choice.macro_id, "name": tool.name, "disclosure_level": level}
    if level == "minimal":
        return out
    metadata = {"selection_phase": selection.phase, "score": selection.score}
    if level == "condensed":
        out["description"] = tool.summary.splitlines()[0] if tool.summary else tool.name
        out["metadata"] = metadata
        return out
    out["description"] = tool.description
    out["input_schema"] = dict(tool.input_schema)
    if tool.output_schema is not None:
        out["output_schema"] = dict(tool.output_schema)
    out["safety"] = {"requires_user_confirmation": tool.requires_confirmation,
                     "side_effects": list(tool.side_effects) or ["none"],
                     "reversible": tool.reversible, "idempotent": tool.idempotent}
    injection: dict[str, Any] = {}
    if tool.instructions:
        injection["instructions"] = tool.instructions
    refs = []
    for skill_id in selection.skills:
        skill = (skills or {}).get(skill_id)
        if skill is None:
            continue
        if skill.inline and choice.inline_skills:
            refs.append({"skill_id": skill.skill_id, "inline": True, "content": skill.content})
        else:
            refs.append({"skill_id": skill.skill_id, "inline": False, "description": skill.description})
    if refs:
        injection["skills"] = refs
    if choice.resources:
        injection["context_resources"] = [{"uri": uri, "priority": priority}
                                          for uri, priority in choice.resources]
    if injection:
        out["context_injection"] = injection
    if choice.validity:
        out["validity"] = dict(choice.validity)
    out["metadata"] = metadata
    return out


def wire_fact(fact: NormalFact) -> dict[str, Any]:
    """A validated fact back in wire form (ints beyond 2^53 as ``int64`` wrappers, spec 03 §3.2)."""
    def value(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, list, dict)):
            return v
        if isinstance(v, int):
            return v if abs(v) <= INT53_MAX else {"_type": "int64", "value": str(v)}
        if isinstance(v, list):
            return [value(x) for x in v]
        return {k: value(x) for k, x in v.items()}

    out: dict[str, Any] = {"pred": fact.pred, "args": [value(a) for a in fact.args]}
    if fact.t is not None:
        start, end = (format_time(p) if isinstance(p, int) else p for p in fact.t)
        point = fact.t[0] == fact.t[1] and fact.t[0] != "_"
        out["t"] = {"at": start} if point else {"start": start, "end": end}
    return out
