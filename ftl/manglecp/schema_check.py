"""Checking a tool's arguments and results against its JSON Schema (MangleCP spec 07 §2).

The server checks the arguments of every invocation against the tool's ``input_schema`` and a
result against its ``output_schema``. Almost every instance is valid, and the answer "valid"
comes from `jsonschema-rs` (a compiled validator: under 1 us for a tool's arguments, where the
pure-Python `jsonschema` takes 25-60 us, twice per task; issue 11 item 3). The errors of an
invalid instance come from `jsonschema`: their paths, messages and keywords are what clients see,
and an instance jsonschema-rs calls invalid is asked again there, so jsonschema keeps the last
word on every rejection.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

__all__ = ["SchemaCheck"]

_SCALARS = frozenset({str, int, float, bool, type(None)})
_MAX_DEPTH = 64  # deeper instances go to jsonschema (jsonschema-rs crashed past ~50,000 levels)


class SchemaCheck:
    """A JSON Schema 2020-12 check of instances against ``schema``. Thread-safe.

    The fast validator answers only where it is known to agree with jsonschema:
    * instances made of plain JSON values: dicts with string keys, lists, strings, numbers,
      booleans and None, at most `_MAX_DEPTH` levels deep. A tuple, an Enum member, a subclass
      of str or dict (what an in-process caller can pass and no wire carries) goes to
      jsonschema, which reads them its own way;
    * schemas without the keywords whose meaning the two libraries implement differently: a
      ``pattern`` or ``patternProperties`` regex with a backslash (``\\d``, ``\\w`` and ``\\s``
      are Unicode classes in Python's ``re``, ASCII ones in Rust's regex) and a ``multipleOf``
      that is not an integer (float remainders). Such a schema is checked by jsonschema alone,
      as is one jsonschema-rs cannot compile.

    Args:
        schema: the JSON Schema (a mapping; copied).
    """

    __slots__ = ("schema", "_fast", "_full")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = dict(schema)
        self._full: Any = None
        self._fast: Any = None
        if _agreed(self.schema):
            try:
                import jsonschema_rs

                self._fast = jsonschema_rs.Draft202012Validator(self.schema)
            except Exception:  # noqa: BLE001 - a schema it cannot compile: jsonschema decides alone
                self._fast = None

    def iter_errors(self, instance: Any) -> Iterator[Any]:
        """The validation errors of ``instance``: none when it is valid, else jsonschema's
        ``ValidationError`` objects (``absolute_path``, ``message``, ``validator``)."""
        if self._fast is not None and _plain(instance, 0):
            try:
                if self._fast.is_valid(instance):
                    return iter(())
            except (ValueError, TypeError, OverflowError):  # a value it cannot read
                pass
        full = self._full
        if full is None:  # built on the first invalid instance only (its import costs ~0.1 s)
            import jsonschema

            full = self._full = jsonschema.Draft202012Validator(self.schema)
        return full.iter_errors(instance)


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` is made of plain JSON values only, nested at most `_MAX_DEPTH` deep
    (plain loops: a task's workspace takes about 8 us)."""
    kind = type(value)
    if kind is dict:
        if depth >= _MAX_DEPTH:
            return False
        for key in value:
            if type(key) is not str:
                return False
        return _items_plain(value.values(), depth)
    if kind is list:
        return depth < _MAX_DEPTH and _items_plain(value, depth)
    return kind in _SCALARS


def _items_plain(items: Any, depth: int) -> bool:
    """`_plain` for the items of a container at ``depth``."""
    for item in items:
        inner = type(item)
        if inner is dict or inner is list:
            if not _plain(item, depth + 1):
                return False
        elif inner not in _SCALARS:
            return False
    return True


def _agreed(schema: Any) -> bool:
    """Whether ``schema`` (and every schema inside it) avoids the keywords the two validators
    read differently (see `SchemaCheck`)."""
    if isinstance(schema, list):
        return all(_agreed(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and "\\" in pattern:
        return False
    patterns = schema.get("patternProperties")
    if isinstance(patterns, dict) and any("\\" in str(key) for key in patterns):
        return False
    step = schema.get("multipleOf")
    if step is not None and not (type(step) is int or (type(step) is float and step.is_integer())):
        return False
    return all(_agreed(value) for key, value in schema.items() if key not in _DATA_KEYWORDS)


_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas
