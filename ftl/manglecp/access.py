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
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

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

    A ``cancel`` may arrive before its request is tracked: while the request waits in the stdio
    queue, is validated, or waits at the gate for an approval. The session remembers such
    cancels (at most `EARLY_CANCEL_LIMIT` ids, each for `EARLY_CANCEL_TTL_S`), and the request
    starts cancelled when it gets there; after `cancel_all` (the transport closed) every request
    that gets there starts cancelled (MangleCP spec 02 §6.2: a cancelled request ends in
    ``cancelled`` or its normal response, never runs on unasked).

    Args:
        key: scope of the macro cache; defaults to the principal's identity.
        credentials: bearer token from an HTTP ``Authorization`` header (None on sessions,
            which authenticate with an ``authenticate`` message).
        clock: monotonic seconds, for the early-cancel TTL; injected in tests.
    Attributes:
        principal: set by ``authenticate`` on session transports.
    """

    EARLY_CANCEL_LIMIT = 1024
    EARLY_CANCEL_TTL_S = 3600.0  # outlives an approval wait at the gate

    def __init__(self, key: str | None = None, credentials: str | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.key = key
        self.credentials = credentials
        self.principal: Principal | None = None
        self._clock = clock
        self._running: dict[str, threading.Event] = {}
        self._given: dict[str, threading.Event] = {}  # the caller's own cancel events (in process)
        self._owned: set[str] = set()  # running requests whose flag is a caller's own event
        self._early: OrderedDict[str, float] = OrderedDict()  # request id -> when its cancel came, s
        self._closed = False  # cancel_all ran: nothing starts any more
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

    def _take_early(self, request_id: str) -> bool:
        """Whether a cancel for ``request_id`` came early (and forget it). Caller holds the lock."""
        now = self._clock()
        while self._early and next(iter(self._early.values())) < now - self.EARLY_CANCEL_TTL_S:
            self._early.popitem(last=False)
        return self._early.pop(request_id, None) is not None

    def cancel_pending(self, request_id: str) -> bool:
        """Whether request ``request_id`` would start cancelled (a cancel came early, or the
        session is closed), without consuming the cancel: lets the server skip work such as a
        gate's approval wait."""
        with self._lock:
            came_s = self._early.get(request_id)
            return self._closed or (came_s is not None
                                    and came_s >= self._clock() - self.EARLY_CANCEL_TTL_S)

    def _remember(self, request_id: str) -> bool:
        """Remember an early cancel for ``request_id`` (oldest dropped past the limit). Caller
        holds the lock. Returns True."""
        self._early[request_id] = self._clock()
        self._early.move_to_end(request_id)
        while len(self._early) > self.EARLY_CANCEL_LIMIT:
            self._early.popitem(last=False)
        return True

    def claim_cancel_flag(self, request_id: str) -> threading.Event:
        """The cancel flag for a new invocation: the caller's (`give_cancel`), else a new one.
        Already set when a cancel for ``request_id`` came early or the session is closed (a
        fresh event then: the caller's own is never set here)."""
        with self._lock:
            given = self._given.pop(request_id, None)
            cancelled = self._take_early(request_id) or self._closed
            if given is not None and not cancelled:
                self._owned.add(request_id)  # `track_running` / `cancel_all` must not set it
        if cancelled:
            flag = threading.Event()
            flag.set()
            return flag
        return given or threading.Event()

    def track_running(self, request_id: str, event: threading.Event) -> None:
        """Record ``event`` as the cancel flag of the running request ``request_id`` (so
        `cancel` and `cancel_all` reach it) until `untrack_running`. It is set at once when a
        cancel for ``request_id`` came early or the session is closed, unless it is the caller's
        own (`give_cancel`)."""
        with self._lock:
            self._running[request_id] = event
            cancelled = self._take_early(request_id) or self._closed
            owned = request_id in self._owned
        if cancelled and not owned:
            event.set()

    def untrack_running(self, request_id: str) -> None:
        """Forget request ``request_id`` once it finished (no-op when it is not tracked)."""
        with self._lock:
            self._running.pop(request_id, None)
            self._owned.discard(request_id)

    def cancel(self, request_id: str) -> bool:
        """Signal the running request ``request_id``. When it is not running (yet), remember the
        cancel so the request starts cancelled if it comes (see the class doc).

        Returns:
            True when a running request was signalled, False when the cancel was remembered.
        """
        with self._lock:
            event = self._running.get(request_id)
            if event is None:
                self._remember(request_id)
                return False
        event.set()
        return True

    def cancel_all(self) -> None:
        """Signal every running request and close the session: a request that starts later
        starts cancelled (transport closed, e.g. stdin EOF with requests still queued)."""
        with self._lock:
            self._closed = True
            events = [event for request_id, event in self._running.items() if request_id not in self._owned]
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
