"""Who may call a MangleCP server, over which connection, how often, and with whose consent.

`Principal` and `BearerAuth` (bearer-token authentication, MangleCP spec 08 §3.2, reference §7.2),
`Session` (one connection and its in-flight requests, so a ``cancel`` reaches them: spec 02
§5, reference §1.8), `TokenBucket` (the per-identity rate limit behind ``rate_limited``,
spec 09) and `ConfirmationTokens` (server-issued, single-use confirmation of side effects,
spec 08 §4, reference §7.3 and §11 item 24). The server applies them as layer-1 checks
(spec 08 §2.1) before anything reaches the evaluator or a tool.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ftl.manglecp.definitions import Clock, canonical_json


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    Attributes:
        identity: stable name (scopes the macro cache and the rate limit).
        permissions: intent names it may use; ``"*"`` means all.
        trust_level: ``"automated"`` allows confirmation bypass for ``auto_confirm_effects``.
        auto_confirm_effects: side effects confirmed without a token (only when automated).
    """

    identity: str
    permissions: frozenset[str] = frozenset({"*"})
    trust_level: str | None = None
    auto_confirm_effects: frozenset[str] = frozenset()

    def permits(self, intent: str) -> bool:
        return "*" in self.permissions or intent in self.permissions

    def auto_confirms(self, side_effects: Iterable[str]) -> bool:
        return self.trust_level == "automated" and set(side_effects) <= self.auto_confirm_effects


ANONYMOUS = Principal("anonymous")


class BearerAuth:
    """Bearer-token authentication (spec 08 §3.2): token -> `Principal`.

    Tokens are compared with `hmac.compare_digest`; they are never logged or echoed.
    """

    schemes = ("bearer",)

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        self._tokens = [(token.encode("utf-8"), principal) for token, principal in tokens.items()]

    def verify(self, token: str) -> Principal | None:
        """The principal for ``token``, or None when no configured token matches."""
        given = token.encode("utf-8")
        found = None
        for known, principal in self._tokens:  # no early exit: same work for every token
            if hmac.compare_digest(given, known):
                found = principal
        return found


class Session:
    """One client connection (stdio, WebSocket, in-process) or one HTTP request.

    Attributes:
        key: scope of the macro cache; defaults to the principal's identity.
        credentials: bearer token from an HTTP ``Authorization`` header (None on sessions,
            which authenticate with an ``authenticate`` message).
        principal: set by ``authenticate`` on session transports.
    """

    def __init__(self, key: str | None = None, credentials: str | None = None) -> None:
        self.key = key
        self.credentials = credentials
        self.principal: Principal | None = None
        self._running: dict[str, threading.Event] = {}
        self._given: dict[str, threading.Event] = {}  # the caller's own cancel events (in process)
        self._lock = threading.Lock()

    def give_cancel(self, request_id: str, event: threading.Event | None) -> None:
        """In process only: ``event`` (the caller's) is the cancel flag of request
        ``request_id``'s invocation, so a cancel needs no message and no relay thread. None
        forgets it (after the request). `cancel_all` never sets a caller's event."""
        with self._lock:
            if event is None:
                self._given.pop(request_id, None)
            else:
                self._given[request_id] = event

    def claim_cancel_flag(self, request_id: str) -> threading.Event:
        """The cancel flag for a new invocation: the caller's (`give_cancel`), else a new one."""
        with self._lock:
            return self._given.pop(request_id, None) or threading.Event()

    def track_running(self, request_id: str, event: threading.Event) -> None:
        """Record ``event`` as the cancel flag of the running request ``request_id`` (so
        `cancel` and `cancel_all` reach it) until `untrack_running`."""
        with self._lock:
            self._running[request_id] = event

    def untrack_running(self, request_id: str) -> None:
        """Forget request ``request_id`` once it finished (no-op when it is not tracked)."""
        with self._lock:
            self._running.pop(request_id, None)

    def cancel(self, request_id: str) -> bool:
        """Signal the running request ``request_id``; False when it is not running."""
        with self._lock:
            event = self._running.get(request_id)
        if event is None:
            return False
        event.set()
        return True

    def cancel_all(self) -> None:
        """Signal every running request (transport closed, e.g. stdin EOF)."""
        with self._lock:
            given = {id(event) for event in self._given.values()}
            events = [event for event in self._running.values() if id(event) not in given]
        for event in events:
            event.set()

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)


class TokenBucket:
    """Rate limiter: ``rate_per_s`` tokens per second, at most ``burst`` stored.

    `take` returns None when a token was available, else the wait in ms until one is.
    """

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate_per_s, burst
        self.tokens, self.stamp = float(burst), now

    def take(self, now: float) -> int | None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - self.tokens) / self.rate * 1000))


class ConfirmationTokens:
    """Server-issued confirmation tokens (reference §7.3 / §11 item 24).

    A token is ``base64url(json{m, i, a, t, n}) + "." + hex(hmac_sha256(secret, body))``: bound to
    the macro id (m), the identity (i) and a digest of the exact args (a), issued at t (ms),
    single use (nonce n), valid ``ttl_s``.
    """

    def __init__(self, secret: bytes, ttl_s: float, clock: Clock) -> None:
        self._secret, self._ttl_s, self._clock = secret, ttl_s, clock
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _digest(args: Mapping[str, Any]) -> str:
        return hashlib.sha256(canonical_json(args).encode("utf-8")).hexdigest()[:32]

    def issue(self, macro_id: str, identity: str, args: Mapping[str, Any]) -> str:
        body = canonical_json({"m": macro_id, "i": identity, "a": self._digest(args),
                               "t": int(self._clock.time() * 1000), "n": uuid.uuid4().hex})
        encoded = base64.urlsafe_b64encode(body.encode("utf-8")).decode("ascii").rstrip("=")
        return encoded + "." + hmac.new(self._secret, encoded.encode("ascii"), "sha256").hexdigest()

    def redeem(self, token: str, macro_id: str, identity: str, args: Mapping[str, Any]) -> str | None:
        """Consume ``token``; return None when valid, else the reason it is not."""
        encoded, _, mac = token.partition(".")
        expected = hmac.new(self._secret, encoded.encode("ascii", "replace"), "sha256").hexdigest()
        if not mac or not hmac.compare_digest(mac.encode("ascii", "replace"), expected.encode("ascii")):
            return "the token was not issued by this server"
        try:
            body = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except ValueError:
            return "the token is unreadable"
        if body.get("m") != macro_id or body.get("i") != identity:
            return "the token was issued for another macro-tool or caller"
        if body.get("a") != self._digest(args):
            return "the token was issued for different args"
        now = self._clock.time()
        if now * 1000 - body.get("t", 0) > self._ttl_s * 1000:
            return "the token has expired"
        with self._lock:
            for nonce, until in list(self._used.items()):
                if until < now:
                    del self._used[nonce]
            if body.get("n") in self._used:
                return "the token was already used"
            self._used[body.get("n")] = now + self._ttl_s
        return None
