"""The γ advisor past the widest verify pass timed: a forecast on the cost
line, said to be one on the panel, never a cliff to 0×."""

from __future__ import annotations

import pytest

from specchat.engine.costs import interpolate_verify_ms
from specchat.engine.events import RoundEvent
from specchat.ui.state.live import LiveStats
from specchat.ui.talk.theory_tracker import ADVISOR_GAMMAS, TheoryTracker, TheoryView, theory_lines

PLAIN_MS = 90.0
DRAFT_MS_PER_TOKEN = 3.0


def verify_ms(width: int) -> float:
    """A CPU-like pass: every extra position costs a little more."""
    return PLAIN_MS + 6.0 * width


def rounds_up_to(widest: int) -> list[RoundEvent]:
    """A plain step, then rounds at every width up to ``widest`` (a reply at γ ``widest``
    whose model draft sometimes stopped early), each accepting all but its last draft."""
    events = [RoundEvent(0, 0, 0, 0, 0.0, PLAIN_MS, "none")]
    for n, width in enumerate(range(1, widest + 1), start=1):
        events += [
            RoundEvent(n, widest, width, width - 1, DRAFT_MS_PER_TOKEN * width, verify_ms(width), "model")
        ] * 3
    return events


def view_after(widest: int, gamma: int = 4) -> TheoryView:
    tracker = TheoryTracker(LiveStats())
    tracker.live.extend(rounds_up_to(widest))
    tracker.poll()
    return tracker.view(gamma, "model")


def test_the_curve_past_the_widest_width_is_the_cost_line_s_forecast_not_a_cliff() -> None:
    view = view_after(4)
    assert view.alpha is not None and view.c is not None and view.plain_ms is not None
    measured = {0: view.plain_ms, **{w: verify_ms(w) for w in range(1, 5)}}
    for gamma in ADVISOR_GAMMAS:
        assert view.curve[gamma] > 0.1, f"γ {gamma}: {view.curve[gamma]:.2f}×"
    for gamma in (5, 6, 9, 16):
        # The one interpolation of v(γ) is what every reader uses, past the widest width too.
        line = interpolate_verify_ms(measured, gamma)
        assert line is not None and line > verify_ms(4)
        assert view.curve[gamma] == pytest.approx(
            (1 - view.alpha ** (gamma + 1)) / (1 - view.alpha) / (gamma * view.c + line / view.plain_ms)
        )
    # No cliff at the edge: one width past it costs about what one width did before it.
    assert view.curve[5] >= 0.9 * view.curve[4]


def test_the_panel_says_where_the_curve_stops_being_measured() -> None:
    view = view_after(4)
    assert view.extrapolated_past == 4
    text = "\n".join(theory_lines(view))
    assert "past γ 4" in text and "no wider verify pass timed yet" in text


def test_a_curve_measured_at_every_width_claims_no_forecast() -> None:
    view = view_after(max(ADVISOR_GAMMAS))
    assert view.extrapolated_past is None
    assert "no wider verify pass" not in "\n".join(theory_lines(view))


def test_the_advisor_s_best_gamma_is_read_off_the_curve_it_shows() -> None:
    view = view_after(4)
    assert view.best_gamma is not None
    assert view.curve[view.best_gamma] == max(view.curve.values())
    assert view.best_gamma == min(g for g, s in view.curve.items() if s == max(view.curve.values()))
