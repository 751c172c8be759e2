"""Talk mode, part 2: the race, theory against measurement and the exactness self-test in the chat.

The chat screen's keys open the race and self-test screens and the theory panel (through
:mod:`specchat.ui.talk.screens`), handing them the model lease
(:mod:`specchat.ui.state.lease`); what those actions decide is here, as plain functions of what
they are given, so this module knows neither the app nor the screens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specchat.engine.gamma import GAMMA_CHANGE
from specchat.ui.state.lease import ModelLease

if TYPE_CHECKING:
    from specchat.engine.backend import Controls
    from specchat.store.conversation import Conversation
    from specchat.ui.talk.theory_tracker import TheoryTracker

POLL_S = 0.5
"""Seconds between the tracker's looks at the live statistics (a timer, never per token)."""

FALLBACK_RACE_PROMPT = "Write a Python function that checks whether a number is prime."


def default_prompt(conversation: Conversation) -> str:
    """The race's prompt: the last message sent, else a code prompt that drafts well."""
    for turn in reversed(conversation.turns):
        if turn.role == "user" and turn.content.strip():
            return turn.content
    return FALLBACK_RACE_PROMPT


def why_not_open(lease: ModelLease, what: str) -> str | None:
    """Why ``what`` ("the race", …) cannot open now (None: it can): a server, or busy models."""
    if lease.backend is not None and lease.local is None:
        return (
            f"{what[0].upper()}{what[1:]} needs local models (it counts token ids and times every "
            "token itself); a server does not report them."
        )
    return lease.busy_reason()


def apply_best_gamma(tracker: TheoryTracker, controls: Controls) -> tuple[str, str]:
    """Set γ to the advisor's best. Returns the notice and its title ("" when γ is unchanged)."""
    view = tracker.view(controls.gamma, controls.drafter)
    if view.best_gamma is None:
        return "The γ advisor needs α, c and v(γ) measured first: send a message with drafting on.", ""
    before = controls.gamma
    controls.gamma = view.best_gamma  # one attribute write: the engine reads γ once per round
    note = f"γ {before} → {view.best_gamma}: predicted {view.curve[view.best_gamma]:.2f}×"
    if controls.schedule != "fixed" and controls.schedule in GAMMA_CHANGE:
        note += f" ({controls.schedule}: {GAMMA_CHANGE[controls.schedule]})"
    return note, "γ advisor"
