"""FTL-compatible ``logging_config.py``: read, clear or probe the operator's log ``.ftl/ftl.log``.

FTL logging_config.py (enzokro/crinzo-plugins ``ftl/lib/logging_config.py``, commit 89a2f8e):
``tail [-n N]``, ``clear``, ``test``. ftl's runner writes the same file (``.ftl/ftl.log``), one
JSON object per line (`ftl.telemetry.logs`), so ``tail`` shows those lines; FTL's lines were plain text.
``clear`` empties the file instead of deleting it, so a runner that holds it open keeps
logging into it. Output and exit codes: see ``lib/_common.py``; the FTL output mode prints
FTL's text.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import click

from _common import Env, FtlText, Reply, command, script_group

cli = script_group("logging_config.py", "The operator's log .ftl/ftl.log (FTL logging_config.py).")

LOG = Path(".ftl") / "ftl.log"


@command(cli, "tail")
@click.option("-n", "--lines", "count", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many of the last lines.")
def tail(env: Env, count: int) -> Reply:
    """The last N lines of .ftl/ftl.log (none when it does not exist).
    data: {"lines": [str]}; FTL output: the lines as text."""
    path = env.repo / LOG
    lines: list[str] = []
    if path.exists() and count:
        with path.open(encoding="utf-8", errors="replace") as handle:
            lines = [line.rstrip("\n") for line in deque(handle, maxlen=count)]
    return Reply({"lines": lines}, ftl=FtlText("\n".join(lines)))


@command(cli, "clear")
def clear(env: Env) -> Reply:
    """Empty .ftl/ftl.log. data: {"cleared": bool (it existed)}; FTL output: "Log cleared"."""
    path = env.repo / LOG
    existed = path.exists()
    if existed:
        path.write_text("", encoding="utf-8")
    return Reply({"cleared": existed}, ftl=FtlText("Log cleared"))


@command(cli, "test")
def test(env: Env) -> Reply:
    """Write one record per level (debug, info, warning, error) from logger ``ftl.test`` to
    .ftl/ftl.log. data: {"written": 4, "log": ".ftl/ftl.log"}; FTL output: "Test entries
    written to log"."""
    import logging

    from ftl.telemetry.logs import configure

    logger, root = logging.getLogger("ftl.test"), logging.getLogger("ftl")
    level = root.level  # configure() may lower it; restored so a caller's logging is unchanged
    handler = configure("DEBUG", env.repo / LOG)
    try:
        logger.debug("Debug message")
        logger.info("Info message")
        logger.warning("Warning message")
        logger.error("Error message")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
    return Reply({"written": 4, "log": LOG.as_posix()}, ftl=FtlText("Test entries written to log"))

