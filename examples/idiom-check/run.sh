#!/usr/bin/env bash
# Idiom check: copy the small package in project/ to examples/work/idiom-check (a fresh git
# repository on every run) and run plan.json on it with ftl. The plan forbids print() in Python
# by an ast-grep pattern; task 001 adds a module that prints, task 002 one that does not.
# Expected outcome: expected.json (exit code 3: 001 blocked as idiom_violation naming
# greet/shout.py:9, 002 complete). Extra arguments go to `ftl campaign run`, e.g. `--json`.
# Environment: FTL_WORK_DIR (default examples/work), FTL_BIN (default ftl), PYTHON (default
# python3) runs the plan's commands.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../common.sh"
repo="$work/idiom-check"
require_ftl

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
find "$repo" -name __pycache__ -prune -exec rm -rf {} +

cd "$repo"
commit_baseline "greet: idiom-check baseline"

objective="$(plan_objective "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
