"""The exactness self-test: its statistics on known inputs, and the sampler on tiny models."""

from __future__ import annotations

from collections import Counter

import pytest

from specchat.engine import sampling as sampling_module
from specchat.engine.backend import Controls
from specchat.engine.selftest import (
    END,
    ExactnessSampler,
    Outcome,
    chi_square_homogeneity,
    chi_square_p_value,
    expected_noise,
    greedy_equality,
    selftest_messages,
    total_variation,
    tv_noise,
)
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import TinyPair, make_tiny_pair


def counts(**values: int) -> Counter[tuple[int, ...]]:
    return Counter({(ord(k),): v for k, v in values.items()})


def test_total_variation_on_known_histograms() -> None:
    assert total_variation(counts(a=5, b=5), counts(a=50, b=50)) == 0.0
    assert total_variation(counts(a=10), counts(b=3)) == 1.0
    # ½(|0.5 − 0.25| + |0.5 − 0.25| + |0 − 0.5|) = 0.5
    assert total_variation(counts(a=2, b=2), counts(a=1, b=1, c=2)) == pytest.approx(0.5)


def test_chi_square_p_value_matches_known_quantiles() -> None:
    assert chi_square_p_value(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert chi_square_p_value(18.307038053275146, 10) == pytest.approx(0.05, abs=1e-9)
    assert chi_square_p_value(0.0, 3) == pytest.approx(1.0)
    assert chi_square_p_value(5.0, 0) is None


def test_chi_square_homogeneity_by_hand_and_pooling() -> None:
    # 2×2 table [[30, 10], [20, 20]]: expected [[25, 15], [25, 15]] → 1 + 5/3 + 1 + 5/3.
    statistic, dof = chi_square_homogeneity(counts(a=30, b=10), counts(a=20, b=20))
    assert statistic == pytest.approx(2 + 10 / 3) and dof == 1
    # Rare outcomes (expected < 5) are pooled into one cell.
    statistic, dof = chi_square_homogeneity(counts(a=40, b=40, c=1, d=2), counts(a=40, b=40, e=1, f=1))
    assert dof == 2  # a, b, and the pooled rare cell


def test_noise_band_matches_the_normal_approximation_and_contains_same_distribution_pairs() -> None:
    import random

    rng = random.Random(1)
    weights = [rng.random() for _ in range(12)]
    inside = 0
    for trial in range(40):
        a: Counter[Outcome] = Counter((x,) for x in rng.choices(range(12), weights, k=800))
        b: Counter[Outcome] = Counter((x,) for x in rng.choices(range(12), weights, k=800))
        mean, band = tv_noise(a, b, seed=trial)
        assert mean == pytest.approx(expected_noise(a, b), rel=0.15)
        inside += total_variation(a, b) <= band
    assert inside >= 34  # about 95% of same-distribution pairs fall inside the band


def test_noise_band_stays_honest_when_most_outcomes_are_seen_once() -> None:
    a: Counter[Outcome] = Counter((i,) for i in range(0, 1000))
    b: Counter[Outcome] = Counter((i,) for i in range(1000, 2000))  # two samples of a huge flat distribution
    mean, band = tv_noise(a, b)
    assert total_variation(a, b) == pytest.approx(1.0)
    assert band == pytest.approx(1.0) and mean == pytest.approx(1.0)


def test_a_different_distribution_falls_outside_the_band() -> None:
    a, b = counts(a=600, b=400), counts(a=500, b=500)
    _, band = tv_noise(a, b)
    statistic, dof = chi_square_homogeneity(a, b)
    assert total_variation(a, b) > band
    p_value = chi_square_p_value(statistic, dof)
    assert p_value is not None and p_value < 0.01


@pytest.fixture(scope="module")
def peaked_pair() -> TinyPair:
    return make_tiny_pair(0)  # sharper distributions: a few dozen likely first tokens


@pytest.fixture
def peaked_engine(peaked_pair: TinyPair) -> ChatEngine:
    return ChatEngine(peaked_pair.target, peaked_pair.tokenizer, peaked_pair.draft)


@pytest.mark.slow
def test_sampler_finds_speculative_and_target_samples_alike(peaked_engine: ChatEngine) -> None:
    controls = Controls(gamma=3, drafter="model", temperature=1.0)
    sampler = ExactnessSampler(peaked_engine, selftest_messages("hello"), controls, tokens=1)
    reports: list[object] = []
    report = sampler.run(400, on_report=reports.append, report_every=0.0)
    assert report.samples == 400 and sum(report.speculative.values()) == 400
    assert reports and reports[-1] == report
    assert report.consistent, (report.tv, report.noise_band, report.p_value)
    assert all(len(label) >= 1 for label in report.labels.values())
    rows = report.rows(5)
    assert rows[0].speculative + rows[0].target >= rows[-1].speculative + rows[-1].target
    assert report.to_json()["samples_per_lane"] == 400


def test_sampler_uses_the_current_gamma_and_is_repeatable(peaked_engine: ChatEngine) -> None:
    controls = Controls(gamma=5, drafter="model", temperature=1.0, max_new_tokens=2)
    first = ExactnessSampler(peaked_engine, selftest_messages("hi"), controls)
    assert first.speculative_controls.max_new_tokens == 6  # room for γ drafts in the first round
    assert first.speculative_controls.schedule == "fixed"
    first.run(30)
    second = ExactnessSampler(peaked_engine, selftest_messages("hi"), controls)
    second.run(30)
    assert first.speculative == second.speculative and first.target == second.target


@pytest.mark.slow
def test_sampler_detects_a_wrong_residual(peaked_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The classic bug (resampling a rejection from p_target) shows on screen as a failed test."""
    monkeypatch.setattr(sampling_module, "residual_distribution", lambda p_target, p_draft: p_target)
    controls = Controls(gamma=3, drafter="model", temperature=1.0)
    sampler = ExactnessSampler(peaked_engine, selftest_messages("hello"), controls, tokens=1)
    report = sampler.run(1500)
    assert not report.consistent
    assert report.p_value is not None and report.p_value < 0.01


def test_a_reply_that_ends_early_is_its_own_outcome(peaked_engine: ChatEngine) -> None:
    controls = Controls(gamma=2, drafter="model", temperature=1.0)
    sampler = ExactnessSampler(peaked_engine, selftest_messages("hello"), controls, tokens=2)
    eos = next(iter(peaked_engine.stop_ids))
    assert sampler._outcome([]) == () and sampler.labels[()] == END
    assert eos not in sampler.labels


def test_sampler_needs_a_temperature(peaked_engine: ChatEngine) -> None:
    with pytest.raises(ValueError, match="temperature"):
        ExactnessSampler(peaked_engine, selftest_messages(), Controls(temperature=0.0))


def test_greedy_equality_on_a_few_prompts(peaked_engine: ChatEngine) -> None:
    checks = list(greedy_equality(peaked_engine, Controls(gamma=3, drafter="model", max_new_tokens=24)))
    assert len(checks) == 3
    assert all(c.identical and c.first_difference is None for c in checks)
    assert all(c.to_json()["identical"] is True for c in checks)


def test_permutation_p_value_on_known_draws() -> None:
    import numpy as np

    from specchat.engine.selftest import permutation_p_value

    null = np.array([0.1, 0.2, 0.3, 0.4])
    assert permutation_p_value(0.25, null) == pytest.approx(3 / 5)  # 0.3, 0.4 and the observed deal
    assert permutation_p_value(0.9, null) == pytest.approx(1 / 5)
    assert permutation_p_value(0.1, null) == pytest.approx(1.0)
    assert permutation_p_value(0.5, np.zeros(0)) is None


def test_the_verdict_reads_p_values_not_the_band() -> None:
    """TV just above the 95% band happens to one look in twenty: not evidence on its own."""
    from specchat.engine.selftest import build_report

    # A difference of 0.05 in proportion at 1000 each: about 2.2 standard errors.
    report = build_report(counts(a=525, b=475), counts(a=475, b=525), {}, 1.0)
    assert report.tv == pytest.approx(0.05) and not report.within_noise
    assert report.tv_p_value is not None and 0.01 <= report.tv_p_value < 0.05
    assert report.p_value is not None and 0.01 <= report.p_value < 0.05
    assert report.consistent
    far = build_report(counts(a=700, b=300), counts(a=500, b=500), {}, 1.0)
    assert not far.consistent and far.tv_p_value is not None and far.tv_p_value < 0.01


def test_a_report_round_trips_through_its_json(peaked_engine: ChatEngine) -> None:
    import json

    from specchat.engine.selftest import report_from_json

    controls = Controls(gamma=3, drafter="model", temperature=1.0)
    report = ExactnessSampler(peaked_engine, selftest_messages("hello"), controls, tokens=1).run(80)
    back = report_from_json(json.loads(json.dumps(report.to_json())))
    assert back.speculative == report.speculative and back.target == report.target
    assert back.tv == report.tv and back.p_value == report.p_value
    assert back.noise_band == report.noise_band and back.tv_p_value == report.tv_p_value
    assert back.labels == report.labels and back.settings == report.settings
    with pytest.raises(ValueError):
        report_from_json({"type": "race"})


def test_greedy_equality_stopped_midway_reports_no_difference(
    peaked_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping the check while a prompt decodes must not show that prompt as "DIFFERENT"."""
    import threading

    cancel = threading.Event()
    stream_ids = peaked_engine.stream_ids

    def cancelled_first(*args: object, **kwargs: object) -> object:
        cancel.set()  # the user stops the check just as the speculative decode starts
        return stream_ids(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(peaked_engine, "stream_ids", cancelled_first)
    checks = list(
        greedy_equality(peaked_engine, Controls(gamma=3, drafter="model", max_new_tokens=24), cancel=cancel)
    )
    assert checks == []
