"""The ``ftl`` command line (click).

Every command prints a response-v2 envelope with ``--json`` (``success``, ``data``, ``error``,
``meta.version == "response-v2"``) and human text otherwise. Exit codes: 0 success (every task
complete), 2 bad input (invalid plan, unknown campaign, bad configuration), 3 finished with
blocked tasks, 4 returned from ERROR, 1 internal error, 75 stopped because the Ray cluster
was lost (resumable), 130 cancelled (resumable).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import click

from ftl.surfaces import envelope
from ftl.surfaces.clickutil import (EXIT_BAD_INPUT, LazyGroup, emit as _emit, freezing_at_exit, handled,
                                   json_option, usage_error)
from ftl.errors import FtlError

def repo_option(func: Callable) -> Callable:
    return click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
                        show_default=True, help="Target repository (its .ftl/ holds state and logs).")(func)


class _EnvelopeGroup(LazyGroup):
    """A group whose usage errors become a response-v2 envelope when ``--json`` is given."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(argv, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            if "--json" in argv:
                _emit(envelope.failure(usage_error(exc)), True)
            else:
                exc.show()
            sys.exit(EXIT_BAD_INPUT if isinstance(exc, click.UsageError) else exc.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(130)


@click.group(cls=_EnvelopeGroup)
@click.version_option(package_name="ftl-runner")
def main() -> None:
    """ftl: a deterministic campaign runner for coding agents."""


def console() -> Any:
    """The ``ftl`` console script and ``python -m ftl`` (launched by `ftl.surfaces.entry.console`):
    `main`, returning what it returns (the exit code of ``--help``; a command exits itself), under
    `freezing_at_exit`."""
    return freezing_at_exit(main)


@main.group()
def campaign() -> None:
    """Run, resume and inspect campaigns (a DAG of tasks driven through the state machine)."""


def _load_json_file(path: Path, what: str, known_seqs: list[str] | None = None) -> dict[str, Any]:
    """Read and validate a plan file (every violation with its JSON path; exit 2 on failure).

    ``known_seqs``: for a revised plan, the tasks it may depend on without listing them.
    """
    from ftl.validation import load_plan_file

    plan = load_plan_file(path, known_seqs=known_seqs or ())
    return plan.model_dump(mode="json", by_alias=True, exclude_none=True)


def _runner(repo: Path, config_path: Path | None, as_json: bool, **overrides: Any):
    from ftl.config import load_config
    from ftl.telemetry.progress import PlainProgress, RichProgress
    from ftl.engine.runner import Runner

    repo = repo.resolve()
    if not repo.is_dir():
        raise FtlError("not_found", {"what": "the repository directory given by --repo"})
    config = load_config(config_path, repo, **overrides)
    from ftl.telemetry.metrics import EventMetrics

    view = None
    if not as_json and sys.stderr.isatty():
        view = RichProgress()
    listener = view if view is not None else (None if as_json else PlainProgress())
    return Runner(repo, config, on_event=EventMetrics(then=listener)), view


def _run_with(view: Any, action: Callable[[], Any], metrics_file: Path | None,
              as_json: bool) -> Any:
    """Run ``action`` inside the live view (if any); write the metrics file however it ends.

    With ``--json`` standard output carries the envelope and nothing else: whatever a library
    prints there during the run (Ray prints its cluster's error messages to ``sys.stdout``)
    goes to standard error instead."""
    try:
        if view is not None:
            with view:
                return action()
        if as_json:
            with contextlib.redirect_stdout(sys.stderr):
                return action()
        return action()
    finally:
        if metrics_file is not None:
            from ftl.telemetry.metrics import write_textfile
            write_textfile(metrics_file)


def executor_options(func: Callable) -> Callable:
    """``--executor`` and ``--ray-address`` (the ``[executor]`` table), for run and resume."""
    func = click.option("--ray-address", help="Ray cluster: auto, HOST:PORT or ray://HOST:PORT "
                                              "(default: [executor] address, else auto).")(func)
    return click.option("--executor", "executor_kind", type=click.Choice(["local", "ray"]),
                        help="Where task attempts run: this machine, or a Ray cluster (default: "
                             "ftl.toml's [executor] kind, else local).")(func)


def metrics_option(func: Callable) -> Callable:
    return click.option("--metrics-file", type=click.Path(dir_okay=False, path_type=Path),
                        help="Write Prometheus counters (ftl_errors_total, ftl_retries_total, "
                             "ftl_tasks_total, ...) to FILE when the run ends.")(func)


def _finish(result: Any, as_json: bool) -> int:
    data = {"campaign_id": result.campaign_id, "outcome": result.outcome,
            "exit_code": result.exit_code, "event_log": str(result.log_path.name),
            "summary": result.summary}
    warnings = []
    blocked = result.summary.get("blocked", 0) if isinstance(result.summary, dict) else 0
    if blocked:
        warnings.append(envelope.Warning("PARTIAL_FAILURE",
                                         f"{blocked} of {result.summary.get('total')} tasks blocked"))
    if result.outcome in ("returned", "stopped"):  # stopped: the executor was lost (resumable)
        error = result.summary.get("error", {})
        payload = envelope.failure(FtlError(error.get("error_type", "internal_error"),
                                            error.get("details"), message=error.get("message")))
        payload["data"].update(summary=result.summary, campaign_id=result.campaign_id,
                               exit_code=result.exit_code)  # as the MCP server's result has it
    else:
        payload = envelope.success(data, warnings=warnings)
    human = result.summary.get("message") if isinstance(result.summary, dict) else None
    human = f"{human}\ncampaign {result.campaign_id}; event log .ftl/events/{result.log_path.name}"
    _emit(payload, as_json, human)
    return result.exit_code


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


SERVER_HELP = ("MangleCP server: 'embedded' (default: ftl's, in this process), 'embedded:stdio' "
               "(ftl's, as a subprocess over stdio), 'stdio:COMMAND' or an http(s) URL.")


@campaign.command("run")
@click.argument("objective", required=False)
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path),
              help="plan.json to run (validated first; every violation is reported).")
