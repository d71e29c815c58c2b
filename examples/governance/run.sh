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
work="${FTL_WORK_DIR:-$(dirname "$here")/work}"
repo="$work/governance"
python="${PYTHON:-python3}"
ftl_bin="${FTL_BIN:-ftl}"

command -v "$ftl_bin" >/dev/null 2>&1 || {
    echo "run.sh: '$ftl_bin' not found; activate the environment where ftl-runner is installed or set FTL_BIN" >&2
    exit 2
}

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
mkdir -p "$repo/governance"
cp -R "$here/policies" "$repo/governance/policies"
cp "$here/approve.py" "$repo/governance/approve.py"

cd "$repo"
git -c init.defaultBranch=main init -q
git config user.name "ftl example"
git config user.email "ftl-example@example.invalid"
git add -A
git -c commit.gpgsign=false commit -q --no-verify -m "shipyard: governance example baseline"

objective="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["objective"])' "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" \
    --config "$here/ftl.toml" "$@"
