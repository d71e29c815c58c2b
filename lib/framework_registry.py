"""FTL-compatible ``framework_registry.py``: the frameworks ftl recognises, their idioms, and
detection in a directory.

The commands live in ``lib/_framework_registry.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/framework_registry.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_framework_registry", __name__)
