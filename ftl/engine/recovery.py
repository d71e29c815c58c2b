"""Failure classification, retry policies (tenacity) and the recovery protocol.

The order on every failure is FTL ERROR_HANDLING's, enforced here rather than asked for:
emit ``TOOL_FAILURE`` -> classify (``FAILURE_CLASSIFIED`` with the decision) -> a transient
failure is retried once (``RETRY`` first, honouring ``retry_after_ms`` up to
``retry_backoff_max_s``; a failing verify up to twice, as a possibly flaky test) -> still
failing, it is structural and the caller attempts in-state recovery (``RECOVERY_ATTEMPT``) or
goes to ERROR. A cancel (the run's, or the operation's own) ends a backoff at once and starts
no further attempt.

Classification is a pure function of the failure (output text, exit status, timeout flag), so
it is tested without processes or clocks.
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from tenacity import RetryCallState, Retrying

from ftl import events as ev
from ftl.errors import FtlError, retry_after_ms
from ftl.ids import unique_hex

T = TypeVar("T")

# Output text that marks a failure as transient, checked in order (FTL ERROR_HANDLING lists
# timeouts, network errors, rate limits, lock contention and flaky tests as transient). They are
# looked for only where a command says why it stopped: its last `TRANSIENT_TAIL_LINES` lines,
# leaving out lines that state an assertion (`_ASSERTION_LINE`), so a test that asserts on a
# "rate limited" message is not retried as a transient failure.
_TRANSIENT_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(?:HTTP(?:/[\d.]+)?\s+429|status(?: code)?[:= ]\s*429|429 too many requests"
                r"|too many requests|rate[ _-]?limit(?:s|ed|ing)?)\b"), "rate_limited"),
    # No bare "lockfile": yarn's and pnpm's "lockfile needs to be updated ... --frozen-lockfile"
    # is a stale lock file in the repository, which no retry fixes.
    (re.compile(r"(?i)(database is locked|could not (obtain|acquire) (a )?lock|lock(ed)? by another"
                r"|resource temporarily unavailable|\.lock\b.*exists)"), "lock_contention"),
    (re.compile(r"(?i)(connection (refused|reset|aborted|timed out)|temporary failure in name "
                r"resolution|network is unreachable|name or service not known|ECONNRESET|"
                r"ETIMEDOUT|EAI_AGAIN|remote end closed connection|read timed out|"
                r"service unavailable|\b50[234]\b (bad gateway|service unavailable|gateway))"),
     "network_error"),
)
TRANSIENT_TAIL_LINES = 10
_ASSERTION_LINE = re.compile(r"AssertionError|\bassert\b")
# Output text that names a structural cause more precisely than "the task failed"; checked
# before the transient markers, over the whole output: a missing module is missing however the
# log ends, even one that mentions a refused connection on the way.
_STRUCTURAL_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(ModuleNotFoundError|ImportError|command not found|No module named)"),
     "dependency_missing"),
)
# Too common to count anywhere (an early `ls` of a missing path in a long log): a missing file
# is the cause only where the command stopped, and after the transient markers there.
_TAIL_STRUCTURAL_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"No such file or directory"), "dependency_missing"),
)


def _transient_text(output: str) -> str:
    """The part of ``output`` transient markers are looked for in: its last
    `TRANSIENT_TAIL_LINES` non-blank lines, without the lines that state an assertion."""
    lines = [line for line in output.splitlines() if line.strip()][-TRANSIENT_TAIL_LINES:]
    return "\n".join(line for line in lines if not _ASSERTION_LINE.search(line))


def classify_command(result: dict[str, Any], *, what: str, seq: str | None = None) -> FtlError:
    """Turn a failed command result (builder or verifier output) into a registry error.

    Args:
        result: a tool result with ``exit_code``, ``output``, ``timed_out`` and optionally
            ``error_type`` / ``retry_after_ms`` reported by an agent.
        what: the step, for messages ("build", "verify").
        seq: the task, when there is one.

    Order: the timeout flag; the agent's own ``error_type``; structural markers anywhere in
    the output (``dependency_missing``: a missing module or command); transient markers in the
    output's last lines, not in assertion lines (`_transient_text`); a missing file there
    (``dependency_missing``); then ``flaky_test`` for a verify, else ``task_failed``.
    Builder and verifier results carry stdout and stderr interleaved (``output``), so the last
    lines stand for "what the command said as it stopped".

    Returns:
        FtlError of a transient kind (timeout, rate_limited, lock_contention, network_error,
        flaky_test for a failing verify) or a structural one (dependency_missing,
        task_failed, or the agent's own error_type).
    """
    details: dict[str, Any] = {"seq": seq, "exit_code": result.get("exit_code"), "tool": what,
                               "what": f"{what} of task {seq}" if seq else what,
                               "timeout_s": result.get("timeout_s")}
    output = str(result.get("output") or result.get("reason") or "")
    details["output_tail"] = output[-2000:]
    if result.get("timed_out"):
        return FtlError("timeout", details)
    agent_kind = result.get("error_type")
    if agent_kind and agent_kind != "task_failed":  # a bare exit status is classified below
        message = None
        if seq is None and agent_kind == "budget_exhausted":  # no task: say whose budget
            from ftl.sanitize import redact_paths, scrub_all

            reason = redact_paths(scrub_all(str(result.get("reason") or "no turns left")))[:300]
            message = f"The {what} step used up its budget: {reason}."
        return FtlError(str(agent_kind), details, retry_after_ms=result.get("retry_after_ms"),
                        message=message)
    for pattern, error_type in _STRUCTURAL_MARKERS:
        found = pattern.search(output)
        if found:
            details["name"] = found.group(0)
            return FtlError(error_type, details)
    said = _transient_text(output)
    for pattern, error_type in _TRANSIENT_MARKERS:
        if pattern.search(said):
            return FtlError(error_type, details, retry_after_ms=retry_after_ms(output))
    for pattern, error_type in _TAIL_STRUCTURAL_MARKERS:
        found = pattern.search(said)
        if found:
            details["name"] = found.group(0)
            return FtlError(error_type, details)
    if what == "verify":
        return FtlError("flaky_test", details)
    return FtlError("task_failed", details)


def classify_exception(exc: BaseException) -> FtlError:
    """Any exception as a registry error; unclassified ones fail closed as ``internal_error``."""
    if isinstance(exc, FtlError):
        return exc
    if isinstance(exc, TimeoutError):
        return FtlError("timeout", {"what": "operation"})
    if isinstance(exc, (ConnectionError,)):
        return FtlError("network_error", {})
    return FtlError("internal_error", {"correlation_id": uuid.uuid4().hex[:12],
                                       "exception": type(exc).__name__})


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts each error kind gets and how long to wait between them.

    ``attempts_for(error)`` is the single source both for tenacity's ``stop`` and for the
    decision written into ``FAILURE_CLASSIFIED``, so the log never disagrees with what ran.

    Attributes:
        transient_retries: retries of a transient failure (FTL: once).
        flaky_retries: retries of a failing verify (FTL: up to 2 for flaky tests).
        backoff_min_s / backoff_max_s: exponential backoff bounds, s (config
            ``retry_backoff_min_s`` / ``retry_backoff_max_s``).
        retry_after_max_s: the longest a server's ``retry_after_ms`` is honoured, s (config
            ``retry_after_max_s``): a hint wins over the backoff when larger, so a rate limit's
            window (often a minute or more) is waited out, but a server asking for a day
            cannot stall a campaign: the retry then fails again and the failure is
            structural. No jitter, so replays are identical.
    """

    transient_retries: int = 1
    flaky_retries: int = 2
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 300.0

    def attempts_for(self, error: BaseException | None) -> int:
        if not isinstance(error, FtlError) or not error.transient:
            return 1
        if error.error_type == "flaky_test":
            return 1 + self.flaky_retries
        return 1 + self.transient_retries

    def wait_s(self, attempt_number: int, error: BaseException | None) -> float:
        """Seconds to wait before attempt ``attempt_number + 1``: the exponential backoff
        (``backoff_min_s`` doubling, at most ``backoff_max_s``), or the server's retry-after
        when longer, at most ``retry_after_max_s``."""
        backoff = min(self.backoff_min_s * (2 ** max(0, attempt_number - 1)), self.backoff_max_s)
        hint_s = (getattr(error, "retry_after_ms", None) or 0) / 1000.0
        return max(backoff, min(hint_s, self.retry_after_max_s))


_op_counter = itertools.count(1)


class RecoveryProtocol:
    """Runs an operation under the emit -> classify -> retry protocol, writing every step.

    Args:
        log: the campaign's event log.
        policy: the retry policy (built from config).
        sleep: called with seconds between attempts; inject a recorder in tests. The default
            waits on the operation's cancel event (see `run`), so Ctrl-C does not sit out a
            backoff.
        cancel: the run's cancel event: when set, no further attempt of any operation starts.
    """

    def __init__(self, log: ev.EventLog, policy: RetryPolicy, *,
                 sleep: Callable[[float], Any] | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.log = log
        self.policy = policy
        self.cancel = cancel or threading.Event()
        self._sleep = sleep

    def run(self, action: Callable[[int], T], *, tool: str, seq: str | None = None,
            state: str | None = None, escalate: Callable[[FtlError], FtlError] | None = None,
            cancel: threading.Event | None = None) -> T:
        """Call ``action(attempt_number)`` until it succeeds or the policy gives up.

        ``action`` raises FtlError on failure (use `classify_command` for command results).
        Returns the action's value. Raises the final FtlError when attempts are exhausted,
        passed through ``escalate`` (e.g. flaky_test -> verify_failed): after its retries a
        transient failure is structural (FTL ERROR_HANDLING).

        ``cancel`` is this operation's own cancel event (a task's scheduler token, an explorer
        pool's stop flag). When it or the protocol's ``cancel`` is set, the failure is not
        retried (decision ``escalate``/``structural``) and no further attempt starts, even one
        already waited for; the default sleep waits on it, so a backoff ends the moment it is set
        (the scheduler token and the explorer stop flag are both set on Ctrl-C, so a wait never
        outlives the run's cancel).
        """
        op_id = f"op{next(_op_counter)}-{unique_hex(6)}"
        policy = self.policy
        own = cancel if cancel is not None else self.cancel

        def cancelled() -> bool:
            return own.is_set() or self.cancel.is_set()

        sleep = self._sleep or own.wait

        def attempt_once(retry_state_number: int) -> T:
            try:
                return action(retry_state_number)
            except BaseException as exc:  # noqa: BLE001 - every failure is emitted first
                if isinstance(exc, KeyboardInterrupt):
                    raise
                error = classify_exception(exc)
                failure = self.log.emit(
                    ev.TOOL_FAILURE, state=state, op_id=op_id, tool=tool, task_seq=seq,
                    attempt=retry_state_number, error_type=error.error_type,
                    message=error.message, details=error.details)
                allowed = policy.attempts_for(error)
                decision = "retry" if (retry_state_number < allowed and not cancelled()) \
                    else ("escalate" if error.transient else "structural")
                self.log.emit(ev.FAILURE_CLASSIFIED, state=state, op_id=op_id, tool=tool, task_seq=seq,
                              failure_seq=failure["seq"], error_type=error.error_type,
                              klass=error.kind.klass.value, decision=decision,
                              max_attempts=allowed)
                error.emitted = True
                raise error from None

        def stop(retry_state: RetryCallState) -> bool:
            error = retry_state.outcome.exception() if retry_state.outcome else None
            return cancelled() or retry_state.attempt_number >= policy.attempts_for(error)

        def wait(retry_state: RetryCallState) -> float:
            error = retry_state.outcome.exception() if retry_state.outcome else None
            return policy.wait_s(retry_state.attempt_number, error)

        def before_sleep(retry_state: RetryCallState) -> None:
            error = retry_state.outcome.exception()
            self.log.emit(ev.RETRY, state=state, op_id=op_id, tool=tool, task_seq=seq,
                          attempt=retry_state.attempt_number + 1,
                          error_type=getattr(error, "error_type", "internal_error"),
                          wait_ms=int(round(retry_state.upcoming_sleep * 1000)))

        try:  # the first try on its own: most succeed, and need no Retrying (20 us a call)
            return attempt_once(1)
        except FtlError as error:
            last: FtlError = error
        retrying = Retrying(
            retry=lambda rs: rs.outcome is not None and rs.outcome.failed
            and isinstance(rs.outcome.exception(), FtlError),
            stop=stop, wait=wait, sleep=sleep, before_sleep=before_sleep, reraise=True)
        try:
            for attempt in retrying:
                with attempt:
                    number = attempt.retry_state.attempt_number
                    if number == 1 or cancelled():
                        # the first try's failure (emitted and classified already), or a
                        # cancel during the backoff: no further attempt
                        raise last
                    try:
                        return attempt_once(number)
                    except FtlError as error:
                        last = error
                        raise
        except FtlError as error:
            final = escalate(error) if escalate else error
            final.op_id = op_id
            if final is not error:
                final.details.setdefault("op_id", op_id)
                final.emitted = True
            raise final from None
        raise AssertionError("tenacity ended without a result")  # pragma: no cover

    def recovery(self, *, strategy: str, success: bool, state: str | None = None,
                 error: FtlError | None = None, **fields: Any) -> None:
        """Record an in-state recovery attempt and whether it worked (``RECOVERY_ATTEMPT``).

        Passing the ``error`` being recovered from links the event to its operation (``op_id``)
        so a postmortem can pair them even when tasks run in parallel.
        """
        if error is not None:
            fields.setdefault("error_type", error.error_type)
            if getattr(error, "op_id", None):
                fields.setdefault("op_id", error.op_id)
        self.log.emit(ev.RECOVERY_ATTEMPT, state=state, strategy=strategy, success=success, **fields)


def escalate_flaky(error: FtlError) -> FtlError:
    """A verify that kept failing through its retries is no longer flaky: it is verify_failed."""
    if error.error_type == "flaky_test":
        return FtlError("verify_failed", error.details)
    return error

