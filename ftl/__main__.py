import sys

from ftl.surfaces.entry import console

sys.exit(console())
