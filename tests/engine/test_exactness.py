"""The product's spine: speculative decoding reproduces the target alone.

Greedy: token for token. Sampling: the distribution of the first two tokens matches the exact
target distribution, computed by enumeration on a 7-token vocabulary, under a chi-square test.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
import torch

from specchat.engine import sampling as sampling_module
from specchat.engine.backend import Controls
from specchat.engine.events import Event, RoundEvent, TokenEvent
from specchat.engine.gamma import FixedGamma
from specchat.engine.sampling import SamplingParams, shape_probs
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import make_model, make_tiny_pair, make_tokenizer, perturbed_copy

if TYPE_CHECKING:
    from specchat.engine.kv import EngineModel


def token_ids(events: object) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("drafter", ["model", "hybrid", "ngram"])
@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_greedy_speculative_equals_plain(seed: int, drafter: str, gamma: int) -> None:
    pair = make_tiny_pair(seed=seed, draft_noise=0.5, logit_scale=2.5)
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat sat on"}])
    controls = Controls(gamma=gamma, drafter=drafter, max_new_tokens=48)
    plain = token_ids(engine.stream_plain(prompt, controls))
    speculative = list(engine.stream_ids(prompt, controls))
    assert token_ids(speculative) == plain
    summary = speculative[-1]
    assert summary.drafted > 0  # type: ignore[union-attr]


def test_greedy_equality_with_heuristic_schedule(engine: ChatEngine) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": "hello, how are you today?"}])
    controls = Controls(gamma=2, schedule="heuristic", max_new_tokens=64)
    assert token_ids(engine.stream_ids(prompt, controls)) == token_ids(engine.stream_plain(prompt, controls))


# --- distribution exactness ----------------------------------------------------------------

VOCAB_CHARS = "abcd"  # with <unk>, <s>, </s>: 7 tokens, 49 two-token outcomes
SAMPLES = 2500  # enough that a wrong residual scores p ≈ 1e-6 (see the power tests below)
# Significance level of each chi-square test. Seeds are fixed, so the test is deterministic;
# the level says how unlikely a failure of a correct sampler would be for a random seed.
ALPHA_LEVEL = 1e-3


def exact_two_token_distribution(
    target: EngineModel, prompt: list[int], params: SamplingParams
) -> torch.Tensor:
    with torch.inference_mode():
        first = shape_probs(target(torch.tensor([prompt])).logits[0, -1:], params)[0]
        vocab = first.shape[0]
        extended = torch.tensor([[*prompt, t] for t in range(vocab)])
        second = shape_probs(target(extended).logits[:, -1], params)
    return first[:, None] * second


def chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Upper tail of the chi-square statistic, pooling cells whose expected count is < 5."""
    n = counts.sum().item()
    expected = expected_probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    statistic = float(((obs - exp) ** 2 / exp).sum())
    dof = int(keep.sum().item()) - 1
    return _chi2_sf(statistic, dof)


def _chi2_sf(x: float, k: int) -> float:
    """Survival function of chi-square with k degrees of freedom (regularised gamma, series)."""
    a, z = k / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    term = total = 1.0 / a
    for n in range(1, 2000):
        term *= z / (a + n)
        total += term
        if term < total * 1e-15:
            break
    lower = math.exp(-z + a * math.log(z) - math.lgamma(a)) * total
    return max(0.0, 1.0 - lower)


def sample_two_tokens(engine: ChatEngine, prompt: list[int], controls: Controls) -> torch.Tensor:
    counts = torch.zeros(engine.vocab_width * engine.vocab_width, dtype=torch.float64)
    for seed in range(SAMPLES):
        controls.seed = seed
        first, second = first_two_tokens(engine.stream_ids(prompt, controls))
        counts[first * engine.vocab_width + second] += 1
    return counts


def first_two_tokens(events: Iterator[Event]) -> tuple[int, int]:
    """The first round may carry several tokens; stop reading after two."""
    found = [e.token_id for e in itertools.islice((e for e in events if isinstance(e, TokenEvent)), 2)]
    return found[0], found[1]


@pytest.fixture(scope="module")
def small_vocab_engine() -> ChatEngine:
    tokenizer = make_tokenizer(VOCAB_CHARS)
    target = make_model(len(tokenizer), seed=3, hidden_size=32, logit_scale=1.5)
    draft = perturbed_copy(target, noise=1.5, seed=4)
    engine = ChatEngine(target, tokenizer, draft)
    engine.stop_ids = frozenset()  # every token counts as an outcome, </s> included
    engine._decoder.stop_ids = frozenset()
    return engine


PROMPT = [1, 3, 4, 3, 4, 3]  # <s> a b a b a: gives the n-gram drafter something to copy

CASES = {
    "model-t1": Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8),
    "model-t0.7-top-p": Controls(drafter="model", gamma=2, temperature=0.7, top_p=0.8, max_new_tokens=8),
    "model-top-k": Controls(drafter="model", gamma=1, temperature=1.3, top_k=4, max_new_tokens=8),
    "ngram-t1": Controls(drafter="ngram", gamma=2, temperature=1.0, max_new_tokens=8),
    # The lookup proposes while the text repeats, the model once it stops: both in one reply.
    "hybrid-t1": Controls(drafter="hybrid", gamma=2, temperature=1.0, max_new_tokens=8),
}


UNSURE_BELOW = 0.18
"""A confidence threshold that cuts about a fifth of the tiny draft's first rounds at T = 1 after
two of three tokens (its top probabilities there lie around 0.15–0.2)."""


