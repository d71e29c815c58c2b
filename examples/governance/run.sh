#!/usr/bin/env bash
# Governance example: copy the small repository in project/ to examples/work/governance (a fresh
# git repository on every run), add the gate files (policies/ and approve.py, under governance/),
# and run plan.json on it with ftl and this directory's ftl.toml. Expected outcome: expected.json
# (exit code 3: the campaign finishes with the refused tasks blocked). Extra arguments go to
# `ftl campaign run`, e.g. `--jobs 1` or `--json`. Environment: FTL_WORK_DIR (default
# examples/work) holds the scratch repository; FTL_BIN (default ftl) is the ftl executable;
# PYTHON (default python3) reads the plan's objective. The approval command in ftl.toml runs
# `python3` from PATH.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../common.sh"
repo="$work/governance"
require_ftl

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
mkdir -p "$repo/governance"
cp -R "$here/policies" "$repo/governance/policies"
cp "$here/approve.py" "$repo/governance/approve.py"

cd "$repo"
commit_baseline "shipyard: governance example baseline"

objective="$(plan_objective "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" \
    --config "$here/ftl.toml" "$@"
