"""Figures derived from the event stream: α, τ, per-position acceptance, predicted speedup.

Pure Python (no torch), so the TUI, the CLI and tests compute the same numbers from events.

The seed formula and the cost model (c, v(γ) from rounds' own timings) live in
:mod:`specchat.engine.costs`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from specchat.engine.events import Event, NoticeEvent, RoundEvent, StopReason, SummaryEvent, TokenEvent

__all__ = [
    "RollingAlpha",
    "SectionCounts",
    "SectionStats",
    "StreamStats",
    "acceptance_per_position",
    "per_position_acceptance",
    "positions_tested",
]


def positions_tested(event: RoundEvent) -> int:
    """Draft positions the round's verification looked at: up to and including the first rejection."""
    return min(event.accepted + 1, event.drafted)


def acceptance_per_position(rounds: Iterable[RoundEvent]) -> float | None:
    """α as the seed formula means it: accepted drafts over draft positions tested.

    accepted / drafted would count the drafts after a rejection (never tested) as failures and
    understate α for any γ > 1; E[T] = (1 − α^(γ+1)) / (1 − α) assumes each tested position
    passes with probability α.
    """
    accepted = tested = 0
    for event in rounds:
        if event.drafted:
            accepted += event.accepted
            tested += positions_tested(event)
    return accepted / tested if tested else None


def per_position_acceptance(rounds: Iterable[RoundEvent]) -> tuple[float | None, ...]:
    """Acceptance at each draft position, given the round reached that position.

    A round reaches position i when it drafted more than i tokens and accepted the i before.
    """
    reached: list[int] = []
    passed: list[int] = []
    for r in rounds:
        last_tested = min(r.accepted, r.drafted - 1)
        for i in range(last_tested + 1):
            if i == len(reached):
                reached.append(0)
                passed.append(0)
            reached[i] += 1
            passed[i] += int(i < r.accepted)
    return tuple(p / n if n else None for p, n in zip(passed, reached, strict=True))


@dataclass
class SectionCounts:
    """Tokens, drafts and accepted drafts of one part of a reply (its reasoning, or its answer)."""

    tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def alpha(self) -> float | None:
        """accepted / drafted, as the reply's own α (None when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class SectionStats:
    """Reasoning and answer counted apart: they accept differently (reasoning is freer text).

    Each draft position of a round is charged to the section of the token that stands for it:
    an accepted draft is a token of the reply; the rejected one and any untested after it stand
    for the round's closing token, which took their place. A round cut short by a stop token
    charges its leftover positions to its last token (or, with none, to the token before it).
    Reasoning and answer then add up to the reply's own drafted and accepted counts.
    """

    reasoning: SectionCounts = field(default_factory=SectionCounts)
    answer: SectionCounts = field(default_factory=SectionCounts)
    _round_tokens: list[bool] = field(default_factory=list)
    _last: bool = False

    def section(self, reasoning: bool) -> SectionCounts:
        return self.reasoning if reasoning else self.answer

    def add(self, event: Event) -> None:
        if isinstance(event, TokenEvent):
            self.section(event.reasoning).tokens += 1
            self._round_tokens.append(event.reasoning)
            self._last = event.reasoning
        elif isinstance(event, RoundEvent):
            flags = self._round_tokens or [self._last]
            for position in range(event.drafted):
                counts = self.section(flags[min(position, len(flags) - 1)])
                counts.drafted += 1
                counts.accepted += int(position < event.accepted)
            self._round_tokens = []


@dataclass
class StreamStats:
    """Running figures over a stream of events (one reply or a whole conversation)."""

    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    kind_counts: dict[str, int] = field(default_factory=dict)
    round_events: list[RoundEvent] = field(default_factory=list)
    sections: SectionStats = field(default_factory=SectionStats)
    notes: list[str] = field(default_factory=list)
    """The notices' texts, for the summary."""

    def add(self, event: Event) -> None:
        if isinstance(event, TokenEvent):
            self.tokens += 1
            self.kind_counts[event.kind] = self.kind_counts.get(event.kind, 0) + 1
            self.sections.add(event)
        elif isinstance(event, RoundEvent):
            self.rounds += 1
            self.drafted += event.drafted
            self.accepted += event.accepted
            self.round_events.append(event)
            self.sections.add(event)
        elif isinstance(event, NoticeEvent):
            self.notes.append(event.text)

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @property
    def per_position(self) -> tuple[float | None, ...]:
        return per_position_acceptance(self.round_events)

    def summary(
        self, stop: StopReason, *, prefill_ms: float, decode_s: float, prompt_tokens: int
    ) -> SummaryEvent:
        return SummaryEvent(
            tokens=self.tokens,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            alpha=self.alpha,
            tau=self.tau,
            tokens_per_s=self.tokens / decode_s if decode_s > 0 else 0.0,
            per_position=self.per_position,
            stop=stop,
            prefill_ms=prefill_ms,
            decode_s=decode_s,
            prompt_tokens=prompt_tokens,
            reasoning_tokens=self.sections.reasoning.tokens,
            reasoning_alpha=self.sections.reasoning.alpha if self.sections.reasoning.tokens else None,
            answer_alpha=self.sections.answer.alpha if self.sections.reasoning.tokens else None,
            notes=tuple(self.notes),
        )


class RollingAlpha:
    """α over the most recent rounds that drafted anything: shows acceptance collapsing live."""

    def __init__(self, window: int = 16) -> None:
        self._rounds: deque[tuple[int, int]] = deque(maxlen=window)

    def add(self, event: RoundEvent) -> None:
        if event.drafted:
            self._rounds.append((event.drafted, event.accepted))

    def clear(self) -> None:
        self._rounds.clear()

    @property
    def value(self) -> float | None:
        drafted = sum(d for d, _ in self._rounds)
        return sum(a for _, a in self._rounds) / drafted if drafted else None
