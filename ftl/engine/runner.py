"""Runs a campaign: builds the machine, the tool client and the run context; starts and resumes.

The loop is deliberately small: enter a state (``STATE_ENTRY`` first, then the state and the
tracked variables are saved to the store), run that state's handler from ``ftl.states``, fire
the trigger it returns. A handler that raises goes to ERROR at once: the failure is emitted and
classified (if the recovery protocol has not already done it) and ``fail`` is the next and only
trigger. A trigger the machine refuses (an illegal transition) goes to ERROR the same way. A
run ends in COMPLETE, or RETURNs from ERROR with a summary, or is cancelled (Ctrl-C) and left
resumable. An error outside any state (the store cannot save the machine, or cannot finish the
campaign) stops the run: ``RUN_END`` (outcome ``cancelled``, ``reason: "error"``, resumable) is
still written, the log and the tool server are closed, and the error is raised to the caller.

One process drives a repository's campaign at a time: `Runner.start` and `Runner.resume` hold
an exclusive ``flock`` on ``.ftl/run.lock`` for the whole drive (a second process gets
``conflict`` naming the holder's pid; `ftl.engine.run_lock`). The lock dies with its process,
so ``kill -9`` frees it.

A lost executor (the Ray cluster went away) is not the campaign's error either: the state that
finds it raises `RunStopped`, and the run ends ``stopped`` (resumable) with its tasks back to
pending, so `ftl campaign resume` continues once the cluster is back.

Exit codes (FTL has none; these are ftl's): 0 every task complete, 3 finished with blocked
tasks, 4 returned from ERROR, 75 stopped because the executor was lost (resumable; sysexits'
EX_TEMPFAIL), 130 cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ftl import events as ev
from ftl.config import Config
from ftl.errors import FtlError, Route
from ftl.executors.agent_limits import AgentLimits
from ftl.engine.machine import CampaignMachine, Flow, State, Tracked
from ftl.models import Plan
from ftl.engine.run_lock import LOCK_FILE, RunLock
from ftl.engine.recovery import RecoveryProtocol, RetryPolicy, classify_exception
from ftl.store import Store
from ftl.engine.tools import ToolClient

_LOG = logging.getLogger("ftl")

EXIT_OK, EXIT_BLOCKED, EXIT_RETURNED, EXIT_BAD_INPUT, EXIT_CANCELLED = 0, 3, 4, 2, 130
EXIT_STOPPED = 1  # an error outside any state stopped the run (the CLI's internal-error code)
EXIT_UNAVAILABLE = 75  # the executor was lost; resume later (sysexits.h EX_TEMPFAIL)
MAX_ERROR_ENTRIES = 5
#: Key in the stored tracked variables: a re-plan was merged and EXECUTE has not started on it
#: yet (written with the merge, in one transaction; see ``states/cascade.py``).
REPLAN_MERGED = "replan_merged"


@dataclass(frozen=True)
class Next:
    """A handler's answer: fire ``trigger`` next."""

    trigger: str


@dataclass(frozen=True)
class Finish:
    """A handler's answer: the run is over with ``outcome`` and ``exit_code``."""

    outcome: str
    exit_code: int
    summary: dict[str, Any]


