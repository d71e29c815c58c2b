"""JSON Schema files for ftl's data, generated from the pydantic models (one source of truth).

The files in the repository's ``schemas/`` directory are this module's output; a test fails when
they drift from the models. Regenerate them with::

    python -m ftl.schemas            # writes <repo>/schemas/*.schema.json
    python -m ftl.schemas DIR        # writes DIR/*.schema.json

Schemas are JSON Schema 2020-12 in pydantic's validation mode, i.e. they describe what ftl
accepts as input. Where a model normalises its input in a ``mode="before"`` validator (a seq may be
``"001"``, ``"1"`` or ``1``; ``depends`` may be ``"none"``, one seq or a list), pydantic would
describe only the normalised form, so `INPUT_FORMS` widens those properties to the input forms.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel

from ftl.surfaces.envelope import ResponseV2
from ftl.events import EventRecord, add_event_fields
from ftl.models import BuildResult, ExplorerResult, Plan, Task, Workspace

SCHEMAS: dict[str, type[BaseModel]] = {
    "plan": Plan,
    "task": Task,
    "workspace": Workspace,
    "build_result": BuildResult,
    "explorer_result": ExplorerResult,
    "event": EventRecord,
    "response-v2": ResponseV2,
}

DIALECT = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX = "urn:ftl-runner:schema:"
DEFAULT_DIRECTORY = Path(__file__).resolve().parent.parent / "schemas"

# A seq as ftl.models.normalize_seq accepts it: digits (surrounding blanks allowed) or an integer.
SEQ_INPUT: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": r"^\s*[0-9]+\s*$"},
        {"type": "integer", "minimum": 0, "maximum": 999_999},
    ],
    "description": "Task number: \"001\", \"1\" and 1 are the same task.",
}
_NO_DEPENDENCY: dict[str, Any] = {"anyOf": [{"enum": ["none", ""]}, {"type": "null"}]}

# (model, property) -> the input forms its "before" validator accepts (ftl.models.Task).
INPUT_FORMS: dict[tuple[type[BaseModel], str], dict[str, Any]] = {
    (Task, "seq"): {"$ref": "#/$defs/SeqInput"},
    (Task, "depends"): {
        "anyOf": [
            _NO_DEPENDENCY,
            {"$ref": "#/$defs/SeqInput"},
            {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/SeqInput"}, _NO_DEPENDENCY]}},
        ],
        "default": "none",
    },
}


def filename(name: str) -> str:
    """The file name of schema ``name``: ``"plan"`` -> ``"plan.schema.json"``."""
    return f"{name}.schema.json"


def _model_definition(schema: dict[str, Any], root: type[BaseModel],
                      model: type[BaseModel]) -> dict[str, Any] | None:
    """Where ``model``'s object schema sits inside ``root``'s schema (root or ``$defs``)."""
    if model is root:
        return schema
    return schema.get("$defs", {}).get(model.__name__)


def schema_for(name: str) -> dict[str, Any]:
    """The JSON Schema of ``SCHEMAS[name]``, with ``$schema`` and ``$id`` and widened input forms.

    Raises:
        KeyError: ``name`` is not a key of `SCHEMAS`.
    """
    model = SCHEMAS[name]
    schema = model.model_json_schema(mode="validation")
    if model is EventRecord:
        add_event_fields(schema)
    widened = False
    for (owner, prop), form in INPUT_FORMS.items():
        definition = _model_definition(schema, model, owner)
        if definition is None or prop not in definition.get("properties", {}):
            continue
        original = definition["properties"][prop]
        replacement = copy.deepcopy(form)
        for key in ("title", "description"):
            if key in original:
                replacement.setdefault(key, original[key])
        definition["properties"][prop] = replacement
        widened = True
    if widened:
        schema.setdefault("$defs", {})["SeqInput"] = copy.deepcopy(SEQ_INPUT)
        schema["$defs"] = dict(sorted(schema["$defs"].items()))
    return {"$schema": DIALECT, "$id": ID_PREFIX + filename(name), **schema}


def generate() -> dict[str, dict[str, Any]]:
    """Every schema, keyed by file name: ``{"plan.schema.json": {...}, ...}``."""
    return {filename(name): schema_for(name) for name in SCHEMAS}


def render(schema: dict[str, Any]) -> str:
    """The committed text of a schema file (2-space indent, trailing newline)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write(directory: Path) -> list[Path]:
    """Write every schema into ``directory`` (created if missing); return the paths written.

    Raises:
        OSError: the directory or a file cannot be written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in generate().items():
        path = directory / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ftl.schemas [DIR]``: write the schemas (default: the repository's schemas/)."""
    parser = argparse.ArgumentParser(prog="python -m ftl.schemas",
                                     description="Generate ftl's JSON Schema files from its models.")
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT_DIRECTORY,
                        help="output directory (default: schemas/ next to the ftl package)")
    args = parser.parse_args(argv)
    for path in write(args.directory):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
