"""Gate 4: the approval workflows that ask a person: a TTY prompt, a command, a decision file.

Each is an `Approver` (``decide(request, timeout_s) -> (answer, approver label)``); the
`ftl.gate.gatekeeper.Gatekeeper` picks one per call. This is the gates' I/O: processes, the
terminal, files; the clock and the sleep are injected so tests take no real time.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import termios
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

from ftl.gate.call import Call
from ftl.gate.config import config_error, resolve_path

log = logging.getLogger("ftl.gate")  # one log for every gate (module docstring of ftl.gate)

TIMEOUT_APPROVER = "system:timeout-auto-approve"  # ThoughtGate's synthetic approver (§1.4)
MAX_PROMPT_ATTEMPTS = 3               # unreadable answers before a prompt counts as a rejection
OUTPUT_LOG_CHARS = 1000               # approver output kept in the log

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
        try:  # what was typed before the question is no answer to it
            termios.tcflush(self._fd, termios.TCIFLUSH)
        except termios.error:
            pass
        os.write(self._fd, question.encode("utf-8", "replace"))
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
        if not ready:
            os.write(self._fd, b"\n")
            return None
        return os.read(self._fd, 4096).decode("utf-8", "replace").strip()

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class ApprovalRequest:
    request_id: str
    call: Call
    context: dict[str, Any]

    def payload(self) -> dict[str, Any]:
        """The JSON an approver sees: the call, its Cedar context and the request id."""
        return {"request_id": self.request_id, "tool": self.call.tool, "args": self.call.args,
                "side_effects": list(self.call.side_effects), "principal": self.call.principal,
                "source": self.call.source, "context": self.context}


class Approver(Protocol):
    name: str

    def decide(self, request: ApprovalRequest, timeout_s: float) -> tuple[Answer, str]: ...


@dataclass
class CommandApprover:
    """Runs the approval command with the call JSON on stdin (real time: it is a real process)."""

    argv: list[str]
    repo: Path
    name: str = "command"

    def decide(self, request: ApprovalRequest, timeout_s: float) -> tuple[Answer, str]:
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
        except BaseException:  # the approver must not outlive the question (its own session)
            _kill_group(proc)
            raise
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
class FileApprover:
    """Writes the pending request to ``<file>.pending/<request_id>.json`` and polls ``file``
    (a JSON object ``{request_id: "approve" | "reject" | {"decision", "by"}}``)."""

    path: Path
    poll_s: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    name: str = "file"

    def decide(self, request: ApprovalRequest, timeout_s: float) -> tuple[Answer, str]:
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
class PromptApprover:
    io: PromptIO
    clock: Callable[[], float]
    lock: threading.Lock
    name: str = "prompt"

    def decide(self, request: ApprovalRequest, timeout_s: float) -> tuple[Answer, str]:
        deadline = self.clock() + timeout_s
        # One question at a time on a terminal; the wait for the turn counts against the timeout.
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            return "timeout", "prompt"
        try:
            ctx = request.context
            shown = _printable  # the call's own text must not steer the terminal it is shown on
            question = (f"\nftl approval {request.request_id}: {shown(request.call.tool)}"
                        f" (task {shown(ctx.get('seq') or '-')}, files "
                        f"{shown(', '.join(map(str, ctx.get('files') or [])) or '-')},"
                        f" side effects {shown(', '.join(request.call.side_effects) or '-')})"
                        "\nApprove? [y/n] ")
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


def resolve_command(argv: list[str], repo: Path) -> list[str]:
    """argv with argv[0] resolved: a path (with '/') against ``repo``, a bare name on PATH."""
    program = argv[0]
    if "/" in program:
        path = resolve_path(repo, program)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise config_error("the approval command cannot be run", [
                {"path": "gates.approval.command.0", "message": f"{program}: not an executable file"}])
        return [str(path), *argv[1:]]
    found = shutil.which(program)
    if found is None:
        raise config_error("the approval command cannot be run", [
            {"path": "gates.approval.command.0", "message": f"{program}: not found on PATH"}])
    return [found, *argv[1:]]


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: object) -> str:
    """``text`` with control characters (escape sequences included) shown as ``?``."""
    return _CONTROL_CHARS.sub("?", str(text))
