"""A validated plan as the rows the store writes, built without pydantic when the plan allows it.

Registering a plan (``campaign.py add-tasks``, REGISTER) needs only, per task, its seq, slug,
type, dependencies and spec text (``Task.model_dump_json()``), plus the plan's text for the plan
version (``Plan.model_dump_json(by_alias=True)``) and its framework. `PlanRows` is that shape.

`plan_rows` builds it two ways:

* the lean path, `lean_plan_rows`: the parsed JSON is checked one field at a time across all
  tasks against the rules of `ftl.models.Plan` / `Task` (the value rules themselves come from
  `ftl.plan_rules`, shared with the models) and each task is dumped to its spec text, so the
  process never holds 10,000 pydantic models and never imports pydantic (about 20 MiB of a
  40 MiB budget: issue 11 item 4). It accepts only plans whose values already have their canonical JSON types (e.g.
  ``"budget": 5``, not ``"5"`` or ``5.0``), with plain-string idioms and no graph defect;
  for anything else it answers None and decides nothing;
* otherwise `ftl.validation.parse_plan` (pydantic) judges the plan: it raises the structured
  violations users know (every error keeps its shape and wording), or returns the `Plan`,
  converted with `PlanRows.from_plan`.

Both paths give equal `PlanRows` for every plan the lean path accepts, byte for byte (orjson and
pydantic-core write the same JSON for JSON values: a hypothesis test in
tests/test_plan_rows.py holds them to it, along with a check that the field tables here match
the models).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple

import orjson

from ftl import dag, plan_rules

if TYPE_CHECKING:  # pydantic loads only on the fallback path
    from ftl.models import Plan


class TaskRow(NamedTuple):
    """One task as the store writes it (``.seq`` and ``.depends`` as `ftl.store.check_plan_graph`
    reads them)."""

    seq: str  # canonical seq (`plan_rules.normalize_seq`)
    slug: str
    type: str  # TaskType value: SPEC | BUILD | VERIFY
    depends: tuple[str, ...]  # canonical seqs, sorted as integers
    spec: str  # Task.model_dump_json()


@dataclass(frozen=True, slots=True)
class PlanRows:
    """A validated plan, ready for `ftl.store.Store.add_tasks`.

    Attributes:
        plan_json: ``Plan.model_dump_json(by_alias=True)``, the plan version's text.
        framework: the plan's framework (None when unset).
        tasks: one `TaskRow` per task, in plan order.
        graph_checked: the tasks are known to form a DAG over their own seqs (no duplicate seq,
            no dangling dependency, no cycle): the lean path checked it, so the store need not
            check it again (`ftl.store.check_plan_graph`).
    """

    plan_json: str
    framework: str | None
    tasks: list[TaskRow]
    graph_checked: bool = field(default=False, compare=False)  # provenance, not content

    @classmethod
    def from_plan(cls, plan: Plan) -> "PlanRows":
        """The rows of an already validated `ftl.models.Plan`."""
        return cls(plan_json=plan.model_dump_json(by_alias=True), framework=plan.framework,
                   tasks=[TaskRow(t.seq, t.slug, t.type.value, tuple(t.depends), t.model_dump_json())
                          for t in plan.tasks])


def plan_rows(raw: object, *, source: str = "plan") -> PlanRows:
    """Validate already-parsed plan JSON into `PlanRows`: lean when it can, pydantic otherwise.

    Args:
        raw: the parsed JSON (any JSON value).
        source: what the input is, for error messages (e.g. ``"plan on standard input"``).

    Returns:
        The rows; equal, for any plan, to ``PlanRows.from_plan(parse_plan(raw))``.

    Raises:
        FtlError(schema_invalid | cycle_detected): exactly as `ftl.validation.parse_plan`.
        pydantic_core.PydanticSerializationError: a valid plan whose text cannot be written (a
            string with a lone surrogate), as when the store dumped the `Plan` itself.
    """
    rows = lean_plan_rows(raw)
    if rows is not None:
        return rows
    from ftl.validation import parse_plan  # pydantic: only for plans the lean path declines

    return PlanRows.from_plan(parse_plan(raw, source=source))


class _Declined(Exception):
    """The value needs pydantic's judgement: it is invalid, or valid only after a coercion."""


