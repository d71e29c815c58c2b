"""FTL-compatible ``campaign.py``: campaigns, their task DAG and cascade handling over ftl's store.

The commands live in ``lib/_campaign.py``; how a lib script starts: ``lib/_launch.py``. Usage:
``python lib/campaign.py [--repo DIR] COMMAND ...``; see ``lib/_common.py`` for the output and
exit-code contract.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/campaign.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_campaign", __name__)
