"""The one cost model: c and v(γ) from rounds' own timings, and the seed formula on top of them."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from specchat.engine.costs import (
    CostEstimator,
    CostModel,
    expected_tokens_per_round,
    interpolate_verify_ms,
    monotone_fit,
    predicted_speedup,
)
from specchat.engine.events import UNKNOWN, RoundEvent
from specchat.engine.gamma import AdaptiveGamma
from specchat.engine.metrics import acceptance_per_position


def test_expected_tokens_per_round_is_the_seed_formula() -> None:
    # The seed's worked example and its active-recall answers.
    assert expected_tokens_per_round(0.7, 4) == pytest.approx(2.7731, abs=1e-4)
    assert expected_tokens_per_round(0.85, 3) == pytest.approx(3.187, abs=1e-3)
    assert expected_tokens_per_round(0.4, 8) == pytest.approx(1.6662, abs=1e-4)
    assert predicted_speedup(0.7, 4, 0.08) == pytest.approx(2.10, abs=0.005)
    assert predicted_speedup(0.4, 8, 0.08) == pytest.approx(1.016, abs=0.001)


def test_a_measured_width_is_its_own_value_and_others_lie_on_the_line() -> None:
    measured = {0: 100.0, 1: 110.0, 3: 130.0}
    assert interpolate_verify_ms(measured, 3) == 130.0
    assert interpolate_verify_ms(measured, 2) == pytest.approx(120.0)
    assert interpolate_verify_ms(measured, 16) == pytest.approx(260.0)


def test_a_falling_line_is_held_flat_and_never_below_the_plain_step() -> None:
    assert interpolate_verify_ms({0: 100.0, 2: 90.0}, 8) == pytest.approx(100.0)
    assert interpolate_verify_ms({1: 100.0, 2: 90.0}, 8) == pytest.approx(95.0)  # no plain step: flat mean
    assert interpolate_verify_ms({0: 100.0}, 5) == 100.0
    assert interpolate_verify_ms({3: 120.0}, 6) == 120.0  # one width: flat
    assert interpolate_verify_ms({}, 2) is None


def test_cost_model_gives_c_v_and_the_predicted_speedup() -> None:
    model = CostModel(plain_ms=50.0, draft_ms=10.0, verify_ms={2: 60.0, 4: 70.0})
    assert model.c == pytest.approx(0.2)
    assert model.v(0) == 1.0
    assert model.v(2) == pytest.approx(1.2)
    assert model.is_measured(4) and not model.is_measured(3)
    alpha = 0.75
    for gamma in (1, 2, 3, 4, 8, 16):
        expected = expected_tokens_per_round(alpha, gamma) / (gamma * 0.2 + model.v(gamma))
        assert model.speedup(alpha, gamma) == pytest.approx(expected)
    curve = model.curve(alpha, range(1, 17))
    best = model.best_gamma(alpha, list(range(1, 17)))
    assert curve[best] == max(curve.values())


def timed_round(n: int, drafted: int, accepted: int, draft_ms: float, verify_ms: float) -> RoundEvent:
    return RoundEvent(n, drafted, drafted, accepted, draft_ms, verify_ms, "model" if drafted else "none")


def test_estimator_measures_from_rounds_and_ignores_untimed_ones() -> None:
    estimator = CostEstimator()
    assert estimator.model("model") is None
    estimator.observe(timed_round(0, 0, 0, 0.0, 40.0))
    estimator.observe(timed_round(1, 3, 2, 30.0, 52.0))
    estimator.observe(timed_round(2, 3, 3, 30.0, 56.0))
    estimator.observe(RoundEvent(3, 3, 3, 1, UNKNOWN, UNKNOWN, "model"))  # a server's round
    model = estimator.model("model")
    assert model is not None
    assert model.plain_ms == 40.0 and model.draft_ms == pytest.approx(10.0)
    assert model.c == pytest.approx(0.25)
    assert model.verify_ms == {3: 54.0}
    assert estimator.model("ngram") is None


def test_catch_up_after_plain_rounds_is_not_the_price_of_drafting() -> None:
    estimator = CostEstimator()
    estimator.observe(timed_round(0, 2, 2, 10.0, 50.0))
    for n in range(1, 5):
        estimator.observe(timed_round(n, 0, 0, 0.0, 40.0))
    # The draft read the 4 plain rounds' tokens plus its usual one (78 ms each) before drafting.
    estimator.observe(replace(timed_round(5, 2, 2, 400.0, 50.0), caught_up=5))
    assert estimator.draft_ms("model") == pytest.approx(5.0)
    assert estimator.catch_up_ms("model") == pytest.approx(78.0)
    estimator.observe(replace(timed_round(7, 2, 2, 14.0, 50.0), caught_up=2))  # an ordinary round
    assert estimator.draft_ms("model") == pytest.approx(6.0)  # median of 5 and 7
    assert estimator.catch_up_ms("model") == pytest.approx((400.0 - 2 * 6.0) / 5)  # with d as known now


def test_acceptance_per_position_counts_tested_positions_only() -> None:
    rounds = [timed_round(0, 4, 1, 0, 0), timed_round(1, 4, 4, 0, 0), timed_round(2, 0, 0, 0, 0)]
    # tested: 2 (accepted one, rejected the second) + 4; accepted 1 + 4.
    assert acceptance_per_position(rounds) == pytest.approx(5 / 6)
    assert acceptance_per_position([]) is None


def test_adaptive_schedule_reads_the_same_cost_model() -> None:
    schedule = AdaptiveGamma(3)
    schedule.observe(timed_round(0, 0, 0, 0.0, 40.0))
    for n in range(1, 6):
        schedule.observe(timed_round(n, 3, 2, 15.0, 50.0))
    model = schedule.costs.model("model")
    assert model is not None
    estimates = schedule.estimates()
    for gamma, speedup in estimates.speedup.items():
        assert speedup == pytest.approx(model.speedup(schedule.alpha, gamma))
    assert estimates.c == pytest.approx(model.c)
    assert not math.isnan(estimates.verify_ms[5])


def test_monotone_fit_pools_the_widths_that_fall() -> None:
    assert monotone_fit({0: 40.0, 1: 45.0, 2: 50.0}, {}) == {0: 40.0, 1: 45.0, 2: 50.0}
    # A width timed once, slowly, gives way to its well-measured wider neighbour.
    fitted = monotone_fit({0: 40.0, 1: 75.0, 2: 50.0}, {0: 9.0, 1: 1.0, 2: 9.0})
    assert fitted[0] == 40.0 and fitted[1] == fitted[2] == pytest.approx((75.0 + 9 * 50.0) / 10)
    # Pooling cascades: the pooled block still below its predecessor merges again.
    fitted = monotone_fit({1: 60.0, 2: 50.0, 3: 40.0}, {1: 1.0, 2: 1.0, 3: 1.0})
    assert list(fitted.values()) == pytest.approx([50.0, 50.0, 50.0])
    zigzag = monotone_fit({1: 3.0, 2: 1.0, 3: 2.0, 4: 0.5}, {})
    assert all(a <= b for a, b in itertools.pairwise(zigzag.values()))


def test_the_estimator_reads_a_lone_slow_width_through_the_fit_and_asks_to_time_it_again() -> None:
    estimator = CostEstimator()
    estimator.observe(timed_round(0, 0, 0, 0.0, 40.0))
    estimator.observe(timed_round(1, 1, 1, 10.0, 75.0))  # one slow pass (another process woke up)
    assert estimator.verify_measured()[1] == 75.0
    for n in range(2, 11):
        estimator.observe(timed_round(n, 2, 1, 20.0, 50.0))
    # A wider pass far faster than it says the machine was busier then: the slow timing goes.
    assert 1 not in estimator.verify_measured()
    verify_1, verify_2 = estimator.verify_ms(1), estimator.verify_ms(2)
    assert verify_1 is not None and verify_2 is not None
    assert verify_1 <= verify_2  # never above a wider pass
    assert estimator.needs_refresh(1) and not estimator.needs_refresh(2)
    estimator.observe(timed_round(11, 1, 1, 10.0, 45.0))
    assert estimator.verify_measured()[1] == 45.0 and estimator.needs_refresh(1)  # one sample
    for n in range(12, 14):
        estimator.observe(timed_round(n, 1, 1, 10.0, 45.0))
    assert estimator.verify_ms(1) == 45.0 and not estimator.needs_refresh(1)  # three samples
    for n in range(14, 14 + estimator.stale_after + 1):
        estimator.observe(timed_round(n, 2, 1, 20.0, 50.0))
    assert estimator.needs_refresh(1) and not estimator.needs_refresh(2)  # timed too long ago


def test_a_width_timed_again_after_long_drops_its_old_timings() -> None:
    """Cold first passes timed a width slowly; timed again after stale_after rounds, one fresh
    pass stands for it (a median of old samples could never move)."""
    estimator = CostEstimator()
    estimator.observe(timed_round(0, 0, 0, 0.0, 40.0))
    for n in range(1, 5):
        estimator.observe(timed_round(n, 1, 1, 10.0, 90.0))  # cold
    for n in range(5, 5 + estimator.stale_after + 1):
        estimator.observe(timed_round(n, 2, 1, 20.0, 50.0))
    estimator.observe(timed_round(99, 1, 1, 10.0, 44.0))
    assert estimator.verify_measured()[1] == 44.0
    estimator.observe(timed_round(100, 1, 1, 10.0, 46.0))  # not stale: it joins the fresh one
    assert estimator.verify_measured()[1] == 45.0
