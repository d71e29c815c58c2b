"""The ``[gates]`` table of ftl.toml as validated models: expose, governance, policy, approval.

Globs follow ThoughtGate's syntax (``shared/reference/errors-and-gates.md`` §1); every bad field
is reported at load (`parse_gates`), never at the first call.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ftl.errors import FtlError

Action = Literal["forward", "deny", "approve", "policy"]
# The longest approval wait, s: a week. Past about 1e9 s the waits themselves fail (a select or
# lock timeout overflows), and a call left pending longer than a week is a misconfiguration.
APPROVAL_TIMEOUT_MAX_S = 7 * 24 * 3600.0


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
    timeout_s: float = Field(600.0, ge=0, le=APPROVAL_TIMEOUT_MAX_S, allow_inf_nan=False,
                             description="Wait for a decision, s (ThoughtGate: 10 m); at most a week.")
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


def config_error(problem: str, violations: list[dict[str, str]]) -> FtlError:
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
        raise config_error(f"{len(violations)} invalid field(s) in [gates]", violations) from None


def resolve_path(repo: Path, name: str) -> Path:
    """``name`` as a path: absolute as given, relative against ``repo`` (how [gates] paths resolve)."""
    path = Path(name)
    return path if path.is_absolute() else repo / path
