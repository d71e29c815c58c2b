"""A stand-in coding agent / planner for the builder and planner tool tests.

Usage: ``python fake_agent.py MODE``; the workspace (or planning input) JSON arrives on stdin.
Modes (builder): complete, blocked, garbage, rate-limit-json, rate-limit-exit, complete-exit-1,
out-of-scope, chatty (a JSON-looking log line, then the result), echo-env.
Modes (planner): plan-markdown, plan-malformed, plan-json, clarify, echo-input.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    mode = sys.argv[1]
    data = json.loads(sys.stdin.read() or "{}")
    delta = data.get("delta") or []
    if mode == "complete":
        for path in delta:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(f"# written by the fake agent for {data['workspace_id']}\n")
        print("thinking about it...")
        print(json.dumps({"status": "complete", "delivered": f"wrote {', '.join(delta)}",
                          "utilized": [{"name": "sibling-x", "type": "failure"}]}))
        return 0
    if mode == "blocked":
        print(json.dumps({"status": "blocked", "reason": "delta insufficient - requires b.py"}))
        return 1
    if mode == "garbage":
        print("I could not decide what to print. {not json at all")
        return 0
    if mode == "rate-limit-json":
        print(json.dumps({"status": "blocked", "error_type": "rate_limited", "retry_after_ms": 1500}))
        return 0
    if mode == "rate-limit-exit":
        print("429 Too Many Requests", file=sys.stderr)
        return 75
    if mode == "complete-exit-1":
        print(json.dumps({"status": "complete", "delivered": "done"}))
        return 1
    if mode == "out-of-scope":
        Path("elsewhere.py").write_text("x = 1\n")
        print(json.dumps({"status": "complete", "delivered": "also touched elsewhere.py"}))
        return 0
    if mode == "chatty":
        print(json.dumps({"event": "tool_call", "tool": "Edit"}))
        print('progress {"step": 1}')
        print(json.dumps({"status": "complete", "delivered": "chatty done"}))
        print(json.dumps({"event": "exit"}))
        return 0
    if mode == "echo-env":
        print(json.dumps({"status": "complete", "delivered": " ".join(
            os.environ.get(k, "") for k in ("FTL_WORKSPACE_ID", "FTL_TASK_SEQ", "FTL_ATTEMPT"))}))
        return 0
    if mode == "plan-markdown":
        plan = {"objective": data["objective"], "tasks": [
            {"seq": "001", "slug": "first", "delta": ["a.py"], "verify": "true"}]}
        print("### Confidence: PROCEED\n\nPlan below.\n\n```json\n" + json.dumps(plan, indent=2)
              + "\n```\n\n001 -> done\n")
        return 0
    if mode == "plan-malformed":  # a go-ahead whose plan is not one
        print("Confidence: PROCEED\n\n```json\n" + json.dumps({"objective": data["objective"],
                                                              "tasks": "none yet"}) + "\n```\n")
        return 0
    if mode == "plan-json":
        print(json.dumps({"objective": data["objective"], "tasks": []}))
        return 0
    if mode == "clarify":
        print("Confidence: CLARIFY\n\n## Questions\n1. Which database?\n- Keep the old API?\n")
        return 2
    if mode == "echo-input":
        print("Decision: CONFIRM\n1. " + json.dumps(data, sort_keys=True) + " ok?")
        return 0
    print(f"unknown mode {mode}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