# Checks work on a column: one field's values across every task (the default where a task leaves
# the field out), or a plan header value as a one-element column. Each returns the column as
# pydantic would store it, or raises _Declined. Columns let builtins do the looping in C
# (``set(map(type, column))``, ``all(map(SLUG_RE.fullmatch, column))``): one Python call per task
# and field cost 60 ms on 10,000 tasks, about as much as the rest of add-tasks.

_NONE = type(None)


def _types_of(values: Iterable[Any]) -> set[type]:
    return set(map(type, values))


def _all_match(item: str) -> Callable[[list[str]], bool]:
    """Whether every string of a column matches the regex ``item`` in full, tested with one
    regex pass over the comma-joined column (10,000 slugs: 1.7 ms, where a match per value
    takes 4.8). ``item`` must never match a comma, so that a column whose join holds exactly
    ``len - 1`` commas splits back into its values."""
    joined = re.compile(f"(?:{item})(?:,(?:{item}))*")

    def check(column: list[str]) -> bool:
        if not column:
            return True
        text = ",".join(column)
        return text.count(",") == len(column) - 1 and joined.fullmatch(text) is not None

    return check


#: `plan_rules.CANONICAL_SEQ_RE` (``fullmatch``) for a whole column.
_all_canonical_seqs = _all_match(plan_rules.CANONICAL_SEQ_RE.pattern)
#: `plan_rules.SLUG_RE` (``fullmatch``, as `plan_rules.check_slug` tests it) for a whole column.
_all_slugs = _all_match(plan_rules.SLUG_PATTERN)


def _strs(column: list[Any]) -> list[str]:
    if _types_of(column) != {str}:
        raise _Declined
    return column


def _non_empty_strs(column: list[Any]) -> list[str]:
    if not all(_strs(column)):  # pydantic min_length=1
        raise _Declined
    return column


def _optional_strs(column: list[Any]) -> list[str | None]:
    if not _types_of(column) <= {str, _NONE}:
        raise _Declined
    return column


def _str_lists(column: list[Any]) -> list[list[str]]:
    if _types_of(column) != {list} or not _types_of(chain.from_iterable(column)) <= {str}:
        raise _Declined
    return column


def _str_dicts(column: list[Any]) -> list[dict[str, str]]:
    if _types_of(column) != {dict} or not _types_of(chain.from_iterable(map(dict.values, column))) <= {str}:
        raise _Declined
    return column


def _choices(*allowed: str | None) -> Callable[[list[Any]], list[Any]]:
    """A column of an enum or Literal field: each value one of ``allowed``, exactly."""
    choices = frozenset(allowed)

    def check(column: list[Any]) -> list[Any]:
        try:
            values = set(column)
        except TypeError:  # an unhashable value (a list, an object)
            raise _Declined from None
        if not values <= choices:
            raise _Declined
        return column

    return check


def _ruled(rule: Callable[[Any], Any], types: Callable[[list[Any]], list[Any]] | None = None
           ) -> Callable[[list[Any]], list[Any]]:
    """A column whose values pass an `ftl.plan_rules` rule (after a type check), each value
    replaced by what the rule returns (a normalised seq, a sorted depends list)."""

    def check(column: list[Any]) -> list[Any]:
        try:
            return list(map(rule, column if types is None else types(column)))
        except (ValueError, TypeError):
            raise _Declined from None

    return check


