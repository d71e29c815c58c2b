"""The runner's one door to its tools: MangleCP intent evaluation and invocation, logged.

State handlers never import a tool; they describe the situation as facts, ask the MangleCP
server which macro-tools serve an intent, and invoke one. Every invocation is announced with a
``TOOL_CALL`` event before it is sent (event before action). Protocol errors arrive as
`FtlError`s of the one registry (the MangleCP client maps codes), so recovery sees one vocabulary.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from datetime import datetime
from typing import Any, Callable, Iterable, Protocol

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
        clock: monotonic seconds (injected in tests).

    Selections are reused: the same intent with the same facts (EXPLORE's ``select`` and its
    four explorer calls, PLAN's, a retried build or verify) is evaluated once while the returned
    macro-tools are valid (90% of their shortest ``validity`` window, MangleCP spec 06 §2; tools
    without a window are not reused). Reuse needs identical facts: the server binds a macro-tool
    to the facts it was selected with (its gates decide on them), so another task's facts are a
    new evaluation; the runner therefore describes a task to build or verify by its kind
    (``task_kind``), not its seq, and one selection serves every task of that kind. A reused
    macro-tool the server has evicted (``macro_not_found`` / ``macro_expired``) is selected
    afresh and invoked once more (spec 09 §7).
    """

    CACHE_SIZE = 256  # selections kept (least recently used go first)
    VALIDITY_SHARE = 0.9  # of the window, so a reuse never races the server's expiry

    def __init__(self, client: MangleClient, log: ev.EventLog, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.log = log
        self._clock = clock
        self._selections: OrderedDict[str, tuple[float, dict[str, dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}  # key -> the evaluation in progress
        self.evaluations = 0  # intent evaluations sent (the benchmark and the tests read it)

    def select(self, intent: str, facts: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Evaluate ``intent`` with ``facts`` (or reuse a valid earlier selection of the same);
        return the selected macro-tools by name.

        Returns:
            ``{tool_name: macro_tool_dict}`` (``macro_id``, ``name``, ``input_schema``, ...).
        Raises:
            FtlError: the client's errors (see `ftl.manglecp.client.ManglecpClient.evaluate`).
        """
        return self._select(intent, list(facts))[0]

    def _select(self, intent: str, facts: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], bool]:
        """`select`, and whether the answer is a reused one.

        Single flight: while one thread evaluates a key, others asking for the same key wait
        for its answer instead of sending the same evaluation (the first tasks of a run all
        miss the cache at once; three parallel evaluations on two cores made each of them
        slower). A shared answer counts as reused; when the evaluation fails, each waiter
        evaluates on its own (its error is its own to retry)."""
        key = _selection_key(intent, facts)
        while True:
            now = self._clock()
            with self._lock:
                cached = self._selections.get(key)
                if cached is not None and now < cached[0]:
                    self._selections.move_to_end(key)
                    return cached[1], True
                flight = self._flights.get(key)
                leading = flight is None
                if leading:
                    flight = self._flights[key] = _Flight()
            if leading:
                break
            flight.done.wait()
            if flight.tools is not None:
                return flight.tools, True
        try:
            response = self.client.evaluate(intent, facts, disclosure="full")
            self.evaluations += 1
            tools = {_field(tool, "name"): _as_dict(tool) for tool in (_field(response, "macro_tools") or [])}
            window_s = _validity_s(tools.values())
            with self._lock:
                if window_s is not None and window_s > 0:
                    self._selections[key] = (now + window_s * self.VALIDITY_SHARE, tools)
                    self._selections.move_to_end(key)
                    while len(self._selections) > self.CACHE_SIZE:
                        self._selections.popitem(last=False)
                flight.tools = tools
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()
        return tools, False

    def _forget(self, intent: str, facts: list[dict[str, Any]]) -> None:
        with self._lock:
            self._selections.pop(_selection_key(intent, facts), None)

    def call(self, intent: str, facts: Iterable[dict[str, Any]], tool: str, args: dict[str, Any], *,
             state: str | None = None, seq: str | None = None,
             cancel: threading.Event | None = None,
             admit: Callable[[Callable[[], None]], Any] | None = None) -> dict[str, Any]:
        """Select ``tool`` for ``intent`` and invoke it with ``args``; return its result dict.

        ``admit``: called with the announcement (the ``TOOL_CALL`` emit) after the selection and
        before the invocation; it runs the announcement when the call may start (e.g. the
        agents' rate gate, atomically with its open check) or not at all when cancelled, in
        which case nothing is invoked and FtlError(cancelled) is raised.

        A gate decision the server reports is logged as ``GATE_DECISION`` (``tool``,
        ``outcome``, ``gates``; for a refusal also ``denied_by`` and ``reason``, the refusal's
        error kind) before the result or the refusal is handed on (issue 15 item 4), also when
        the gates let the call through and the tool then failed (the error's
        ``x-gate_decision`` detail).

        Raises:
            FtlError(tool_not_exposed): the server did not select ``tool`` for these facts.
            FtlError: any protocol or tool error, as mapped by the MangleCP client.
        """
        facts = list(facts)
        for fresh in (False, True):
            if fresh:
                self._forget(intent, facts)
            selected, reused = self._select(intent, facts)
            if tool not in selected:
                raise FtlError("tool_not_exposed", {"tool": tool, "intent": intent,
                                                    "selected": sorted(selected)})
            macro_id = selected[tool]["macro_id"]
            announced: list[bool] = []

            def announce(macro_id: str = macro_id) -> None:
                self.log.emit(ev.TOOL_CALL, state=state, tool=tool, intent=intent,
                              macro_id=macro_id, task_seq=seq)
                announced.append(True)

            if admit is None:
                announce()
            else:
                admit(announce)
                if not announced:
                    raise FtlError("cancelled", {"what": f"{tool} for task {seq}"})
            try:
                response = self.client.invoke(macro_id, args, cancel=cancel)
            except FtlError as error:
                if reused and not fresh and error.details.get("manglecp_code") in _REEVALUATE_CODES:
                    continue  # the server no longer knows the reused macro-tool: select again
                gate = error.details.get("gate") or error.kind.gate
                passed = error.details.get("x-gate_decision")
                if gate in GATE_ORDER and error.kind.gate is not None:
                    outcome = "timeout" if error.error_type == "approval_timeout" else "deny"
                    self.log.emit(ev.GATE_DECISION, state=state, tool=tool, task_seq=seq,
                                  outcome=outcome, gates={gate: outcome}, denied_by=gate,
                                  reason=error.error_type)
                elif isinstance(passed, dict) and isinstance(passed.get("gates"), dict):
                    # the gates let the call through and the tool then failed: still a decision
                    self.log.emit(ev.GATE_DECISION, state=state, tool=tool, task_seq=seq,
                                  outcome=passed.get("outcome"), gates=passed["gates"])
                raise
            decision = _field(response, "x-gate_decision")
            if isinstance(decision, dict) and isinstance(decision.get("gates"), dict):
                self.log.emit(ev.GATE_DECISION, state=state, tool=tool, task_seq=seq,
                              outcome=decision.get("outcome"), gates=decision["gates"])
            result = _field(response, "result")
            return result if isinstance(result, dict) else {"value": result}
        raise AssertionError("unreachable")  # the second round returns or raises


class _Flight:
    """One evaluation in progress: ``done`` is set when it ended, ``tools`` holds its answer
    (None when it failed)."""

    __slots__ = ("done", "tools")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.tools: dict[str, dict[str, Any]] | None = None


_REEVALUATE_CODES = frozenset({"macro_not_found", "macro_expired"})


def _selection_key(intent: str, facts: list[dict[str, Any]]) -> str:
    """Canonical text of an evaluation's input (facts in the order given: the server binds them)."""
    return json.dumps([intent, facts], sort_keys=True, separators=(",", ":"), default=str)


def _validity_s(tools: Iterable[dict[str, Any]]) -> float | None:
    """The shortest ``validity`` window (``expires_at - not_before``, s) of ``tools``; None when
    there is no tool or one of them has no window (it is not reused)."""
    shortest: float | None = None
    for tool in tools:
        validity = tool.get("validity") if isinstance(tool, dict) else None
        if not isinstance(validity, dict):
            return None
        try:
            start = datetime.fromisoformat(str(validity["not_before"]).replace("Z", "+00:00"))
            end = datetime.fromisoformat(str(validity["expires_at"]).replace("Z", "+00:00"))
        except (KeyError, ValueError):
            return None
        window = (end - start).total_seconds()
        shortest = window if shortest is None else min(shortest, window)
    return shortest


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", exclude_none=True) if dump else dict(obj.__dict__)
