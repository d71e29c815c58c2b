"""FTL-compatible ``campaign.py``: campaigns, their task DAG and cascade handling over ftl's store.

The commands live in ``lib/_campaign.py``: Python caches the bytecode of imported modules but
compiles a script it runs anew each time, and compiling the commands cost about 5 ms of every
cold start (issue 11 item 1). Usage: ``python lib/campaign.py [--repo DIR] COMMAND ...``; see
``lib/_common.py`` for the output and exit-code contract.
"""

import sys
from pathlib import Path

# The sibling modules, however the script is started (python lib/campaign.py, runpy, tests).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _campaign import cli  # noqa: E402
from _common import script_entry  # noqa: E402

if __name__ == "__main__":
    script_entry(cli)
