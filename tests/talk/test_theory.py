"""Theory against measurement: the panel's figures on known inputs, computed by engine/metrics.py."""

from __future__ import annotations

import pytest

from specchat.engine.costs import CostModel, expected_tokens_per_round, predicted_speedup
from specchat.engine.events import RoundEvent, SummaryEvent
from specchat.ui.state.live import LiveStats
from specchat.ui.talk.theory_tracker import ADVISOR_GAMMAS, COST_GAMMAS, TheoryTracker, theory_lines

PLAIN_MS = 10.0
DRAFT_MS_PER_TOKEN = 2.0
VERIFY_4_MS = 12.0


def plain_round(n: int) -> RoundEvent:
    return RoundEvent(n, 0, 0, 0, 0.0, PLAIN_MS, "none")


def drafted_round(n: int, accepted: int, gamma: int = 4) -> RoundEvent:
    return RoundEvent(n, gamma, gamma, accepted, DRAFT_MS_PER_TOKEN * gamma, VERIFY_4_MS, "model")


def summary(tokens: int, tokens_per_s: float) -> SummaryEvent:
    return SummaryEvent(tokens, 4, 8, 5, 0.6, 2.0, tokens_per_s, (), "max_tokens", 5.0, 1.0, 7)


def measured_live() -> LiveStats:
    """Two plain steps and two drafted rounds: 4 of 4 accepted, then 1 of 4 (2 positions tested)."""
    live = LiveStats()
    live.extend([plain_round(1), plain_round(2), drafted_round(3, 4), drafted_round(4, 1)])
    return live


def test_formulas_on_known_inputs_by_hand() -> None:
    tracker = TheoryTracker(LiveStats())
    tracker.live.extend([plain_round(1), plain_round(2), drafted_round(3, 4), drafted_round(4, 1)])
    assert tracker.poll()
    view = tracker.view(gamma=4, drafter_setting="model")
    # α per tested position: (4 + 1) accepted over (4 + 2) tested.
    assert view.alpha == pytest.approx(5 / 6) and view.alpha_positions == 6
    # E[T] = (1 − (5/6)^5) / (1 − 5/6) = 3.58873…
    assert view.expected_tokens == pytest.approx(3.588734567901234)
    assert view.c == pytest.approx(DRAFT_MS_PER_TOKEN / PLAIN_MS) == pytest.approx(0.2)
    assert view.v == pytest.approx(VERIFY_4_MS / PLAIN_MS) and view.v_measured
    # predicted = E[T] / (γ·c + v(γ)) = 3.58873 / (0.8 + 1.2)
    assert view.predicted == pytest.approx(3.588734567901234 / 2.0)


def test_every_figure_comes_from_engine_metrics() -> None:
    tracker = TheoryTracker(measured_live())
    tracker.poll()
    for gamma in (1, 3, 4, 9):
        view = tracker.view(gamma, "model")
        assert view.alpha is not None and view.c is not None and view.v is not None
        assert view.expected_tokens == expected_tokens_per_round(view.alpha, gamma)
        assert view.predicted == predicted_speedup(view.alpha, gamma, view.c, view.v)
        model = CostModel(PLAIN_MS, DRAFT_MS_PER_TOKEN, {4: VERIFY_4_MS})
        assert view.curve == model.curve(view.alpha, ADVISOR_GAMMAS)
        assert view.best_gamma == model.best_gamma(view.alpha, list(ADVISOR_GAMMAS))
        assert view.curve[view.best_gamma] == max(view.curve.values())
    # Unmeasured widths lie on the engine's one interpolation (a line through V(0) and V(4)).
    assert tracker.view(2, "model").v == pytest.approx(1.1) and not tracker.view(2, "model").v_measured


def test_advisor_moves_with_alpha() -> None:
    live = LiveStats()
    tracker = TheoryTracker(live)
    live.extend([plain_round(1), drafted_round(2, 4), drafted_round(3, 4)])
    tracker.poll()
    high = tracker.view(4, "model")
    live.extend([drafted_round(n, 0) for n in range(4, 40)])  # the draft stops guessing right
    tracker.poll()
    low = tracker.view(4, "model")
    assert low.alpha is not None and high.alpha is not None and low.alpha < high.alpha
    assert low.best_gamma is not None and high.best_gamma is not None
    assert low.best_gamma < high.best_gamma
    assert low.curve[4] < high.curve[4]


def test_measured_speedup_against_a_plain_rate_from_this_session() -> None:
    live = measured_live()
    tracker = TheoryTracker(live)
    tracker.poll()
    view = tracker.view(4, "model")
    assert view.measured_speedup is None and tracker.needs_probe
    live.start_reply()
    live.extend([drafted_round(5, 3), summary(20, 30.0)])
    tracker.poll()
    assert tracker.speculative_rate == 30.0 and tracker.needs_probe
    tracker.observe_probe([plain_round(1), plain_round(2), summary(32, 20.0)])
    view = tracker.view(4, "model")
    assert view.plain_rate == 20.0 and view.measured_speedup == pytest.approx(1.5)
    assert view.agreement == pytest.approx(1.5 / view.predicted)  # type: ignore[operator]
    assert view.plain_source == "plain probe, 32 tokens"


