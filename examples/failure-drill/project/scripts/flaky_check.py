"""A deliberately flaky check for the failure drill: fails on its first run, passes afterwards.

Usage: ``python scripts/flaky_check.py COUNTER_FILE``. Each run adds one to the integer stored in
COUNTER_FILE (created with its directory if missing); the run that takes it to 1 exits 1, every
later run exits 0. Keep COUNTER_FILE in a gitignored directory so the count is not a repo change.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: flaky_check.py COUNTER_FILE", file=sys.stderr)
        return 2
    counter = Path(argv[0])
    counter.parent.mkdir(parents=True, exist_ok=True)
    attempt = int(counter.read_text(encoding="utf-8") or "0") + 1 if counter.exists() else 1
    counter.write_text(str(attempt), encoding="utf-8")
    if attempt == 1:
        print(f"flaky check: attempt {attempt} fails on purpose (a fresh checkout's first check)")
        return 1
    print(f"flaky check: attempt {attempt} passes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
