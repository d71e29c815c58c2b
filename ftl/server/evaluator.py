"""Clingo-backed intent evaluation for the embedded server: the six-phase selection pipeline.

Rules live in ``ftl/server/rules/*.lp``: ``phase1_skeleton`` .. ``phase6_output`` are the
stratified rewrite of the MangleCP six-phase pipeline (spec 01 §4.1, spec 10 §4.5; reference
§10.3), and a domain file maps facts to ``mandatory_for_intent/2``, ``relevant_to_intent/3``,
``prohibited/2``, ``requires_capability/2``, ``tool_requires/2``, ``conflicts_with/2`` and
``prefers/2``. Facts (server base facts and client facts) enter as clingo symbols through the
backend, never as program text (reference §10.2), into a fresh ``clingo.Control`` per request.

Limits (spec 05 §3.3): the gas limit counts derived atoms after grounding
(``derivation_limit_exceeded`` with ``details.budget``); the time limit runs each evaluation in
a killable worker process (``evaluation_timeout``); a worker that exceeds its memory cap counts as
a gas overrun. A program that grounding alone cannot decide (not stratified for this input) is
``evaluation_failed``; one model is never picked among several.
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
from typing import Any, Iterable, Mapping, Sequence

import clingo
import clingo.ast
from multiprocessing.connection import Connection

from ftl.manglecp.messages import ProtocolError
from ftl.manglecp.server import EvaluationInput, EvaluationResult, Selection

log = logging.getLogger("ftl.server.evaluator")

RULES_DIR = Path(__file__).with_name("rules")
PHASE_RULES: tuple[Path, ...] = tuple(sorted(RULES_DIR.glob("phase*.lp")))
INT32_MIN, INT32_MAX = -(2**31) + 1, 2**31 - 1  # sentinels for unbounded interval ends
PHASE_ORDER = {"skeleton": 0, "flesh": 1, "dependency": 2}
RULE_CHAINS = {
    "skeleton": ("mandatory_for_intent", "cand", "score", "kept", "final"),
    "flesh": ("relevant_to_intent", "cand", "score", "kept", "final"),
    "dependency": ("tool_requires", "needs", "added", "final"),
}
_POLL_S = 0.02


# ---------------------------------------------------------------------------------------------
# Encoding JSON values as clingo symbols (reference §10.2)


def to_symbol(value: Any) -> clingo.Symbol:
    """A JSON value as a clingo term.

    Strings -> ``String``; booleans -> ``true``/``false``; integers in 32 bits -> ``Number``,
    others -> ``big("<decimal>")``; floats -> ``float("<repr>")``; arrays -> ``list(...)``;
    objects -> ``map(kv(K, V), ...)`` with keys sorted.
    """
    if isinstance(value, bool):
        return clingo.Function("true" if value else "false")
    if isinstance(value, str):
        return clingo.String(value)
    if isinstance(value, int):
        if INT32_MIN - 1 <= value <= INT32_MAX:
            return clingo.Number(value)
        return clingo.Function("big", [clingo.String(str(value))])
    if isinstance(value, float):
        return clingo.Function("float", [clingo.String(repr(value))])
    if isinstance(value, list):
        return clingo.Function("list", [to_symbol(v) for v in value])
    if isinstance(value, Mapping):
        return clingo.Function("map", [clingo.Function("kv", [clingo.String(str(k)), to_symbol(value[k])])
                                       for k in sorted(value)])
    raise TypeError(f"cannot encode {type(value).__name__} as a fact argument")


def _relative_s(point: int | str, eval_time_ms: int, unbounded: int) -> int:
    if point == "_":
        return unbounded
    if point == "now":
        return 0
    seconds = (int(point) - eval_time_ms) // 1000
    return max(INT32_MIN + 1, min(INT32_MAX - 1, seconds))


def fact_symbol(pred: str, args: Sequence[Any], t: tuple[Any, Any] | None, eval_time_ms: int) -> clingo.Symbol:
    """A fact as a symbol; a temporal fact ``p(a)@[s,e]`` becomes ``p(a, S, E)`` with S and E in
    seconds relative to the evaluation time (``now`` = 0; reference §10.2)."""
    terms = [to_symbol(a) for a in args]
    if t is not None:
        terms += [clingo.Number(_relative_s(t[0], eval_time_ms, INT32_MIN)),
                  clingo.Number(_relative_s(t[1], eval_time_ms, INT32_MAX))]
    return clingo.Function(pred, terms)


# ---------------------------------------------------------------------------------------------
# The program: parsed once, grounded per request


class _Program:
    """Rule text parsed once plus the server base facts; `run` evaluates one request."""

    def __init__(self, rule_texts: Sequence[str], server_facts: Sequence[tuple[str, list[Any]]]) -> None:
        self.statements: list[Any] = []
        for text in rule_texts:
            clingo.ast.parse_string(text, self.statements.append)
        self.server_facts = [fact_symbol(pred, args, None, 0) for pred, args in server_facts]
        # The closure of the rules over server facts alone is server base, not this request's work.
        models = self._models(self._ground(self.server_facts))
        if len(models) != 1:
            raise RuntimeError("the rules have no unique model over the server facts alone")
        self.static = frozenset(models[0])

    def _ground(self, symbols: Iterable[clingo.Symbol]) -> clingo.Control:
        control = clingo.Control(["--warn=none"])
        with clingo.ast.ProgramBuilder(control) as builder:
            for statement in self.statements:
                builder.add(statement)
        with control.backend() as backend:
            for symbol in symbols:
                backend.add_rule([backend.add_atom(symbol)])
        control.ground([("base", [])])
        return control

    @staticmethod
    def _models(control: clingo.Control) -> list[list[clingo.Symbol]]:
        """Up to two models. A stratified program has exactly one (grounding decides it; the
        solve call only confirms it); two mean negation through recursion, none a contradiction."""
        control.configuration.solve.models = 2  # type: ignore[union-attr]
        models: list[list[clingo.Symbol]] = []
        control.solve(on_model=lambda model: models.append(model.symbols(atoms=True)))
        return models

    def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Evaluate ``request`` (plain data, picklable). Returns ``{"ok": {...}}`` or ``{"error": {...}}``."""
        eval_time_ms = request["eval_time_ms"]
        injected = [clingo.Function("intent", [clingo.String(request["intent"])])]
        for key in sorted(request["params"]):
            value = request["params"][key]
            if isinstance(value, (str, int, float, bool)):
                injected.append(clingo.Function("intent_param", [clingo.String(key), to_symbol(value)]))
        for pred, args, t in request["facts"]:
            injected.append(fact_symbol(pred, args, t, eval_time_ms))
        injected.extend(self.server_facts)
        injected_set = set(injected)
        models = self._models(self._ground(injected))
        if len(models) != 1:
            return {"error": {"code": "evaluation_failed",
                              "message": "The selection rules have no unique result for these facts "
                                         "(not stratified, or contradictory).",
                              "details": {"models": "none" if not models else "several"}}}
        derived = 0
        final: dict[str, int] = {}
        phases: dict[str, set[str]] = {}
        excluded: set[tuple[str, str, str]] = set()
        for symbol in models[0]:
            if symbol not in injected_set and symbol not in self.static:
                derived += 1
            name, args = symbol.name, symbol.arguments
            if name == "final" and len(args) == 2:
                final[_text(args[0])] = args[1].number
            elif name == "final_phase" and len(args) == 2:
                phases.setdefault(_text(args[0]), set()).add(_text(args[1]))
            elif name == "excluded_report" and len(args) == 3:
                excluded.add((_text(args[0]), _text(args[1]), _text(args[2])))
        limit = request["max_facts_created"]
        if derived > limit:
            return {"error": {"code": "derivation_limit_exceeded",
                              "message": f"Evaluation derived {derived} facts; the limit is {limit}.",
                              "details": {"budget": {"limit": limit, "consumed": derived,
                                                     "unit": "derived_facts"},
                                          "partial_results_available": False,
                                          "suggestion": "Send fewer facts or raise max_facts_created "
                                                        "up to the server's max_derived_facts."}}}
        selections = []
        for tool in sorted(final):
            phase = min(phases.get(tool, {"flesh"}), key=lambda p: PHASE_ORDER.get(p, 9))
            selections.append((tool, final[tool], phase))
        return {"ok": {"selections": selections, "excluded": sorted(excluded),
                       "facts_evaluated": len(injected_set) + len(self.static),
                       "facts_derived": derived}}


