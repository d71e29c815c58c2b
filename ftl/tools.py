"""The runner's one door to its tools: MangleCP intent evaluation and invocation, logged.

State handlers never import a tool; they describe the situation as facts, ask the MangleCP
server which macro-tools serve an intent, and invoke one. Every invocation is announced with a
``TOOL_CALL`` event before it is sent (event before action). Protocol errors arrive as
`FtlError`s of the one registry (the MangleCP client maps codes), so recovery sees one vocabulary.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Protocol

from ftl import events as ev
from ftl.errors import GATE_ORDER, FtlError


def fact(pred: str, *args: Any) -> dict[str, Any]:
    """A MangleCP fact object (spec 03 §2): ``{"pred": name, "args": [...]}``."""
    return {"pred": pred, "args": list(args)}


class MangleClient(Protocol):
    """What ftl needs of a MangleCP client (ftl.manglecp.client.ManglecpClient provides it)."""

    def evaluate(self, intent: str, facts: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    def invoke(self, macro_id: str, args: dict[str, Any], **kwargs: Any) -> Any: ...


class ToolClient:
    """Discover and invoke tools for the runner.

    Args:
        client: a MangleCP client bound to a transport (in-process, stdio or HTTP).
        log: the campaign's event log (TOOL_CALL events).
    """

    def __init__(self, client: MangleClient, log: ev.EventLog) -> None:
        self.client = client
        self.log = log

    def select(self, intent: str, facts: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Evaluate ``intent`` with ``facts``; return the selected macro-tools by name.

        Returns:
            ``{tool_name: macro_tool_dict}`` (``macro_id``, ``name``, ``input_schema``, ...).
        """
        response = self.client.evaluate(intent, list(facts), disclosure="full")
        tools = _field(response, "macro_tools") or []
        return {_field(tool, "name"): _as_dict(tool) for tool in tools}

    def call(self, intent: str, facts: Iterable[dict[str, Any]], tool: str, args: dict[str, Any], *,
             state: str | None = None, seq: str | None = None,
             cancel: threading.Event | None = None) -> dict[str, Any]:
        """Select ``tool`` for ``intent`` and invoke it with ``args``; return its result dict.

        A gate decision the server reports is logged as ``GATE_DECISION`` (``tool``,
        ``outcome``, ``gates``; for a refusal also ``denied_by`` and ``reason``, the refusal's
        error kind) before the result or the refusal is handed on (issue 15 item 4).

        Raises:
            FtlError(tool_not_exposed): the server did not select ``tool`` for these facts.
            FtlError: any protocol or tool error, as mapped by the MangleCP client.
        """
        selected = self.select(intent, facts)
        if tool not in selected:
            raise FtlError("tool_not_exposed", {"tool": tool, "intent": intent,
                                                "selected": sorted(selected)})
        macro_id = selected[tool]["macro_id"]
        self.log.emit(ev.TOOL_CALL, state=state, tool=tool, intent=intent, macro_id=macro_id, task_seq=seq)
        try:
            response = self.client.invoke(macro_id, args, cancel=cancel)
        except FtlError as error:
            gate = error.details.get("gate") or error.kind.gate
            if gate in GATE_ORDER and error.kind.gate is not None:
                outcome = "timeout" if error.error_type == "approval_timeout" else "deny"
                self.log.emit(ev.GATE_DECISION, state=state, tool=tool, task_seq=seq,
                              outcome=outcome, gates={gate: outcome}, denied_by=gate,
                              reason=error.error_type)
            raise
        decision = _field(response, "x-gate_decision")
        if isinstance(decision, dict) and isinstance(decision.get("gates"), dict):
            self.log.emit(ev.GATE_DECISION, state=state, tool=tool, task_seq=seq,
                          outcome=decision.get("outcome"), gates=decision["gates"])
        result = _field(response, "result")
        return result if isinstance(result, dict) else {"value": result}


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", exclude_none=True) if dump else dict(obj.__dict__)
