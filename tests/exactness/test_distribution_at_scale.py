"""Exactness at scale: over 100,000 replies, first two tokens against the target's exact law.

Each case samples replies through ``ChatEngine.stream_ids`` (T > 0 with top-k and top-p; one
case per drafter, 34,000 replies each by default, 102,000 in all; SPECCHAT_SCALE_SAMPLES sets
the count per drafter), counts the (first, second) token pairs and compares them with the law
of the target alone, enumerated exactly on a 7-token vocabulary. It reports the total variation
distance (next to what an exact sampler scores at the same sample size, for scale) and a
chi-square p-value, and fails if p < ALPHA_LEVEL or if any sample falls outside the target's
support. Seeds are fixed: the outcome is deterministic, and ALPHA_LEVEL is how unlikely a
failure of a correct sampler would be for a random choice of seeds.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
import pytest
from scipy.stats import chisquare

from tests.exactness.conftest import RESULTS, ScaleResult
from tests.exactness.sampler import Case, exact_two_token_law, sample_counts

SAMPLES = int(os.environ.get("SPECCHAT_SCALE_SAMPLES", 34_000))
"""Replies per drafter. Each costs a few tiny forward passes (about 4 ms of CPU on average over
the three drafters), so the default keeps the test to a few minutes on two cores."""
ALPHA_LEVEL = 1e-3
T, TOP_K, TOP_P = 0.9, 5, 0.9

CASES = [
    # γ = 1: the first two tokens are an accepted draft and its bonus token, or a correction and
    # whatever the next round makes: the bonus path is in the joint law.
    Case("model", "model", "fixed", 1, T, TOP_K, TOP_P),
    # Lookups of up to 3 tokens, rounds with nothing found (plain target steps) in between.
    Case("ngram", "ngram", "fixed", 3, T, TOP_K, TOP_P),
    # γ = 2: two drafts can both pass inside the first round, or one pass and the next be
    # corrected; lookups while the text repeats, the draft model once it stops.
    Case("hybrid", "hybrid", "fixed", 2, T, TOP_K, TOP_P),
]
CLOSING_KINDS = {"accepted", "correction", "bonus", "target"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    """One process per core, started once (spawned: no forked torch thread pools)."""
    workers = max(1, min(os.cpu_count() or 1, 4))
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as executor:
        yield executor


def sample_in_parallel(
    pool: ProcessPoolExecutor, case: Case, samples: int, chunk: int = 2500
) -> tuple[np.ndarray, Counter[str]]:
    """Seeds 0..samples-1 in chunks over the pool; every sample's seed is fixed, so the counts
    do not depend on the split."""
    chunks = [range(a, min(a + chunk, samples)) for a in range(0, samples, chunk)]
    counts = np.zeros(0, dtype=np.int64)
    kinds: Counter[str] = Counter()
    for part, part_kinds in pool.map(sample_counts, [case] * len(chunks), chunks):
        counts = part if not counts.size else counts + part
        kinds += part_kinds
    return counts, kinds


def perfect_sampler_tv(law: np.ndarray, samples: int, draws: int = 200) -> tuple[float, float]:
    """Median and 99th percentile of the TV distance an exact sampler scores at this sample size."""
    rng = np.random.default_rng(0)
    tvs = [0.5 * np.abs(rng.multinomial(samples, law) / samples - law).sum() for _ in range(draws)]
    return float(np.median(tvs)), float(np.quantile(tvs, 0.99))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_first_two_tokens_follow_the_target_law(pool: ProcessPoolExecutor, case: Case) -> None:
    law = exact_two_token_law(case)
    start = time.perf_counter()
    counts, kinds = sample_in_parallel(pool, case, SAMPLES)
    elapsed = time.perf_counter() - start
    assert counts.sum() == SAMPLES

    support = law > 0
    outside = int(counts[~support].sum())
    assert outside == 0, f"{outside} samples fell outside the target's top-k/top-p support"
    statistic, p_value = chisquare(counts[support], law[support] * SAMPLES)
    tv = 0.5 * float(np.abs(counts / SAMPLES - law).sum())
    tv_median, tv_p99 = perfect_sampler_tv(law, SAMPLES)
    RESULTS.append(
        ScaleResult(case.name, SAMPLES, int(support.sum()), tv, tv_median, tv_p99, float(p_value),
                    dict(kinds), elapsed)
    )  # fmt: skip
    # Accepted drafts and corrections in every case, or the test would prove little.
    assert kinds["accepted"] > 0 and kinds["correction"] > 0
    assert p_value > ALPHA_LEVEL, f"chi-square {statistic:.1f}, p = {p_value:.2e}, TV {tv:.4f}"


def test_the_cases_cover_every_kind_of_token() -> None:
    """Together the cases' first two tokens include every way a token is produced (runs after
    the cases, reading what they recorded)."""
    if len(RESULTS) < len(CASES):
        pytest.skip("the sampling cases did not all run in this session")
    seen = {kind for result in RESULTS for kind, n in result.kinds.items() if n > 0}
    assert seen == CLOSING_KINDS
