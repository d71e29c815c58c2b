"""Approval command of the governance example (gate 4, ``[gates.approval] mode = "command"``).

ftl runs it with the gated call as JSON on stdin (``request_id``, ``tool``, ``args``,
``side_effects``, ``principal``, ``source``, ``context``) and reads the exit status: 0 approves,
1 rejects. It stands in for a release manager: release notes are fine, the version number is
bumped by the release process only.
"""

import json
import sys

call = json.load(sys.stdin)
context = call.get("context", {})
files = context.get("files", [])
task = context.get("seq") or "-"
if "release/VERSION" in files:
    print(f"{call['request_id']}: task {task} rejected: the version is bumped by the release process",
          file=sys.stderr)
    sys.exit(1)
print(f"{call['request_id']}: task {task} approved ({', '.join(files) or 'no files'})")
sys.exit(0)
