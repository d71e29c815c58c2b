"""The four gates every tool invocation passes: visibility, governance, policy, approval.

Modelled on ThoughtGate's gate flow (``shared/reference/errors-and-gates.md`` §1): the gates run
in a fixed order and the first refusal decides (ThoughtGate EC-ERR-005).

1. **visibility** (``[gates.expose]``): a tool is exposed when its name matches an ``include``
   glob and no ``exclude`` glob. Hidden tools are never selected by evaluation
   (`Gatekeeper.visible`) and an invocation of one is refused with ``tool_not_exposed``.
2. **governance** (``[gates.governance]``): the first rule whose ``match`` (tool and source globs)
   fits the call gives the route; no match gives ``default``. ``forward`` runs the tool at once
   (skips 3 and 4); ``deny`` refuses (``governance_denied``); ``approve`` goes to 4 (skips 3);
   ``policy`` goes to 3.
3. **policy** (``[gates.policy]``): Cedar (cedarpy). Anything but a clean ``Allow`` refuses
   (``policy_denied``): ``Deny``, ``NoDecision`` and an ``Allow`` reached while some policy failed
   to evaluate (fail closed, reference §5 rule 1). An ``Allow`` goes on to 4 only when one of the
   determining permit policies carries the annotation ``@approval("required")``; otherwise the
   call runs. (ThoughtGate sends every permit to an approval workflow; ftl has one workflow and
   asks a human only where a policy says so.)
4. **approval** (``[gates.approval]``): an interactive prompt (only on a TTY), a command (the
   call JSON on stdin; exit 0 approves, 1 rejects, anything else rejects) or a decision file
   polled for the request id. Rejected -> ``approval_rejected``; no answer within ``timeout_s``
   -> ``on_timeout`` (``deny`` -> ``approval_timeout``, ``approve`` -> the call runs and the
   decision records ``system:timeout-auto-approve``); approval needed but no workflow usable ->
   ``approval_not_found``. ``approval_timeout`` is structural (`ftl.errors`): the recovery
   protocol does not retry the call, so an approver that never answers is asked once per task
   attempt, and the next attempt (resume, re-plan) asks again.

Cedar request: principal ``Agent::"<principal>"`` (the caller's identity, ``anonymous`` when
unauthenticated), one action ``Action::"invoke"`` for every tool (side effects travel in the
context instead of one action per effect, so one policy can weigh several effects), resource
``Tool::"<name>"``. The context always has ``seq`` and ``task_type`` (``""`` when the call is not
about a task), ``files`` (the task's delta and creates), ``dirs`` (every ancestor directory of
those files), ``side_effects`` and ``source``; keys the caller passes in ``call["context"]`` are
added (and win).

A refusal raises `FtlError` of the gate's kind with ``details = {"tool", "gate"}`` only: no rule
patterns, policy ids or reasons reach the caller (reference §1.7); they go to the ``ftl.gate``
log at WARNING.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Literal, Mapping, NoReturn, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ftl.errors import FtlError, kind

log = logging.getLogger("ftl.gate")

__all__ = ["ApprovalConfig", "ExposeConfig", "GateDecision", "Gatekeeper", "GatesConfig",
           "GovernanceConfig", "GovernanceRule", "PolicyConfig", "PromptIO", "TtyPrompt",
           "DEFAULT_SOURCE", "TIMEOUT_APPROVER"]

GATES = ("visibility", "governance", "policy", "approval")
DEFAULT_SOURCE = "manglecp"          # calls through ftl's MangleCP server; the MCP server passes "mcp"
DEFAULT_PRINCIPAL = "anonymous"
TIMEOUT_APPROVER = "system:timeout-auto-approve"  # ThoughtGate's synthetic approver (§1.4)
APPROVAL_ANNOTATION = "approval"
MAX_PROMPT_ATTEMPTS = 3               # unreadable answers before a prompt counts as a rejection
OUTPUT_LOG_CHARS = 1000               # approver output kept in the log

Action = Literal["forward", "deny", "approve", "policy"]


# ---------------------------------------------------------------------------------------------
# Configuration: the [gates] table of ftl.toml


def _check_glob(pattern: str) -> str:
    """A glob with ThoughtGate's syntax: ``*``, ``?``, ``[...]``, ``[!...]``; no ``**``."""
    if not pattern:
        raise ValueError("a glob must not be empty")
    if "**" in pattern:
        raise ValueError(f"'**' is not supported (use '*', which also crosses '/'): {pattern!r}")
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            j = i + 1
            if pattern[j:j + 1] == "!":
                j += 1
            if pattern[j:j + 1] == "]":  # a ']' right after '[' or '[!' is a literal member
                j += 1
            end = pattern.find("]", j)
            if end < 0:
                raise ValueError(f"unclosed '[' in glob {pattern!r}")
            i = end
        i += 1
    return pattern


