"""Click command-line errors as registry errors, for every command-line surface (ftl, lib/).

Click prints its own usage text for a bad option or argument; with ``--json`` a caller expects
a response-v2 envelope instead, naming the parameter and how to get the usage.
"""

from __future__ import annotations

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
