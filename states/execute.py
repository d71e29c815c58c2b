"""EXECUTE: hand the ready set to the dynamic scheduler until nothing more can start.

Bounds enforced in code (FTL asked for them in prose): ``iteration_count`` counts EXECUTE
entries (> ``max_iterations`` -> ``iteration_exhausted``); a ready set identical to the one of
the previous entry ``stuck_threshold`` times in a row -> ``stuck_detected``. Both route through
ERROR to CASCADE. Task status is written in the scheduler thread before each start
(pending -> running, ``TASK_START``) and after each end (``TASK_END``), so the store and the log
never disagree about what ran. Both events say where: ``node`` ``"driver"`` for a task run on
this machine; a task sent to a Ray cluster gets its node from ``TASK_PLACED`` (the node is
Ray's choice, known once the attempt starts there) and again in ``TASK_END``. A lost cluster
(`ftl.executors.ray_cluster.RayCluster.lost`) cancels the scheduler; the state then raises
`ftl.engine.runner.RunStopped` and the run ends resumable, its tasks pending.
"""

from __future__ import annotations

from typing import Any

from ftl import dag
from ftl import events as ev
from ftl.errors import FtlError
from ftl.engine.runner import Next, Run, RunStopped
from ftl.engine.scheduler import CancelToken, Scheduler, TaskOutcome, critical_path_priority

#: An agent builder's cost fields, copied from a task's outcome into its TASK_END (issue 12).
AGENT_COST_KEYS = ("total_cost_usd", "num_turns", "duration_api_ms", "usage", "session_id")


def enter(run: Run) -> Next:
    tracked = run.tracked
    tracked.iteration_count += 1
    if tracked.iteration_count > run.config.max_iterations:
        raise FtlError("iteration_exhausted", {"count": tracked.iteration_count})
    rows = run.store.tasks(run.campaign_id)
    ready = dag.ready_set({r["seq"]: r["depends"] for r in rows}, {r["seq"]: r["status"] for r in rows})
    run.log.emit(ev.READY_TASKS, count=len(ready), iteration=tracked.iteration_count, seqs=ready)
    tracked.stuck_count = tracked.stuck_count + 1 if ready and ready == tracked.prior_ready else 0
    tracked.prior_ready, tracked.prior_ready_count = ready, len(ready)
    if tracked.stuck_count >= run.config.stuck_threshold:
        raise FtlError("stuck_detected", {"count": tracked.stuck_count})
    if ready:
        run_dag(run, jobs=run.config.jobs)
    return Next("cascade")


def run_dag(run: Run, *, jobs: int) -> dict[str, TaskOutcome]:
    """Run every runnable pending task of the campaign with at most ``jobs`` at once."""
    from ftl.states.build import run_task

    rows = run.store.tasks(run.campaign_id)
    deps = {r["seq"]: r["depends"] for r in rows}
    done = [r["seq"] for r in rows if r["status"] == "complete"]

    def on_cluster(seq: str) -> bool:
        return run.cluster is not None and run.runs_on_cluster(run.current_plan.task(seq))
    blocked = [r["seq"] for r in rows if r["status"] == "blocked"]

    def on_start(seq: str, worker: str) -> None:
        row = run.store.transition_task(run.campaign_id, seq, "running", worker=worker)
        # A cluster task's node is known once Ray placed it (TASK_PLACED); others run here.
        where = ({"executor": "ray"} if on_cluster(seq)
                 else {"executor": "local", "node": "driver"})
        run.log.emit(ev.TASK_START, task_seq=seq, worker=worker, attempt=row.get("attempts"),
                     workspace_id=f"{seq}-{row.get('slug')}", **where)

    ended: set[str] = set()  # the tasks whose TASK_END this run wrote

    def on_finish(outcome: TaskOutcome, worker: str) -> None:
        # The scheduler repeats a report that a Ctrl-C cut (its drain), so each step is done
        # once: the store's end unless already there, then the log's unless already written.
        # A repeat that only checked the store would leave the attempt without its TASK_END.
        detail: dict[str, Any] = outcome.detail
        if outcome.seq in ended:
            return
        if run.store.task(run.campaign_id, outcome.seq)["status"] != "running":
            pass  # stored by the cut report; its log line is still to write
        elif outcome.status == "complete":
            run.store.transition_task(run.campaign_id, outcome.seq, "complete",
                                      delivered=detail.get("delivered"))
        elif outcome.status == "blocked":
            run.store.transition_task(run.campaign_id, outcome.seq, "blocked",
                                      reason=detail.get("reason"))
        else:
            run.store.transition_task(run.campaign_id, outcome.seq, "pending", reason="resume")
        agent = {key: detail[key] for key in AGENT_COST_KEYS if detail.get(key) is not None}
        where = {key: detail[key] for key in ("node", "node_worker") if detail.get(key)}
        if not on_cluster(outcome.seq):
            where.setdefault("node", "driver")
        run.log.emit(ev.TASK_END, task_seq=outcome.seq, worker=worker, status=outcome.status,
                     error_type=detail.get("error_type"), duration_ms=detail.get("duration_ms"),
                     **({"commit": detail["commit"]} if detail.get("commit") else {}), **agent,
                     **where)
        ended.add(outcome.seq)

    # Longest remaining chain first, with budgets standing in for unknown durations: the
    # scheduler benchmark measured 0.995 of the lower bound this way against 0.946 in seq order.
    # Not the task's timeout: a limit, often the same for every task, which flattens the order
    # to chain length (0.943 of the bound on the 18-task DAG against 0.973, bench_priority.py).
    durations = {r["seq"]: r["spec"].get("budget", 5) * run.config.seconds_per_budget for r in rows}
    cluster = run.cluster
    if cluster is not None and cluster.lost is not None:
        raise _cluster_lost(cluster)
    token = CancelToken()
    # A lost cluster cancels the run (its tasks go back to pending), then stops it resumably.
    scheduler = Scheduler(deps, jobs=jobs, run_task=lambda seq, token, worker: run_task(run, seq, token, worker),
                          on_start=on_start, on_finish=on_finish, done=done, blocked=blocked,
                          priority=critical_path_priority(deps, durations), cancel=token,
                          interrupt=run.interrupt,
                          executor=cluster.executor(on_lost=token.cancel) if cluster is not None else None)
    try:
        outcomes = scheduler.run()
    finally:
        if cluster is not None:
            cluster.run_finished()
    if cluster is not None and cluster.lost is not None and any(
            outcome.status == "cancelled" for outcome in outcomes.values()):
        raise _cluster_lost(cluster)
    return outcomes


def _cluster_lost(cluster: Any) -> RunStopped:
    """The resumable stop for a lost Ray cluster (`ftl.executors.ray_cluster.RayCluster.lost`)."""
    return RunStopped(FtlError("cluster_lost", {"address": cluster.address, "cause": cluster.lost}))
