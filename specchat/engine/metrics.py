"""Figures derived from the event stream: α, τ, per-position acceptance, predicted speedup.

Pure Python (no torch), so the TUI, the CLI and tests compute the same numbers from events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from specchat.engine.events import Event, RoundEvent, StopReason, SummaryEvent, TokenEvent


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """E[T] = (1 − α^(γ+1)) / (1 − α): accepted drafts plus the one closing token."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Speedup over plain decoding: E[T] / (γ·c + v(γ)).

    ``cost_ratio`` is c, one draft pass over one target pass; ``verify_ratio`` is v(γ), one
    target pass over γ+1 positions relative to a single-position pass (1 when memory-bound).
    """
    if gamma <= 0:
        return 1.0
    return expected_tokens_per_round(alpha, gamma) / (gamma * cost_ratio + verify_ratio)


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
class StreamStats:
    """Running figures over a stream of events (one reply or a whole conversation)."""

    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    kind_counts: dict[str, int] = field(default_factory=dict)
    round_events: list[RoundEvent] = field(default_factory=list)

    def add(self, event: Event) -> None:
        if isinstance(event, TokenEvent):
            self.tokens += 1
            self.kind_counts[event.kind] = self.kind_counts.get(event.kind, 0) + 1
        elif isinstance(event, RoundEvent):
            self.rounds += 1
            self.drafted += event.drafted
            self.accepted += event.accepted
            self.round_events.append(event)

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
