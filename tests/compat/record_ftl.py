"""Refresh the golden outputs of FTL's scripts (tests/compat/golden/) from an FTL checkout.

Usage: ``python tests/compat/record_ftl.py --ftl PATH [--python PY]`` where PATH is the
``ftl/`` directory of enzokro/crinzo-plugins (the one holding ``lib/campaign.py``), and PY a
Python with FTL's requirements (``pip install fastsql``; sentence-transformers is left out so
FTL uses its difflib fallback). Each step of sequence.json runs in a fresh temporary directory
shared by the whole sequence; outputs are normalised (ids, timestamps) and written as data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import GOLDEN, run_sequence  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ftl", required=True, type=Path, help="FTL's ftl/ directory (with lib/).")
    parser.add_argument("--python", default=sys.executable, help="Python with fastsql installed.")
    parser.add_argument("--commit", default="89a2f8e", help="FTL commit the checkout is at.")
    args = parser.parse_args()
    lib = args.ftl.resolve() / "lib"
    if not (lib / "campaign.py").is_file():
        parser.error(f"{args.ftl} has no lib/campaign.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTL_")}

    def runner(script: str, argv: list[str], stdin: str, cwd: Path) -> tuple[int, str, str]:
        proc = subprocess.run([args.python, str(lib / f"{script}.py"), *argv], input=stdin,
                              capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
        return proc.returncode, proc.stdout, proc.stderr

    with tempfile.TemporaryDirectory(prefix="ftl-golden-") as tmp:
        results = run_sequence(runner, Path(tmp))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({"source": f"enzokro/crinzo-plugins ftl/lib at {args.commit}",
                                  "steps": results}, indent=1) + "\n", encoding="utf-8")
    print(f"{len(results)} steps written to tests/compat/golden/{GOLDEN.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
