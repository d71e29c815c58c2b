"""FTL-compatible ``observer.py``: learn from finished workspaces (FTL observer.py commands).

The commands live in ``lib/_observer.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/observer.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_observer", __name__)
