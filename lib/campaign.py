"""FTL-compatible ``campaign.py``: campaigns, their task DAG and cascade handling over ftl's store.

The commands live in ``lib/_campaign.py``: Python caches the bytecode of imported modules but
compiles a script it runs anew each time, and compiling the commands cost about 5 ms of every
cold start (issue 11 item 1). Usage: ``python lib/campaign.py [--repo DIR] COMMAND ...``; see
``lib/_common.py`` for the output and exit-code contract.
"""

import gc

# Loading the commands allocates tens of thousands of objects and frees none: the cyclic garbage
# collector would only scan them again at each threshold (about 5 ms of every start). It is
# paused for the imports; `script_entry` freezes what they built and resumes it.
gc.disable()
try:
    import sys
    from pathlib import Path

    # The sibling modules, however the script is started (python lib/campaign.py, runpy, tests).
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    from _campaign import cli
    from _common import script_entry
finally:
    if __name__ != "__main__":  # imported (runpy, tests): collect as usual from here on
        gc.enable()

if __name__ == "__main__":
    script_entry(cli)
