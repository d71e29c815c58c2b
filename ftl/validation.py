"""Plan loading and validation that reports every violation at once, each with a JSON path and a fix.

`parse_plan` turns already-parsed JSON into a `Plan`; `load_plan_file` reads and parses a file
first. Both raise only `FtlError`: ``schema_invalid`` (details ``count`` and ``violations``) or,
when the only problem is a dependency cycle, ``cycle_detected`` (details ``cycle`` and
``violations``); `load_plan_file` also raises ``not_found``. A violation is
``{"path": "$.tasks[2].seq", "message": ..., "fix": ...}``.

Beyond the pydantic model (`ftl.models`), the plan's graph is checked on every task whose seq
could be read, even when other fields of that task are invalid: duplicate seqs (FTL accepted them,
§8.2-12), dangling dependencies (FTL §6.4) and cycles (FTL §6.3, message ``001 -> 003 -> 001``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from ftl import dag, plan_rules
from ftl.errors import FtlError
from ftl.models import Idioms, Plan, Task, normalize_depends, normalize_seq

Violation = dict[str, Any]

_JSON_TYPE_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number",
                    bool: "a boolean", type(None): "null"}

_SELF_DEPENDENCY = "depends on itself"

# Fix hints for value errors raised by ftl.models' validators, by field name.
_FIELD_FIXES = {
    "seq": 'use a task number: digits like "001" (or the integer 1)',
    "depends": 'use "none", one seq like "001", or a list of seqs like ["001", "002"]',
    "slug": 'use a kebab-case name like "add-login" (a-z, 0-9 and single hyphens)',
    "campaign": 'use a kebab-case name like "auth-rework" (a-z, 0-9 and single hyphens)',
    "delta": "list concrete repository-relative file paths: no globs, no leading '/', no '..'",
    "creates": "list concrete repository-relative file paths: no globs, no leading '/', no '..'",
    "verify": 'give a shell command that exits 0 when the task is done, e.g. "pytest tests/test_x.py"',
}

# Fix hints by pydantic error type; {placeholders} come from the error's ctx and the field name.
_TYPE_FIXES = {
    "missing": "add the required field '{field}'",
    "extra_forbidden": "remove '{field}'; allowed fields here: {allowed}",
    "string_type": "use a JSON string",
    "string_too_short": "use a non-empty string",
    "list_type": "use a JSON array",
    "too_short": "give at least {min_length} item(s)",
    "dict_type": "use a JSON object",
    "model_type": "use a JSON object",
    "model_attributes_type": "use a JSON object",
    "int_type": "use a whole number",
    "int_parsing": "use a whole number",
    "int_from_float": "use a whole number",
    "float_type": "use a number",
    "float_parsing": "use a number",
    "bool_type": "use true or false",
    "greater_than_equal": "use a number >= {ge}",
    "greater_than": "use a number > {gt}",
    "less_than_equal": "use a number <= {le}",
    "less_than": "use a number < {lt}",
    "enum": "use one of {expected}",
    "literal_error": "use one of {expected}",
}


def json_path(loc: Iterable[Any]) -> str:
    """Render a pydantic error ``loc`` as a JSON path: ``("tasks", 2, "seq")`` -> ``$.tasks[2].seq``.

    Keys that are not identifiers are quoted: ``$.tasks[0].target_lines["src/a.py"]``.
    """
    parts = ["$"]
    for item in loc:
        if isinstance(item, int) and not isinstance(item, bool):
            parts.append(f"[{item}]")
        elif isinstance(item, str) and item.isidentifier():
            parts.append(f".{item}")
        else:
            parts.append(f"[{json.dumps(str(item))}]")
    return "".join(parts)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field the last element of ``loc`` names (for 'allowed fields' hints)."""
    parent = loc[:-1]
    if not parent:
        return Plan
    if len(parent) == 2 and parent[0] == "tasks" and isinstance(parent[1], int):
        return Task
    if parent == ("idioms",):
        return Idioms
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _fix(error: Mapping[str, Any]) -> str:
    loc = tuple(error.get("loc", ()))
    field = next((item for item in reversed(loc) if isinstance(item, str)), "")
    error_type = error.get("type", "")
    if error_type == "value_error":
        if _SELF_DEPENDENCY in str(error.get("msg", "")):
            return "remove the task's own seq from its depends"
        return _FIELD_FIXES.get(field, "correct the value as the message says")
    template = _TYPE_FIXES.get(error_type)
    if template is None:
        return "correct the value to match plan.schema.json"
    model = _model_at(loc) if loc else None
    values = {str(k): v for k, v in (error.get("ctx") or {}).items()}
    values.setdefault("field", field)
    values.setdefault("allowed", ", ".join(_field_names(model)) if model else "see plan.schema.json")
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):
        return template.split(" {")[0]


