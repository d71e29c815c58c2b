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
source "$here/../common.sh"
downloads="$work/downloads"
repo="$work/$name"
require_ftl

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
commit_baseline "$name $version sdist"

objective="$(plan_objective "$here/plan.json")"
exec "$ftl_bin" campaign run "$objective" --plan "$here/plan.json" --repo "$repo" "$@"
