"""FTL-compatible ``benchmark.py``: benchmarks of ftl's memory and the records of their runs.

The commands live in ``lib/_benchmark.py``; how a lib script starts: ``lib/_launch.py``.
"""

import os
import sys

# The sibling modules, however the script is started (python lib/benchmark.py, runpy, tests).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from _launch import launch  # noqa: E402

cli = launch("_benchmark", __name__)
