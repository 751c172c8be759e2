"""Each figure once: the theory panel's c and the adaptive schedule's note agree for the same
rounds, and where they describe different drafters (a hybrid's two parts) each says whose.

On a loaded machine the panel once printed c = 0.020 in its formula while the schedule's note
beside it said c 2.28: under the hybrid the panel showed the part that drafted last (the
lookups, whose drafting costs next to nothing) and the note the draft model, which the schedule
had switched off as too slow; neither named its drafter.
"""

from __future__ import annotations

import re

from specchat.engine.events import RoundEvent
from specchat.engine.gamma import AdaptiveGamma
from specchat.ui.state.live import LiveStats
from specchat.ui.talk.theory_tracker import TheoryTracker, schedule_line, theory_lines

PLAIN_MS = 15.0
MODEL_MS_PER_TOKEN = 2.28 * PLAIN_MS  # a draft model slowed down by a loaded machine
LOOKUP_MS_PER_TOKEN = 0.02 * PLAIN_MS


def rounds() -> list[RoundEvent]:
    """Plain steps, costly model drafts that are mostly rejected, then cheap lookups that hit."""
    events = [RoundEvent(n, 0, 0, 0, 0.0, PLAIN_MS, "model") for n in range(3)]
    for n in range(3, 9):
        events.append(RoundEvent(n, 3, 3, n % 2, 3 * MODEL_MS_PER_TOKEN, 17.0, "model"))
    for n in range(9, 15):
        events.append(RoundEvent(n, 2, 2, 2, 2 * LOOKUP_MS_PER_TOKEN, 16.0, "ngram"))
    return events


def noted_c(note: str) -> str:
    found = re.search(r"(\w+): α [0-9.]+, c ([0-9.]+)", note)
    assert found is not None, note
    return f"{found.group(1)} {found.group(2)}"


def test_the_same_rounds_give_the_panel_and_the_note_the_same_c() -> None:
    schedule = AdaptiveGamma(4)
    tracker = TheoryTracker(LiveStats())
    for event in rounds():
        schedule.observe(event)
    tracker.live.extend(rounds())
    tracker.poll()
    for drafter in ("model", "ngram"):
        schedule.next_gamma(drafter)
        panel = tracker.view(4, drafter)
        assert panel.c is not None
        model = schedule.costs.model(drafter)
        assert model is not None and model.c == panel.c  # one estimator, the same rounds
        assert noted_c(schedule.note) == f"{drafter} {panel.c:.2f}"
        assert f"= {panel.c:.3f}  (a draft / a step)" in "\n".join(theory_lines(panel))
    assert noted_c(schedule.note) == "ngram 0.02"
    schedule.next_gamma("model")
    assert schedule.note.startswith("plain: drafting cannot pay") and noted_c(schedule.note) == "model 2.28"


def test_under_the_hybrid_each_c_names_its_drafter() -> None:
    schedule = AdaptiveGamma(4)
    tracker = TheoryTracker(LiveStats())
    for event in rounds():
        schedule.observe(event)
    schedule.next_gamma("model")  # no lookup at hand: the draft model, too slow to pay
    tracker.live.extend([*rounds(), RoundEvent(15, 0, 0, 0, 0.0, PLAIN_MS, "ngram", note=schedule.note)])
    tracker.poll()
    view = tracker.view(4, "hybrid")
    text = "\n".join([*theory_lines(view), schedule_line("adaptive", 4, view.schedule_note)])
    assert view.drafter == "ngram" and view.part_of == "hybrid"
    assert "c = d / V(0) = 0.30 ms / 15.00 ms = 0.020  (ngram: a draft / a step)" in text
    assert "of ngram, the part of hybrid that drafted last" in text
    assert "; model: α " in text and ", c 2.28, " in text
    assert "schedule adaptive (its own α, weighted to recent positions): plain: drafting" in text


def test_without_a_note_the_panel_says_what_the_users_gamma_means_to_the_schedule() -> None:
    assert schedule_line("heuristic", 5, "") == (
        "schedule heuristic: γ 5 is where it starts; a changed γ restarts it from the new γ at the next round"
    )
