"""Runs a campaign: builds the machine, the tool client and the run context; starts and resumes.

The loop is deliberately small: enter a state (``STATE_ENTRY`` first, then the state and the
tracked variables are saved to the store), run that state's handler from ``ftl.states``, fire
the trigger it returns. A handler that raises goes to ERROR at once: the failure is emitted and
classified (if the recovery protocol has not already done it) and ``fail`` is the next and only
trigger. A run ends in COMPLETE, or RETURNs from ERROR with a summary, or is cancelled (Ctrl-C)
and left resumable.

Exit codes (FTL has none; these are ftl's): 0 every task complete, 3 finished with blocked
tasks, 4 returned from ERROR, 130 cancelled.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ftl import events as ev
from ftl.config import Config
from ftl.errors import FtlError, Route
from ftl.machine import CampaignMachine, Flow, State, Tracked
from ftl.models import Plan
from ftl.recovery import RecoveryProtocol, RetryPolicy, classify_exception
from ftl.store import Store
from ftl.tools import ToolClient

_LOG = logging.getLogger("ftl")

EXIT_OK, EXIT_BLOCKED, EXIT_RETURNED, EXIT_BAD_INPUT, EXIT_CANCELLED = 0, 3, 4, 2, 130
MAX_ERROR_ENTRIES = 5


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
    cascade_analysis: dict[str, Any] | None = None
    observation: dict[str, Any] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
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

    def facts(self) -> list[dict[str, Any]]:
        """Facts that describe the campaign to the tool server (MangleCP intent_request)."""
        from ftl.tools import fact
        facts = [fact("campaign_state", self.machine_state.lower())]
        if self.current_plan is not None and self.current_plan.framework:
            facts.append(fact("framework", self.current_plan.framework))
        return facts


def connect(config: Config, repo: Path) -> Any:
    """The MangleCP client for ``config.server``: ftl's embedded server over stdio (default),
    ``stdio:CMD`` or an http(s) URL (`ftl.server.app.connect` documents the forms).

    Raises:
        FtlError(configuration_error): an unrecognised server address.
    """
    from ftl.server.app import connect as connect_server

    return connect_server(repo, config)


def connect_in_process(config: Config, repo: Path) -> Any:
    """The embedded server in this process (tests; no subprocess to start)."""
    from ftl.server.app import connect as connect_server

    return connect_server(repo, config, in_process=True)


class Runner:
    """Starts or resumes campaigns in one repository.

    Args:
        repo: the target repository (its ``.ftl/`` holds the store and the event logs).
        config: the run configuration.
        client_factory: builds the MangleCP client (tests pass a recording one); default `connect`.
        sleep: injected into the retry protocol (tests record delays instead of sleeping).
        on_event: a listener for every event (progress views).
    """

    def __init__(self, repo: Path, config: Config, *,
                 client_factory: Callable[[Config, Path], Any] = connect,
                 sleep: Callable[[float], Any] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.repo = repo
        self.config = config
        self.client_factory = client_factory
        self.sleep = sleep
        self.on_event = on_event
        self.store = Store.for_repo(repo)
        _attach_server_log(repo)

    # --- entry points ---
    def start(self, objective: str, *, plan_input: dict[str, Any] | None = None,
              flow: Flow = Flow.CAMPAIGN, revised_plan_input: dict[str, Any] | None = None) -> RunResult:
        """Create a campaign and drive it to its end.

        Raises:
            FtlError(conflict): another campaign is active in this repository (resume or
                finish it first).
        """
        # Connect first: a tool server that cannot be reached must not leave a campaign active.
        client = self.client_factory(self.config, self.repo)
        try:
            campaign = self.store.create_campaign(objective, flow=flow.value)
        except BaseException:
            _close(client)
            raise
        run = self._make_run(campaign, Tracked(), plan_input, revised_plan_input, client=client)
        run.log.emit(ev.RUN_START, state=None, mode=flow.value, objective=objective, resume=False,
                     pid=os.getpid(), config=self.config.model_dump(mode="json"))
        self._save_inputs(run)
        return self._drive(run, CampaignMachine(run, flow, State.INIT))

    def resume(self, campaign_id: str | None = None) -> RunResult:
        """Continue an interrupted campaign from its stored state.

        Completed tasks are never run again; tasks that were running when the process died go
        back to pending and are re-run from a fresh workspace.

        Raises:
            FtlError(not_found): no such campaign, or no active campaign to resume.
        """
        campaign = self.store.get_campaign(campaign_id) if campaign_id else self.store.active_campaign()
        if campaign is None:
            raise FtlError("not_found", {"what": "an active campaign to resume"})
        if campaign["status"] != "active":
            raise FtlError("conflict", {"what": f"campaign {campaign['id']} is {campaign['status']}, "
                                                "not active; nothing to resume"})
        inputs = campaign.get("inputs") or {}
        tracked = Tracked.from_json(campaign.get("tracked"))
        run = self._make_run(campaign, tracked, inputs.get("plan_input"), inputs.get("revised_plan_input"))
        state = State(campaign.get("machine_state") or State.INIT.value)
        try:
            run.current_plan = self.store.get_plan(run.campaign_id)
        except FtlError:
            run.current_plan = None
        if campaign.get("error"):
            run.error = FtlError(campaign["error"]["error_type"], campaign["error"].get("details"))
        reset = self.store.reset_running(run.campaign_id)
        run.log.emit(ev.RUN_START, state=None, mode=run.flow.value, objective=run.objective,
                     resume=True, pid=os.getpid(), config=self.config.model_dump(mode="json"))
        run.log.emit(ev.RESUME, state=None, from_state=state.value, reset_tasks=reset)
        return self._drive(run, CampaignMachine(run, run.flow, state), resumed=True)

    # --- internals ---
    def _make_run(self, campaign: dict[str, Any], tracked: Tracked, plan_input: dict | None,
                  revised_plan_input: dict | None, client: Any = None) -> Run:
        campaign_id = campaign["id"]
        log = ev.EventLog(ev.log_path(self.repo, campaign_id), campaign_id)
        if self.on_event:
            log.subscribe(self.on_event)
        cancel = threading.Event()
        policy = RetryPolicy(transient_retries=self.config.transient_retries,
                             flaky_retries=self.config.flaky_verify_retries,
                             backoff_min_s=self.config.retry_backoff_min_s,
                             backoff_max_s=self.config.retry_backoff_max_s)
        client = client if client is not None else self.client_factory(self.config, self.repo)
        return Run(repo=self.repo, store=self.store, config=self.config, log=log,
                   tools=ToolClient(client, log),
                   recovery=RecoveryProtocol(log, policy, sleep=self.sleep, cancel=cancel),
                   campaign_id=campaign_id, flow=Flow(campaign.get("flow") or "campaign"),
                   objective=campaign["objective"], tracked=tracked, plan_input=plan_input,
                   revised_plan_input=revised_plan_input, cancel=cancel)

    def _save_inputs(self, run: Run) -> None:
        self.store.save_inputs(run.campaign_id, {"plan_input": run.plan_input,
                                                 "revised_plan_input": run.revised_plan_input})

    def _drive(self, run: Run, machine: CampaignMachine, resumed: bool = False) -> RunResult:
        from ftl.states import HANDLERS

        try:
            while True:
                state = machine.state
                run.log.state = state.value
                entry: dict[str, Any] = {"resumed": True} if resumed else {}
                resumed = False
                if state is State.ERROR and run.error is not None:
                    entry.update(error_type=run.error.error_type, route=run.error.kind.route.value)
                run.log.emit(ev.STATE_ENTRY, state=state.value, **entry)
                self.store.save_machine(run.campaign_id, state.value, run.tracked.to_json(),
                                        error=_error_record(run.error))
                try:
                    step = HANDLERS[state](run)
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:  # noqa: BLE001 - every failure goes to ERROR
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
                    if state is State.ERROR:
                        # An error while handling an error: return a bare internal error.
                        bare = FtlError("internal_error", {"correlation_id": run.campaign_id})
                        summary = {"error": {"error_type": bare.error_type, "message": bare.message,
                                             "details": bare.safe_details()},
                                   "route": "summary", "message": bare.message}
                        run.log.emit(ev.RETURN, reason=bare.error_type, route="summary",
                                     summary={"message": bare.message})
                        return self._finish(run, Finish("returned", EXIT_RETURNED, summary))
                    run.error = error
                    run.error_origin = state.value
                    machine.fire("fail")
                    continue
                if isinstance(step, Finish):
                    return self._finish(run, step)
                machine.fire(step.trigger)
                if state is State.ERROR:
                    run.error = None  # handled: its route has been taken
        except KeyboardInterrupt:
            run.cancel.set()
            run.log.emit(ev.RUN_END, outcome="cancelled", exit_code=EXIT_CANCELLED,
                         resumable=True)
            run.log.close()
            _close(run.tools.client)
            return RunResult(run.campaign_id, "cancelled", EXIT_CANCELLED,
                             {"message": "cancelled; run `ftl campaign resume` to continue"},
                             run.log.path)

    def _finish(self, run: Run, finish: Finish) -> RunResult:
        status = "complete" if finish.outcome.startswith("complete") else "returned"
        # Event before action: a kill between the two leaves an active campaign whose resume
        # finishes it again, never a finished campaign whose log has no RUN_END.
        run.log.emit(ev.RUN_END, outcome=finish.outcome, exit_code=finish.exit_code)
        self.store.finish_campaign(run.campaign_id, status, finish.summary)
        run.log.close()
        _close(run.tools.client)
        return RunResult(run.campaign_id, finish.outcome, finish.exit_code, finish.summary,
                         run.log.path)


def _error_record(error: FtlError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"error_type": error.error_type, "details": error.safe_details()}


def _attach_server_log(repo: Path) -> None:
    """Internals (tracebacks keyed by correlation id) go to ``.ftl/ftl.log``, never to a response."""
    path = (repo / ".ftl" / "ftl.log").resolve()
    if any(getattr(h, "baseFilename", None) == str(path) for h in _LOG.handlers):
        return
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    _LOG.addHandler(handler)
    _LOG.setLevel(logging.INFO)


def _close(client: Any) -> None:
    close = getattr(client, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # closing a dead server must not hide the run's outcome
            _LOG.warning("closing the tool server failed", exc_info=True)
