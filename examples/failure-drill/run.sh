#!/usr/bin/env bash
# Failure drill: copy the synthetic project in project/ to examples/work/failure-drill (a fresh
# git repository on every run) and run plan.json on it with ftl. Expected outcome: expected.json
# (exit code 3: the campaign finishes with blocked tasks). Extra arguments go to
# `ftl campaign run`, e.g. `--jobs 1`. Environment: PYTHON (default python3) runs the plan's
# commands; FTL_BIN (default ftl) is the ftl executable.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../common.sh"
repo="$work/failure-drill"
require_ftl

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
find "$repo" \( -name __pycache__ -o -name .drill -o -name build \) -prune -exec rm -rf {} +

cd "$repo"
commit_baseline "tally: failure drill baseline"

objective="$(plan_objective "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
