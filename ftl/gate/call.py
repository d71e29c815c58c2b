"""One gated call as the gates see it (`Call`: its Cedar context and request id) and what they
decided for it (`GateDecision`)."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, Mapping

from ftl.errors import FtlError

DEFAULT_SOURCE = "manglecp"          # calls through ftl's MangleCP server; the MCP server passes "mcp"
DEFAULT_PRINCIPAL = "anonymous"


@dataclass(frozen=True)
class Call:
    tool: str
    args: dict[str, Any]
    side_effects: tuple[str, ...]
    principal: str
    source: str
    context: dict[str, Any]

    @classmethod
    def parse(cls, call: Mapping[str, Any]) -> "Call":
        tool = call.get("tool")
        if not isinstance(tool, str) or not tool:
            raise FtlError("invalid_params", {"schema_errors": [
                {"path": "/tool", "message": "the gated call needs a tool name", "keyword": "required"}]})
        args = call.get("args")
        context = call.get("context")
        return cls(tool=tool, args=dict(args) if isinstance(args, Mapping) else {},
                   side_effects=tuple(str(e) for e in call.get("side_effects") or ()),
                   principal=str(call.get("principal") or DEFAULT_PRINCIPAL),
                   source=str(call.get("source") or DEFAULT_SOURCE),
                   context=dict(context) if isinstance(context, Mapping) else {})

    def cedar_context(self) -> dict[str, Any]:
        """Context record for Cedar (see the module docstring for its keys)."""
        workspace = self.args.get("workspace")
        workspace = workspace if isinstance(workspace, Mapping) else {}
        files = sorted({str(p) for key in ("delta", "creates") for p in workspace.get(key) or ()
                        if isinstance(p, str)})
        context: dict[str, Any] = {
            "seq": str(workspace.get("seq") or ""), "task_type": str(workspace.get("type") or ""),
            "files": files, "side_effects": sorted(set(self.side_effects)), "source": self.source}
        for key, value in _cedar_value(self.context).items():
            context[key] = value
        if "files" in self.context:
            context["files"] = sorted({str(p) for p in self.context["files"] or ()})
        context["dirs"] = sorted({str(parent) for p in context["files"]
                                  for parent in PurePosixPath(p).parents if str(parent) != "."})
        return context

    def request_id(self) -> str:
        """A new id for one approval request of this call: a digest of everything the approver
        is shown (tool, args, principal, source, side effects, context), then a random part, so
        a decision answers that one request and no later call, however alike (ThoughtGate:
        one approval per request). Raises nothing."""
        canonical = json.dumps({"tool": self.tool, "args": self.args, "principal": self.principal,
                                "source": self.source, "side_effects": sorted(self.side_effects),
                                "context": self.context}, sort_keys=True, separators=(",", ":"),
                               default=str)
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
        return f"apr-{digest}-{secrets.token_hex(4)}"


def _cedar_value(value: Any) -> Any:
    """A JSON value Cedar can hold: floats and huge ints become strings; None and record keys
    starting with ``__`` are dropped."""
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if -(2 ** 63) <= value < 2 ** 63 else str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        # Keys such as "__entity" / "__extn" would make Cedar read caller data as an entity
        # reference or an extension value, so they are dropped.
        return {str(k): v for k, v in ((k, _cedar_value(v)) for k, v in value.items())
                if v is not None and not str(k).startswith("__")}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [v for v in (_cedar_value(v) for v in value) if v is not None]
    return str(value)


Outcome = Literal["forward", "allow", "approved", "approved_on_timeout"]


@dataclass(frozen=True)
class GateDecision:
    """What the gates decided for a call that may run (a record for the server log).

    Attributes:
        tool: the tool name.
        outcome: ``forward`` (governance sent it straight on), ``allow`` (Cedar allowed it),
            ``approved`` or ``approved_on_timeout`` (``on_timeout = "approve"``).
        gates: ``(gate, result)`` in the order they ran, e.g. ``(("visibility", "pass"),
            ("governance", "policy"), ("policy", "allow"))``.
        rule: index of the governance rule that matched (None: the default action).
        policy_ids: the determining Cedar policies (their ``@id`` when they have one).
        request_id: the approval request id, when gate 4 ran.
        approver: who decided (``command``, ``file:<by>``, ``prompt``, `TIMEOUT_APPROVER`).
    """

    tool: str
    outcome: Outcome
    gates: tuple[tuple[str, str], ...]
    rule: int | None = None
    policy_ids: tuple[str, ...] = ()
    request_id: str | None = None
    approver: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "outcome": self.outcome, "gates": dict(self.gates),
                "rule": self.rule, "policy_ids": list(self.policy_ids),
                "request_id": self.request_id, "approver": self.approver}

    def public(self) -> dict[str, Any]:
        """What may leave the server (the invoke response's ``x-gate_decision``): ``{"tool",
        "outcome", "gates": {gate: step result}}``; no rule index, policy ids or approver
        (reference §1.7: those stay in the log)."""
        return {"tool": self.tool, "outcome": self.outcome, "gates": dict(self.gates)}
