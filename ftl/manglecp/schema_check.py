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


class SchemaCheck:
    """A JSON Schema 2020-12 check of instances against ``schema``. Thread-safe.

    Where the two validators could differ, the fast one only ever passes what jsonschema would:
    both follow the 2020-12 specification and its official test suite; a schema jsonschema-rs
    cannot compile, and an instance holding a value it cannot read (a dict key that is not a
    string), go to jsonschema alone. One known difference: jsonschema-rs reads a Python tuple
    as a JSON array, as every wire form of the instance would carry it.

    Args:
        schema: the JSON Schema (a mapping; copied).
    """

    __slots__ = ("schema", "_fast", "_full")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = dict(schema)
        self._full: Any = None
        try:
            import jsonschema_rs

            self._fast: Any = jsonschema_rs.Draft202012Validator(self.schema)
        except Exception:  # noqa: BLE001 - a schema it cannot compile: jsonschema decides alone
            self._fast = None

    def iter_errors(self, instance: Any) -> Iterator[Any]:
        """The validation errors of ``instance``: none when it is valid, else jsonschema's
        ``ValidationError`` objects (``absolute_path``, ``message``, ``validator``)."""
        if self._fast is not None:
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
