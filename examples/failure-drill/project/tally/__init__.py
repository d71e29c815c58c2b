"""tally: count the words of a text and rank them (the failure drill's tiny target project)."""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["count_words", "most_common"]
__version__ = "1.0.0"

_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def count_words(text: str) -> dict[str, int]:
    """Count the words of ``text``, case-folded; a word is letters/digits with an optional
    apostrophe suffix ("don't"). Returns ``{word: count}``."""
    return dict(Counter(_WORD_RE.findall(text.casefold())))


def most_common(counts: dict[str, int], n: int) -> list[tuple[str, int]]:
    """The ``n`` most frequent ``(word, count)`` pairs, ties broken alphabetically so the
    result is the same on every run. Raises ValueError when ``n`` is negative."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
