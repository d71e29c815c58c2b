"""FTL-compatible ``decision_parser.py``: read a planner's answer (PROCEED, CLARIFY, CONFIRM or
UNKNOWN), its plan and its questions.

FTL decision_parser.py (enzokro/crinzo-plugins ``ftl/lib/decision_parser.py``, commit 89a2f8e):
``decision_parser.py INPUT_FILE [--validate]`` prints ``{decision, markers_found, questions?
(CLARIFY), plan_json?, validation?: {valid, errors}}``. The reading is ftl's planner parser
(`ftl.server.tools.planner.parse_planner_output`) and the validation ftl's plan schema
(`ftl.validation.parse_plan`), so ``markers_found`` names ftl's markers (FTL's patterns in the
FTL output mode, `ftl_markers`) and ``errors`` ftl's violations (docs/ftl-compat.md). Exit codes in the FTL output mode are FTL's: 0 PROCEED,
2 CLARIFY, 3 CONFIRM, 1 UNKNOWN or a missing file; the envelope mode exits 0 with the decision
in ``data`` (2 for a missing file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from _common import EXIT_HELP, OUTPUT_OPTION, FtlRefusal, Reply

#: FTL's exit code per decision (FTL_OUTPUT=ftl only).
FTL_EXIT = {"PROCEED": 0, "CLARIFY": 2, "CONFIRM": 3, "UNKNOWN": 1}

#: The marker names FTL printed in ``markers_found`` (its line patterns, matched case-blind
#: line by line), per decision. FTL output mode only: the decision itself is ftl's parser's.
FTL_MARKERS = {
    "CLARIFY": (r"^### CLARIFY", r"^## Blocking Questions", r"^Confidence:\s*CLARIFY",
                r"^Decision:\s*CLARIFY", r"CLARIFY.*need.*clarification"),
    "CONFIRM": (r"^### Confidence:\s*CONFIRM", r"^Confidence:\s*CONFIRM", r"^Decision:\s*CONFIRM"),
    "PROCEED": (r"^### Confidence:\s*PROCEED", r"^Confidence:\s*PROCEED", r"^Decision:\s*PROCEED",
                r"```json\s*\{"),
}


def ftl_markers(decision: str, text: str) -> list[str]:
    """FTL's ``markers_found`` for ``decision``: the first matching CLARIFY or CONFIRM pattern,
    or every matching PROCEED pattern (FTL detect_decision's listing); [] for UNKNOWN."""
    import re

    lines = text.split("\n")
    found = [p for p in FTL_MARKERS.get(decision, ())
             if any(re.search(p, line, re.IGNORECASE) for line in lines)]
    return found if decision == "PROCEED" else found[:1]


def validation_of(plan: Any) -> dict[str, Any]:
    """``{"valid": bool, "errors": ["<json path>: <message>"]}`` for a plan dict."""
    from ftl.errors import FtlError
    from ftl.validation import parse_plan

    try:
        parse_plan(plan, source="plan_json")
    except FtlError as error:
        found = error.details.get("violations") or [{"path": "$", "message": error.message}]
        return {"valid": False, "errors": [f"{v.get('path', '$')}: {v.get('message', '')}" for v in found]}
    return {"valid": True, "errors": []}


def decide(text: str) -> dict[str, Any]:
    """FTL's decision object for a planner's answer ``text`` (see the module docstring)."""
    from ftl.server.tools.planner import parse_planner_output

    answer = parse_planner_output(text)
    result: dict[str, Any] = {"decision": answer["decision"], "markers_found": answer["markers"]}
    if answer["decision"] == "CLARIFY":
        if answer["questions"]:
            result["questions"] = answer["questions"]
        return result
    if answer["decision"] == "CONFIRM":
        return result
    # A malformed plan (e.g. {"objective": "x", "tasks": "no"}) is shown with its violations, and
    # without a decision header means PROCEED, as in FTL: the flow then re-plans on valid: false.
    plan = answer.get("plan", answer.get("plan_attempt"))
    if isinstance(plan, dict):
        if result["decision"] == "UNKNOWN":
            result["decision"] = "PROCEED"
        result["plan_json"] = plan
        result["validation"] = validation_of(plan)
    return result


@click.command(name="decision_parser.py", help=__doc__.split("\n\n")[0] + "\n\n" + EXIT_HELP)
@click.argument("input_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--validate", is_flag=True, help="Validate plan_json (always done, as in FTL).")
@OUTPUT_OPTION
def cli(input_file: Path, validate: bool, output: str | None) -> Reply:
    """Print the decision found in INPUT_FILE (a planner's answer).

    data: {decision: PROCEED | CLARIFY | CONFIRM | UNKNOWN, markers_found: [str], questions?:
    [str] (CLARIFY), plan_json?: {...}, validation?: {valid, errors: [str]}}.
    """
    try:
        text = input_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        raise FtlRefusal("not_found", {"what": f"planner output {input_file.name}"},
                         message=f"File not found: {input_file.name}",
                         ftl_payload={"error": f"File not found: {input_file}"}) from None
    result = decide(text)
    ftl = {**result, "markers_found": ftl_markers(result["decision"], text)}
    return Reply(result, ftl=ftl, ftl_exit=FTL_EXIT[result["decision"]])