def _seqs(column: list[Any]) -> list[str]:
    """Seqs as `plan_rules.normalize_seq` makes them; a column of canonical seqs, as planners
    write them, is returned as it is after one C-level match per value."""
    if _types_of(column) == {str} and _all_canonical_seqs(column):
        return column
    return _normalised_seqs(column)


_normalised_seqs = _ruled(plan_rules.normalize_seq)
_normalised_depends = _ruled(plan_rules.normalize_depends)
_NO_DEPENDS: list[str] = []  # shared by every task without dependencies; rows only read it


def _depends(column: list[Any]) -> list[list[str]]:
    """Dependency lists as `plan_rules.normalize_depends` makes them. Fast path for the forms a
    planner writes: "none", or a list of canonical seqs in increasing order (already normal)."""
    if _types_of(column) <= {str, list}:
        lists = [value for value in column if type(value) is list]
        if len(lists) + column.count("none") == len(column) and _normal_lists(lists):
            return [value if type(value) is list else _NO_DEPENDS for value in column]
    return _normalised_depends(column)


def _normal_lists(lists: list[list[Any]]) -> bool:
    """Every list holds canonical seqs in strictly increasing order (`normalize_depends` would
    return it unchanged). Canonical seqs order as integers when compared by (length, text)."""
    items = list(chain.from_iterable(lists))
    if not _types_of(items) <= {str} or not _all_canonical_seqs(items):
        return False
    return all((len(a), a) < (len(b), b) for values in lists if len(values) > 1
               for a, b in zip(values, values[1:]))


def _slugs(column: list[Any]) -> list[str]:
    if not _all_slugs(_strs(column)):  # the rule of plan_rules.check_slug
        raise _Declined
    return column


def _verifies(column: list[Any]) -> list[str]:
    if not all(map(str.strip, _strs(column))):  # the rule of plan_rules.check_verify
        raise _Declined
    return column


def _paths(column: list[Any]) -> list[list[str]]:
    try:
        plan_rules.check_paths(list(chain.from_iterable(_str_lists(column))))
    except ValueError:
        raise _Declined from None
    return column


def _budgets(column: list[Any]) -> list[int]:
    if _types_of(column) != {int} or min(column) < 1 or max(column) > 100:  # ge=1, le=100
        raise _Declined
    return column


def _number(value: Any) -> float:
    """A float field's value as pydantic stores it (``5`` -> ``5.0``); booleans and strings are
    declined (pydantic's coercions judge them)."""
    if type(value) is not float and type(value) is not int:
        raise _Declined
    try:
        return float(value)
    except OverflowError:  # an integer past the float range
        raise _Declined from None


def _timeout_s(value: Any) -> float | None:
    """``gt=0``, finite (an infinite timeout is pydantic's call)."""
    if value is None:
        return None
    number = _number(value)
    if not 0.0 < number < float("inf"):  # also declines NaN
        raise _Declined
    return number


def _fraction(value: Any) -> float | None:
    """``framework_confidence``: ``ge=0, le=1``."""
    if value is None:
        return None
    number = _number(value)
    if not 0.0 <= number <= 1.0:
        raise _Declined
    return number


def _resources(value: Any) -> dict[str, float] | None:
    """`ftl.models.TaskResources`: ``{"num_cpus": 0..1024}``, default 1.0; nothing else."""
    if value is None:
        return None
    if type(value) is not dict or set(value) - {"num_cpus"}:
        raise _Declined
    cpus = _number(value["num_cpus"]) if "num_cpus" in value else 1.0
    if not 0.0 <= cpus <= 1024.0:
        raise _Declined
    return {"num_cpus": cpus}


def _idioms(value: Any) -> dict[str, list[str]]:
    """`ftl.models.Idioms` with plain-string entries only (rule objects need pydantic and
    ast-grep, so plans with them take the pydantic path)."""
    if type(value) is not dict or set(value) - {"required", "forbidden"}:
        raise _Declined
    return {"required": _str_lists([value.get("required", [])])[0],
            "forbidden": _str_lists([value.get("forbidden", [])])[0]}