@click.option("--revised-plan", type=click.Path(dir_okay=False, path_type=Path),
              help="Revised plan merged when CASCADE re-plans (>= 2 unreachable tasks).")
@repo_option
@click.option("--jobs", type=click.IntRange(1, 256), help="Tasks run at once (default: CPU count).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="ftl.toml to use (default: <repo>/ftl.toml when present).")
@click.option("--server", help=SERVER_HELP)
@click.option("--isolation", type=click.Choice(["auto", "worktree", "shared"]),
              help="Where tasks run: a git worktree each, or the shared checkout (default: "
                   "ftl.toml's isolation, else auto = worktree in a git work tree).")
@executor_options
@metrics_option
@json_option
@handled
def campaign_run(objective: str | None, plan_file: Path | None, revised_plan: Path | None, repo: Path,
                 jobs: int | None, config_path: Path | None, server: str | None,
                 isolation: str | None, executor_kind: str | None, ray_address: str | None,
                 metrics_file: Path | None, as_json: bool) -> int:
    """Run a campaign to its end.

    Prints the campaign summary (or a response-v2 envelope with --json). Exit 0 every task
    complete; 3 finished with blocked tasks; 4 returned from ERROR; 2 bad input; 75 stopped, the
    Ray cluster lost (resumable); 130 cancelled.
    """
    intent = _record_intent(repo, objective, plan_file, revised_plan, isolation)
    try:
        plan_input = _load_json_file(plan_file, "plan") if plan_file else None
        revised_input = None
        if revised_plan:
            known = [task["seq"] for task in (plan_input or {}).get("tasks", [])]
            revised_input = _load_json_file(revised_plan, "revised plan", known_seqs=known)
        objective = objective or (plan_input or {}).get("objective")
        if not objective:
            raise FtlError("invalid_params", {"schema_errors": [
                {"path": "OBJECTIVE", "message": "give an objective or a plan with one",
                 "keyword": "required"}]})
        runner, view = _runner(repo, config_path, as_json, jobs=jobs, server=server,
                               isolation=isolation, executor_kind=executor_kind,
                               ray_address=ray_address)
    except BaseException:
        from ftl.engine.intent import discard_intent

        discard_intent(intent)  # refused before it began: nothing to resume
        raise
    _sigterm_as_interrupt()
    with runner:  # closes the store (its checkpoint): nothing at exit may be left to the collector
        result = _run_with(view, lambda: runner.start(objective, plan_input=plan_input,
                                                      revised_plan_input=revised_input,
                                                      intent=intent), metrics_file, as_json)
    return _finish(result, as_json)


def _record_intent(repo: Path, objective: str | None, plan_file: Path | None,
                   revised_plan: Path | None, isolation: str | None = None) -> Path | None:
    """Write the run's intent (`ftl.engine.intent`) before anything slow: the objective and the plan
    files' JSON as read (validated later, by the run or by the resume that finds it). None when
    there is nothing to record (an unreadable plan is refused in a moment anyway)."""
    from ftl.engine.intent import write_intent

    def read(path: Path | None) -> Any:
        if path is None:
            return None
        try:
            import json

            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise LookupError from None

    try:
        plan, revised = read(plan_file), read(revised_plan)
    except LookupError:
        return None
    if not repo.is_dir():
        return None
    return write_intent(repo, {"objective": objective, "plan": plan, "revised_plan": revised,
                               "flow": "campaign", "isolation": isolation})


@campaign.command("resume")
@click.option("--campaign", "campaign_id", help="Campaign id (default: the active campaign).")
@repo_option
@click.option("--jobs", type=click.IntRange(1, 256))
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--server", help=SERVER_HELP)
@click.option("--kill-leftovers", is_flag=True,
              help="Kill at once the build and verify commands the interrupted run left running "
                   "(default: let them finish, up to their task timeout, so a finished build is "
                   "reused rather than run again).")
@executor_options
@metrics_option
@json_option
@handled
def campaign_resume(campaign_id: str | None, repo: Path, jobs: int | None, config_path: Path | None,
                    server: str | None, kill_leftovers: bool, executor_kind: str | None,
                    ray_address: str | None, metrics_file: Path | None, as_json: bool) -> int:
    """Resume an interrupted campaign: completed tasks are kept, in-flight ones re-run fresh.

    Same output and exit codes as `ftl campaign run`.
    """
    runner, view = _runner(repo, config_path, as_json, jobs=jobs, server=server,
                           executor_kind=executor_kind, ray_address=ray_address)
    runner.wait_for_leftovers = not kill_leftovers
    _sigterm_as_interrupt()
    with runner:
        result = _run_with(view, lambda: runner.resume(campaign_id), metrics_file, as_json)
    return _finish(result, as_json)


@campaign.command("status")
@click.option("--campaign", "campaign_id", help="Campaign id (default: active, else latest).")
@repo_option
@json_option
@handled
def campaign_status(campaign_id: str | None, repo: Path, as_json: bool) -> int:
    """Show a campaign's state and task counts (envelope data: campaign, tasks, cascade)."""
    from ftl.engine.status import campaign_status as status_of

    data = status_of(repo.resolve(), campaign_id)
    if data is None:
        _emit(envelope.success({"status": "none"}), as_json, "no campaign in this repository")
        return 0
    record = data["campaign"]
    interrupted = record["status"] == "active" and record.get("run_pid") is None
    state = "active, interrupted" if interrupted else record["status"]
    lines = [f"{record['id']} [{state}] state={record.get('machine_state')}: {record['objective']}"]
    lines += [f"  {t['seq']} {t['slug']:<28} "
              + (f"interrupted (was running on {t['worker']})"
                 if interrupted and t["status"] == "running" else t["status"])
              + (f"  on {t['worker']}" if t.get("worker") and not interrupted else "")
              + (f"  after {', '.join(t['blocked_by'])}" if t.get("blocked_by") else "")
              + (f"  ({_one_line(t['block_reason'])})" if t.get("block_reason") else "")
              + (f"  ${t['cost_usd']:.4f} ({t['num_turns']} turns)" if t.get("cost_usd") is not None
                 else "") for t in data["tasks"]]
    if record.get("cost_usd") is not None:
        lines.append(f"  agent cost: ${record['cost_usd']:.4f} total")
    if record.get("integration_branch") and any(t["status"] == "complete" for t in data["tasks"]):
        lines.append(f"  work on branch {record['integration_branch']} "
                     "(take it with `ftl campaign land`)")
    if record["status"] == "returned" and record.get("message"):
        lines.append(f"  {record['message']}")
    if interrupted:
        lines.append("  no ftl process is running it: continue with `ftl campaign resume`")
    _emit(envelope.success(data), as_json, "\n".join(lines))
    return 0


def _one_line(text: str, limit: int = 240) -> str:
    """``text`` on one line of at most ``limit`` characters (a status row per task): its start
    (the error type and message) and its end (a command's output ends with the error)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = limit * 9 // 16
    return f"{flat[:head]} ... {flat[-(limit - head - 5):]}"


def _existing_repo(repo: Path) -> Path:
    """``repo`` resolved. Raises FtlError(not_found) when it is not a directory."""
    repo = repo.resolve()
    if not repo.is_dir():
        raise FtlError("not_found", {"what": "the repository directory given by --repo"})
    return repo


def _campaign_for(repo: Path, campaign_id: str | None) -> dict[str, Any]:
    """``campaign_id``'s record, else the active campaign's, else the latest one's.

    Raises: FtlError(not_found) when there is none."""
    from ftl.store import Store

    with Store.for_repo(repo) as store:
        found = (store.get_campaign(campaign_id) if campaign_id
                 else store.active_campaign() or store.latest_campaign())
    if found is None:
        raise FtlError("not_found", {"what": "a campaign in this repository"})
    return found


@campaign.command("land")
@click.option("--campaign", "campaign_id", help="Campaign id (default: the latest).")
@click.option("--into", help="Branch to land on (default: the branch checked out in --repo).")
@repo_option
@json_option
@handled
def campaign_land(campaign_id: str | None, into: str | None, repo: Path, as_json: bool) -> int:
    """Merge a finished campaign's integration branch into your branch (fast-forward when
    possible). Refuses, changing nothing, while the campaign is active, when the target
    checkout has uncommitted changes, or when the merge conflicts."""
    from ftl.vcs.land import land

    repo = _existing_repo(repo)
    record = _campaign_for(repo, campaign_id)
    if record["status"] == "active":
        raise FtlError("conflict", {"what": f"campaign {record['id']} is still active; let it "
                                            "finish (or resume it) before landing"})
    landing = land(repo, record["id"], into)
    human = (f"{landing.source} is already in {landing.target}" if landing.how == "up-to-date"
             else f"landed {landing.source} on {landing.target} ({landing.how}): "
                  f"{landing.previous[:12]} -> {landing.head[:12]}")
    _emit(envelope.success({"campaign_id": record["id"], **landing.to_json()}), as_json, human)
    return 0


@campaign.command("clean")
@click.option("--campaign", "campaign_id", help="Only this campaign's worktrees and branches.")
@click.option("--force", is_flag=True, help="Also clean the active campaign (its resume then "
                                            "rebuilds in-flight tasks from scratch).")
@repo_option
@json_option
@handled
def campaign_clean(campaign_id: str | None, force: bool, repo: Path, as_json: bool) -> int:
    """Remove task worktrees left under .ftl/worktrees (after a crash) and the task branches
    whose work is integrated; keeps the integration branches and any task branch holding a
    commit that was never integrated."""
    from ftl.store import Store
    from ftl.vcs.land import clean

    repo = _existing_repo(repo)
    with Store.for_repo(repo) as store:
        campaigns = [store.get_campaign(campaign_id)] if campaign_id else store.list_campaigns()
        active = store.active_campaign()
    keep = None if force or active is None else active["id"]
    if keep is not None and campaign_id == keep:
        raise FtlError("conflict", {"what": f"campaign {keep} is active; resume it, or pass "
                                            "--force to clean it anyway"})
    result = clean(repo, [c["id"] for c in campaigns], keep_worktrees_of=keep)
    human = (f"removed {len(result['removed'])} worktree(s)"
             + (f"; kept task branches with unintegrated commits: {', '.join(result['kept_branches'])}"
                if result["kept_branches"] else ""))
    _emit(envelope.success(result), as_json, human)
    return 0


@main.command("task")
@click.argument("objective")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A plan whose tasks are built in dependency order.")
@click.option("--run", "run_command", help="Shell command that does the work (shell builder).")
@click.option("--verify", "verify_command", help="Shell command that checks it (required without --plan).")
@click.option("--delta", multiple=True, help="A file the task may change (repeatable).")
@repo_option
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--server", help=SERVER_HELP)
@metrics_option
@json_option
@handled
def task_command(objective: str, plan_file: Path | None, run_command: str | None, verify_command: str | None,
                 delta: tuple[str, ...], repo: Path, config_path: Path | None, server: str | None,
                 metrics_file: Path | None, as_json: bool) -> int:
    """Run the single-task TASK flow (INIT, EXPLORE, PLAN, BUILD, OBSERVE, COMPLETE).

    Same output and exit codes as `ftl campaign run`.
    """
    from ftl.engine.machine import Flow
    from ftl.validation import parse_plan

    if plan_file:
        plan_input = _load_json_file(plan_file, "plan")
    else:
        if not verify_command:
            raise FtlError("invalid_params", {"schema_errors": [
                {"path": "--verify", "message": "a verify command is required without --plan",
                 "keyword": "required"}]})
        raw = {"objective": objective, "tasks": [{"seq": "001", "slug": "task", "verify": verify_command,
                                                   "run": run_command, "delta": list(delta),
                                                   "builder": "shell" if run_command else None}]}
        plan_input = parse_plan(raw, source="ftl task").model_dump(mode="json", by_alias=True, exclude_none=True)
    runner, view = _runner(repo, config_path, as_json, server=server)
    _sigterm_as_interrupt()
    with runner:
        result = _run_with(view, lambda: runner.start(objective, plan_input=plan_input, flow=Flow.TASK),
                           metrics_file, as_json)
    return _finish(result, as_json)


def _register_optional_commands() -> None:
    """Commands whose modules are heavy, imported only when they run (`ftl.surfaces.clickutil.LazyGroup`);
    the summaries are their help's first paragraph (tests/test_cold_start.py keeps them equal)."""
    main.add_lazy_command("replay", "ftl.postmortem.cli:replay_command",
                          "Rebuild a campaign's run from its event log(s) and check the protocol's invariants.")
    main.add_lazy_command("diagram", "ftl.postmortem.cli:diagram",
                          "Mermaid diagrams of the state machine and of a plan's DAG.")
    main.add_lazy_command("serve", "ftl.server.serve:serve",
                          "Run ftl's embedded MangleCP server (protocol 2026-02-draft).")
    # the MCP surface is optional: without its module (or the mcp SDK) `ftl mcp` is unknown
    main.add_lazy_command("mcp", "ftl.surfaces.mcp_server:mcp", "Serve ftl to MCP clients (Claude Code) over stdio.")


_register_optional_commands()  # `python -m ftl` (ftl/__main__.py) runs `main`
