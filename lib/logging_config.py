"""FTL-compatible ``logging_config.py``: read, clear or probe the operator's log ``.ftl/ftl.log``.

The commands live in ``lib/_logging_config.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/logging_config.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_logging_config", __name__)
