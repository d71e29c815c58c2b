"""Tests for ftl.memory.scoring's pure rules that the store's speed depends on."""

from __future__ import annotations

from difflib import SequenceMatcher

from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.memory import scoring

_TEXT = st.text(alphabet="abcde fgh'ij:", max_size=40)


@settings(max_examples=300, deadline=None)
@given(a=_TEXT, b=_TEXT)
def test_near_duplicate_prefilters_never_change_the_answer(a: str, b: str) -> None:
    # FTL's rule: difflib ratio of the lower-cased texts > 0.85; the quick bounds only skip work.
    plain = bool(a) and bool(b) and SequenceMatcher(None, a.lower(), b.lower()).ratio() > scoring.DUPLICATE_THRESHOLD
    assert scoring.is_near_duplicate(a, b) == plain


def test_near_duplicate_examples() -> None:
    assert scoring.is_near_duplicate("ImportError: cannot import name 'x'", "importerror: cannot import name 'y'")
    assert not scoring.is_near_duplicate("KeyError: 'user_id'", "TimeoutError after 30 seconds")
    assert not scoring.is_near_duplicate("", "anything")
