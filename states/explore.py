"""EXPLORE: run the explorer modes in parallel under a timeout and a quorum (FTL EXPLORE_PATTERN).

Quorum: `ftl.models.quorum_met` (distinct modes with an ``ok`` or ``partial`` result;
``explorer_quorum`` of them, default 3 of 4, or both structure and delta). Outcomes: quorum met
-> PLAN (with ``PARTIAL_FAILURE`` naming missing modes); quorum not met but explorers timed out with some results -> ``timeout`` (ERROR routes to PLAN with the
partial data); otherwise -> ``quorum_failure`` (ERROR returns the partial results).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from ftl import events as ev
from ftl.errors import FtlError
from ftl.models import EXPLORER_MODES, quorum_met
from ftl.runner import Next, Run
from ftl.tools import fact

MODES = EXPLORER_MODES
INTENT = "explore_codebase"
# Explorers get a slightly shorter deadline than the state waits for them, so an explorer that
# runs out of time still returns its partial result before EXPLORE gives up on it.
EXPLORER_SHARE = 0.9
JOIN_GRACE_S = 5.0


def enter(run: Run) -> Next:
    facts = run.facts() + [fact("explorer_mode", mode) for mode in MODES]
    selected = run.tools.select(INTENT, facts)
    modes = [mode for mode in MODES if f"explore_{mode}" in selected]
    stop = threading.Event()
    results: dict[str, dict[str, Any]] = {}
    timeout_s = run.config.explorer_timeout_s

    def explore(mode: str) -> dict[str, Any]:
        args = {"objective": run.objective, "campaign_id": run.campaign_id,
                "timeout_s": timeout_s * EXPLORER_SHARE}
        return run.recovery.run(
            lambda attempt: run.tools.call(INTENT, facts, f"explore_{mode}", args,
                                           state="EXPLORE", cancel=stop),
            tool=f"explore_{mode}", state="EXPLORE", cancel=stop)

    pool = ThreadPoolExecutor(max_workers=max(1, len(modes)), thread_name_prefix="explorer")
    futures = {pool.submit(explore, mode): mode for mode in modes}
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
            result = future.result()
            results[mode] = result
            run.store.record_explorer_result(run.campaign_id, mode, result)
            run.log.emit(ev.EXPLORER_RESULT, mode=mode, status=result.get("status", "ok"))
        else:
            run.recovery.recovery(strategy="proceed_without_explorer", success=True,
                                  mode=mode, error_type=getattr(error, "error_type", "internal_error"))

    usable = {mode for mode, result in results.items() if result.get("status") in ("ok", "partial")}
    missing = sorted(set(MODES) - usable)
    run.exploration = aggregate(results, run.objective)
    run.store.save_exploration(run.campaign_id, run.exploration)
    quorum = min(run.config.explorer_quorum, len(MODES))
    if quorum_met(usable, quorum):
        if missing:
            run.log.emit(ev.PARTIAL_FAILURE, missing=missing)
        return Next("plan")
    if not_done and usable:
        run.log.emit(ev.PARTIAL_FAILURE, missing=missing)
        raise FtlError("timeout", {"what": "exploration", "timeout_s": timeout_s, "missing": missing})
    raise FtlError("quorum_failure", {"completed": len(usable), "required": quorum, "missing": missing})


def aggregate(results: dict[str, dict[str, Any]], objective: str) -> dict[str, Any]:
    """FTL's aggregated exploration: ``{_meta, structure, pattern, memory, delta}``.

    A missing or failed mode is kept as ``{"mode", "status": "error"}`` so the planner sees
    what it is missing instead of a silent gap.
    """
    exploration: dict[str, Any] = {"_meta": {"version": "1.0", "objective": objective,
                                             "modes_completed": sorted(
                                                 m for m, r in results.items()
                                                 if r.get("status") in ("ok", "partial"))}}
    for mode in MODES:
        exploration[mode] = results.get(mode) or {"mode": mode, "status": "error",
                                                  "error": "no result"}
    return exploration
