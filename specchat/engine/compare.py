"""Where two token sequences part: the one comparison behind every "identical" verdict (the race,
the self-test, the bench's check against plain decoding, the comparison with a peer's text)."""

from __future__ import annotations

from collections.abc import Sequence


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ; where one is a prefix of the other,
    the shorter one's length; None when they are equal."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))
