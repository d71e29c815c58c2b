# Shared steps of the examples' run.sh scripts (sourced, not run). Each example builds a fresh
# scratch git repository under ${FTL_WORK_DIR:-examples/work} and hands it to `ftl campaign run`.
# Environment: FTL_WORK_DIR (scratch space), FTL_BIN (default ftl), PYTHON (default python3).

examples_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${FTL_WORK_DIR:-$examples_dir/work}"
export PYTHON="${PYTHON:-python3}"
ftl_bin="${FTL_BIN:-ftl}"

require_ftl() {
    command -v "$ftl_bin" >/dev/null 2>&1 || {
        echo "run.sh: '$ftl_bin' not found; activate the environment where ftl-runner is installed or set FTL_BIN" >&2
        exit 2
    }
}

# commit_baseline MESSAGE: make the current directory a one-commit git repository.
commit_baseline() {
    git -c init.defaultBranch=main init -q
    git config user.name "ftl example"
    git config user.email "ftl-example@example.invalid"
    git add -A
    git -c commit.gpgsign=false commit -q --no-verify -m "$1"
}

# plan_objective PLAN: the plan's objective (the campaign's objective on the command line).
plan_objective() {
    "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["objective"])' "$1"
}
