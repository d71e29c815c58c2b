"""The distribution ships every room of ftl: a package folder missing from pyproject's
``packages`` list works in a development checkout but not in an installed ftl (the plugin's
SessionStart hook installs one)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_ftl_package_is_in_the_distribution() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(init.parent.relative_to(ROOT).parts)
               for init in (ROOT / "ftl").rglob("__init__.py") if "__pycache__" not in init.parts}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert "ftl.states" in listed and config["package-dir"]["ftl.states"] == "states"
