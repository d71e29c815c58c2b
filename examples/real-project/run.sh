#!/usr/bin/env bash
# Real-project example: fetch the more-itertools sdist (pinned version and sha256) from the package
# index, unpack it into examples/work/more-itertools as a fresh git repository, and run plan.json on
# it with ftl: install, test, lint and package the library, then smoke-test the wheel.
# Needs network access to the package index. Extra arguments go to `ftl campaign run`, e.g.
# `--jobs 2`. Environment: PYTHON (default python3, >= 3.11) fetches the sdist and builds the
# campaign's venvs; FTL_BIN (default ftl) is the ftl executable.
set -euo pipefail

name="more-itertools"
version="11.2.1"
sdist="more_itertools-$version.tar.gz"
sha256="cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${FTL_WORK_DIR:-$(dirname "$here")/work}"
downloads="$work/downloads"
repo="$work/$name"
export PYTHON="${PYTHON:-python3}"
ftl_bin="${FTL_BIN:-ftl}"

command -v "$ftl_bin" >/dev/null 2>&1 || {
    echo "run.sh: '$ftl_bin' not found; activate the environment where ftl-runner is installed or set FTL_BIN" >&2
    exit 2
}

mkdir -p "$downloads"
if [ ! -f "$downloads/$sdist" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$name==$version" -d "$downloads"
fi
actual="$("$PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$downloads/$sdist")"
if [ "$actual" != "$sha256" ]; then
    echo "run.sh: $sdist has sha256 $actual, expected $sha256; delete it and re-run" >&2
    exit 2
fi

rm -rf "$repo"
mkdir -p "$repo"
tar -xzf "$downloads/$sdist" -C "$repo" --strip-components=1
cat "$here/gitignore" >> "$repo/.gitignore"

cd "$repo"
git -c init.defaultBranch=main init -q
git config user.name "ftl example"
git config user.email "ftl-example@example.invalid"
git add -A
git -c commit.gpgsign=false commit -q --no-verify -m "$name $version sdist"

objective="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["objective"])' "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
