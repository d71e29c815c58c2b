"""`ClingoEvaluator`, the embedded server's evaluator: where an evaluation runs, and its limits.

Process isolation (the default): each evaluation runs in a worker process (``python -m
ftl.server.evaluation.child``, the rules parsed once per worker, an ``RLIMIT_AS`` cap) that is
killed and replaced on a timeout (``evaluation_timeout``), a cancel or a memory overrun (counted
as a gas overrun, ``derivation_limit_exceeded``); spec 05 §3.3. Thread isolation runs in this
process, one evaluation at a time: the default of the stdio server the runner starts, of the
in-process server and of tests (a timeout abandons the grounding thread, which clingo cannot
interrupt, with its own parsed program; see `ClingoEvaluator`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ftl.manglecp.definitions import EvaluationInput, EvaluationResult, Selection
from ftl.manglecp.messages import ProtocolError
from ftl.server.evaluation.program import PHASE_RULES, Program, run_safely
from ftl.server.evaluation.symbols import DEFAULT_HIDDEN_PREDICATES

log = logging.getLogger("ftl.server.evaluation")

_POLL_S = 0.02


@dataclass
class _Worker:
    process: subprocess.Popen
    send_conn: Any
    recv_conn: Any

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for conn in (self.send_conn, self.recv_conn):
            try:
                conn.close()
            except OSError:
                pass


class ClingoEvaluator:
    """The embedded server's `Evaluator` (see `ftl.manglecp.definitions.Evaluator`).

    Args:
        domain_rules: domain rule files (e.g. ``rules/ftl_domain.lp``), loaded after the phases.
        server_facts: server base facts ``[(pred, [args...])]`` (catalog and configuration).
        phase_rules: the pipeline files (default: ``rules/phase*.lp``).
        isolation: ``"process"`` (default): evaluations run in worker processes that are
            killed on timeout, cancel or memory overrun. ``"thread"``: in this process, one
            evaluation at a time; a timeout or cancel abandons the evaluation thread (clingo
            grounding cannot be interrupted) together with the parsed program it uses, and
            later evaluations get a program parsed afresh, so they never wait behind it. The
            abandoned thread still runs to its end: use it only with terminating rules.
        workers: maximum concurrent worker processes.
        memory_limit_bytes: address-space cap per worker (RLIMIT_AS), or None.
        hidden_predicates: policy predicates never named in proof hints or rule coverage.
    Raises:
        ProtocolError(evaluation_failed): the rules do not parse or ground (at construction for
            ``thread``, at the first evaluation for ``process``).
    """

    def __init__(self, domain_rules: Sequence[Path], server_facts: Sequence[tuple[str, Sequence[Any]]] = (),
                 *, phase_rules: Sequence[Path] = PHASE_RULES, isolation: str = "process",
                 workers: int = 2, memory_limit_bytes: int | None = 2 * 1024**3,
                 hidden_predicates: Iterable[str] = DEFAULT_HIDDEN_PREDICATES) -> None:
        if isolation not in ("process", "thread"):
            raise ValueError("isolation must be 'process' or 'thread'")
        self.rule_texts = [Path(p).read_text(encoding="utf-8") for p in (*phase_rules, *domain_rules)]
        self.server_facts = [(pred, list(args)) for pred, args in server_facts]
        self.isolation = isolation
        self.workers = max(1, workers)
        self.memory_limit_bytes = memory_limit_bytes
        self.hidden_predicates = sorted(set(hidden_predicates))
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        self._program: Program | None = None
        # Thread isolation shares one parsed program (clingo AST objects and the static closure
        # cache); concurrent use of them from several threads crashed a child process (SIGSEGV)
        # once in CI, so evaluations in this mode run one at a time: under this lock, which
        # belongs to the program (an abandoned evaluation keeps both, see `_abandon`).
        self._thread_eval_lock = threading.Lock()
        self._swap = threading.Lock()  # guards replacing the program and its lock
        if isolation == "thread":
            try:
                self._program = Program(self.rule_texts, self.server_facts, self.hidden_predicates)
            except RuntimeError as exc:
                raise ProtocolError("evaluation_failed", "The selection rules do not load.",
                                    {"problem": str(exc)[:200]}) from None

    # -- public --------------------------------------------------------------------------------

    def warm(self) -> None:
        """Start one worker now (process isolation), so the first request does not wait for it."""
        if self.isolation == "process":
            self._release(self._acquire())

    def evaluate(self, request: EvaluationInput) -> EvaluationResult:
        """Run the pipeline for ``request``; see the class doc for the errors raised."""
        # NormalFacts are (pred, args, t) tuples already; a worker process gets plain tuples
        # (cheaper to pickle than named ones).
        facts: Sequence[tuple[str, Sequence[Any], Any]] = (
            request.facts if self.isolation == "thread" else [tuple(f) for f in request.facts])
        plain = {"intent": request.intent, "params": dict(request.params), "facts": facts,
                 "eval_time_ms": request.eval_time_ms,
                 "max_facts_created": request.max_facts_created,
                 "hidden": sorted(request.hidden_tools), "explain": request.explain,
                 "coverage": request.rule_coverage}
        timeout_s = None if request.max_compute_ms is None else request.max_compute_ms / 1000
        if self.isolation == "thread":
            answer = self._run_thread(plain, timeout_s, request.cancel, request.max_compute_ms)
        else:
            answer = self._run_process(plain, timeout_s, request.cancel, request.max_compute_ms)
        if "memory" in answer:
            raise ProtocolError("derivation_limit_exceeded",
                                "Evaluation ran out of memory before finishing.",
                                {"budget": {"limit": request.max_facts_created,
                                            "consumed": request.max_facts_created,
                                            "unit": "derived_facts"},
                                 "partial_results_available": False})
        if "error" in answer:
            error = answer["error"]
            raise ProtocolError(error["code"], error["message"], error.get("details"))
        ok = answer["ok"]
        facts = request.facts
        explained = ok.get("explain") or {}
        derivations = explained.get("derivations", {})
        selections = []
        for tool, score, phase, skills, resources in ok["selections"]:
            why = derivations.get(tool, {})
            selections.append(Selection(
                tool, score, phase, tuple(why.get("chain", ())), tuple(skills),
                tuple((uri, priority) for uri, priority in resources),
                tuple(facts[i] for i in why.get("support", ()))))
        return EvaluationResult(
            selections=tuple(selections), excluded=tuple(tuple(e) for e in ok["excluded"]),
            facts_evaluated=ok["facts_evaluated"], facts_derived=ok["facts_derived"],
            unmatched=tuple(facts[i] for i in explained.get("unmatched", ())),
            rules_fired=ok.get("rules_fired"), rule_coverage=ok.get("coverage"))

    def close(self) -> None:
        """Stop every worker process."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            try:
                worker.send_conn.send(None)
            except OSError:
                pass
            worker.kill()

    # -- thread isolation ----------------------------------------------------------------------

    def _run_thread(self, plain: dict, timeout_s: float | None, cancel: threading.Event | None,
                    limit_ms: int | None) -> dict[str, Any]:
        started = time.monotonic()
        with self._swap:
            program, lock = self._program, self._thread_eval_lock
        assert program is not None
        while not lock.acquire(timeout=_POLL_S):  # one at a time, within this request's limits
            _check(cancel, timeout_s, limit_ms, started)
            with self._swap:  # the evaluation ahead was abandoned: wait on the fresh program
                program, lock = self._program, self._thread_eval_lock
        try:
            _check(cancel, timeout_s, limit_ms, started)  # cancelled meanwhile: do not start
        except ProtocolError:
            lock.release()
            raise
        box: dict[str, Any] = {}

        def evaluate() -> None:
            try:
                box.update(run_safely(program, plain))
            finally:
                lock.release()

        thread = threading.Thread(target=evaluate, name="ftl-eval", daemon=True)
        try:
            thread.start()
        except BaseException:
            lock.release()
            raise
        while thread.is_alive():
            thread.join(_POLL_S)
            try:
                _check(cancel, timeout_s, limit_ms, started)
            except ProtocolError:
                if thread.is_alive():
                    self._abandon(program)
                    raise
        return box

    def _abandon(self, program: Program) -> None:
        """Leave ``program`` and its lock to the evaluation thread still using it (a timeout or
        cancel: grounding cannot be interrupted) and parse the rules again for later requests.
        Parsing cost is paid once per abandoned evaluation; a failure keeps the old program."""
        with self._swap:
            if self._program is not program:
                return  # another request replaced it already
            try:
                fresh = Program(self.rule_texts, self.server_facts, self.hidden_predicates)
            except RuntimeError:  # it loaded before; should it not now, queue behind the old one
                log.exception("the selection rules could not be parsed again after a timeout")
                return
            self._program, self._thread_eval_lock = fresh, threading.Lock()

    # -- process isolation ---------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        # A plain subprocess (not multiprocessing): no re-import of the caller's __main__, and
        # its stdout is closed so it can never write into a stdio transport.
        from multiprocessing.connection import Connection

        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "ftl.server.evaluation.child", str(to_child_r),
                 str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, close_fds=True, env=_worker_env())
        except OSError as exc:  # no interpreter, no fds, no memory: our ends go too
            os.close(to_child_w)
            os.close(from_child_r)
            log.error("evaluation worker could not start: %s", exc)
            raise ProtocolError("evaluation_failed", "The evaluation worker could not start.") from None
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        worker = _Worker(process, Connection(to_child_w, readable=False),
                         Connection(from_child_r, writable=False))
        try:
            worker.send_conn.send({"rule_texts": self.rule_texts, "server_facts": self.server_facts,
                                   "memory_limit_bytes": self.memory_limit_bytes,
                                   "hidden_predicates": self.hidden_predicates})
            hello = worker.recv_conn.recv() if worker.recv_conn.poll(60) else {"fatal": "no answer"}
        except (EOFError, OSError):
            hello = {"fatal": "worker exited while starting"}
        if "fatal" in hello:
            worker.kill()
            log.error("evaluation worker failed to start: %s", hello["fatal"])
            raise ProtocolError("evaluation_failed", "The selection rules do not load.")
        return worker

    def _acquire(self, cancel: threading.Event | None = None, timeout_s: float | None = None,
                 limit_ms: int | None = None, started: float | None = None) -> _Worker:
        """An idle live worker, else a new one while fewer than ``workers`` exist, else wait:
        within the request's own time limit and cancel (``started``: when its clock began)."""
        started = time.monotonic() if started is None else started
        with self._cond:
            while True:
                if self._closed:
                    raise ProtocolError("server_not_ready", "The evaluator is shut down.",
                                        {"status": "draining"})
                while self._idle:
                    worker = self._idle.pop()
                    if worker.process.poll() is None:
                        return worker
                    worker.kill()  # died while idle (killed, OOM): never hand it a request
                    self._count -= 1
                if self._count < self.workers:
                    self._count += 1
                    break
                _check(cancel, timeout_s, limit_ms, started)
                self._cond.wait(_POLL_S)
        try:
            return self._spawn()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None or self._closed:
                self._count -= 1
                if worker is not None:
                    worker.kill()
            else:
                self._idle.append(worker)
            self._cond.notify()

    def _run_process(self, plain: dict, timeout_s: float | None, cancel: threading.Event | None,
                     limit_ms: int | None) -> dict[str, Any]:
        started = time.monotonic()  # the wait for a worker counts against the request's limit
        worker = self._acquire(cancel, timeout_s, limit_ms, started)
        try:
            try:
                worker.send_conn.send(plain)
            except OSError:  # it died between the check and the send: one fresh worker
                worker.kill()
                self._release(None)
                worker = self._acquire(cancel, timeout_s, limit_ms, started)
                worker.send_conn.send(plain)
            while not worker.recv_conn.poll(_POLL_S):
                _check(cancel, timeout_s, limit_ms, started)
                if worker.process.poll() is not None:
                    raise EOFError("worker exited")
            answer = worker.recv_conn.recv()
        except ProtocolError:
            worker.kill()
            self._release(None)
            raise
        except (EOFError, OSError):
            worker.kill()
            self._release(None)
            return {"memory": True}  # the worker died mid-request: treated as a resource overrun
        self._release(worker)
        return answer


def _worker_env() -> dict[str, str]:
    """The worker's environment: ours, with ftl's source root first on PYTHONPATH (so a
    source checkout works without installation)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _check(cancel: threading.Event | None, timeout_s: float | None, limit_ms: int | None,
           started: float) -> None:
    """Raise ProtocolError(cancelled) or (evaluation_timeout) when the request is cancelled or
    past its limit (``timeout_s`` from ``started``, monotonic s)."""
    if cancel is not None and cancel.is_set():
        raise ProtocolError("cancelled", "The evaluation was cancelled.")
    if timeout_s is not None and time.monotonic() - started > timeout_s:
        raise _timeout(limit_ms, started)


def _timeout(limit_ms: int | None, started: float) -> ProtocolError:
    consumed = int((time.monotonic() - started) * 1000)
    return ProtocolError("evaluation_timeout",
                         f"Evaluation did not finish within {limit_ms} ms.",
                         {"budget": {"limit": limit_ms, "consumed": consumed, "unit": "ms"},
                          "partial_results_available": False,
                          "suggestion": "Send fewer facts or raise max_compute_ms up to the server limit."})

