"""Gate 3: Cedar policies (cedarpy), loaded and checked once, evaluated per call, fail closed.

Request shape: principal ``Agent::"<principal>"``, action ``Action::"invoke"``, resource
``Tool::"<name>"``, the context of `ftl.gate.call.Call.cedar_context` (see `ftl.gate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ftl.gate.config import PolicyConfig, config_error, resolve_path

APPROVAL_ANNOTATION = "approval"


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
            raise config_error("the Cedar policies cannot be loaded", violations)
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


def _read(repo: Path, name: str, where: str, violations: list[dict[str, str]]) -> str | None:
    try:
        return resolve_path(repo, name).read_text(encoding="utf-8")
    except OSError as exc:
        violations.append({"path": where, "message": f"cannot read {name}: {exc.strerror or exc}"})
        return None
