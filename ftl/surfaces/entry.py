"""The ``ftl`` console script and ``python -m ftl``: load the command line with the cyclic garbage
collector paused, then run it.

Loading click and ftl's command modules allocates tens of thousands of objects that live as long
as the process; the collector would scan the growing heap at each of its thresholds, about 5 ms
of every start (issue 11 item 1). The few hundred objects imports drop in reference cycles stay
allocated instead, a small fixed cost. `ftl.surfaces.clickutil.freezing_at_exit` freezes what
was loaded and resumes collection before the command runs. Nothing is imported here at module
level (not even ``typing``): this module is what the console script imports first.
"""

from __future__ import annotations


def console() -> int | None:
    """Load `ftl.surfaces.cli` with collection paused and run its ``console``; returns what it
    returns (the exit code of ``--help``; a command exits itself)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        from ftl.surfaces.cli import console as run_cli
    except BaseException:
        if enabled:
            gc.enable()
        raise
    return run_cli()