def _globs(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExposeConfig(_Strict):
    """``[gates.expose]``: which tools exist for callers (gate 1)."""

    include: list[str] = Field(default_factory=lambda: ["*"],
                               description="Globs of exposed tool names (default: every tool).")
    exclude: list[str] = Field(default_factory=list,
                               description="Globs of hidden tool names; beat include.")

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _globs(value)

    @field_validator("include", "exclude")
    @classmethod
    def _valid(cls, value: list[str]) -> list[str]:
        return [_check_glob(p) for p in value]


class RuleMatch(_Strict):
    """What a governance rule applies to: globs of tool names and of call sources."""

    tool: list[str] = Field(default_factory=lambda: ["*"])
    source: list[str] = Field(default_factory=lambda: ["*"],
                              description="Surface of the call: 'manglecp' or 'mcp'.")

    @field_validator("tool", "source", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _globs(value)

    @field_validator("tool", "source")
    @classmethod
    def _valid(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("give at least one glob")
        return [_check_glob(p) for p in value]

    def matches(self, tool: str, source: str) -> bool:
        # Source first, as ThoughtGate skips a rule whose source filter does not apply.
        return (any(fnmatch.fnmatchcase(source, p) for p in self.source)
                and any(fnmatch.fnmatchcase(tool, p) for p in self.tool))


class GovernanceRule(_Strict):
    match: RuleMatch = Field(default_factory=RuleMatch)
    action: Action
    description: str | None = Field(None, description="Free text for people; unused at runtime.")


class GovernanceConfig(_Strict):
    """``[gates.governance]``: ordered rules, first match wins (gate 2)."""

    default: Action = "forward"
    rules: list[GovernanceRule] = Field(default_factory=list)


class PolicyConfig(_Strict):
    """``[gates.policy]``: Cedar policy files, paths relative to the repository (gate 3)."""

    files: list[str] = Field(min_length=1, description="Cedar policy files (.cedar).")
    schema_file: str | None = Field(None, alias="schema",
                                    description="Cedar schema (.cedarschema text or JSON).")
    entities: str | None = Field(None, description="Cedar entities JSON file (list of entities).")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ApprovalConfig(_Strict):
    """``[gates.approval]``: the human decision (gate 4). Durations in s."""

    mode: Literal["prompt", "command", "file"] | None = Field(
        None, description="prompt (TTY only; falls back to command, then file), command or file.")
    command: list[str] | None = Field(
        None, min_length=1, description="argv; gets the call JSON on stdin; exit 0 approve, 1 reject.")
    file: str | None = Field(
        None, min_length=1, description="Decision file (JSON object: request_id -> approve|reject).")
    timeout_s: float = Field(600.0, ge=0, description="Wait for a decision, s (ThoughtGate: 10 m).")
    on_timeout: Literal["deny", "approve"] = "deny"
    poll_s: float = Field(1.0, gt=0, description="Decision-file poll interval, s.")

    @model_validator(mode="after")
    def _workflow(self) -> "ApprovalConfig":
        if self.mode == "command" and not self.command:
            raise ValueError("mode 'command' needs command (an argv list)")
        if self.mode == "file" and not self.file:
            raise ValueError("mode 'file' needs file (a path relative to the repository)")
        if self.mode is None and (self.command or self.file):
            raise ValueError("set mode ('prompt', 'command' or 'file') to use command or file")
        return self


class GatesConfig(_Strict):
    """The whole ``[gates]`` table. Every key is optional; an empty table lets everything through."""

    expose: ExposeConfig = Field(default_factory=ExposeConfig)
    governance: GovernanceConfig = Field(default_factory=GovernanceConfig)
    policy: PolicyConfig | None = None
    approval: ApprovalConfig = Field(default_factory=ApprovalConfig)

    @model_validator(mode="after")
    def _policy_needed(self) -> "GatesConfig":
        routes = [self.governance.default] + [r.action for r in self.governance.rules]
        if "policy" in routes and self.policy is None:
            raise ValueError("a governance action is 'policy' but [gates.policy] gives no files")
        return self


def _config_error(problem: str, violations: list[dict[str, str]]) -> FtlError:
    return FtlError("configuration_error", {"problem": problem, "violations": violations})


def parse_gates(gates: Mapping[str, Any]) -> GatesConfig:
    """Validate the ``[gates]`` table.

    Raises:
        FtlError(configuration_error): details.violations lists every bad field as
            ``{"path": "gates.<dotted path>", "message"}``.
    """
    try:
        return GatesConfig.model_validate(dict(gates))
    except ValidationError as exc:
        violations = [{"path": ".".join(["gates", *map(str, e["loc"])]).rstrip("."),
                       "message": e["msg"]} for e in exc.errors(include_url=False)]
        raise _config_error(f"{len(violations)} invalid field(s) in [gates]", violations) from None


# ---------------------------------------------------------------------------------------------
# The call and the decision


@dataclass(frozen=True)
class _Call:
    tool: str
    args: dict[str, Any]
    side_effects: tuple[str, ...]
    principal: str
    source: str
    context: dict[str, Any]

    @classmethod
    def parse(cls, call: Mapping[str, Any]) -> "_Call":
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
        """Deterministic id of this call (same call, same id), for decision files and the log."""
        canonical = json.dumps({"tool": self.tool, "args": self.args, "principal": self.principal,
                                "source": self.source}, sort_keys=True, separators=(",", ":"),
                               default=str)
        return "apr-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


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


# ---------------------------------------------------------------------------------------------
# Gate 3: Cedar


@dataclass(frozen=True)
class PolicyVerdict:
    allowed: bool
    decision: str
    policy_ids: tuple[str, ...]
    approval_required: bool
    errors: tuple[str, ...]


class CedarPolicies:
    """A loaded, immutable Cedar policy snapshot (one per `Gatekeeper`; no hot reload)."""

    def __init__(self, config: PolicyConfig, repo: Path) -> None:
        """Read and check every file.

        Raises:
            FtlError(configuration_error): a file is missing or unreadable, a policy does not
                parse, the schema or entities do not parse, the policies fail schema
                validation, or an ``@approval`` annotation is not ``"required"``
                (ThoughtGate EC-POL: fail at load, never at the first call).
        """
        import cedarpy

        self._cedarpy = cedarpy
        violations: list[dict[str, str]] = []
        texts: list[str] = []
        for index, name in enumerate(config.files):
            where = f"gates.policy.files.{index}"
            text = _read(repo, name, where, violations)
            if text is None:
                continue
            try:
                cedarpy.PolicySet.from_str(text)
            except ValueError as exc:
                violations.append({"path": where, "message": f"{name}: Cedar syntax error: {exc}"})
                continue
            texts.append(text)
        schema = None
        if config.schema_file is not None:
            text = _read(repo, config.schema_file, "gates.policy.schema", violations)
            if text is not None:
                try:
                    schema = (cedarpy.Schema.from_json_str(text) if text.lstrip().startswith("{")
                              else cedarpy.Schema.from_str(text))
                except ValueError as exc:
                    violations.append({"path": "gates.policy.schema",
                                       "message": f"{config.schema_file}: {exc}"})
        entities: Any = []
        if config.entities is not None:
            text = _read(repo, config.entities, "gates.policy.entities", violations)
            if text is not None:
                try:
                    entities = cedarpy.Entities.from_json_str(text, schema=schema)
                except ValueError as exc:
                    violations.append({"path": "gates.policy.entities",
                                       "message": f"{config.entities}: {exc}"})
        joined = "\n".join(texts)
        if schema is not None and not violations:
            result = cedarpy.validate_policies(joined, schema)
            if not result.validation_passed:
                violations += [{"path": "gates.policy.files", "message": f"schema validation: {e}"}
                               for e in result.errors]
        annotations: dict[str, dict[str, str]] = {}
        if not violations:
            static = json.loads(cedarpy.policies_to_json_str(joined)).get("staticPolicies", {})
            annotations = {pid: dict(p.get("annotations") or {}) for pid, p in static.items()}
            for pid, notes in annotations.items():
                value = notes.get(APPROVAL_ANNOTATION)
                if value is not None and value != "required":
                    violations.append({"path": "gates.policy.files", "message": (
                        f"policy {notes.get('id', pid)}: @approval must be \"required\", got {value!r}")})
        if violations:
            raise _config_error("the Cedar policies cannot be loaded", violations)
        self._policies = cedarpy.PolicySet.from_str(joined)
        self._schema = schema
        self._entities = entities
        self._annotations = annotations

    def evaluate(self, principal: str, tool: str, context: Mapping[str, Any]) -> PolicyVerdict:
        """Cedar's answer for ``Agent::principal`` invoking ``Tool::tool`` (fail closed)."""
        cedarpy = self._cedarpy
        request = {"principal": {"type": "Agent", "id": principal},
                   "action": {"type": "Action", "id": "invoke"},
                   "resource": {"type": "Tool", "id": tool}, "context": dict(context)}
        try:
            result = cedarpy.is_authorized(request, self._policies, self._entities, self._schema)
        except Exception as exc:  # a binding failure must deny, not crash the server
            return PolicyVerdict(False, "error", (), False, (f"{type(exc).__name__}: {exc}",))
        reasons = tuple(result.diagnostics.reasons)
        errors = tuple(str(e) for e in result.diagnostics.errors)
        ids = tuple(self._annotations.get(r, {}).get("id", r) for r in reasons)
        allowed = result.decision == cedarpy.Decision.Allow and not errors
        approval = allowed and any(
            self._annotations.get(r, {}).get(APPROVAL_ANNOTATION) == "required" for r in reasons)
        return PolicyVerdict(allowed, result.decision.name, ids, approval, errors)


def _resolve(repo: Path, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() else repo / path


def _read(repo: Path, name: str, where: str, violations: list[dict[str, str]]) -> str | None:
    try:
        return _resolve(repo, name).read_text(encoding="utf-8")
    except OSError as exc:
        violations.append({"path": where, "message": f"cannot read {name}: {exc.strerror or exc}"})
        return None


# ---------------------------------------------------------------------------------------------
# Gate 4: approval workflows


Answer = Literal["approve", "reject", "timeout"]


class PromptIO(Protocol):
    """An interactive channel to a person (a TTY; tests pass a fake)."""

    def ask(self, question: str, timeout_s: float) -> str | None:
        """Show ``question``; return the answer line, or None when ``timeout_s`` passed."""


class TtyPrompt:
    """`PromptIO` on the controlling terminal (``/dev/tty``), so it works even when stdin and
    stdout carry a protocol (the stdio MangleCP server)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls) -> "TtyPrompt | None":
        """The controlling terminal, or None when there is none (CI, daemons, pipes)."""
        try:
            fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return None
        if not os.isatty(fd):
            os.close(fd)
            return None
        return cls(fd)

    def ask(self, question: str, timeout_s: float) -> str | None:
        os.write(self._fd, question.encode("utf-8", "replace"))
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        if not ready:
            os.write(self._fd, b"\n")
            return None
        return os.read(self._fd, 4096).decode("utf-8", "replace").strip()

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class _Request:
    request_id: str
    call: _Call
    context: dict[str, Any]

    def payload(self) -> dict[str, Any]:
        """The JSON an approver sees: the call, its Cedar context and the request id."""
        return {"request_id": self.request_id, "tool": self.call.tool, "args": self.call.args,
                "side_effects": list(self.call.side_effects), "principal": self.call.principal,
                "source": self.call.source, "context": self.context}


class _Approver(Protocol):
    name: str

    def decide(self, request: _Request, timeout_s: float) -> tuple[Answer, str]: ...


@dataclass
class _CommandApprover:
    """Runs the approval command with the call JSON on stdin (real time: it is a real process)."""

    argv: list[str]
    repo: Path
    name: str = "command"

    def decide(self, request: _Request, timeout_s: float) -> tuple[Answer, str]:
        payload = json.dumps(request.payload(), sort_keys=True, default=str)
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=self.repo, text=True,
                                    start_new_session=True)
        except OSError as exc:
            log.error("approval command %s could not start: %s", self.argv[0], exc)
            return "reject", "command"
        try:
            out, err = proc.communicate(payload, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return "timeout", "command"
        tail = (out + err)[-OUTPUT_LOG_CHARS:]
        if proc.returncode == 0:
            log.info("approval %s approved by command: %s", request.request_id, tail.strip())
            return "approve", "command"
        if proc.returncode != 1:  # fail closed: a crash is not an approval
            log.error("approval command exited %s for %s (treated as a rejection): %s",
                      proc.returncode, request.request_id, tail.strip())
        return "reject", "command"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.communicate()


@dataclass
class _FileApprover:
    """Writes the pending request to ``<file>.pending/<request_id>.json`` and polls ``file``
    (a JSON object ``{request_id: "approve" | "reject" | {"decision", "by"}}``)."""

    path: Path
    poll_s: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    name: str = "file"

    def decide(self, request: _Request, timeout_s: float) -> tuple[Answer, str]:
        pending = self.path.parent / f"{self.path.name}.pending" / f"{request.request_id}.json"
        try:
            pending.parent.mkdir(parents=True, exist_ok=True)
            pending.write_text(json.dumps(request.payload(), sort_keys=True, indent=2, default=str),
                               encoding="utf-8")
        except OSError as exc:
            log.warning("approval request %s not written to %s: %s", request.request_id, pending, exc)
        deadline = self.clock() + timeout_s
        try:
            while True:
                answer = self._read(request.request_id)
                if answer is not None:
                    return answer
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return "timeout", "file"
                self.sleep(min(self.poll_s, remaining))
        finally:
            pending.unlink(missing_ok=True)

    def _read(self, request_id: str) -> tuple[Answer, str] | None:
        try:
            decisions = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # not written yet, or caught half-written: poll again
        entry = decisions.get(request_id) if isinstance(decisions, dict) else None
        if entry is None:
            return None
        decision, by = (entry.get("decision"), entry.get("by")) if isinstance(entry, dict) else (entry, None)
        label = f"file:{by}" if by else "file"
        if decision == "approve":
            return "approve", label
        if decision != "reject":
            log.error("approval %s: unknown decision %r in %s (treated as a rejection)",
                      request_id, decision, self.path)
        return "reject", label


@dataclass
class _PromptApprover:
    io: PromptIO
    clock: Callable[[], float]
    lock: threading.Lock
    name: str = "prompt"

    def decide(self, request: _Request, timeout_s: float) -> tuple[Answer, str]:
        deadline = self.clock() + timeout_s
        # One question at a time on a terminal; the wait for the turn counts against the timeout.
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            return "timeout", "prompt"
        try:
            ctx = request.context
            question = (f"\nftl approval {request.request_id}: {request.call.tool}"
                        f" (task {ctx.get('seq') or '-'}, files {', '.join(ctx.get('files') or []) or '-'},"
                        f" side effects {', '.join(request.call.side_effects) or '-'})\nApprove? [y/n] ")
            for _ in range(MAX_PROMPT_ATTEMPTS):
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return "timeout", "prompt"
                answer = self.io.ask(question, remaining)
                if answer is None:
                    return "timeout", "prompt"
                word = answer.strip().lower()
                if word in ("y", "yes", "approve"):
                    return "approve", "prompt"
                if word in ("n", "no", "reject"):
                    return "reject", "prompt"
                question = "Please answer y or n: "
            return "reject", "prompt"
        finally:
            self.lock.release()


# ---------------------------------------------------------------------------------------------
# The gatekeeper


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
            count: count each decision in `ftl.metrics` (``ftl_gate_decisions_total``,
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
            command = _resolve_command(config.approval.command, repo)
        routes = [config.governance.default] + [r.action for r in config.governance.rules]
        needs_approval = "approve" in routes
        if needs_approval and config.approval.mode is None:
            log.warning("[gates] routes calls to approval but [gates.approval] sets no mode; "
                        "those calls will fail with approval_not_found")
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
        c = _Call.parse(call)
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
        request = _Request(c.request_id(), c, context)
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

    def _approver(self) -> _Approver | None:
        """The workflow to use now: prompt only with a TTY, else command, else file."""
        approval = self.config.approval
        file = _FileApprover(_resolve(self.repo, approval.file), approval.poll_s, self.clock,
                             self.sleep) if approval.file else None
        command = _CommandApprover(self.command_argv, self.repo) if self.command_argv else None
        if approval.mode == "prompt":
            io = self.prompt_io if self.prompt_io is not None else TtyPrompt.open()
            if io is not None:
                return _PromptApprover(io, self.clock, self._prompt_lock)
            return command or file
        if approval.mode == "command":
            return command
        if approval.mode == "file":
            return file
        return None

    def _ask(self, request: _Request) -> tuple[Answer, str]:
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
            if isinstance(approver, _PromptApprover) and approver.io is not self.prompt_io:
                close = getattr(approver.io, "close", None)
                if close:
                    close()

    def _refuse(self, error_type: str, gate: str, call: _Call, *, level: int = logging.WARNING,
                **why: Any) -> NoReturn:
        # Everything about the refusal goes to the log; the caller learns the tool and the gate.
        log.log(level, "gate %s refused %s (principal %s, source %s): %s", gate, call.tool,
                call.principal, call.source, json.dumps(why, sort_keys=True, default=str))
        text = kind(error_type).message.format(tool=call.tool).rstrip(".")
        raise FtlError(error_type, {"tool": call.tool, "gate": gate}, message=f"{text} ({gate} gate).")


def _resolve_command(argv: list[str], repo: Path) -> list[str]:
    """argv with argv[0] resolved: a path (with '/') against ``repo``, a bare name on PATH."""
    program = argv[0]
    if "/" in program:
        path = _resolve(repo, program)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise _config_error("the approval command cannot be run", [
                {"path": "gates.approval.command.0", "message": f"{program}: not an executable file"}])
        return [str(path), *argv[1:]]
    found = shutil.which(program)
    if found is None:
        raise _config_error("the approval command cannot be run", [
            {"path": "gates.approval.command.0", "message": f"{program}: not found on PATH"}])
    return [found, *argv[1:]]


def refusal_outcome(error_type: str) -> str:
    """The ``outcome`` label of a refusal of kind ``error_type``: ``timeout`` for an approval
    that never came, ``deny`` for every other refusal."""
    return "timeout" if error_type == "approval_timeout" else "deny"


def _count_gate(gate: str, outcome: str, *, reason: str | None = None) -> None:
    """``ftl_gate_decisions_total{gate, outcome}`` and, for a refusal (``reason``: its error
    kind), ``ftl_gate_denials_total{gate, reason}``; metrics never stop a gate decision."""
    try:
        from ftl.metrics import count_gate, count_gate_denial
        count_gate(gate, outcome)
        if reason is not None:
            count_gate_denial(gate, reason)
    except Exception:  # noqa: BLE001
        log.debug("gate metric not counted", exc_info=True)
