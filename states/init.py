"""INIT: check the target repository and start the campaign (FTL INIT_PATTERN).

The campaign row and the event log already exist (the runner creates them before the machine
starts, fixing FTL's ambiguity of creating the campaign after EXPLORE began).
"""

from __future__ import annotations

from ftl.errors import FtlError
from ftl.engine.runner import Next, Run


def enter(run: Run) -> Next:
    if not run.repo.is_dir():
        raise FtlError("not_found", {"what": "the repository directory"})
    (run.repo / ".ftl").mkdir(exist_ok=True)
    return Next("explore")
