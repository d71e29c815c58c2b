"""FTL-compatible ``orchestration.py``: explorer sessions, the transition table and state events.

The commands live in ``lib/_orchestration.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/orchestration.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_orchestration", __name__)
