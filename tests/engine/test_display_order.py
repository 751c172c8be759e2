"""The stream's display order: a correction waits for its round's event, nothing else moves."""

from __future__ import annotations

from specchat.engine.display import ClosedRound, Shown, display_order
from specchat.engine.events import (
    DraftTrace,
    Event,
    NoticeEvent,
    RoundEvent,
    SummaryEvent,
    TokenEvent,
    TokenKind,
)


def token(kind: TokenKind, round_: int, position: int, text: str = "x") -> TokenEvent:
    return TokenEvent(kind, 7, text, round_, position, 0.5, 0.5 if kind == "accepted" else None)


def round_event(number: int, drafted: int, accepted: int) -> RoundEvent:
    drafts = tuple(
        DraftTrace(3, "d", 0.5, 0.5, 1.0, None, "accepted" if i < accepted else "rejected")
        for i in range(drafted)
    )
    return RoundEvent(number, drafted, drafted, accepted, 1.0, 1.0, "model", drafts)


def order(events: list[Event], *, final: bool = False) -> list[Shown]:
    shown, held = display_order(events, final=final)
    assert held is None or not final
    return shown


def test_a_correction_comes_out_with_its_round_after_the_accepted_prefix() -> None:
    a0, a1, fix = token("accepted", 0, 0), token("accepted", 0, 1), token("correction", 0, 2)
    r0 = round_event(0, 4, 2)
    assert order([a0, a1, fix, r0]) == [a0, a1, ClosedRound(r0, fix)]


def test_rounds_without_a_correction_close_in_stream_order() -> None:
    a0, bonus, r0 = token("accepted", 0, 0), token("bonus", 0, 1), round_event(0, 1, 1)
    plain, r1 = token("target", 1, 0), round_event(1, 0, 0)
    closed = [ClosedRound(r0, None), ClosedRound(r1, None)]
    assert order([a0, bonus, r0, plain, r1]) == [a0, bonus, closed[0], plain, closed[1]]


def test_a_held_correction_crosses_a_batch_boundary() -> None:
    fix, r0 = token("correction", 0, 0), round_event(0, 2, 0)
    first, held = display_order([fix])
    assert first == [] and held is fix
    second, held = display_order([r0, token("target", 1, 0)], held)
    assert second[0] == ClosedRound(r0, fix) and held is None


def test_a_correction_whose_round_never_reports_goes_before_what_follows() -> None:
    fix, plain = token("correction", 0, 0), token("target", 1, 0)
    assert order([fix, plain]) == [fix, plain]
    other = round_event(1, 0, 0)
    assert order([fix, other]) == [fix, ClosedRound(other, None)]
    second = token("correction", 1, 0)
    shown, held = display_order([fix, second])
    assert shown == [fix] and held is second


def test_the_end_of_the_stream_lets_a_held_correction_go() -> None:
    fix = token("correction", 0, 0)
    shown, held = display_order([fix], final=True)
    assert shown == [fix] and held is None
    shown, held = display_order([], fix, final=True)
    assert shown == [fix] and held is None
    assert display_order([], None, final=True) == ([], None)


def test_other_events_are_not_shown_and_do_not_release_the_correction() -> None:
    fix, r0 = token("correction", 0, 0), round_event(0, 1, 0)
    notice = NoticeEvent("stall", "waiting")
    summary = SummaryEvent(1, 1, 1, 0, 0.0, 1.0, 1.0, (0.0,), "eos", 1.0, 1.0, 3)
    assert order([fix, notice, r0, summary]) == [ClosedRound(r0, fix)]
