"""The gatekeeper: runs the four gates on a call, in order, first refusal wins (see `ftl.gate`)."""

from __future__ import annotations

import fnmatch
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from ftl.errors import FtlError, kind
from ftl.gate.approval import (
    TIMEOUT_APPROVER, Answer, ApprovalRequest, Approver, CommandApprover, FileApprover, PromptApprover,
    PromptIO, TtyPrompt, resolve_command,
)
from ftl.gate.call import DEFAULT_SOURCE, Call, GateDecision
from ftl.gate.config import GatesConfig, parse_gates, resolve_path
from ftl.gate.policy import CedarPolicies

log = logging.getLogger("ftl.gate")  # one log for every gate (module docstring of ftl.gate)

GATES = ("visibility", "governance", "policy", "approval")


@dataclass
class Gatekeeper:
    """The four gates, built once from ``[gates]`` and shared by every invocation (thread-safe).

    Use `Gatekeeper.from_config`; the constructor takes already-checked parts.
    """

    config: GatesConfig
    repo: Path
    policies: CedarPolicies | None = None
    prompt_io: PromptIO | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    command_argv: list[str] | None = None
    count: bool = True
    _prompt_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_config(cls, gates: Mapping[str, Any], *, repo: Path, prompt_io: PromptIO | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep, count: bool = True) -> "Gatekeeper":
        """Parse ``[gates]`` and load the Cedar policies.

        Args:
            gates: the ``[gates]`` table (``ftl.config.Config.gates``).
            repo: repository; relative policy, decision-file and command paths resolve against it.
            prompt_io: interactive channel for ``mode = "prompt"`` (default: the controlling
                TTY, looked up at each approval).
            clock: monotonic clock, s; sleep: sleep function, s (both injected by tests).
            count: count each decision in `ftl.telemetry.metrics` (``ftl_gate_decisions_total``,
                ``ftl_gate_denials_total``). Off for a campaign's in-process tool server, whose
                decisions the campaign counts from its ``GATE_DECISION`` events.
        Raises:
            FtlError(configuration_error): naming each bad field (``details.violations``):
                unknown keys, bad actions or globs, missing or malformed policy files, an
                approval command that cannot be found.
        """
        config = parse_gates(gates)
        repo = Path(repo).resolve()
        policies = CedarPolicies(config.policy, repo) if config.policy is not None else None
        command = None
        if config.approval.command:
            command = resolve_command(config.approval.command, repo)
        routes = [config.governance.default] + [r.action for r in config.governance.rules]
        needs_approval = "approve" in routes
        if needs_approval and config.approval.mode is None:
            log.warning("[gates] routes calls to approval but [gates.approval] sets no mode; "
                        "those calls will fail with approval_not_found")
        if policies is not None and "policy" not in routes:
            # ThoughtGate's V-004 (a policy_id without action: policy) is a warning too: the
            # policies load and are checked, but no call ever reaches them.
            log.warning("[gates.policy] is set but no governance rule (nor the default) has "
                        "action 'policy', so its Cedar policies are never consulted; route "
                        "calls to it with action = \"policy\" or remove [gates.policy]")
        return cls(config=config, repo=repo, policies=policies, prompt_io=prompt_io, clock=clock,
                   sleep=sleep, command_argv=command, count=count)

    # -- gate 1 -------------------------------------------------------------------------------

    def visible(self, tool_name: str) -> bool:
        """Gate 1: whether ``tool_name`` is exposed (``include`` match and no ``exclude`` match)."""
        expose = self.config.expose
        return (any(fnmatch.fnmatchcase(tool_name, p) for p in expose.include)
                and not any(fnmatch.fnmatchcase(tool_name, p) for p in expose.exclude))

    # -- all gates ----------------------------------------------------------------------------

    def route(self, tool: str, source: str = DEFAULT_SOURCE) -> tuple[int | None, str]:
        """Gate 2: ``(index of the first matching rule or None, action)``."""
        for index, rule in enumerate(self.config.governance.rules):
            if rule.match.matches(tool, source):
                return index, rule.action
        return None, self.config.governance.default

    def check(self, call: Mapping[str, Any]) -> GateDecision:
        """Run the gates, in order, on one invocation (reference §1.1; first refusal wins).

        Args:
            call: ``{"tool": str, "args": dict, "side_effects": [str], "principal": str | None,
                "context": dict, "source": str}``; only ``tool`` is required (``source``
                defaults to ``"manglecp"``, ``principal`` to ``"anonymous"``).
        Returns:
            a `GateDecision` when the call may run.
        Raises:
            FtlError: ``tool_not_exposed`` (visibility), ``governance_denied`` (governance),
                ``policy_denied`` (policy), ``approval_rejected`` / ``approval_timeout`` /
                ``approval_not_found`` (approval); details are ``{"tool", "gate"}`` only.
            FtlError(invalid_params): ``call`` has no tool name.
        """
        try:
            decision = self._check(call)
        except FtlError as error:
            gate = error.details.get("gate")
            if gate and self.count:
                _count_gate(gate, refusal_outcome(error.error_type), reason=error.error_type)
            raise
        if self.count:
            for gate, outcome in decision.gates:
                _count_gate(gate, outcome)
        return decision

    def _check(self, call: Mapping[str, Any]) -> GateDecision:
        c = Call.parse(call)
        if not self.visible(c.tool):
            self._refuse("tool_not_exposed", "visibility", c, why="excluded by [gates.expose]")
        trail: list[tuple[str, str]] = [("visibility", "pass")]
        rule, action = self.route(c.tool, c.source)
        trail.append(("governance", action))
        if action == "deny":
            self._refuse("governance_denied", "governance", c, rule=rule)
        if action == "forward":
            return GateDecision(c.tool, "forward", tuple(trail), rule=rule)
        context = c.cedar_context()
        policy_ids: tuple[str, ...] = ()
        if action == "policy":
            assert self.policies is not None  # guaranteed by GatesConfig validation
            verdict = self.policies.evaluate(c.principal, c.tool, context)
            if not verdict.allowed:
                self._refuse("policy_denied", "policy", c, rule=rule, decision=verdict.decision,
                             policies=list(verdict.policy_ids), errors=list(verdict.errors))
            policy_ids = verdict.policy_ids
            trail.append(("policy", "allow"))
            if not verdict.approval_required:
                return GateDecision(c.tool, "allow", tuple(trail), rule=rule, policy_ids=policy_ids)
        request = ApprovalRequest(c.request_id(), c, context)
        answer, approver = self._ask(request)
        if answer == "reject":
            self._refuse("approval_rejected", "approval", c, request_id=request.request_id,
                         approver=approver, level=logging.INFO)
        if answer == "timeout":
            if self.config.approval.on_timeout == "deny":
                self._refuse("approval_timeout", "approval", c, request_id=request.request_id,
                             timeout_s=self.config.approval.timeout_s)
            trail.append(("approval", "approved_on_timeout"))
            log.warning("approval %s for %s timed out after %s s; approved by on_timeout",
                        request.request_id, c.tool, self.config.approval.timeout_s)
            return GateDecision(c.tool, "approved_on_timeout", tuple(trail), rule=rule,
                                policy_ids=policy_ids, request_id=request.request_id,
                                approver=TIMEOUT_APPROVER)
        trail.append(("approval", "approved"))
        return GateDecision(c.tool, "approved", tuple(trail), rule=rule, policy_ids=policy_ids,
                            request_id=request.request_id, approver=approver)

    def _approver(self) -> Approver | None:
        """The workflow to use now: prompt only with a TTY, else command, else file."""
        approval = self.config.approval
        file = FileApprover(resolve_path(self.repo, approval.file), approval.poll_s, self.clock,
                             self.sleep) if approval.file else None
        command = CommandApprover(self.command_argv, self.repo) if self.command_argv else None
        if approval.mode == "prompt":
            io = self.prompt_io if self.prompt_io is not None else TtyPrompt.open()
            if io is not None:
                return PromptApprover(io, self.clock, self._prompt_lock)
            return command or file
        if approval.mode == "command":
            return command
        if approval.mode == "file":
            return file
        return None

    def _ask(self, request: ApprovalRequest) -> tuple[Answer, str]:
        approver = self._approver()
        if approver is None:
            self._refuse("approval_not_found", "approval", request.call,
                         mode=self.config.approval.mode, why="no usable approval workflow")
        timeout_s = self.config.approval.timeout_s
        if timeout_s <= 0:  # ThoughtGate EC-PIP-013: a zero timeout expires at once
            return "timeout", approver.name
        log.info("approval %s for %s requested via %s", request.request_id, request.call.tool,
                 approver.name)
        try:
            return approver.decide(request, timeout_s)
        finally:
            if isinstance(approver, PromptApprover) and approver.io is not self.prompt_io:
                close = getattr(approver.io, "close", None)
                if close:
                    close()

    def _refuse(self, error_type: str, gate: str, call: Call, *, level: int = logging.WARNING,
                **why: Any) -> NoReturn:
        # Everything about the refusal goes to the log; the caller learns the tool and the gate.
        log.log(level, "gate %s refused %s (principal %s, source %s): %s", gate, call.tool,
                call.principal, call.source, json.dumps(why, sort_keys=True, default=str))
        text = kind(error_type).message.format(tool=call.tool).rstrip(".")
        raise FtlError(error_type, {"tool": call.tool, "gate": gate}, message=f"{text} ({gate} gate).")


def refusal_outcome(error_type: str) -> str:
    """The ``outcome`` label of a refusal of kind ``error_type``: ``timeout`` for an approval
    that never came, ``deny`` for every other refusal."""
    return "timeout" if error_type == "approval_timeout" else "deny"


def _count_gate(gate: str, outcome: str, *, reason: str | None = None) -> None:
    """``ftl_gate_decisions_total{gate, outcome}`` and, for a refusal (``reason``: its error
    kind), ``ftl_gate_denials_total{gate, reason}``; metrics never stop a gate decision."""
    try:
        from ftl.telemetry.metrics import count_gate, count_gate_denial
        count_gate(gate, outcome)
        if reason is not None:
            count_gate_denial(gate, reason)
    except Exception:  # noqa: BLE001
        log.debug("gate metric not counted", exc_info=True)
