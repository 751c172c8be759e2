"""The lookup index answers what a scan of the whole text answers, as the text grows and changes."""

from __future__ import annotations

import random

import pytest

from specchat.engine.drafters import LookupIndex


def scan(ids: list[int], gamma: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The reference: the most recent earlier match of the longest suffix n-gram, by scanning."""
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == suffix:
                return ids[start + n : start + n + gamma]
    return []


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (3, 2), (4, 2), (1, 1)])
@pytest.mark.parametrize("seed", range(4))
def test_a_growing_text_gets_the_scans_answer_at_every_length(
    max_ngram: int, min_ngram: int, seed: int
) -> None:
    rng = random.Random(seed)
    vocab = rng.choice([3, 6, 40])  # small vocabularies repeat n-grams (and overlap them) often
    index = LookupIndex(max_ngram, min_ngram)
    ids: list[int] = []
    for _ in range(300):
        ids = ids + [rng.randrange(vocab) for _ in range(rng.choice([1, 1, 1, 2, 5]))]
        gamma = rng.randint(1, 8)
        assert index.continuation(ids, gamma) == scan(ids, gamma, max_ngram, min_ngram), ids


def test_a_text_that_does_not_extend_the_indexed_one_is_indexed_afresh() -> None:
    rng = random.Random(7)
    index = LookupIndex(3, 2)
    long = [rng.randrange(5) for _ in range(200)]
    for ids in (long, long[-48:], long, long[:120], [*long[:60], 9, 9, 9, 9], [], [1], long):
        assert index.continuation(ids, 6) == scan(ids, 6, 3, 2)


def test_the_overlapping_repeat_of_a_single_token_continues_it() -> None:
    assert LookupIndex(3, 1).continuation([4, 4, 4], 3) == [4]
    assert LookupIndex(3, 2).continuation([1, 2, 3, 1, 2], 3) == [3, 1, 2]
