#!/usr/bin/env bash
# Failure drill: copy the synthetic project in project/ to examples/work/failure-drill (a fresh
# git repository on every run) and run plan.json on it with ftl. Expected outcome: expected.json
# (exit code 3: the campaign finishes with blocked tasks). Extra arguments go to
# `ftl campaign run`, e.g. `--jobs 1`. Environment: PYTHON (default python3) runs the plan's
# commands; FTL_BIN (default ftl) is the ftl executable.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${FTL_WORK_DIR:-$(dirname "$here")/work}"
repo="$work/failure-drill"
export PYTHON="${PYTHON:-python3}"
ftl_bin="${FTL_BIN:-ftl}"

command -v "$ftl_bin" >/dev/null 2>&1 || {
    echo "run.sh: '$ftl_bin' not found; activate the environment where ftl-runner is installed or set FTL_BIN" >&2
    exit 2
}

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
find "$repo" \( -name __pycache__ -o -name .drill -o -name build \) -prune -exec rm -rf {} +

cd "$repo"
git -c init.defaultBranch=main init -q
git config user.name "ftl example"
git config user.email "ftl-example@example.invalid"
git add -A
git -c commit.gpgsign=false commit -q --no-verify -m "tally: failure drill baseline"

objective="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["objective"])' "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
