"""Click helpers shared by every command-line surface (ftl, lib/).

* `usage_error`: click prints its own usage text for a bad option or argument; with ``--json`` a
  caller expects a response-v2 envelope instead, naming the parameter and how to get the usage.
* `handled`, `emit`, `json_option`: a command's answer as an envelope (``--json``) or text,
  and its exit code; shared by ``ftl`` and the postmortem commands it loads lazily.
* `LazyGroup`: subcommands whose modules are heavy (the MCP SDK, starlette, clingo) are imported
  only when they run, so ``ftl --help`` and ``ftl campaign status`` start in a few tens of ms
  (issue 11 item 1; the pattern of click's "Lazily Loading Subcommands" documentation, with the
  help listing drawn from a stored summary instead of an import).
* `freezing_at_exit`: a process's entry point (the ``ftl`` console script, a lib script): the
  modules it loaded are never scanned by the cyclic garbage collector, neither while the command
  runs nor at exit.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

import click

from ftl.errors import FtlError
from ftl.surfaces import envelope


EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
_BAD_INPUT_TYPES = {"validation", "not_found", "conflict", "authentication", "authorization"}


def freezing_at_exit(entry: Callable[[], Any]) -> Any:
    """Run ``entry`` (a process's entry point, which may exit) and return what it returns, with
    everything alive before and after it in the collector's permanent generation.

    Before: the modules the process loaded (click, ftl, tens of thousands of objects that live as
    long as the process; a few hundred dropped in reference cycles while collection was paused
    stay allocated) are frozen and collection resumes, also where the entry's launcher paused
    it while importing (`ftl.surfaces.entry`, the lib scripts: about 5 ms of each start, issue
    11 item 1). After: whatever is alive is frozen again, so that the interpreter's last collection at exit
    skips it (10-20 ms of each command once click and ftl are loaded, more after a 10,000-task
    plan, issue 11 items 1 and 4). Reference counting still frees objects and atexit handlers
    still run; only a reference cycle alive at exit is not finalised, which CPython does not
    promise anyway (Python reference, ``object.__del__``); a cycle the command itself drops is
    collected as usual. Only for a process's own entry: tests call the commands in their process,
    where objects must stay collectable.
    """
    import gc

    gc.freeze()
    gc.enable()
    try:
        return entry()
    finally:
        gc.freeze()


def emit(payload: dict[str, Any], as_json: bool, human: str | None = None) -> None:
    """Print ``payload`` as indented, key-sorted JSON when ``as_json``, else ``human`` (if any)."""
    if as_json:
        import json  # not on the path of --help and the text commands

        click.echo(json.dumps(payload, indent=2, sort_keys=True, default=str))
    elif human:
        click.echo(human)


def handled(func: Callable[..., int | None]) -> Callable[..., None]:
    """Run a command; turn FtlError and unexpected exceptions into an envelope and exit code
    (`EXIT_BAD_INPUT` for bad input, `EXIT_INTERNAL` otherwise, 130 on Ctrl-C; never a traceback).
    The command returns its exit code (None: 0); with ``as_json`` the failure is an envelope on
    stdout, else an ``error:`` / ``fix:`` pair on stderr."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.get("as_json"))
        try:
            code = func(*args, **kwargs) or 0
        except FtlError as error:
            payload = envelope.failure(error)
            if as_json:
                emit(payload, True)
            else:
                click.echo(f"error: {payload['error']}", err=True)
                click.echo(f"fix: {payload['data']['remediation']}", err=True)
                for violation in payload["data"]["details"].get("violations", [])[:50]:
                    if isinstance(violation, dict):
                        click.echo(f"  {violation.get('path', '')}: {violation.get('message', '')}", err=True)
            code = EXIT_BAD_INPUT if error.kind.v2_error_type in _BAD_INPUT_TYPES else EXIT_INTERNAL
        except click.exceptions.Exit:
            raise
        except KeyboardInterrupt:
            code = 130
        except Exception as exc:  # noqa: BLE001 - fail closed, never a traceback
            import uuid

            correlation_id = uuid.uuid4().hex[:12]
            click.echo(f"internal error ({type(exc).__name__}); correlation id {correlation_id}",
                       err=True) if not as_json else None
            if as_json:
                emit(envelope.internal_failure(correlation_id), True)
            code = EXIT_INTERNAL
        sys.exit(code)

    return wrapper


def json_option(func: Callable) -> Callable:
    """The ``--json`` flag (``as_json``): print a response-v2 envelope."""
    return click.option("--json", "as_json", is_flag=True, help="Print a response-v2 envelope.")(func)


def usage_error(exc: click.ClickException) -> FtlError:
    """``exc`` as ``FtlError("schema_invalid")`` with one violation at the offending parameter."""
    text = exc.format_message().strip()
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        text = "no command given"
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "the command"
    param = getattr(exc, "param", None)
    path = "argv"
    if param is not None:
        path = f"--{param.name.replace('_', '-')}" if isinstance(param, click.Option) else param.name.upper()
    first_line = text.splitlines()[0] if text else "invalid command line"
    return FtlError("schema_invalid", {"count": 1, "violations": [
        {"path": path, "message": first_line, "fix": f"run `{command} --help` for the usage"}]},
        message=f"Bad command line: {first_line}")


class LazyGroup(click.Group):
    """A click group with lazily imported subcommands.

    `add_lazy_command` registers ``name -> "package.module:attribute"`` with the first paragraph
    of the command's help. ``--help`` lists it from that summary (no import); running it imports
    the module then. A test keeps each summary equal to the real command's help.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, tuple[str, str]] = {}
        self.commands = _CommandTable(self, self.commands)

    def add_lazy_command(self, name: str, import_path: str, summary: str) -> None:
        """Register ``name``, found at ``import_path`` (``"module:attribute"``) when it runs.

        Raises:
            ValueError: ``import_path`` has no ``:``.
        """
        if ":" not in import_path:
            raise ValueError(f"import path {import_path!r} must be 'module:attribute'")
        self.lazy_commands[name] = (import_path, summary)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, importing a lazy one on first use; None (click: "No such command")
        when its module cannot be imported (an optional extra that is not installed)."""
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in self.lazy_commands:
            return command
        return self._load(cmd_name)

    def _load(self, cmd_name: str) -> click.Command | None:
        module_name, _, attribute = self.lazy_commands[cmd_name][0].partition(":")
        try:
            command = getattr(importlib.import_module(module_name), attribute)
        except ImportError:
            return None
        self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's listing, with not-yet-imported commands shown from their summary."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name)
            if command is None and name in self.lazy_commands:
                command = click.Command(name, help=self.lazy_commands[name][1])
            if command is not None and not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in rows])


class _CommandTable(dict):
    """``group.commands`` of a `LazyGroup`: indexing a lazy command's name imports it, so code
    that reads ``main.commands["serve"]`` keeps working (``get``, ``in`` and iteration see only
    the commands loaded so far, as click's own listing expects)."""

    def __init__(self, group: LazyGroup, loaded: dict[str, click.Command]) -> None:
        super().__init__(loaded)
        self._group = group

    def __missing__(self, name: str) -> click.Command:
        command = self._group._load(name) if name in self._group.lazy_commands else None
        if command is None:
            raise KeyError(name)
        return command
