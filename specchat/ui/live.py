"""The figures the live panels show, derived only from engine events.

The same :mod:`specchat.engine.metrics` helpers compute α, τ and per-position acceptance here
as in the CLI and the benchmark, so every front end agrees. Pure Python: no torch, no textual.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from specchat.engine.events import Event, RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.metrics import RollingAlpha, StreamStats
from specchat.ui.store import Turn

ROLLING_WINDOW = 16
"""Rounds in the rolling α."""
RATE_HISTORY = 48
"""Rounds kept for the tokens/s sparkline."""


class LiveStats:
    """Whole-conversation and current-reply figures, updated event by event.

    ``version`` grows with every change, so the panels redraw on their timer only when
    something moved.
    """

    def __init__(self) -> None:
        self.conversation = StreamStats()
        self.rolling = RollingAlpha(ROLLING_WINDOW)
        self.rates: deque[float] = deque(maxlen=RATE_HISTORY)
        self.version = 0
        self.start_reply()

    def start_reply(self) -> None:
        self.reply = StreamStats()
        self.reply_summary: SummaryEvent | None = None
        self.reply_round_ms = 0.0
        self.last_round: RoundEvent | None = None
        self._round_tokens = 0
        self.version += 1

    def reset(self) -> None:
        self.conversation = StreamStats()
        self.rolling.clear()
        self.rates.clear()
        self.start_reply()

    def add(self, event: Event) -> None:
        self.version += 1
        if isinstance(event, SummaryEvent):
            self.reply_summary = event
            return
        self.conversation.add(event)
        self.reply.add(event)
        if isinstance(event, TokenEvent):
            self._round_tokens += 1
        elif isinstance(event, RoundEvent):
            self.rolling.add(event)
            self.last_round = event
            ms = event.draft_ms + event.verify_ms
            self.reply_round_ms += ms
            if ms > 0:
                self.rates.append(self._round_tokens / (ms / 1000.0))
            self._round_tokens = 0

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    def load(self, turns: Iterable[Turn]) -> None:
        """Rebuild from saved turns (a reopened conversation, or after a regenerate)."""
        self.reset()
        for turn in turns:
            if turn.role != "assistant":
                continue
            self.start_reply()
            self.extend(replay(turn))

    @property
    def tokens_per_s(self) -> float | None:
        """The engine's figure once the reply is done; while streaming, tokens over round time."""
        if self.reply_summary is not None:
            return self.reply_summary.tokens_per_s
        if self.reply_round_ms <= 0:
            return None
        return self.reply.tokens / (self.reply_round_ms / 1000.0)


def replay(turn: Turn) -> list[Event]:
    """A saved reply's events in stream order: each round's tokens, then its RoundEvent."""
    by_round: dict[int, list[TokenEvent]] = {}
    for token in turn.tokens:
        by_round.setdefault(token.round, []).append(token)
    events: list[Event] = []
    seen: Counter[int] = Counter()
    for round_event in turn.rounds:
        events.extend(by_round.get(round_event.round, []))
        seen[round_event.round] += 1
        events.append(round_event)
    # Tokens whose round was never closed (a reply cut by an error) still count.
    for round_no, tokens in by_round.items():
        if not seen[round_no]:
            events.extend(tokens)
    if turn.summary is not None:
        events.append(turn.summary)
    return events
