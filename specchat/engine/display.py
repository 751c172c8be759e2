"""The stream in the order a reader sees it: one pure rule, beside the events it reorders.

The engine yields a round's tokens, then its :class:`~specchat.engine.events.RoundEvent`
(:mod:`specchat.engine.events`). A reader shows a round's rejected drafts in place, after the
accepted prefix and before the correction that replaced them, so the correction, which the
engine yields before its RoundEvent, waits for it (:func:`display_order`). Rejected drafts are
shown, never part of the reply: :data:`Rejected` is their kind beside the token kinds.

This module imports nothing heavy: the UI may import it without loading torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from specchat.engine.events import Event, RoundEvent, TokenEvent, TokenKind

Rejected = Literal["rejected"]
"""The kind of a rejected draft shown in place: not a token kind, it never enters the reply."""
REJECTED: Rejected = "rejected"
ShownKind = TokenKind | Rejected
"""What a reader draws a stretch of text as: a reply token of some kind, or a rejected draft."""


@dataclass(frozen=True, slots=True)
class ClosedRound:
    """A round closing, as a reader shows it: its rejected drafts (``round.rejected``), then the
    correction that replaced them."""

    round: RoundEvent
    correction: TokenEvent | None
    """The round's correction, shown right after its rejected drafts (None: the round had none,
    or a stop token ended it, or its correction came in an earlier round's place)."""


Shown = TokenEvent | ClosedRound
"""One step of the display order: a token to show, or a round's close."""


def display_order(
    events: Iterable[Event], held: TokenEvent | None = None, *, final: bool = False
) -> tuple[list[Shown], TokenEvent | None]:
    """``events`` (a stretch of a reply's stream, in stream order) in display order, and the
    correction still held back for its round (pass it with the next stretch).

    Every token comes out in stream order, except a correction: it is held until its round's
    RoundEvent and comes out with it, in the :class:`ClosedRound`. Anything else that arrives
    first (a token, another round's event) lets the held correction go before it, as a
    correction whose round never reported (an old reply, a stream cut short); so does
    ``final``, at the end of the stream. Events other than tokens and rounds are not shown.
    """
    shown: list[Shown] = []
    for event in events:
        if isinstance(event, TokenEvent):
            if held is not None:
                shown.append(held)
            held = None
            if event.kind == "correction":
                held = event  # its RoundEvent comes next
            else:
                shown.append(event)
        elif isinstance(event, RoundEvent):
            correction = held if held is not None and held.round == event.round else None
            if held is not None and correction is None:
                shown.append(held)
            held = None
            shown.append(ClosedRound(event, correction))
    if final and held is not None:
        shown.append(held)
        held = None
    return shown, held
