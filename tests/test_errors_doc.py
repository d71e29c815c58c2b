"""Every FTL error type has a producing test (issue 15 item 3): ``PRODUCED_BY`` names one per
type, the test exists, is not skipped and names the kind it produces; docs/errors.md shows it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ftl.errors import FTL_ERROR_TYPES, REGISTRY
from ftl.surfaces.errors_doc import PRODUCED_BY, render

ROOT = Path(__file__).resolve().parents[1]


def _function(test: str) -> tuple[ast.FunctionDef, str]:
    """The test's function node and its source text, from ``tests/<file>.py::<name>``."""
    path_text, _, name = test.partition("::")
    path = ROOT / path_text
    assert path.is_file() and path_text.startswith("tests/"), f"{test}: no such test file"
    source = path.read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node, ast.get_source_segment(source, node) or ""
    raise AssertionError(f"{test}: no test function {name!r} at module level")


def _skipped(node: ast.FunctionDef) -> bool:
    return any("skip" in ast.unparse(decorator) for decorator in node.decorator_list)


def test_the_fourteen_ftl_error_types_are_registry_rows() -> None:
    assert len(FTL_ERROR_TYPES) == len(set(FTL_ERROR_TYPES)) == 14
    assert set(FTL_ERROR_TYPES) <= set(REGISTRY)


@pytest.mark.parametrize("error_type", FTL_ERROR_TYPES)
def test_every_ftl_error_type_has_a_producing_test(error_type: str) -> None:
    producer = PRODUCED_BY.get(error_type)
    assert producer is not None, f"{error_type}: no entry in ftl.surfaces.errors_doc.PRODUCED_BY"
    assert producer.check.strip(), f"{error_type}: say which check produces it"
    node, source = _function(producer.test)
    assert node.name.startswith("test_")
    assert not _skipped(node), f"{producer.test} is skipped: it cannot show {error_type}"
    assert f'"{error_type}"' in source or f"'{error_type}'" in source, (
        f"{producer.test} never names {error_type!r}: it does not show that kind")


def test_produced_by_lists_only_ftl_types_and_the_doc_shows_each() -> None:
    assert set(PRODUCED_BY) == set(FTL_ERROR_TYPES)
    text = render()
    section = text.split("## Produced by", 1)[1].split("\n## ", 1)[0]
    for error_type in FTL_ERROR_TYPES:
        line = next(row for row in section.splitlines() if row.startswith(f"| `{error_type}` |"))
        assert PRODUCED_BY[error_type].test in line


def test_the_checker_catches_a_skipped_or_missing_test() -> None:
    skipped, plain = ast.parse('@pytest.mark.skip(reason="x")\ndef test_a(): pass\n'
                               '@pytest.mark.parametrize("a", [1])\ndef test_b(a): pass\n').body
    assert _skipped(skipped) and not _skipped(plain)
    with pytest.raises(AssertionError):
        _function("tests/test_error_producers.py::test_that_does_not_exist")
