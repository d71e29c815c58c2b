#!/usr/bin/env bash
# Claude Code as ftl's builder: six tasks, four in parallel then two that depend on them, each
# built by `claude -p --output-format stream-json` in its own worktree. By default the
# `claude` here is the stand-in `stand_in_claude.py` (offline, free): the first task meets a
# usage limit that resets 3 s later, so every agent start waits at the shared rate gate
# (RATE_GATE events), the limited task is retried, the campaign completes, and
# `ftl replay --format html` shows the cost of every task and the total.
# FTL_REAL_CLAUDE=1 uses your logged-in `claude` and ftl.toml as written (costs money).
# Environment: PYTHON, FTL_BIN, FTL_WORK_DIR (as every example); FTL_STAND_IN_SCENARIOS
# (JSON {slug: scenario}, see stand_in_claude.py), FTL_STAND_IN_LOG (argv log folder).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../common.sh"
repo="$work/claude-builder"
require_ftl

rm -rf "$repo"
mkdir -p "$work"
cp -R "$here/project" "$repo"
cp "$here/ftl.toml" "$repo/ftl.toml"
if [ "${FTL_REAL_CLAUDE:-0}" != "1" ]; then
    stand_in="$here/stand_in_claude.py"
    "$PYTHON" - "$repo/ftl.toml" "$PYTHON" "$stand_in" <<'PY'
import json, re, sys
path, python, stand_in = sys.argv[1:]
text = open(path).read()
text = re.sub(r'(?m)^command = .*$', "command = " + json.dumps([python, stand_in]), text)
open(path, "w").write(text)
PY
    export FTL_STAND_IN_SCENARIOS="${FTL_STAND_IN_SCENARIOS:-{\"greet\": \"usage_limit_once\"\}}"
    export FTL_STAND_IN_WORK_S="${FTL_STAND_IN_WORK_S:-0.5}"
    export FTL_STAND_IN_RESET_S="${FTL_STAND_IN_RESET_S:-3}"
    export FTL_STAND_IN_LOG="${FTL_STAND_IN_LOG:-$work/claude-builder-argv}"
    rm -rf "$FTL_STAND_IN_LOG"
fi
cd "$repo"
commit_baseline "claude builder baseline"

objective="$(plan_objective "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
