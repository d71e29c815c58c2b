import sys

from ftl.surfaces.cli import console

sys.exit(console())