def _each(check: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    """A column check from a one-value check (fields that are rare or need per-value work)."""
    return lambda column: list(map(check, column))


def _campaigns(column: list[Any]) -> list[str | None]:
    try:
        return list(map(plan_rules.check_campaign_slug, _optional_strs(column)))
    except ValueError:
        raise _Declined from None


_REQUIRED: Any = object()  # a field without a default

#: `ftl.models.Task` fields in declaration order (the order of model_dump_json): default and
#: column check. tests/test_plan_rows.py checks names, order and defaults against the model.
TASK_FIELDS: dict[str, tuple[Any, Callable[[list[Any]], list[Any]]]] = {
    "seq": (_REQUIRED, _seqs),
    "slug": (_REQUIRED, _slugs),
    "type": ("BUILD", _choices("SPEC", "BUILD", "VERIFY")),
    "delta": ([], _paths),
    "creates": ([], _paths),
    "verify": (_REQUIRED, _verifies),
    "budget": (5, _budgets),
    "depends": ([], _depends),
    "run": (None, _optional_strs),
    "timeout_s": (None, _each(_timeout_s)),
    "preflight": ([], _str_lists),
    "verify_source": (None, _optional_strs),
    "target_lines": ({}, _str_dicts),
    "builder": (None, _choices(None, "shell", "agent")),
    "isolation": (None, _choices(None, "worktree", "shared")),
    "resources": (None, _each(_resources)),
}
#: Fields whose stored value can differ from the input value (normalised or coerced).
_NORMALISED = ("seq", "depends", "timeout_s", "resources")

#: `ftl.models.Plan` fields before ``tasks``, by alias (``by_alias=True`` dump order).
PLAN_FIELDS: dict[str, tuple[Any, Callable[[list[Any]], list[Any]]]] = {
    "_schema_version": ("1.0", _strs),
    "objective": (_REQUIRED, _non_empty_strs),
    "campaign": (None, _campaigns),
    "framework": (None, _optional_strs),
    "framework_confidence": (None, _each(_fraction)),
    "idioms": ({"required": [], "forbidden": []}, _each(_idioms)),
}
_PLAN_NAMES_BY_FIELD = {"schema_version"}  # populate_by_name: the field's own name is input too

_TASK_TEMPLATE = {name: default for name, (default, _) in TASK_FIELDS.items()}


def lean_plan_rows(raw: object) -> PlanRows | None:
    """`PlanRows` of ``raw`` without pydantic, or None when pydantic must judge the plan.

    None means: some value is invalid, or valid only after a coercion pydantic would make
    (``"5"`` -> ``5``), or is an idiom rule object, or the graph has a duplicate seq, a dangling
    dependency or a cycle. Never raises for any JSON value.
    """
    if type(raw) is not dict or _PLAN_NAMES_BY_FIELD & raw.keys():
        return None
    tasks = raw.get("tasks")
    if type(tasks) is not list or not tasks:
        return None
    try:
        header = {name: check([raw[name]])[0] if name in raw else _default(default)
                  for name, (default, check) in PLAN_FIELDS.items()}
        extras = {key: value for key, value in raw.items() if key not in PLAN_FIELDS and key != "tasks"}
        if _too_deep(extras.values()) or plan_rules.non_finite_locations(extras):
            raise _Declined
        rows, texts = _task_rows(tasks)
        head = orjson.dumps(header)[:-1].decode()
        tail = orjson.dumps(extras)[1:-1].decode()
    except (_Declined, orjson.JSONEncodeError):  # JSONEncodeError: an int past 64 bits, a lone surrogate
        return None
    plan_json = "".join((head, ',"tasks":[', ",".join(texts), "]", "," if tail else "", tail, "}"))
    return PlanRows(plan_json=plan_json, framework=header["framework"], tasks=rows, graph_checked=True)


def _default(default: Any) -> Any:
    if default is _REQUIRED:
        raise _Declined
    return default


def _task_rows(tasks: list[Any]) -> tuple[list[TaskRow], list[str]]:
    """The rows and spec texts of the plan's tasks. Raises: _Declined (including a
    self-dependency, a duplicate seq, a dangling dependency or a cycle)."""
    if _types_of(tasks) != {dict}:
        raise _Declined
    present = set().union(*tasks)  # every key some task gives
    extra_names = present.difference(TASK_FIELDS)
    if extra_names:
        values = [task[name] for task in tasks for name in extra_names if name in task]
        if _too_deep(values) or plan_rules.non_finite_locations(values):  # orjson writes NaN as null
            raise _Declined
    columns: dict[str, list[Any]] = {}
    for name, (default, check) in TASK_FIELDS.items():
        if name in present:
            try:
                column = list(map(operator.itemgetter(name), tasks)) if default is _REQUIRED else \
                    list(map(dict.get, tasks, repeat(name), repeat(default)))
            except KeyError:  # a required field missing from some task
                raise _Declined from None
            columns[name] = check(column)
        elif default is _REQUIRED:
            raise _Declined
    count = len(tasks)
    seqs = columns["seq"]
    depends = columns.get("depends") or [[]] * count
    if any(map(operator.contains, depends, seqs)) or not _is_dag(seqs, depends):
        raise _Declined
    # Each spec: the model's fields in order (defaults for those the task leaves out), then the
    # task's extras in its own order, as pydantic dumps them.
    dumps, template = orjson.dumps, _TASK_TEMPLATE
    rare = [(name, columns[name]) for name in _NORMALISED[2:] if name in columns]
    if not rare:
        texts = [dumps({**template, **task, "seq": seq, "depends": task_depends}).decode()
                 for task, seq, task_depends in zip(tasks, seqs, depends)]
    else:  # fields whose stored value may differ from the input's (5 -> 5.0), seldom given
        texts = []
        for index, (task, seq, task_depends) in enumerate(zip(tasks, seqs, depends)):
            spec = {**template, **task, "seq": seq, "depends": task_depends}
            for name, column in rare:
                spec[name] = column[index]
            texts.append(dumps(spec).decode())
    fields = zip(seqs, columns["slug"], columns.get("type") or ["BUILD"] * count, map(tuple, depends), texts)
    # tuple.__new__ is what TaskRow._make calls, minus a Python frame per row (10,000 rows: 8 ms).
    return list(map(tuple.__new__, repeat(TaskRow), fields)), texts


def _too_deep(values: Iterable[Any]) -> bool:
    """Whether an extra field nests past `plan_rules.MAX_EXTRA_DEPTH` (pydantic words the error)."""
    limit = plan_rules.MAX_EXTRA_DEPTH
    return any(plan_rules.nests_deeper_than(value, limit) for value in values
               if isinstance(value, (dict, list)))


def _is_dag(seqs: list[str], depends: list[list[str]]) -> bool:
    """No duplicate seq, no dependency outside the plan, no cycle (self-dependencies were
    declined before); `ftl.validation` words the violations when this is False.

    ``seqs`` are canonical and each ``depends`` list is sorted (`_depends`), so canonical seqs
    order as integers when compared by (length, text). When every task's highest dependency is
    below its own seq, every path descends and none can close a cycle: the usual plan passes
    with one comparison per task (10,000 tasks: 1.1 ms, where `dag.find_cycle` takes 3.2)."""
    known = set(seqs)
    if len(known) != len(seqs) or not known.issuperset(chain.from_iterable(depends)):
        return False
    if all(len(values[-1]) < len(seq) or (len(values[-1]) == len(seq) and values[-1] < seq)
           for values, seq in zip(depends, seqs) if values):
        return True
    return dag.find_cycle(dict(zip(seqs, depends))) is None