def _message(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def _schema_violations(exc: ValidationError) -> list[Violation]:
    violations = []
    for error in exc.errors(include_url=False, include_input=False):
        if error.get("type") == "value_error" and _SELF_DEPENDENCY in str(error.get("msg", "")):
            continue  # reported by the graph checks, which see it even when the task has other errors
        violations.append({"path": json_path(error.get("loc", ())), "message": _message(error),
                           "fix": _fix(error)})
    return violations


def _lenient_tasks(raw: Mapping[str, Any]) -> list[tuple[int, str, list[str], Any]]:
    """``(index, seq, depends, raw depends)`` for every task whose seq can be read.

    An unreadable ``depends`` counts as empty here; the schema violation already names it.
    """
    tasks = raw.get("tasks")
    if not isinstance(tasks, list):
        return []
    found = []
    for index, task in enumerate(tasks):
        if not isinstance(task, dict):
            continue
        try:
            seq = normalize_seq(task.get("seq"))
        except (ValueError, TypeError):
            continue
        raw_depends = task.get("depends")
        try:
            depends = normalize_depends(raw_depends)
        except (ValueError, TypeError):
            depends = []
        found.append((index, seq, depends, raw_depends))
    return found


def _depends_path(index: int, raw_depends: Any, dep: str) -> str:
    """Path of one dependency inside a raw ``depends`` (an element path when it is a list)."""
    base = f"$.tasks[{index}].depends"
    if isinstance(raw_depends, list):
        for position, item in enumerate(raw_depends):
            try:
                if normalize_seq(item) == dep:
                    return f"{base}[{position}]"
            except (ValueError, TypeError):
                continue
    return base


def _graph_violations(raw: Mapping[str, Any], known: frozenset[str] = frozenset()
                      ) -> tuple[list[Violation], list[str] | None]:
    """Duplicate seqs, self-dependencies, dangling deps and one cycle; also the cycle path.

    A dependency on a ``known`` seq (a task outside this document) is not dangling.
    """
    tasks = _lenient_tasks(raw)
    violations: list[Violation] = []
    first_index: dict[str, list[int]] = {}
    graph: dict[str, set[str]] = {}
    raw_depends_of: dict[tuple[int, str], Any] = {}
    for index, seq, depends, raw_depends in tasks:
        first_index.setdefault(seq, []).append(index)
        if seq in depends:
            violations.append({
                "path": _depends_path(index, raw_depends, seq),
                "message": f"task {seq} depends on itself",
                "fix": "remove the task's own seq from its depends"})
        graph.setdefault(seq, set()).update(d for d in depends if d != seq)
        for dep in depends:
            raw_depends_of[(index, dep)] = raw_depends

    for seq, indexes in first_index.items():
        if len(indexes) > 1:
            paths = [f"$.tasks[{i}].seq" for i in indexes]
            violations.append({
                "path": paths[1],
                "message": f"seq {seq} is used by more than one task: {', '.join(paths)} "
                           "('1', '001' and 1 are the same seq)",
                "fix": "give each task its own seq"})

    # A revision's tasks may depend on the campaign's existing tasks (``known``): both are valid.
    valid = ", ".join(sorted(graph.keys() | known, key=dag.seq_key)) or "(none)"
    for index, seq, depends, raw_depends in tasks:
        for dep in depends:
            if dep not in graph and dep not in known:
                violations.append({
                    "path": _depends_path(index, raw_depends, dep),
                    "message": f"task {seq} depends on {dep}, which is not a task of the "
                               f"{'plan or the campaign' if known else 'plan'}; valid seqs: {valid}",
                    "fix": f"depend on one of the valid seqs, or add a task with seq {dep}"})

    cycle = dag.find_cycle({seq: sorted(parents) for seq, parents in graph.items()})
    if cycle:
        index = first_index[cycle[0]][0]
        violations.append({
            "path": _depends_path(index, raw_depends_of.get((index, cycle[1])), cycle[1]),
            "message": f"dependency cycle: {dag.format_cycle(cycle)}",
            "fix": "remove one dependency on the cycle so the plan is a DAG"})
    return violations, cycle


def parse_plan(raw: object, *, source: str = "plan", known_seqs: Iterable[str] = ()) -> Plan:
    """Validate already-parsed JSON as a plan, reporting every violation at once.

    Args:
        raw: the parsed JSON (a dict for a valid plan; any JSON value is accepted as input).
        source: what the input is, for the error message (e.g. ``"plan file plan.json"``).
        known_seqs: seqs of tasks that exist outside this document (a revised plan may list
            only the tasks it changes or adds; the merged graph is checked by the store).

    Returns:
        The `Plan` (seqs normalised to three digits, depends to sorted seq lists).

    Raises:
        FtlError(schema_invalid): details ``{"count": n, "violations": [...]}``, each violation
            ``{"path", "message", "fix"}``; schema violations first (pydantic order, then every
            number that is not finite), then graph violations (self-dependency, duplicate seq,
            dangling dependency, cycle).
        FtlError(cycle_detected): the cycle is the only problem; details
            ``{"cycle": "001 -> 003 -> 001", "violations": [one violation]}``.
    """
    if not isinstance(raw, dict):
        kind = _JSON_TYPE_NAMES.get(type(raw), type(raw).__name__)
        violations = [{"path": "$", "message": f"a plan must be a JSON object, got {kind}",
                       "fix": 'send an object with "objective" and "tasks"'}]
        raise _schema_error(source, violations)
    try:
        plan: Plan | None = Plan.model_validate(raw, context={plan_rules.NEW_INPUT: True})
        schema_violations: list[Violation] = []
    except ValidationError as exc:
        plan = None
        schema_violations = _schema_violations(exc)
    seen = {v["path"] for v in schema_violations}
    schema_violations += [v for v in _non_finite_violations(raw) if v["path"] not in seen]
    graph_violations, cycle = _graph_violations(raw, frozenset(known_seqs))
    violations = schema_violations + graph_violations
    if cycle and len(violations) == 1:
        text = dag.format_cycle(cycle)
        raise FtlError("cycle_detected", {"cycle": text, "violations": violations, "source": source},
                       message=f"The {source} has a dependency cycle: {text}.")
    if violations or plan is None:
        raise _schema_error(source, violations)
    return plan


def _non_finite_violations(raw: Mapping[str, Any]) -> list[Violation]:
    """A violation for every NaN or infinite number in the plan (`plan_rules.non_finite_locations`):
    pydantic accepts them, but the saved plan would hold null instead (e.g. ``1e400``)."""
    return [{"path": json_path(loc), "message": "is not a finite number (JSON numbers must fit a "
                                                "64-bit float; 1e400, NaN and Infinity do not)",
             "fix": "use a finite number, or leave the field out"}
            for loc in plan_rules.non_finite_locations(raw)]


def _schema_error(source: str, violations: list[Violation]) -> FtlError:
    count = len(violations)
    return FtlError("schema_invalid", {"count": count, "violations": violations, "source": source},
                    message=f"The {source} does not match its schema ({count} violation(s)).")


def load_plan_file(path: Path, *, known_seqs: Iterable[str] = ()) -> Plan:
    """Read a plan.json file and validate it with `parse_plan` (``known_seqs`` as there).

    Raises:
        FtlError(not_found): the file cannot be read; details ``{"what": "plan file <name>"}``
            (the file name only, never the absolute path).
        FtlError(schema_invalid): the file is not UTF-8 JSON (one violation at ``$`` with
            ``line`` and ``column``, 1-based), or any `parse_plan` violation.
        FtlError(cycle_detected): as for `parse_plan`.
    """
    path = Path(path)
    source = f"plan file {path.name}"
    try:
        data = path.read_bytes()
    except OSError:
        raise FtlError("not_found", {"what": source}) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _schema_error(source, [{
            "path": "$", "line": line, "column": column,
            "message": f"not UTF-8 text (line {line}, column {column})",
            "fix": "save the plan as UTF-8 JSON"}]) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _schema_error(source, [{
            "path": "$", "line": exc.lineno, "column": exc.colno,
            "message": f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            "fix": "fix the JSON syntax at that position"}]) from None
    except RecursionError:
        raise _schema_error(source, [{
            "path": "$", "line": 1, "column": 1,
            "message": "JSON nested too deeply to read",
            "fix": "a plan needs only a few levels of nesting"}]) from None
    return parse_plan(raw, source=source, known_seqs=known_seqs)
