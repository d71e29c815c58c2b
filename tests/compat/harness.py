"""The differential harness of ftl's FTL output mode: run `sequence.json` against a set of
FTL-style ``lib/*.py`` scripts, normalise what they print, compare with the golden file.

Used by ``record_ftl.py`` (runs FTL's own scripts in subprocesses and writes the golden file)
and by ``tests/test_ftl_compat.py`` (runs ftl's scripts in process with ``FTL_OUTPUT=ftl``).
Normalisation replaces what legitimately differs between two runs: campaign / session ids,
timestamps, float noise (rounded to 6 places) and the order of memory ``source`` lists (FTL
merged them through a Python set, so their order changes with the hash seed); everything else
must be equal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
SEQUENCE = HERE / "sequence.json"
GOLDEN = HERE / "golden" / "ftl-89a2f8e.json"
DIFFERENCES = HERE / "differences.json"

#: runner(script, args, stdin_text, cwd) -> (exit_code, stdout, stderr)
Runner = Callable[[str, list[str], str, Path], tuple[int, str, str]]

_TS = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?$")
_FTL_CAMPAIGN_ID = re.compile(r"^c-\d{8}-\d{6}-[0-9a-f]{4}$")
_ID_KEYS = {"campaign_id", "session_id", "archive"}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def load_sequence() -> dict[str, Any]:
    return json.loads(SEQUENCE.read_text(encoding="utf-8"))


def prepare(directory: Path, sequence: dict[str, Any]) -> None:
    """Write the sequence's files into ``directory``."""
    for name, text in sequence["files"].items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def normalize(value: Any, key: str | None = None) -> Any:
    """Ids -> "<id>", timestamps -> "<ts>", floats rounded to 6 places, ``source`` lists sorted,
    recursively."""
    if isinstance(value, dict):
        return {k: normalize(v, k) for k, v in value.items()}
    if key == "source" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return sorted(value)  # FTL merged sources through a set: its order is random
    if isinstance(value, list):
        return [normalize(v, key) for v in value]
    if isinstance(value, float):
        return round(value, 6)
    if key in _ID_KEYS and value is not None:
        return "<id>"
    if key == "id" and (isinstance(value, int) and not isinstance(value, bool)
                        or isinstance(value, str) and _FTL_CAMPAIGN_ID.match(value)):
        return "<id>"
    if isinstance(value, str) and (_TS.match(value) or _FTL_CAMPAIGN_ID.match(value)):
        return "<ts>" if _TS.match(value) else "<id>"
    return value


def parse_stdout(text: str) -> dict[str, Any]:
    """``{"json": normalised value}`` when stdout is one JSON value, else ``{"text": stdout}``."""
    if not text.strip():
        return {"text": ""}
    try:
        return {"json": normalize(json.loads(text))}
    except json.JSONDecodeError:
        return {"text": text}


def run_sequence(runner: Runner, directory: Path, sequence: dict[str, Any] | None = None) -> list[dict]:
    """Run every step in ``directory``; return ``[{id, exit_code, stdout: {json|text}}]``."""
    sequence = sequence or load_sequence()
    prepare(directory, sequence)
    outputs: dict[str, str] = {}
    captured: dict[str, str] = {}
    results = []
    for step in sequence["steps"]:
        stdin = step.get("stdin", "")
        if isinstance(stdin, dict):
            stdin = json.dumps(sequence["plan"]) if stdin.get("plan") else outputs[stdin["from"]]
        args = [_PLACEHOLDER.sub(lambda m: captured.get(m.group(1), m.group(0)), a) for a in step["args"]]
        code, out, _err = runner(step["script"], args, stdin, directory)
        outputs[step["id"]] = out
        for name, field in step.get("capture", {}).items():
            captured[name] = json.loads(out)[field]
        results.append({"id": step["id"], "exit_code": code, "stdout": parse_stdout(out)})
    return results


def compare(actual: list[dict], golden: list[dict]) -> list[dict]:
    """Per step ``{id, equal: bool, ftl: golden entry, ftl_rs: actual entry}``, in order."""
    by_id = {g["id"]: g for g in golden}
    return [{"id": a["id"], "equal": a == by_id.get(a["id"]), "golden": by_id.get(a["id"]), "actual": a}
            for a in actual]
