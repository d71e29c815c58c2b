"""``ftl replay`` and ``ftl diagram``: postmortems of event logs and Mermaid diagrams.

Registered on the main ``ftl`` group by ``ftl.surfaces.cli``.
"""

from __future__ import annotations

import io
import os
import sqlite3
import sys
from itertools import chain
from pathlib import Path
from typing import Callable, Iterable, TextIO

import click

from ftl.surfaces import envelope
from ftl.surfaces.clickutil import emit as _emit, handled, json_option
from ftl.errors import FtlError


def _existing(paths: tuple[Path, ...], option: str) -> list[Path]:
    for path in paths:
        if not path.is_file():
            raise FtlError("not_found", {"what": f"event log {path.name} ({option})"})
    return list(paths)


def _write(text: str, output: Path | None) -> None:
    _stream(lambda handle: handle.write(text), output)


def _write_lines(lines: Iterable[str], output: Path | None) -> None:
    _stream(lambda handle: handle.writelines(lines), output)


def _stream(write: Callable[[TextIO], object], output: Path | None) -> None:
    """Run ``write`` on stdout or on ``output`` (created with its folders): a postmortem goes
    out as it is made, never held whole in memory. Text a log carries that the encoding cannot
    hold (a lone surrogate) goes out backslash-escaped; a reader that stops early (``| head``)
    ends the output quietly.

    Raises:
        FtlError: not_found when ``output`` cannot be created or written.
    """
    if output is None:
        stdout = sys.stdout
        buffer = getattr(stdout, "buffer", None)
        if buffer is None:  # a text-only stream (an embedding host): no re-encoding possible
            write(stdout)
            return
        stdout.flush()
        handle = io.TextIOWrapper(buffer, encoding=stdout.encoding or "utf-8", errors="backslashreplace",
                                  newline="\n")
        try:
            write(handle)
            handle.flush()
        except BrokenPipeError:
            # Point stdout at /dev/null so the interpreter's last flush does not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stdout.fileno())
            os.close(devnull)
        finally:
            try:
                handle.detach()  # never let the wrapper close stdout's buffer
            except ValueError:
                pass
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", encoding="utf-8", errors="backslashreplace") as handle:
            write(handle)
    except OSError as exc:
        raise FtlError("not_found", {"what": f"a writable place for {output.name} "
                                             f"({exc.strerror or 'OS error'})"}) from None


@click.command("replay")
@click.argument("logs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", is_flag=True, help="Exit 1 when an invariant is violated.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True, help="text: terminal postmortem; json: response-v2 envelope; "
                                      "html: one self-contained report file.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the postmortem to this file instead of stdout.")
@click.option("--against", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Log(s) of another run of the same plan: print where the two runs' decisions "
                   "first differ (repeat for a crashed run and its resume). Exit 1 when they differ.")
@json_option
@handled
def replay_command(logs: tuple[Path, ...], check: bool, fmt: str, output: Path | None,
                   against: tuple[Path, ...], as_json: bool) -> int:
    """Rebuild a campaign's run from its event log(s) and check the protocol's invariants.

    Several logs of one campaign (a crashed run, then its resume) are read as one story, in the
    order given; a resume that appended to the same file is found inside it. The postmortem
    lists the states with durations, every task attempt (worker, node, outcome, failures), every
    failure with its classification and what followed (retry, recovery, ERROR), the cascade
    roots, the crash boundaries, the outcome and exit code, and each broken invariant with its
    seq. A torn last line is a warning, not an error.

    Prints text, a response-v2 envelope (--format json or --json; ``data`` is the replay, with
    ``check`` and, with --against, ``diff``), or an HTML report (--format html; use -o FILE).
    Exit codes: 0; 1 with --check when an invariant is violated, or with --against when the
    decisions differ; 2 when a log file is missing.
    """
    from ftl.postmortem.replay import replay

    paths = _existing(logs, "LOGS")
    other = _existing(against, "--against")
    if as_json and fmt == "html" and output is None:
        raise FtlError("invalid_params", {"schema_errors": [
            {"path": "--output", "message": "give -o FILE for the HTML report when --json prints "
                                            "the envelope", "keyword": "required"}]})
    try:
        with replay(paths) as result:
            return _report(result, paths, other, check, fmt, output, as_json)
    except sqlite3.Error:
        # The story's records spill to a temporary database (ftl.postmortem.spool) on long logs.
        raise FtlError("not_found", {"what": "a writable temporary directory with free space for "
                                             "the replay's records (set TMPDIR to one)"}) from None


