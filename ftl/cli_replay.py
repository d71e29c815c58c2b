"""``ftl replay`` and ``ftl diagram``: postmortems of event logs and Mermaid diagrams.

Registered on the main ``ftl`` group by ``ftl.cli``.
"""

from __future__ import annotations

from pathlib import Path

import click

from ftl import envelope
from ftl.cli import _emit, handled, json_option
from ftl.errors import FtlError


@click.command("replay")
@click.argument("logs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", is_flag=True, help="Exit 1 when an invariant is violated.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@json_option
@handled
def replay_command(logs: tuple[Path, ...], check: bool, fmt: str, as_json: bool) -> int:
    """Rebuild a campaign's run from its event log(s) and check the protocol's invariants.

    Several logs of one campaign (a crashed run, then its resume) are read as one story.
    Exit 1 with --check when a violation is found (each names its seq).
    """
    from ftl.replay import render_text, replay

    missing = [p.name for p in logs if not p.is_file()]
    if missing:
        raise FtlError("not_found", {"what": f"event log {missing[0]}"})
    result = replay(logs)
    if as_json or fmt == "json":
        warnings = [envelope.Warning("LOG_TAIL_REPAIRED", "the last line was torn and skipped")] \
            if result.torn_tail else []
        _emit(envelope.success(result.to_json(), warnings=warnings), True)
    else:
        click.echo(render_text(result), nl=False)
    return 1 if (check and result.violations) else 0


@click.group()
def diagram() -> None:
    """Mermaid diagrams of the state machine and of a plan's DAG."""


@diagram.command("machine")
@click.option("--flow", type=click.Choice(["campaign", "task"]), default="campaign", show_default=True)
def diagram_machine(flow: str) -> None:
    """Print the state machine as Mermaid stateDiagram-v2 (from the transitions table)."""
    from ftl.machine import Flow, mermaid

    click.echo(mermaid(Flow(flow)), nl=False)


@diagram.command("plan")
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@handled
def diagram_plan(plan_file: Path) -> int:
    """Print a plan's task DAG as a Mermaid flowchart."""
    from ftl.validation import load_plan_file

    plan = load_plan_file(plan_file)
    lines = ["flowchart LR"]
    for task in plan.tasks:
        lines.append(f'    t{task.seq}["{task.seq} {task.slug}"]')
        for dep in task.depends:
            lines.append(f"    t{dep} --> t{task.seq}")
    click.echo("\n".join(lines))
    return 0
