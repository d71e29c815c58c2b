"""Click helpers shared by every command-line surface (ftl, lib/).

* `usage_error`: click prints its own usage text for a bad option or argument; with ``--json`` a
  caller expects a response-v2 envelope instead, naming the parameter and how to get the usage.
* `LazyGroup`: subcommands whose modules are heavy (the MCP SDK, starlette, clingo) are imported
  only when they run, so ``ftl --help`` and ``ftl campaign status`` start in a few tens of ms
  (issue 11 item 1; the pattern of click's "Lazily Loading Subcommands" documentation, with the
  help listing drawn from a stored summary instead of an import).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from ftl.errors import FtlError


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
