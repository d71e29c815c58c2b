"""EXPLORE: run the explorer modes in parallel under a timeout and a quorum (FTL EXPLORE_PATTERN).

Quorum: `ftl.explore_rules.quorum_met` (distinct modes with an ``ok`` or ``partial`` result;
``explorer_quorum`` of them, default 3 of 4, or both structure and delta). Outcomes: quorum met
-> PLAN (with ``PARTIAL_FAILURE`` naming missing modes); quorum not met but explorers timed
out with some results -> ``timeout`` (ERROR routes to PLAN with the partial data); otherwise ->
``quorum_failure`` (ERROR returns the partial results). The explorers are chosen by a MangleCP
evaluation under the recovery protocol (`ftl.engine.runner.Run.select_tools`: a transient
failure is retried once); if it still fails, nothing was explored and ERROR returns the summary.

Aggregation (FTL ERROR_HANDLING ``aggregation_failed``: "retry aggregation, then ERROR"): every
explorer result must match its schema (`ftl.models.ExplorerResult`, its requested mode, and the
fields FTL's explorer contract requires of an ``ok``/``partial`` result, behaviour reference
§5.5) and the merged exploration must be storable. When it fails, the failure is emitted and
classified (``TOOL_FAILURE`` tool ``aggregate_exploration``), the modes whose results broke it
are explored once more and everything is aggregated again (``RECOVERY_ATTEMPT``
``retry_aggregation`` with its success); a second failure goes to ERROR as
``aggregation_failed`` (route: summary).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from pydantic import ValidationError

from ftl import events as ev
from ftl.errors import FtlError
from ftl.explore_rules import EXPLORER_MODES, quorum_met
from ftl.models import ExplorerResult
from ftl.engine.runner import Next, Run
from ftl.engine.tools import fact

MODES = EXPLORER_MODES
INTENT = "explore_codebase"
# Explorers get a slightly shorter deadline than the state waits for them, so an explorer that
# runs out of time still returns its partial result before EXPLORE gives up on it.
EXPLORER_SHARE = 0.9
JOIN_GRACE_S = 5.0


def enter(run: Run) -> Next:
    facts = run.facts() + [fact("explorer_mode", mode) for mode in MODES]
    selected = run.select_tools(INTENT, facts)
    modes = [mode for mode in MODES if f"explore_{mode}" in selected]
    stop = threading.Event()
    results: dict[str, dict[str, Any]] = {}
    timeout_s = run.config.explorer_timeout_s

    def explore(mode: str, cancel: threading.Event) -> dict[str, Any]:
        args = {"objective": run.objective, "campaign_id": run.campaign_id,
                "timeout_s": timeout_s * EXPLORER_SHARE}
        return run.recovery.run(
            lambda attempt: run.tools.call(INTENT, facts, f"explore_{mode}", args,
                                           state="EXPLORE", cancel=cancel),
            tool=f"explore_{mode}", state="EXPLORE", cancel=cancel)

    pool = ThreadPoolExecutor(max_workers=max(1, len(modes)), thread_name_prefix="explorer")
    futures = {pool.submit(explore, mode, stop): mode for mode in modes}
    try:
        done, not_done = wait(futures, timeout=timeout_s)
    finally:
        # Late explorers must not act once EXPLORE is over (or on Ctrl-C): cancel them and give
        # them a bounded moment to stop their subprocesses and record how they ended.
        stop.set()
        wait(futures, timeout=JOIN_GRACE_S)
        pool.shutdown(wait=False, cancel_futures=True)

    for future in done:
        mode = futures[future]
        error = future.exception()
        if error is None:
            _record(run, results, mode, future.result())
        else:
            run.recovery.recovery(strategy="proceed_without_explorer", success=True,
                                  mode=mode, error_type=getattr(error, "error_type", "internal_error"))

    try:
        _aggregate_and_save(run, results)
    except FtlError as failure:
        _emit_failure(run, failure)
        retried = [mode for mode in failure.details.get("modes") or () if mode in modes]
        for mode in retried:  # once each, one after the other: a retry, not a second fan-out
            try:
                _record(run, results, mode, explore(mode, run.cancel))
            except FtlError:
                pass  # its result stays the broken one; the second aggregation fails on it
        try:
            _aggregate_and_save(run, results)
        except FtlError as again:
            run.recovery.recovery(strategy="retry_aggregation", success=False, state="EXPLORE",
                                  error=again, modes=retried)
            raise
        run.recovery.recovery(strategy="retry_aggregation", success=True, state="EXPLORE",
                              error=failure, modes=retried)

    usable = {mode for mode, result in results.items() if result.get("status") in ("ok", "partial")}
    missing = sorted(set(MODES) - usable)
    quorum = min(run.config.explorer_quorum, len(MODES))
    if quorum_met(usable, quorum):
        if missing:
            run.log.emit(ev.PARTIAL_FAILURE, missing=missing)
        return Next("plan")
    if not_done and usable:
        run.log.emit(ev.PARTIAL_FAILURE, missing=missing)
        raise FtlError("timeout", {"what": "exploration", "timeout_s": timeout_s, "missing": missing})
    raise FtlError("quorum_failure", {"completed": len(usable), "required": quorum, "missing": missing})


AGGREGATE_TOOL = "aggregate_exploration"

# Fields an ok/partial result must carry, per mode (FTL explorer contract, reference §5.5).
REQUIRED_FINDINGS: dict[str, dict[str, tuple[type, ...]]] = {
    "structure": {"directories": (dict, list)},
    "pattern": {},
    "memory": {},
    "delta": {"candidates": (list,)},
}


def _record(run: Run, results: dict[str, dict[str, Any]], mode: str, result: dict[str, Any]) -> None:
    results[mode] = result
    run.store.record_explorer_result(run.campaign_id, mode, result)
    status = result.get("status", "ok") if isinstance(result, dict) else "invalid"
    run.log.emit(ev.EXPLORER_RESULT, mode=mode, status=status)


def _aggregate_and_save(run: Run, results: dict[str, dict[str, Any]]) -> None:
    """Aggregate and store the exploration; any failure of the merge is aggregation_failed."""
    exploration = aggregate(results, run.objective)
    try:
        run.store.save_exploration(run.campaign_id, exploration)
    except (TypeError, ValueError) as error:  # e.g. a finding that cannot be stored as JSON
        raise FtlError("aggregation_failed", {"modes": [], "violations": [
            {"mode": None, "path": "$", "message": f"the exploration cannot be stored: {error}"}]})
    run.exploration = exploration


def _emit_failure(run: Run, error: FtlError) -> None:
    failure = run.log.emit(ev.TOOL_FAILURE, state="EXPLORE", tool=AGGREGATE_TOOL,
                           error_type=error.error_type, message=error.message,
                           details=error.safe_details())
    run.log.emit(ev.FAILURE_CLASSIFIED, state="EXPLORE", tool=AGGREGATE_TOOL,
                 failure_seq=failure["seq"], error_type=error.error_type,
                 klass=error.kind.klass.value, decision="structural")


def check_result(mode: str, result: Any) -> list[dict[str, Any]]:
    """Why explorer ``mode``'s ``result`` cannot be aggregated: ``[{mode, path, message}]``.

    Checks: a JSON object that `ExplorerResult` accepts, whose ``mode`` is the one requested
    (another mode would overwrite that mode's section in the merge), and, when its status is
    ``ok`` or ``partial``, with the findings `REQUIRED_FINDINGS` names. Empty: usable.
    """
    if not isinstance(result, dict):
        return [{"mode": mode, "path": "$", "message": "the result is not a JSON object"}]
    try:
        parsed = ExplorerResult.model_validate(result)
    except ValidationError as error:
        return [{"mode": mode, "path": "$." + ".".join(str(p) for p in e["loc"]) if e["loc"] else "$",
                 "message": e["msg"]} for e in error.errors(include_url=False)]
    if parsed.mode.value != mode:
        return [{"mode": mode, "path": "$.mode",
                 "message": f"explore_{mode} returned a {parsed.mode.value!r} result"}]
    problems = []
    if parsed.status in ("ok", "partial"):
        for key, types in REQUIRED_FINDINGS[mode].items():
            if not isinstance(result.get(key), types):
                wanted = " or ".join("object" if t is dict else "array" for t in types)
                problems.append({"mode": mode, "path": f"$.{key}",
                                 "message": f"an {parsed.status} {mode} result needs {key} ({wanted})"})
    return problems


def aggregate(results: dict[str, dict[str, Any]], objective: str) -> dict[str, Any]:
    """FTL's aggregated exploration: ``{_meta, structure, pattern, memory, delta}``.

    A missing or failed mode is kept as ``{"mode", "status": "error"}`` so the planner sees
    what it is missing instead of a silent gap.

    Raises:
        FtlError(aggregation_failed): a result does not match its schema (`check_result`);
            ``details = {"modes": [modes to explore again], "violations": [{mode, path,
            message}]}``.
    """
    violations = [v for mode, result in sorted(results.items()) for v in check_result(mode, result)]
    if violations:
        modes = sorted({v["mode"] for v in violations})
        raise FtlError("aggregation_failed", {"modes": modes, "violations": violations},
                       message=f"Explorer results could not be aggregated: {violations[0]['message']}"
                               f" ({violations[0]['path']} of the {violations[0]['mode']} result).")
    exploration: dict[str, Any] = {"_meta": {"version": "1.0", "objective": objective,
                                             "modes_completed": sorted(
                                                 m for m, r in results.items()
                                                 if r.get("status") in ("ok", "partial"))}}
    for mode in MODES:
        exploration[mode] = results.get(mode) or {"mode": mode, "status": "error",
                                                  "error": "no result"}
    return exploration
