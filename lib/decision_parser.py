"""FTL-compatible ``decision_parser.py``: read a planner's answer (PROCEED, CLARIFY, CONFIRM or
UNKNOWN), its plan and its questions.

The commands live in ``lib/_decision_parser.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/decision_parser.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_decision_parser", __name__)
