"""FTL-compatible ``exploration.py``: explorer results and the aggregated exploration.

The commands live in ``lib/_exploration.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/exploration.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_exploration", __name__)