class RunStopped(Exception):
    """Raised by a state handler to stop the run resumably: the campaign stays active, its
    interrupted tasks are pending again, and ``RUN_END`` says why (outcome ``stopped``).

    Args:
        error: what stopped it (e.g. ``cluster_lost`` whose ``cause`` says why the cluster is
            lost); its message and safe details become the run's summary.
    """

    def __init__(self, error: FtlError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class RunResult:
    campaign_id: str
    outcome: str
    exit_code: int
    summary: dict[str, Any]
    log_path: Path


@dataclass
class Run:
    """Everything a state handler may use; also the `transitions` model (guards, callbacks).

    Locals of a state are not kept here: a handler computes them on every entry. Attribute
    names must not collide with trigger names (`transitions` binds each trigger as a method
    on the model), hence ``current_plan`` rather than ``plan``.
    """

    repo: Path
    store: Store
    config: Config
    log: ev.EventLog
    tools: ToolClient
    recovery: RecoveryProtocol
    campaign_id: str
    flow: Flow
    objective: str
    tracked: Tracked
    plan_input: dict[str, Any] | None = None
    revised_plan_input: dict[str, Any] | None = None
    current_plan: Plan | None = None  # not "plan": that name is the trigger
    exploration: dict[str, Any] = field(default_factory=dict)
    error: FtlError | None = None
    error_origin: str | None = None
    replan_ok: bool = False
    replan_pending: bool = False  # a merged re-plan not yet handed to EXECUTE (REPLAN_MERGED)
    ended: bool = False  # RUN_END written
    cascade_analysis: dict[str, Any] | None = None
    observation: dict[str, Any] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    interrupt: threading.Event = field(default_factory=threading.Event)  # `Runner.interrupt`
    isolation: str = "shared"  # the campaign's default: "worktree" or "shared"
    worktrees: Any = None  # ftl.vcs.worktrees.Worktrees when worktree isolation is possible
    cluster: Any = None  # ftl.executors.ray_cluster.RayCluster with [executor] kind = "ray"
    agent_limits: AgentLimits = field(default_factory=AgentLimits)  # shared by agent builders
    machine_state: str = State.INIT.value  # set by transitions

    # --- guards (named methods; transitions passes EventData) ---
    def clarifications_left(self, _event: Any = None) -> bool:
        return self.tracked.clarify_count <= self.config.max_clarifications

    def plan_accepted(self, _event: Any = None) -> bool:
        return self.current_plan is not None

    def replan_merged(self, _event: Any = None) -> bool:
        return self.replan_ok

    def replan_from_error_allowed(self, _event: Any = None) -> bool:
        return self.error is not None and self.error.kind.route is Route.PLAN

    # --- callbacks ---
    def on_transition(self, event: Any) -> None:
        self.log.emit(ev.PHASE_TRANSITION, state=event.transition.source,
                      **{"from": event.transition.source.lower(), "to": event.transition.dest.lower(),
                         "trigger": event.event.name})

    @property
    def state(self) -> State:
        return State(self.machine_state)

    def task_isolation(self, task: Any) -> str:
        """``worktree`` or ``shared`` for ``task``: its own ``isolation``, else the campaign's."""
        return task.isolation or self.isolation

    def runs_on_cluster(self, task: Any) -> bool:
        """Whether ``task``'s attempts go to the Ray cluster: a cluster is connected, the task
        is isolated in a worktree (its result is a commit) and its builder is the shell
        builder (agent builders need the driver's agent CLI and login). Else the driver."""
        return (self.cluster is not None and self.worktrees is not None
                and self.task_isolation(task) == "worktree" and task.builder_kind == "shell")

    def tracked_json(self) -> dict[str, Any]:
        """The tracked variables as stored: `Tracked` plus the ``replan_merged`` marker while a
        merged re-plan waits for EXECUTE."""
        data = self.tracked.to_json()
        if self.replan_pending:
            data[REPLAN_MERGED] = True
        return data

    def select_tools(self, intent: str, facts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """`ToolClient.select` under the recovery protocol (tool ``select:<intent>``): a
        transient failure of the evaluation (``server_not_ready`` with its ``retry_after_ms``,
        ``timeout``, ``network_error``) is emitted, classified and retried once like any tool
        call (FTL ERROR_HANDLING), instead of going straight to ERROR.

        Returns:
            ``{tool_name: macro_tool_dict}`` as `ToolClient.select`.
        Raises:
            FtlError: the last failure once the policy gives up (already emitted and classified).
        """
        return self.recovery.run(lambda attempt: self.tools.select(intent, facts),
                                 tool=f"select:{intent}", state=self.machine_state,
                                 cancel=self.cancel)

    def facts(self) -> list[dict[str, Any]]:
        """Facts that describe the campaign to the tool server (MangleCP intent_request)."""
        from ftl.engine.tools import fact
        facts = [fact("campaign_state", self.machine_state.lower())]
        if self.current_plan is not None and self.current_plan.framework:
            facts.append(fact("framework", self.current_plan.framework))
        return facts


def _end_cut_attempts(run: Any) -> None:
    """Write, on the crashed run's behalf, the ``TASK_END`` a kill kept from its log.

    A task's end is committed to the store first and logged just after (`ftl.states.execute`):
    a kill between the two leaves a task complete (or blocked) in the store whose attempt the
    log shows as cut. The resume does not run such a task again, so nothing else would ever
    end that attempt in the log. Its ``TASK_END`` carries the stored status and
    ``recovered: true``, and goes before the resume's ``RUN_START``, inside the run it belongs to.
    Attempts still ``running`` in the store were reset to pending and stay cut: they run again.
    ``duration_ms`` is the store's running -> end span (the line's own timestamp is the
    resume's, which would count the time ftl was down).
    """
    cut = ev.unended_task_starts(run.log.path)
    if not cut:
        return
    for row in run.store.tasks(run.campaign_id, seqs=sorted(cut)):
        if row["status"] in ("complete", "blocked"):
            start = cut[row["seq"]]
            where = {key: start[key] for key in ("executor", "node") if start.get(key)}
            run.log.emit(ev.TASK_END, state=start.get("state"), task_seq=row["seq"],
                         worker=start.get("worker"), status=row["status"],
                         duration_ms=ev.ms_between(row.get("started_at"), row.get("finished_at")),
                         recovered=True, **where)


def connect(config: Config, repo: Path) -> Any:
    """The MangleCP client for ``config.server``: ftl's embedded server in this process
    (default), the same server as a subprocess over stdio (``embedded:stdio``), ``stdio:CMD``
    or an http(s) URL (`ftl.server.app.connect` documents the forms).

    The client never retries on its own (``max_retries=0``): every retry is the recovery
    protocol's, announced by ``TOOL_FAILURE`` / ``FAILURE_CLASSIFIED`` / ``RETRY``.

    Raises:
        FtlError(configuration_error): an unrecognised server address.
    """
    from ftl.server.app import connect as connect_server

    return connect_server(repo, config, max_retries=0)


def connect_in_process(config: Config, repo: Path) -> Any:
    """The embedded server in this process, also when ``config.server`` is ``embedded:stdio``
    (tests; another server's address is still used); no client retries."""
    from ftl.server.app import connect as connect_server

    return connect_server(repo, config, in_process=True, max_retries=0)


def decide_isolation(setting: str, repo: Path) -> tuple[str, str]:
    """The campaign's isolation for the ``isolation`` setting of ftl.toml.

    Returns:
        ``(isolation, notice)``: ``worktree`` or ``shared``, and a one-line notice for the user
        ("" when there is nothing to say).

    Raises:
        FtlError(configuration_error): ``worktree`` was asked for where it cannot work (not a
            git work tree, no commit yet, git older than 2.38).
    """
    if setting == "shared":
        return "shared", ""
    from ftl.vcs.worktrees import probe

    found = probe(repo)
    if found.available:
        notice = ""
        if found.dirty:
            notice = (f"tasks run in git worktrees from HEAD; {found.dirty} uncommitted change(s) "
                      "in your checkout are not part of the campaign")
        return "worktree", notice
    if setting == "worktree":
        raise FtlError("configuration_error", {
            "problem": f"isolation = \"worktree\" cannot be used here: {found.reason}"})
    return "shared", f"tasks share the repository's checkout ({found.reason}); isolation = shared"


class Runner:
    """Starts or resumes campaigns in one repository.

    Args:
        repo: the target repository (its ``.ftl/`` holds the store and the event logs).
        config: the run configuration.
        client_factory: builds the MangleCP client (tests pass a recording one); default `connect`.
        sleep: injected into the retry protocol (tests record delays instead of sleeping).
        on_event: a listener for every event (progress views).
        wait_for_leftovers: on resume, let commands a crashed run left running finish (up to
            their task timeout) before anything runs again; False kills them at once.
        interrupt: set it from any thread to stop the run as a Ctrl-C would: running tasks are
            cancelled (pending again, within the scheduler's 0.2 s poll), the state in progress
            finishes, and the run ends ``cancelled``, resumable (e.g. an MCP client cancelling
            its ``campaign_run``). A fresh event when None (`interrupt`).

    A context manager: leaving it (or `close`) closes the store.
    """

    def __init__(self, repo: Path, config: Config, *,
                 client_factory: Callable[[Config, Path], Any] = connect,
                 sleep: Callable[[float], Any] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 wait_for_leftovers: bool = True,
                 interrupt: threading.Event | None = None) -> None:
        self.repo = repo
        self.config = config
        self.client_factory = client_factory
        self.sleep = sleep
        self.on_event = on_event
        self.wait_for_leftovers = wait_for_leftovers
        self.interrupt = interrupt if interrupt is not None else threading.Event()
        self.store = Store.for_repo(repo)

    def close(self) -> None:
        """Close the store. Idempotent."""
        self.store.close()

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # --- entry points ---
    def start(self, objective: str, *, plan_input: dict[str, Any] | None = None,
              flow: Flow = Flow.CAMPAIGN, revised_plan_input: dict[str, Any] | None = None,
              intent: Path | None = None) -> RunResult:
        """Create a campaign and drive it to its end.

        Args:
            intent: the intent file the CLI wrote first (`ftl.engine.intent`); removed once the
                campaign row holds the same inputs.

        Raises:
            FtlError(conflict): another campaign is active in this repository (resume or
                finish it first), or another ftl process is driving one.
        """
        try:
            with self._driving(None):
                return self._start_locked(objective, plan_input, flow, revised_plan_input, intent)
        except FtlError:
            from ftl.engine.intent import discard_intent

            discard_intent(intent)  # refused (conflict, configuration): nothing to resume
            raise

    def _start_locked(self, objective: str, plan_input: dict[str, Any] | None, flow: Flow,
                      revised_plan_input: dict[str, Any] | None,
                      intent: Path | None, isolation_setting: str | None = None) -> RunResult:
        """Start with the run lock held (by `start`, or by `resume` from an intent, with the
        ``--isolation`` the interrupted `ftl campaign run` was given, if any)."""
        isolation, notice = decide_isolation(isolation_setting or self.config.isolation, self.repo)
        # Intent first (issue "crash safety", item 2): the campaign with every input, and
        # RUN_START, are written before anything slow (the tool server's boot, EXPLORE), so a
        # kill from the first second on leaves a campaign that `resume` continues.
        plan_sha256 = _digest(plan_input)
        campaign = self.store.create_campaign(
            objective, flow=flow.value,
            inputs={"plan_input": plan_input, "revised_plan_input": revised_plan_input,
                    "isolation": isolation, "plan_sha256": plan_sha256,
                    "executor": self.config.executor.kind,
                    "intent": intent.name if intent is not None else None})
        from ftl.engine.intent import discard_intent

        discard_intent(intent)  # the campaign row holds it now
        log = self._open_log(campaign["id"])
        log.emit(ev.RUN_START, state=None, mode=flow.value, objective=objective, resume=False,
                 pid=os.getpid(), config=self.config.model_dump(mode="json"),
                 isolation=isolation, plan_sha256=plan_sha256,
                 **({"notice": notice} if notice else {}))
        client, cluster = self._connect_or_stop(log)
        try:
            run = self._make_run(campaign, Tracked(), plan_input, revised_plan_input,
                                 client=client, log=log, cluster=cluster)
        except BaseException:
            _close(client)
            if cluster is not None:
                cluster.shutdown()
            log.close()
            raise
        return self._drive(run, CampaignMachine(run, flow, State.INIT))

    def resume(self, campaign_id: str | None = None) -> RunResult:
        """Continue an interrupted campaign from its stored state.

        Completed tasks are never run again; tasks that were running when the process died go
        back to pending and are re-run from a fresh workspace.

        Raises:
            FtlError(not_found): no such campaign, or no active campaign to resume.
            FtlError(conflict): the campaign is finished, or another ftl process is running it
                (its running tasks are then left alone).
        """
        # Locked before anything is read: reset_running must never touch the tasks of a live run.
        with self._driving(campaign_id):
            campaign = self.store.get_campaign(campaign_id) if campaign_id else self.store.active_campaign()
            if campaign is None:
                started = self._start_from_intent()
                if started is not None:
                    return started
                latest = self.store.latest_campaign()
                if latest is not None:  # say what there is, not "not found"
                    raise FtlError("conflict", {"what": (
                        f"campaign {latest['id']} is {latest['status']}, not active; nothing to "
                        "resume (`ftl campaign status` shows it; `ftl campaign run` starts a new "
                        "one)")})
                raise FtlError("not_found", {"what": "an active campaign to resume"})
            if campaign["status"] != "active":
                raise FtlError("conflict", {"what": f"campaign {campaign['id']} is {campaign['status']}, "
                                                    "not active; nothing to resume"})
            inputs = campaign.get("inputs") or {}
            tracked = Tracked.from_json(campaign.get("tracked"))
            run = self._make_run(campaign, tracked, inputs.get("plan_input"),
                                 inputs.get("revised_plan_input"))
            state = State(campaign.get("machine_state") or State.INIT.value)
            try:
                run.replan_pending = bool((campaign.get("tracked") or {}).get(REPLAN_MERGED))
                run.exploration = self.store.exploration(run.campaign_id) or {}
                try:
                    run.current_plan = self.store.get_plan(run.campaign_id)
                except FtlError:
                    run.current_plan = None
                if campaign.get("error"):
                    record = campaign["error"]
                    run.error = FtlError(record["error_type"], record.get("details"),
                                         message=record.get("message") or None)
                    # The state that failed decides the route (a timeout re-plans only from
                    # EXPLORE); a record written before the origin was kept has None, which
                    # routes that error to the summary.
                    run.error_origin = campaign["error"].get("origin")
                reset = self.store.reset_running(run.campaign_id)
                _end_cut_attempts(run)
            except BaseException:  # not driving yet: close what _make_run opened
                run.log.close()
                _close(run.tools.client)
                if run.cluster is not None:
                    run.cluster.shutdown()
                raise
            started_on = inputs.get("executor") or "local"
            notice = (f"this campaign started with executor {started_on}; it resumes with "
                      f"{self.config.executor.kind} (--executor chooses)"
                      if started_on != self.config.executor.kind else None)
            run.log.emit(ev.RUN_START, state=None, mode=run.flow.value, objective=run.objective,
                         resume=True, pid=os.getpid(), config=self.config.model_dump(mode="json"),
                         isolation=run.isolation, **({"notice": notice} if notice else {}))
            run.log.emit(ev.RESUME, state=None, from_state=state.value, reset_tasks=reset)
            return self._drive(run, CampaignMachine(run, run.flow, state), resumed=True)

    # --- internals ---
    def _start_from_intent(self) -> RunResult | None:
        """A run killed before it recorded its campaign left its intent (`ftl.engine.intent`): start
        that campaign now (the plan validated as `ftl campaign run` would), or None when there
        is no intent. A plan that no longer validates is refused and its intent removed."""
        from ftl.engine.intent import discard_intent, pending_intent
        from ftl.validation import parse_plan

        found = pending_intent(self.repo)
        if found is None:
            return None
        path, intent = found
        recorded = {(c.get("inputs") or {}).get("intent") for c in self.store.list_campaigns()}
        if path.name in recorded:  # killed between recording the campaign and removing this
            discard_intent(path)
            return None
        try:
            plan = (parse_plan(intent["plan"], source="the recorded intent")
                    if intent.get("plan") is not None else None)
            plan_input = plan.model_dump(mode="json", by_alias=True, exclude_none=True) if plan else None
            revised = intent.get("revised_plan")
            if revised is not None:
                known = [task["seq"] for task in (plan_input or {}).get("tasks", [])]
                revised = parse_plan(revised, source="the recorded intent",
                                     known_seqs=known).model_dump(mode="json", by_alias=True,
                                                                  exclude_none=True)
            objective = intent.get("objective") or (plan_input or {}).get("objective")
            if not objective:
                raise FtlError("invalid_params", {"schema_errors": [
                    {"path": "OBJECTIVE", "message": "the recorded intent has no objective"}]})
        except BaseException:
            discard_intent(path)
            raise
        setting = intent.get("isolation")  # the run's --isolation: the campaign it asked for
        return self._start_locked(objective, plan_input, Flow(intent.get("flow") or "campaign"),
                                  revised, path,
                                  setting if setting in ("auto", "worktree", "shared") else None)

    @contextlib.contextmanager
    def _driving(self, campaign_id: str | None) -> Iterator[None]:
        """Hold the repository's run lock and route internals to ``.ftl/ftl.log`` for one drive."""
        lock = RunLock(self.repo / ".ftl" / LOCK_FILE)
        lock.acquire(lambda: self._holder_campaign(campaign_id))
        try:
            with _server_log(self.repo):
                yield
        finally:
            lock.release()

    def _holder_campaign(self, campaign_id: str | None) -> str:
        if campaign_id:
            return campaign_id
        try:
            active = self.store.active_campaign()
        except FtlError:
            active = None
        return active["id"] if active else "(not yet created)"

    def _open_log(self, campaign_id: str) -> ev.EventLog:
        log = ev.EventLog(ev.log_path(self.repo, campaign_id), campaign_id)
        if self.on_event:
            log.subscribe(self.on_event)
        return log

    def _connect_cluster(self) -> Any:
        """The Ray cluster of ``[executor] kind = "ray"`` (`ftl.executors.ray_cluster`), or
        None for the local executor. Raises FtlError(configuration_error) when it cannot."""
        if self.config.executor.kind != "ray":
            return None
        if self.config.gates:
            # The gates run in the tool server on the driver; cluster attempts do not pass
            # through it, so a gate would be skipped without a word: refused instead.
            raise FtlError("configuration_error", {
                "problem": "[gates] cannot be used with [executor] kind = \"ray\" yet: cluster "
                           "attempts do not pass through the tool server that runs the gates; "
                           "remove one of the two tables"})
        from ftl.executors.ray_cluster import RayCluster

        return RayCluster(self.config.executor.address, self.repo,
                          lost_after_s=self.config.executor.lost_after_s)

    def _connect_or_stop(self, log: ev.EventLog) -> Any:
        """Connect to the tool server (and the Ray cluster, when configured): ``(client,
        cluster)``; if that fails (or is interrupted), end the log as a
        stopped run, leave the campaign active for `resume`, and re-raise."""
        try:
            client = self.client_factory(self.config, self.repo)
            try:
                return client, self._connect_cluster()
            except BaseException:
                _close(client)
                raise
        except BaseException as exc:
            with contextlib.suppress(Exception):
                if isinstance(exc, KeyboardInterrupt):
                    log.emit(ev.RUN_END, outcome="cancelled", exit_code=EXIT_CANCELLED,
                             resumable=True)
                else:
                    error = classify_exception(exc)
                    _LOG.error("connecting to the tool server failed (correlation id %s)",
                               error.details.get("correlation_id"), exc_info=exc)
                    if error.error_type == "configuration_error":
                        # A wrong server address or gate setup: resuming cannot help, so the
                        # campaign ends here and a corrected `ftl campaign run` may start.
                        log.emit(ev.RUN_END, outcome="cancelled", exit_code=EXIT_STOPPED,
                                 resumable=False, reason="configuration_error",
                                 error_type=error.error_type)
                        self.store.finish_campaign(log.campaign_id, "cancelled", {
                            "error": {"error_type": error.error_type,
                                      "details": error.safe_details()}})
                    else:  # unreachable for now: the campaign stays active for `resume`
                        log.emit(ev.RUN_END, outcome="stopped", exit_code=EXIT_STOPPED,
                                 resumable=True, reason="error", error_type=error.error_type)
            log.close()
            raise

    def _make_run(self, campaign: dict[str, Any], tracked: Tracked, plan_input: dict | None,
                  revised_plan_input: dict | None, client: Any = None,
                  log: ev.EventLog | None = None, cluster: Any = None) -> Run:
        campaign_id = campaign["id"]
        if client is None:
            client = self.client_factory(self.config, self.repo)
            try:
                cluster = self._connect_cluster()
            except BaseException:
                _close(client)
                raise
        log = log if log is not None else self._open_log(campaign_id)
        cancel = threading.Event()
        isolation = (campaign.get("inputs") or {}).get("isolation") or "shared"
        worktrees = None
        if isolation == "worktree" or any(
                (task or {}).get("isolation") == "worktree"
                for task in ((plan_input or {}).get("tasks") or [])):
            from ftl.vcs.worktrees import Worktrees, probe

            if isolation == "worktree" or probe(self.repo).available:
                worktrees = Worktrees(self.repo, campaign_id)
        policy = RetryPolicy(transient_retries=self.config.transient_retries,
                             flaky_retries=self.config.flaky_verify_retries,
                             backoff_min_s=self.config.retry_backoff_min_s,
                             backoff_max_s=self.config.retry_backoff_max_s,
                             retry_after_max_s=self.config.retry_after_max_s)
        return Run(repo=self.repo, store=self.store, config=self.config, log=log,
                   tools=ToolClient(client, log),
                   recovery=RecoveryProtocol(log, policy, sleep=self.sleep, cancel=cancel),
                   campaign_id=campaign_id, flow=Flow(campaign.get("flow") or "campaign"),
                   objective=campaign["objective"], tracked=tracked, plan_input=plan_input,
                   revised_plan_input=revised_plan_input, cancel=cancel, isolation=isolation,
                   worktrees=worktrees, cluster=cluster, interrupt=self.interrupt)

    def _drive(self, run: Run, machine: CampaignMachine, resumed: bool = False) -> RunResult:
        """Run states until the run finishes; always ends the log with ``RUN_END`` and closes
        the log and the tool client, whatever escapes."""
        from ftl.states import HANDLERS

        try:
            while True:
                if run.interrupt.is_set():  # asked to stop from another thread: as a Ctrl-C
                    raise KeyboardInterrupt
                state = machine.state
                run.log.state = state.value
                entry: dict[str, Any] = {"resumed": True} if resumed else {}
                resumed = False
                if state is State.ERROR and run.error is not None:
                    entry.update(error_type=run.error.error_type, route=run.error.kind.route.value)
                run.log.emit(ev.STATE_ENTRY, state=state.value, **entry)
                if run.cluster is not None and run.cluster.lost is not None:
                    run.cluster.shutdown()  # else Ray's driver ends this process a minute on
                if entry.get("resumed"):
                    self._reap_orphans(run, state)
                self.store.save_machine(run.campaign_id, state.value, run.tracked_json(),
                                        error=_error_record(run.error, run.error_origin))
                try:
                    step = HANDLERS[state](run)
                except (KeyboardInterrupt, RunStopped):
                    raise
                except BaseException as exc:  # noqa: BLE001 - every failure goes to ERROR,
                    if run.interrupt.is_set():  # unless an interrupt caused it
                        raise KeyboardInterrupt from exc
                    returned = self._fail(run, machine, state, exc)
                    if returned is not None:
                        return returned
                    continue
                if run.interrupt.is_set():  # the state ended early (its tasks were cancelled)
                    raise KeyboardInterrupt
                if isinstance(step, Finish):
                    return self._finish(run, step)
                try:
                    machine.fire(step.trigger)
                except FtlError as exc:  # an illegal trigger or a refused guard: a handler bug
                    returned = self._fail(run, machine, state, exc)
                    if returned is not None:
                        return returned
                    continue
                if state is State.ERROR:
                    run.error = None  # handled: its route has been taken
        except KeyboardInterrupt:
            run.cancel.set()
            if not run.ended:
                self._end(run, outcome="cancelled", exit_code=EXIT_CANCELLED, resumable=True)
            return RunResult(run.campaign_id, "cancelled", EXIT_CANCELLED,
                             {"message": "cancelled; run `ftl campaign resume` to continue"},
                             run.log.path)
        except RunStopped as stop:
            run.cancel.set()
            error = stop.error
            if not run.ended:
                self._end(run, outcome="stopped", exit_code=EXIT_UNAVAILABLE, resumable=True,
                          reason=error.error_type, error_type=error.error_type,
                          details=error.safe_details())
            return RunResult(run.campaign_id, "stopped", EXIT_UNAVAILABLE, {
                "error": {"error_type": error.error_type, "message": error.message,
                          "details": error.safe_details()},
                "message": f"{error.message} Stopped; the campaign is resumable: "
                           "run `ftl campaign resume` once the cluster is back."}, run.log.path)
        except BaseException as exc:
            # Outside any state (saving the machine, finishing the campaign): nothing to route
            # it to. The campaign stays active and resumable; the log still gets its end.
            run.cancel.set()
            error = classify_exception(exc)
            _LOG.error("run of %s stopped: %s (correlation id %s)", run.campaign_id, error.error_type,
                       error.details.get("correlation_id"), exc_info=exc)
            if not run.ended:
                with contextlib.suppress(Exception):
                    self._end(run, outcome="stopped", exit_code=EXIT_STOPPED, resumable=True,
                              reason="error", error_type=error.error_type)
            raise
        finally:
            with contextlib.suppress(Exception):
                run.log.close()
            _close(run.tools.client)
            if run.cluster is not None:
                run.cluster.shutdown()

    def _reap_orphans(self, run: Run, state: State) -> None:
        """Before a resumed run does anything: let the build and verify commands the crashed
        run left behind finish, up to their deadlines, then kill what is left
        (`ftl.processes.reap`; ``ORPHANS_WAITING`` first, then RECOVERY_ATTEMPT
        ``reap_orphans``). A build that finishes records its checkpoint, so the resume reuses
        it instead of running it again; nothing of the old run changes the repository once
        tasks run again. ``wait_for_leftovers=False`` kills at once."""
        from ftl.processes import LEDGER_DIR, reap

        def announce(groups: list[dict]) -> None:
            until = max(group["deadline_s"] for group in groups)
            run.log.emit(ev.ORPHANS_WAITING, state=state.value, count=len(groups),
                         until=ev.utc_at(until), commands=[g["what"][:120] for g in groups])

        reaped = reap(self.repo / LEDGER_DIR, wait=self.wait_for_leftovers, on_wait=announce)
        if reaped:
            run.recovery.recovery(strategy="reap_orphans", success=True, state=state.value,
                                  groups=reaped)
        if run.worktrees is not None:  # git calls the kill cut short leave their lock files
            released = run.worktrees.release_stale_locks()
            if released:
                run.recovery.recovery(strategy="release_git_locks", success=True,
                                      state=state.value, files=released)

    def _fail(self, run: Run, machine: CampaignMachine, state: State,
              exc: BaseException) -> RunResult | None:
        """Route a failure in ``state`` to ERROR (emit and classify it first, unless the recovery
        protocol did); from ERROR itself, or when ``fail`` cannot fire, RETURN a bare internal
        error. Returns the finished run in that case, else None (the machine is in ERROR)."""
        error = classify_exception(exc)
        if error.error_type == "internal_error":
            _LOG.error("internal error in %s (correlation id %s)", state.value,
                       error.details.get("correlation_id"), exc_info=exc)
        if not getattr(error, "emitted", False):
            failure = run.log.emit(ev.TOOL_FAILURE, state=state.value,
                                   tool=f"state:{state.value.lower()}",
                                   error_type=error.error_type, message=error.message,
                                   details=error.details)
            run.log.emit(ev.FAILURE_CLASSIFIED, state=state.value,
                         failure_seq=failure["seq"], error_type=error.error_type,
                         klass=error.kind.klass.value, decision="error")
        if state is not State.ERROR:
            run.error = error
            run.error_origin = state.value
            try:
                machine.fire("fail")
                return None
            except FtlError:
                pass  # COMPLETE cannot fail over to ERROR: return instead
        # An error while handling an error: return a bare internal error.
        bare = FtlError("internal_error", {"correlation_id": run.campaign_id})
        summary = {"error": {"error_type": bare.error_type, "message": bare.message,
                             "details": bare.safe_details()},
                   "route": "summary", "message": bare.message}
        run.log.emit(ev.RETURN, reason=bare.error_type, route="summary",
                     summary={"message": bare.message})
        return self._finish(run, Finish("returned", EXIT_RETURNED, summary))

    def _end(self, run: Run, *, outcome: str, exit_code: int, **fields: Any) -> None:
        run.log.emit(ev.RUN_END, outcome=outcome, exit_code=exit_code, **fields)
        run.ended = True

    def _finish(self, run: Run, finish: Finish) -> RunResult:
        status = "complete" if finish.outcome.startswith("complete") else "returned"
        # Event before action: a kill between the two leaves an active campaign whose resume
        # finishes it again, never a finished campaign whose log has no RUN_END.
        if run.worktrees is not None and run.worktrees.head() is not None:
            branch = run.worktrees.integration
            finish.summary.update(integration_branch=branch, land=f"git merge {branch}")
            if isinstance(finish.summary.get("message"), str):
                finish.summary["message"] += (f"\nThe campaign's work is on branch {branch}; take it "
                                              f"with `ftl campaign land` or `git merge {branch}`.")
        # Worktrees and task branches go before the campaign is marked finished: a kill in
        # between leaves an active campaign whose resume cleans up again (idempotent), never a
        # finished one with leftovers that no resume would touch.
        if run.worktrees is not None:
            kept = run.worktrees.finish()
            if kept:
                _LOG.info("campaign %s: task branches kept (not integrated): %s", run.campaign_id,
                          ", ".join(kept))
        self._end(run, outcome=finish.outcome, exit_code=finish.exit_code)
        self.store.finish_campaign(run.campaign_id, status, finish.summary)
        if run.cluster is not None:
            run.cluster.forget(run.campaign_id)
        return RunResult(run.campaign_id, finish.outcome, finish.exit_code, finish.summary,
                         run.log.path)


def _digest(value: Any) -> str | None:
    """sha256 of ``value`` as canonical JSON (sorted keys), or None for None."""
    if value is None:
        return None
    import hashlib
    import json

    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"),
                                     default=str).encode()).hexdigest()


def _error_record(error: FtlError | None, origin: str | None = None) -> dict[str, Any] | None:
    """The pending error as stored with the machine: ``{error_type, details, origin, message}``, where
    ``origin`` is the state that failed (ERROR's route depends on it; `Runner.resume` restores
    it), or None when there is no pending error."""
    if error is None:
        return None
    return {"error_type": error.error_type, "details": error.safe_details(), "origin": origin,
            "message": error.message}


@contextlib.contextmanager
def _server_log(repo: Path) -> Iterator[None]:
    """For one drive, internals (tracebacks keyed by correlation id) also go to
    ``.ftl/ftl.log``, never to a response. The level is the handler's (INFO): the ``ftl``
    logger's own level, which the embedding application owns, is left alone."""
    path = (repo / ".ftl" / "ftl.log").resolve()
    if any(getattr(h, "baseFilename", None) == str(path) for h in _LOG.handlers):
        yield  # an outer drive of this repository already writes there
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    _LOG.addHandler(handler)
    try:
        yield
    finally:
        _LOG.removeHandler(handler)
        handler.close()


def _close(client: Any) -> None:
    close = getattr(client, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # closing a dead server must not hide the run's outcome
            _LOG.warning("closing the tool server failed", exc_info=True)
