"""MangleCP client: manifest handling, fact validation, intent evaluation, invocation, retries.

`ManglecpClient` wraps a `Transport`. It waits for the manifest (and for a ``booting`` server to
become ready), gives every request a fresh unique id, checks facts against the manifest's
``facts_profile`` before sending (conformance C-4), clamps constraints to the server's limits,
retries ``rate_limited`` / ``server_not_ready`` as MangleCP spec 09 §7 requires (wait at least
``retry_after_ms``, exponential backoff, at most 5 retries, never a ``recoverable: false`` error),
re-evaluates on ``macro_not_found`` / ``macro_expired`` in `ManglecpClient.invoke_tool`, and
raises every failure as an `FtlError` (`ftl.manglecp.messages.to_ftl_error`), so the runner's
recovery sees one vocabulary. Safe to use from several threads at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Sequence

from pydantic import BaseModel, ValidationError

from ftl.errors import FtlError
from ftl.ids import unique_hex
from ftl.manglecp.facts import validate_facts
from ftl.manglecp.messages import (
    Constraints, Fact, IntentResponse, InvokeResponse, Manifest, Progress, envelope, retry_hint_ms,
    to_ftl_error)
from ftl.manglecp.transport import Transport

RETRYABLE_CODES = frozenset({"rate_limited", "server_not_ready"})
REEVALUATE_CODES = frozenset({"macro_not_found", "macro_expired"})
MAX_RETRIES = 5  # spec 09 §7: never more


class ManglecpClient:
    """A thread-safe MangleCP client.

    Args:
        transport: the connection (`InProcessTransport`, `StdioTransport`, `HttpTransport`).
        sleep: ``sleep(seconds)``; injected in tests.
        max_retries: retries per request for retryable errors (capped at 5, spec 09 §7).
        backoff_base_ms, backoff_max_ms: exponential backoff, ms: ``base * 2**attempt`` capped,
            and never less than the server's ``retry_after_ms`` (a hint that is not a
            non-negative number is ignored; a larger one is capped at ``backoff_max_ms``, also
            in the raised error's ``retry_after_ms``).
        boot_timeout_s: how long to wait (in slept seconds) for a ``booting`` server.
        request_timeout_s: wait for one reply, s (None: no limit).
    """

    def __init__(self, transport: Transport, *, sleep: Callable[[float], None] = time.sleep,
                 max_retries: int = MAX_RETRIES, backoff_base_ms: int = 200,
                 backoff_max_ms: int = 30_000, boot_timeout_s: float = 60.0,
                 request_timeout_s: float | None = None) -> None:
        self.transport = transport
        self._sleep = sleep
        self.max_retries = max(0, min(MAX_RETRIES, max_retries))
        self.backoff_base_ms = backoff_base_ms
        self.backoff_max_ms = backoff_max_ms
        self.boot_timeout_s = boot_timeout_s
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._parsed_manifest: tuple[Mapping[str, Any], Manifest] | None = None

    # -- manifest ------------------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The newest manifest payload (waits for the first one).

        Raises:
            FtlError(network_error): no manifest; FtlError(invalid_request): not a valid manifest.
        """
        return self._parse_manifest(self.transport.manifest())

    def _parse_manifest(self, message: Mapping[str, Any]) -> Manifest:
        """``message``'s payload as a `Manifest`, validated once per manifest object (every
        request checks readiness; transports hand out the same object until a new one arrives)."""
        parsed = self._parsed_manifest
        if parsed is not None and parsed[0] is message:
            return parsed[1]
        manifest = self._validate_manifest(message)
        self._parsed_manifest = (message, manifest)
        return manifest

    @staticmethod
    def _validate_manifest(message: Mapping[str, Any]) -> Manifest:
        try:
            return Manifest.model_validate(message.get("payload", {}))
        except ValidationError as exc:
            raise FtlError("invalid_request", {"violations": [
                {"path": "/" + "/".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()]},
                message="The server's manifest is not valid.") from None

    def wait_ready(self) -> Manifest:
        """Return the manifest once the server is ``ready`` or ``degraded``.

        While it is ``booting`` or ``draining`` the client sends nothing (conformance C-3): it
        waits for a pushed manifest (session transports) or sleeps with backoff and re-reads it.

        Raises:
            FtlError(server_not_ready): still not ready after ``boot_timeout_s``.
        """
        raw = self.transport.manifest()
        manifest = self._parse_manifest(raw)
        slept, attempt = 0.0, 0
        while manifest.status in ("booting", "draining"):
            if slept >= self.boot_timeout_s:
                raise FtlError("server_not_ready", {"status": manifest.status},
                               retry_after_ms=int(self._backoff_ms(attempt)))
            delay = min(self._backoff_ms(attempt) / 1000, max(0.001, self.boot_timeout_s - slept))
            if self.transport.supports_push:
                self.transport.wait_manifest(raw, delay)
            else:
                self._sleep(delay)
            slept += delay
            attempt += 1
            raw = self.transport.manifest(refresh=True)
            manifest = self._parse_manifest(raw)
        return manifest

    # -- requests ------------------------------------------------------------------------------

    @staticmethod
    def new_id() -> str:
        """A unique, non-empty request id (conformance C-2)."""
        return "c-" + unique_hex(32)

    def _backoff_ms(self, attempt: int) -> float:
        return min(self.backoff_max_ms, self.backoff_base_ms * (2 ** attempt))

    def _call(self, message_type: str, payload: Mapping[str, Any], expected: str, *,
              cancel: threading.Event | None = None,
              on_message: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Send with retries; return the final reply payload of type ``expected``."""
        attempt = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise FtlError("cancelled", {}, message="The request was cancelled before it was sent.")
            self.wait_ready()
            message = envelope(message_type, self.new_id(), payload)  # a retry is a new request
            reply = self.transport.request(message, on_message=on_message, cancel=cancel,
                                           timeout_s=self.request_timeout_s)
            if reply.get("type") == expected:
                body = reply.get("payload")
                if not isinstance(body, dict):
                    raise FtlError("invalid_request", {}, message=f"The server's {expected} has no payload.")
                return body
            if reply.get("type") != "error" or not isinstance(reply.get("payload"), dict):
                raise FtlError("invalid_request", {},
                               message=f"The server answered {reply.get('type')!r} to a {message_type}.")
            error = dict(reply["payload"])
            # A server's hint is honoured up to backoff_max_ms: a bad one ("soon", 1e400) is no
            # hint, a huge one (1e12 ms) must not park a worker for years.
            hint_ms = retry_hint_ms(error.get("retry_after_ms"))
            if hint_ms is not None:
                hint_ms = min(hint_ms, self.backoff_max_ms)
            error["retry_after_ms"] = hint_ms
            if (error.get("code") in RETRYABLE_CODES and error.get("recoverable") is True
                    and attempt < self.max_retries):
                self._sleep(max(hint_ms or 0, self._backoff_ms(attempt)) / 1000)
                attempt += 1
                continue
            raise to_ftl_error(error)

    @staticmethod
    def _as_dict(item: Any) -> Any:
        if isinstance(item, BaseModel):
            return item.model_dump(mode="json", by_alias=True, exclude_none=True)
        return item

    def _check_facts(self, facts: Sequence[Any], manifest: Manifest) -> list[Any]:
        wire = [self._as_dict(f) for f in facts]
        _, violations = validate_facts(wire, manifest.facts_profile)
        if violations:
            raise FtlError("invalid_facts", {"count": len(violations), "violations": violations})
        limit = manifest.limits.max_facts_per_request
        if len(wire) > limit:
            raise FtlError("too_many_facts", {"count": len(wire), "limit": limit})
        return wire

    def evaluate(self, intent: str, facts: Sequence[Fact | Mapping[str, Any]], *,
                 params: Mapping[str, Any] | None = None, disclosure: str = "full",
                 constraints: Constraints | Mapping[str, Any] | None = None,
                 eval_time: str | int | None = None,
                 include_proof_hints: bool = False, rule_coverage: bool = False) -> IntentResponse:
        """Ask which macro-tools serve ``intent`` given ``facts`` (spec 05).

        Args:
            intent: intent name (see the manifest's ``intents``).
            facts: wire facts (``{"pred", "args"}`` dicts or `Fact` models); checked against
                the manifest's facts_profile before sending.
            params: intent parameters (not tool args).
            disclosure: ``full`` | ``condensed`` | ``minimal`` | ``adaptive``.
            constraints: client limits; values above the server's limits are clamped down.
            eval_time: RFC 3339 string or epoch ms; the server clock when None.
            include_proof_hints: ask for ``proof_hints`` (spec 09 §5).
            rule_coverage: ask for ``diagnostics.rule_coverage`` (``options["x-rule_coverage"]``;
                answered only by a server in dev mode).
        Returns:
            the `IntentResponse` (``macro_tools`` may be empty).
        Raises:
            FtlError: ``invalid_facts`` / ``too_many_facts`` before sending; otherwise the
                server's error mapped by `to_ftl_error` (``timeout``, ``derivation_limit_exceeded``,
                ``rate_limited`` after 5 retries...).
        """
        manifest = self.wait_ready()
        wire_facts = self._check_facts(facts, manifest)
        limits = manifest.limits
        merged = dict(self._as_dict(constraints) or {}) if constraints is not None else {}
        for key, server in (("max_facts_created", limits.max_derived_facts),
                            ("max_compute_ms", limits.max_compute_ms),
                            ("max_intervals_per_atom", limits.max_intervals_per_atom)):
            if merged.get(key) is not None and server is not None:
                merged[key] = min(int(merged[key]), server)
        payload: dict[str, Any] = {"intent": {"name": intent, "params": dict(params or {})},
                                   "facts": wire_facts,
                                   "options": {"disclosure_preference": disclosure,
                                               "include_proof_hints": include_proof_hints}}
        if rule_coverage:
            payload["options"]["x-rule_coverage"] = True
        if merged:
            payload["constraints"] = {k: v for k, v in merged.items() if v is not None}
        if eval_time is not None:
            payload["eval_time"] = eval_time
        body = self._call("intent_request", payload, "intent_response")
        try:
            return IntentResponse.model_validate(body)
        except ValidationError:
            raise FtlError("invalid_request", {}, message="The server's intent_response is not valid.") from None

    def invoke(self, macro_id: str, args: Mapping[str, Any], *, cancel: threading.Event | None = None,
               on_progress: Callable[[Progress], None] | None = None,
               confirmation_token: str | None = None) -> InvokeResponse:
        """Run a macro-tool returned by a recent `evaluate` (spec 07).

        Args:
            macro_id: the tool's ``macro_id``.
            args: tool arguments (validated by the server against ``input_schema``).
            cancel: set it to cancel (session transports send ``cancel``; over HTTP the client
                stops waiting). The call then raises ``FtlError(cancelled)`` unless the tool
                had already finished.
            on_progress: gets each `Progress` (session transports only).
            confirmation_token: a token from a ``confirmation_required`` error's details, sent
                once the user agreed. Never add it automatically.
        Returns:
            the `InvokeResponse` (``result`` is the tool's dict).
        Raises:
            FtlError: the server's error mapped by `to_ftl_error`. A tool's own `FtlError`
                comes back with its kind (``details.error_type``), e.g. ``verify_failed``.
        """
        payload: dict[str, Any] = {"macro_id": macro_id, "args": dict(args)}
        if confirmation_token:
            payload["confirmation_token"] = confirmation_token

        def relay(message: dict[str, Any]) -> None:
            if on_progress is None:
                return
            try:
                update = Progress.model_validate(message.get("payload", {}))
            except ValidationError:
                return
            on_progress(update)

        body = self._call("invoke_request", payload, "invoke_response", cancel=cancel, on_message=relay)
        try:
            return InvokeResponse.model_validate(body)
        except ValidationError:
            raise FtlError("invalid_request", {}, message="The server's invoke_response is not valid.") from None

    def invoke_tool(self, intent: str, facts: Sequence[Fact | Mapping[str, Any]], tool_name: str,
                    args: Mapping[str, Any], *, params: Mapping[str, Any] | None = None,
                    cancel: threading.Event | None = None,
                    on_progress: Callable[[Progress], None] | None = None,
                    confirmation_token: str | None = None, max_reevaluations: int = 2) -> InvokeResponse:
        """Evaluate ``intent``, pick the macro-tool called ``tool_name`` and invoke it.

        A ``macro_not_found`` / ``macro_expired`` reply triggers a fresh evaluation and one more
        invocation, at most ``max_reevaluations`` times (spec 09 §7).

        Raises:
            FtlError(tool_not_exposed): the evaluation did not return ``tool_name`` (its
                details list the tools that were offered); any error of `evaluate`/`invoke`.
        """
        rounds = 0
        while True:
            response = self.evaluate(intent, facts, params=params, disclosure="minimal")
            tool = response.tool(tool_name)
            if tool is None:
                raise FtlError("tool_not_exposed", {"tool": tool_name, "intent": intent,
                                                    "offered": [t.name for t in response.macro_tools]})
            try:
                return self.invoke(tool.macro_id, args, cancel=cancel, on_progress=on_progress,
                                   confirmation_token=confirmation_token)
            except FtlError as exc:
                if exc.details.get("manglecp_code") in REEVALUATE_CODES and rounds < max_reevaluations:
                    rounds += 1
                    continue
                raise

    def close(self) -> None:
        """Close the transport."""
        self.transport.close()

    def __enter__(self) -> "ManglecpClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
