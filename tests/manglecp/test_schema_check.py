"""`SchemaCheck` against jsonschema alone, on the schemas of ftl's own tools (differential).

The check answers "valid" from jsonschema-rs and asks jsonschema for everything else, so it
agrees with jsonschema exactly when jsonschema-rs never passes an instance jsonschema rejects.
These tests look for such an instance: ones drawn along each schema (mostly valid, with values
at the edges of its bounds), and arbitrary JSON objects over the schema's own property names
(mostly invalid).
"""

from __future__ import annotations

import enum
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl.config import Config
from ftl.manglecp.schema_check import SchemaCheck
from ftl.server.catalog import build_catalog

_CATALOG, _ = build_catalog(Path("."), Config())
_SCHEMAS = sorted(
    [(f"{name}:input", dict(tool.input_schema)) for name, tool in _CATALOG.items()]
    + [(f"{name}:output", dict(tool.output_schema)) for name, tool in _CATALOG.items()
       if tool.output_schema is not None])

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)


def _messages(errors) -> list[tuple[str, str, str]]:
    return sorted(("/".join(map(str, e.absolute_path)), e.message, str(e.validator)) for e in errors)


def _along(schema: dict, root: dict, depth: int = 0) -> st.SearchStrategy:
    """Instances drawn along ``schema`` (the subset of JSON Schema pydantic writes): each
    property present or not (required ones always), typed values, bounds and their neighbours,
    enum members, a null where anyOf allows one. Not always valid (a ``pattern`` is not
    followed), which the comparison does not need."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return _along(root["$defs"][name], root, depth + 1) if depth < 6 else st.none()
    if "anyOf" in schema:
        return st.one_of([_along(option, root, depth + 1) for option in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | _JSON
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        return st.fixed_dictionaries(
            {k: _along(v, root, depth + 1) for k, v in props.items() if k in required},
            optional={k: _along(v, root, depth + 1) for k, v in props.items() if k not in required})
    if kind == "array":
        items = schema.get("items") or {}
        return st.lists(_along(items, root, depth + 1) if depth < 6 else _JSON, max_size=3)
    if kind in ("integer", "number"):
        edges = [schema[k] + d for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
                 if k in schema for d in (-1, 0, 1)]
        base = st.integers(-10**6, 10**6) if kind == "integer" else st.floats(-1e6, 1e6)
        return (st.sampled_from(edges) | base) if edges else base
    if kind == "string":
        lengths = [schema[k] + d for k in ("minLength", "maxLength") if k in schema for d in (-1, 0, 1)]
        return st.text(max_size=12) | st.sampled_from([max(0, n) for n in lengths] or [0]).map(lambda n: "x" * n)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return _JSON


def _near_instances(schema: dict) -> st.SearchStrategy[dict]:
    """Objects over the schema's property names (and one stranger), with arbitrary JSON values."""
    names = sorted(schema.get("properties") or {}) + ["unexpected"]
    return st.dictionaries(st.sampled_from(names), _JSON, max_size=len(names))


def test_the_catalog_has_schemas_to_compare():
    assert len(_SCHEMAS) >= 10
    assert all(SchemaCheck(schema)._fast is not None for _, schema in _SCHEMAS), \
        "every schema of ftl's tools compiles in jsonschema-rs (else the fast answer is lost)"


@pytest.mark.parametrize("name,schema", _SCHEMAS, ids=[name for name, _ in _SCHEMAS])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_check_agrees_with_jsonschema(name, schema, data):
    full = jsonschema.Draft202012Validator(schema)
    check = SchemaCheck(schema)
    for instance in (data.draw(_along(schema, schema), label="along"),
                     data.draw(_near_instances(schema), label="near")):
        assert _messages(check.iter_errors(instance)) == _messages(full.iter_errors(instance)), name


def test_an_invalid_instance_gets_jsonschemas_errors():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
              "required": ["n"], "additionalProperties": False}
    errors = list(SchemaCheck(schema).iter_errors({"n": 0, "x": 1}))
    assert sorted(e.validator for e in errors) == ["additionalProperties", "minimum"]
    assert [list(e.absolute_path) for e in errors if e.validator == "minimum"] == [["n"]]
    assert list(SchemaCheck(schema).iter_errors({"n": 3})) == []


def test_a_value_the_fast_validator_cannot_read_goes_to_jsonschema():
    check = SchemaCheck({"type": "object", "additionalProperties": {"type": "string"}})
    assert [e.validator for e in check.iter_errors({1: 2})] == ["type"]  # jsonschema's answer
    assert list(check.iter_errors({"a": "b"})) == []


def test_a_schema_the_fast_validator_cannot_compile_is_checked_by_jsonschema_alone():
    schema = {"type": "string", "pattern": "(?<=a)b(?P=missing)"}  # not a regex jsonschema-rs takes
    check = SchemaCheck(schema)
    assert check._fast is None
    assert list(check.iter_errors(5))[0].validator == "type"


class _Command(enum.Enum):
    TRUE = "true"


class _Number(enum.Enum):
    FIVE = 5


@pytest.mark.parametrize("schema,instance", [
    ({"type": "string"}, _Command.TRUE),  # jsonschema-rs reads an Enum as its value
    ({"type": "integer", "maximum": 10}, _Number.FIVE),
    ({"type": "array"}, ("a",)),  # and a tuple as an array
    ({"type": "object", "properties": {"p": {"type": "array"}}}, {"p": ("a",)}),
    ({"multipleOf": 0.01}, 0.07),  # float remainders differ
    ({"multipleOf": 0.1}, 0.3),
    ({"type": "string", "pattern": "^\\S+$"}, "a\x1cb"),  # \s, \d, \w: Unicode in re, ASCII in Rust
    ({"type": "string", "pattern": "^\\D+$"}, "\u0663"),
    ({"type": "string", "pattern": "^\\W+$"}, "\u00e9"),
    ({"type": "object", "patternProperties": {"^\\d+$": {"type": "integer"}}}, {"\u0663": "s"}),
], ids=["enum", "int-enum", "tuple", "nested-tuple", "multipleOf-0.01", "multipleOf-0.1",
        "regex-S", "regex-D", "regex-W", "patternProperties-d"])
def test_where_the_validators_differ_jsonschema_decides(schema, instance):
    """Each of these the fast validator alone would pass; jsonschema rejects it."""
    full = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    assert full, "jsonschema rejects the instance"
    assert _messages(SchemaCheck(schema).iter_errors(instance)) == _messages(full)


def test_a_deep_or_self_containing_instance_goes_to_jsonschema():
    schema = {"$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
              "$ref": "#/$defs/node"}
    check = SchemaCheck(schema)
    deep: list = []
    for _ in range(200):
        deep = [deep]
    assert list(check.iter_errors(deep)) == []  # jsonschema's answer (the fast one is not asked)
    loop: list = []
    loop.append(loop)
    with pytest.raises(RecursionError):  # what jsonschema did before the fast path: not "valid"
        list(check.iter_errors(loop))