def _report(result, paths: list[Path], other: list[Path], check: bool, fmt: str,
            output: Path | None, as_json: bool) -> int:
    from ftl.postmortem.replay import diff_decisions, render_diff_text, text_lines, write_json

    diff = diff_decisions(paths, other) if other else None
    failed = bool(check and result.violations) or bool(diff is not None and not diff.same)

    if fmt == "html":
        from ftl.postmortem.html import render_html

        _write(render_html(result, diff=diff, against=[p.name for p in other]), output)
        if as_json:
            data = {"campaign_id": result.campaign_id, "output": str(output),
                    "check": _check(result), **({"diff": diff.to_json()} if diff else {})}
            _emit(envelope.success(data, warnings=_warnings(result)), True)
        elif output is not None:
            click.echo(f"postmortem written to {output}")
        return 1 if failed else 0
    if as_json or fmt == "json":
        data = result.to_json(lazy=True)  # records stream from the spool as they are written
        data["check"] = _check(result)
        if diff is not None:
            data["diff"] = diff.to_json()
        payload = envelope.success(data, warnings=_warnings(result))
        _stream(lambda handle: write_json(payload, handle), output)
        return 1 if failed else 0
    lines = text_lines(result)
    if diff is not None:
        lines = chain(lines, [render_diff_text(diff, " ".join(p.name for p in paths),
                                               " ".join(p.name for p in other))])
    _write_lines(lines, output)
    if output is not None:
        click.echo(f"postmortem written to {output}")
    return 1 if failed else 0


def _check(result) -> dict:
    return {"passed": not result.violations, "violations": len(result.violations)}


def _warnings(result) -> list:
    warnings = []
    if result.torn_tail:
        warnings.append(envelope.Warning("LOG_TAIL_REPAIRED",
                                         "the last line was torn by a crash and was skipped"))
    if result.invalid_lines:
        warnings.append(envelope.Warning("LOG_LINES_SKIPPED",
                                         f"{len(result.invalid_lines)} unreadable line(s) were skipped"))
    return warnings


@click.group()
def diagram() -> None:
    """Mermaid diagrams of the state machine and of a plan's DAG."""


@diagram.command("machine")
@click.option("--flow", type=click.Choice(["campaign", "task"]), default="campaign", show_default=True)
def diagram_machine(flow: str) -> None:
    """Print the state machine as Mermaid stateDiagram-v2 (from the transitions table)."""
    from ftl.engine.machine import Flow, mermaid

    click.echo(mermaid(Flow(flow)), nl=False)


@diagram.command("plan")
@click.argument("plan_file", type=click.Path(dir_okay=False, path_type=Path))
@handled
def diagram_plan(plan_file: Path) -> int:
    """Print a plan's task DAG as a Mermaid flowchart (validated first; exit 2 if invalid)."""
    from ftl.validation import load_plan_file

    plan = load_plan_file(plan_file)
    lines = ["flowchart LR"]
    for task in plan.tasks:
        lines.append(f'    t{task.seq}["{task.seq} {task.slug}"]')
    for task in plan.tasks:
        for dep in task.depends:
            lines.append(f"    t{dep} --> t{task.seq}")
    click.echo("\n".join(lines))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(replay_command())
