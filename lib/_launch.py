"""How every lib script starts (``lib/plan.py``, ``lib/campaign.py``, ...): each script is a few
lines that put this folder on ``sys.path`` and call `launch` with the module of its commands
(``lib/_plan.py``, ``lib/_campaign.py``, ...).

Two costs of every start go away that way (issue 11 item 1, where plugin commands call these
scripts many times per campaign): Python compiles a script it runs anew each time but caches the
bytecode of a module it imports (1-6 ms per script), and the commands load with the cyclic
garbage collector paused: loading allocates tens of thousands of objects that live as long as
the process, so the collector would only scan them again at each threshold (about 5 ms; the
few hundred that imports drop in reference cycles stay allocated instead, a small fixed cost).
`script_entry` (`ftl.surfaces.clickutil.freezing_at_exit`) freezes what was loaded and resumes
collection before the command runs.
"""

from __future__ import annotations

import gc
import importlib


def launch(module: str, caller: str):  # -> click.Group; click is not loaded yet here
    """Load ``module`` (a sibling holding a click group ``cli``) with collection paused; run it
    when ``caller`` (the script's ``__name__``) is ``"__main__"``, which exits; return the group
    otherwise (the script imported by runpy or a test, collection as it was before).

    Raises: whatever importing ``module`` raises (collection as it was before).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        cli = importlib.import_module(module).cli
        from _common import script_entry
    except BaseException:
        if enabled:
            gc.enable()
        raise
    if caller != "__main__":
        if enabled:
            gc.enable()
        return cli
    script_entry(cli)
    raise AssertionError("unreachable: script_entry exits")