def _text(symbol: clingo.Symbol) -> str:
    return symbol.string if symbol.type == clingo.SymbolType.String else str(symbol)


# ---------------------------------------------------------------------------------------------
# Worker processes (killable on timeout)


def _worker_main(read_fd: int, write_fd: int) -> None:
    """Worker loop (``python -m ftl.server.evaluator READ_FD WRITE_FD``): the first message holds
    the rules, the server facts and the memory cap; then one answer per request until EOF."""
    from multiprocessing.connection import Connection
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        setup = conn_in.recv()
    except (EOFError, OSError):
        return
    if setup.get("memory_limit_bytes"):
        try:
            import resource
            limit = setup["memory_limit_bytes"]
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    try:
        program = _Program(setup["rule_texts"], setup["server_facts"])
    except Exception as exc:  # reported to the parent, which logs it
        conn_out.send({"fatal": f"{type(exc).__name__}: {exc}"})
        return
    conn_out.send({"ready": True})
    while True:
        try:
            request = conn_in.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        conn_out.send(_safe_run(program, request))


def _safe_run(program: _Program, request: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return program.run(request)
    except MemoryError:
        return {"memory": True}
    except RuntimeError as exc:
        if "bad_alloc" in str(exc) or "memory" in str(exc).lower():
            return {"memory": True}
        log.exception("evaluation failed")
        return {"error": {"code": "evaluation_failed", "message": "The selection rules failed to evaluate."}}
    except Exception:
        log.exception("evaluation failed")
        return {"error": {"code": "evaluation_failed", "message": "The selection rules failed to evaluate."}}


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
    """The embedded server's `Evaluator` (see `ftl.manglecp.server.Evaluator`).

    Args:
        domain_rules: domain rule files (e.g. ``rules/ftl_domain.lp``), loaded after the phases.
        server_facts: server base facts ``[(pred, [args...])]`` (catalog and configuration).
        phase_rules: the pipeline files (default: ``rules/phase*.lp``).
        isolation: ``"process"`` (default): evaluations run in worker processes that are
            killed on timeout, cancel or memory overrun. ``"thread"``: in-process, for tests and
            tools; a timeout abandons the evaluation thread (clingo grounding cannot be
            interrupted), so use it only with trusted, terminating rules.
        workers: maximum concurrent worker processes.
        memory_limit_bytes: address-space cap per worker (RLIMIT_AS), or None.
    Raises:
        ProtocolError(evaluation_failed): the rules do not parse or ground (at construction for
            ``thread``, at the first evaluation for ``process``).
    """

    def __init__(self, domain_rules: Sequence[Path], server_facts: Sequence[tuple[str, Sequence[Any]]] = (),
                 *, phase_rules: Sequence[Path] = PHASE_RULES, isolation: str = "process",
                 workers: int = 2, memory_limit_bytes: int | None = 2 * 1024**3) -> None:
        if isolation not in ("process", "thread"):
            raise ValueError("isolation must be 'process' or 'thread'")
        self.rule_texts = [Path(p).read_text(encoding="utf-8") for p in (*phase_rules, *domain_rules)]
        self.server_facts = [(pred, list(args)) for pred, args in server_facts]
        self.isolation = isolation
        self.workers = max(1, workers)
        self.memory_limit_bytes = memory_limit_bytes
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        self._program: _Program | None = None
        if isolation == "thread":
            try:
                self._program = _Program(self.rule_texts, self.server_facts)
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
        plain = {"intent": request.intent, "params": dict(request.params),
                 "facts": [(f.pred, list(f.args), f.t) for f in request.facts],
                 "eval_time_ms": request.eval_time_ms,
                 "max_facts_created": request.max_facts_created}
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
        return EvaluationResult(
            selections=tuple(Selection(tool, score, phase, RULE_CHAINS.get(phase, ()))
                             for tool, score, phase in ok["selections"]),
            excluded=tuple(tuple(e) for e in ok["excluded"]),
            facts_evaluated=ok["facts_evaluated"], facts_derived=ok["facts_derived"])

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
        assert self._program is not None
        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.update(_safe_run(self._program, plain)),
                                  name="ftl-eval", daemon=True)
        started = time.monotonic()
        thread.start()
        while thread.is_alive():
            thread.join(_POLL_S)
            if cancel is not None and cancel.is_set():
                raise ProtocolError("cancelled", "The evaluation was cancelled.")
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise _timeout(limit_ms, started)
        return box

    # -- process isolation ---------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        # A plain subprocess (not multiprocessing): no re-import of the caller's __main__, and
        # its stdout is closed so it can never write into a stdio transport.
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "ftl.server.evaluator", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, close_fds=True, env=_worker_env())
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        worker = _Worker(process, Connection(to_child_w, readable=False),
                         Connection(from_child_r, writable=False))
        try:
            worker.send_conn.send({"rule_texts": self.rule_texts, "server_facts": self.server_facts,
                                   "memory_limit_bytes": self.memory_limit_bytes})
            hello = worker.recv_conn.recv() if worker.recv_conn.poll(60) else {"fatal": "no answer"}
        except (EOFError, OSError):
            hello = {"fatal": "worker exited while starting"}
        if "fatal" in hello:
            worker.kill()
            log.error("evaluation worker failed to start: %s", hello["fatal"])
            raise ProtocolError("evaluation_failed", "The selection rules do not load.")
        return worker

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise ProtocolError("server_not_ready", "The evaluator is shut down.",
                                        {"status": "draining"})
                if self._idle:
                    return self._idle.pop()
                if self._count < self.workers:
                    self._count += 1
                    break
                self._cond.wait()
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
        worker = self._acquire()
        started = time.monotonic()
        try:
            worker.send_conn.send(plain)
            while not worker.recv_conn.poll(_POLL_S):
                if cancel is not None and cancel.is_set():
                    raise ProtocolError("cancelled", "The evaluation was cancelled.")
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    raise _timeout(limit_ms, started)
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
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _timeout(limit_ms: int | None, started: float) -> ProtocolError:
    consumed = int((time.monotonic() - started) * 1000)
    return ProtocolError("evaluation_timeout",
                         f"Evaluation did not finish within {limit_ms} ms.",
                         {"budget": {"limit": limit_ms, "consumed": consumed, "unit": "ms"},
                          "partial_results_available": False,
                          "suggestion": "Send fewer facts or raise max_compute_ms up to the server limit."})


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
