#!/usr/bin/env bash
# Parallel edits: two independent, correct tasks that each verify with a project-wide check
# (`python -m compileall -q .`, as real verifies run a whole test suite or linter), one of them
# writing its file in two steps, then a task that uses both. Each task runs in its own git
# worktree, so neither sees the other's half-done work; each result is a commit integrated into
# the campaign's branch. Expected: 3 complete, exit 0, with --jobs 1 or 2; the user's branch and
# files are untouched until `ftl campaign land`. Extra arguments go to `ftl campaign run`.
# Environment: PYTHON (default python3), FTL_BIN (default ftl), FTL_WORK_DIR (scratch space).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../common.sh"
repo="$work/parallel-edits"
require_ftl

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
cd "$repo"
commit_baseline "parallel edits baseline"

objective="$(plan_objective "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