def test_a_reopened_conversation_is_not_this_session() -> None:
    live = LiveStats()
    tracker = TheoryTracker(live)
    live.reset()  # what ui.live.load does before replaying saved turns
    live.extend([plain_round(1), drafted_round(2, 4)])
    live.conversation = type(live.conversation)()  # another conversation object, already full
    live.conversation.extend([plain_round(1), drafted_round(2, 4)])
    tracker.poll()
    assert tracker.costs.plain_ms is None and tracker.view(4, "model").alpha is None


def test_hybrid_shows_the_part_that_drafted_last_and_none_predicts_nothing() -> None:
    live = measured_live()
    tracker = TheoryTracker(live)
    tracker.poll()
    assert tracker.view(4, "hybrid").drafter == "model"
    assert tracker.view(4, "none").drafter is None
    assert theory_lines(tracker.view(4, "none"))[0].startswith("The drafter is none")


def test_lines_show_each_formula_with_its_numbers() -> None:
    tracker = TheoryTracker(measured_live())
    tracker.poll()
    tracker.observe_probe([plain_round(1), summary(32, 20.0)])
    tracker.speculative_rate = 36.0
    text = "\n".join(theory_lines(tracker.view(4, "model"), "Ctrl+G"))
    assert "E[T] = (1 − α^(γ+1)) / (1 − α) = (1 − 0.833^5) / (1 − 0.833) = 3.59" in text
    assert "c = d / V(0) = 2.00 ms / 10.00 ms = 0.200" in text
    assert "v(γ) = V(γ) / V(0) = 12.00 ms / 10.00 ms = 1.200  (measured)" in text
    assert "predicted = E[T] / (γ·c + v(γ)) = 3.59 / (4 × 0.200 + 1.200) = 1.79×" in text
    assert "measured = 36.0 tok/s / 20.0 tok/s = 1.80×" in text
    assert "measured / predicted = 1.00" in text
    best = tracker.view(4, "model").best_gamma
    assert f"best γ {best}" in text and ("Ctrl+G applies it" in text) == (best != 4)


def test_nothing_measured_yet_says_what_is_missing() -> None:
    text = "\n".join(theory_lines(TheoryTracker(LiveStats()).view(4, "model")))
    assert "no model drafts verified yet" in text and "needs a plain-decoding rate" in text


def test_the_cost_plot_puts_this_machines_v_beside_the_premise_and_the_break_even() -> None:
    """v(γ) measured here against the seed's v = 1, and E[T] − γ·c: what a pass may cost to pay."""
    tracker = TheoryTracker(measured_live())
    tracker.poll()
    view = tracker.view(4, "model")
    assert view.alpha is not None and view.c is not None
    assert set(view.v_curve) == set(COST_GAMMAS)
    assert view.v_curve[4] == pytest.approx(VERIFY_4_MS / PLAIN_MS)  # measured
    assert view.v_curve[2] == pytest.approx(1.1)  # the one line through V(0) and V(4)
    for gamma in COST_GAMMAS:
        assert view.break_even[gamma] == pytest.approx(
            expected_tokens_per_round(view.alpha, gamma) - gamma * view.c
        )
        # Below the break-even line, drafting γ is predicted to beat plain decoding.
        assert (view.v_curve[gamma] < view.break_even[gamma]) == (view.curve[gamma] > 1.0)
    # v(4) = 1.2: the premise (v ≈ 1, within 0.1) fails at the only width measured.
    assert view.premise_holds_to == 0
    text = "\n".join(theory_lines(view))
    assert "gray the premise v ≈ 1 (fails at γ 1: v(4) = 1.20)" in text
    assert "γ pays where orange is below it" in text


def test_where_no_gamma_pays_the_advisor_says_why() -> None:
    live = LiveStats()
    tracker = TheoryTracker(live)
    # A slow verify pass (1.9 steps) and a draft mostly wrong: nothing can pay.
    live.extend([plain_round(1), *(RoundEvent(n, 2, 2, 0, 4.0, 19.0, "model") for n in range(2, 30))])
    tracker.poll()
    view = tracker.view(2, "model")
    assert view.pays is False and view.best_gamma is not None
    text = "\n".join(theory_lines(view, "Ctrl+K"))
    best = view.best_gamma
    cost = best * view.c + view.v_curve[best]  # type: ignore[operator]
    assert f"γ advisor: no γ pays here: at best γ {best}, {best}·c + v = {cost:.2f} steps" in text
    assert "Ctrl+K applies" not in text


def test_the_schedules_own_reason_reaches_the_panel_shown_not_obeyed() -> None:
    live = LiveStats()
    tracker = TheoryTracker(live)
    live.extend([RoundEvent(1, 0, 0, 0, 0.0, PLAIN_MS, "model", note="plain: drafting cannot pay\x1b[2J")])
    tracker.poll()
    assert tracker.view(4, "model").schedule_note == "plain: drafting cannot pay^[[2J"
