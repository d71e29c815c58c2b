"""FTL-compatible ``plan.py``: the plan versions of a campaign, over ftl's store.

The commands live in ``lib/_plan.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/plan.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_plan", __name__)