@pytest.fixture
def whole_chains(small_vocab_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch) -> ChatEngine:
    """The engine with a draft that never stops short of γ: every chain is as long as asked."""
    monkeypatch.setattr(small_vocab_engine.drafter("model"), "stop_below", 0.0)
    return small_vocab_engine


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sampled_distribution_matches_target(whole_chains: ChatEngine, case: str) -> None:
    controls = CASES[case]
    exact = exact_two_token_distribution(whole_chains.target.model, PROMPT, controls.sampling()).flatten()
    counts = sample_two_tokens(whole_chains, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) > ALPHA_LEVEL


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_sampled_distribution_matches_target_when_the_draft_stops_where_unsure(
    small_vocab_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch, drafter: str
) -> None:
    """How many tokens the draft proposes may depend on what it drafted (it stops after a token
    it was unsure of): the reply is still distributed exactly as the target's."""
    monkeypatch.setattr(small_vocab_engine.drafter("model"), "stop_below", UNSURE_BELOW)
    controls = Controls(drafter=drafter, gamma=3, temperature=1.0, max_new_tokens=8)
    model_rounds = [
        e
        for s in range(50)
        for e in small_vocab_engine.stream_ids(PROMPT, replace(controls, seed=s))
        if isinstance(e, RoundEvent) and e.drafter == "model"
    ]
    cut = Counter(e.drafted < e.gamma for e in model_rounds)
    assert cut[True] > 0 and cut[False] > 0, cut  # rounds cut short and whole chains both exercised
    exact = exact_two_token_distribution(
        small_vocab_engine.target.model, PROMPT, controls.sampling()
    ).flatten()
    counts = sample_two_tokens(small_vocab_engine, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) > ALPHA_LEVEL


@pytest.mark.slow
def test_distribution_test_catches_a_wrong_residual(
    whole_chains: ChatEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statistical test has the power to see the classic bug: resampling from p_target."""
    monkeypatch.setattr(sampling_module, "residual_distribution", lambda p_target, p_draft: p_target)
    controls = Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8)
    exact = exact_two_token_distribution(whole_chains.target.model, PROMPT, controls.sampling()).flatten()
    counts = sample_two_tokens(whole_chains, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) < ALPHA_LEVEL


@pytest.mark.slow
def test_distribution_test_catches_unshaped_draft_probabilities(
    whole_chains: ChatEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """p_draft must be the distribution the draft sampled from: report the T=1 softmax while
    sampling at T=0.5, and the test must fail."""
    from specchat.engine import drafters

    real_shape = drafters.shape_probs

    def sample_shaped_report_unshaped(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        return real_shape(logits, SamplingParams(temperature=1.0))

    controls = Controls(drafter="model", gamma=3, temperature=0.5, max_new_tokens=8)
    original_pick = drafters.pick_tokens

    def pick_from_shaped(
        probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> torch.Tensor:
        sharpened = probs ** (1 / params.temperature)
        return original_pick(sharpened / sharpened.sum(-1, keepdim=True), params, generator)

    monkeypatch.setattr(drafters, "shape_probs", sample_shaped_report_unshaped)
    monkeypatch.setattr(drafters, "pick_tokens", pick_from_shaped)
    exact = exact_two_token_distribution(whole_chains.target.model, PROMPT, controls.sampling()).flatten()
    counts = sample_two_tokens(whole_chains, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) < ALPHA_LEVEL


@pytest.mark.slow
def test_plain_decoding_samples_the_same_distribution(small_vocab_engine: ChatEngine) -> None:
    controls = Controls(drafter="none", temperature=1.0, max_new_tokens=2)
    exact = exact_two_token_distribution(
        small_vocab_engine.target.model, PROMPT, controls.sampling()
    ).flatten()
    counts = sample_two_tokens(small_vocab_engine, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) > ALPHA_LEVEL


@pytest.mark.slow
def test_two_token_outcomes_cover_both_closing_kinds(small_vocab_engine: ChatEngine) -> None:
    """Sanity: the sampled cases exercise corrections and bonus tokens, not just one path."""
    kinds: Counter[str] = Counter()
    # (max_new_tokens=8 lets the first round draft all 3 tokens; the tests read the first two.)
    controls = Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8)
    for seed in range(200):
        controls.seed = seed
        kinds.update(
            e.kind for e in small_vocab_engine.stream_ids(PROMPT, controls) if isinstance(e, TokenEvent)
        )
    assert kinds["correction"] > 0 and kinds["accepted"] > 0


class WindowedFixed(FixedGamma):
    """γ every round, the draft reading only the last few tokens whenever it is further behind."""

    window = 6


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_greedy_equals_plain_whatever_window_the_draft_reads(drafter: str) -> None:
    pair = make_tiny_pair(seed=1, draft_noise=0.5, logit_scale=2.5)
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    engine._schedules["fixed"] = WindowedFixed(3)
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. " * 6 + "the cat"}])
    controls = Controls(gamma=3, drafter=drafter, max_new_tokens=48)
    plain = token_ids(engine.stream_plain(prompt, controls))
    speculative = list(engine.stream_ids(prompt, controls))
    assert token_ids(speculative) == plain
    rounds = [e for e in speculative if isinstance(e, RoundEvent) and e.drafter == "model"]
    assert rounds and rounds[0].caught_up == 6 and len(prompt) > 20
    assert engine.draft is not None and len(engine.draft.cached_ids) < len(prompt)
