"""The one live object every panel reads: figures derived only from engine events, plus the
state of the screen they describe (controls, keys, the inspected token, the paused round).

The same :mod:`specchat.engine.metrics` helpers compute α, τ and per-position acceptance here
as in the CLI and the benchmark, so every front end agrees. Panels receive this object and
format what they need themselves; nothing hands them preformatted strings.
Pure Python: no torch, no textual.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from specchat.engine.backend import Capabilities
from specchat.engine.events import Event, RoundEvent, SummaryEvent, TokenEvent, known
from specchat.engine.metrics import RollingAlpha, StreamStats
from specchat.store.conversation import Turn

ROLLING_WINDOW = 16
"""Rounds in the rolling α."""
RATE_HISTORY = 48
"""Rounds kept for the tokens/s sparkline."""


@dataclass(frozen=True)
class ControlsView:
    """The controls as the panels show them (copied from the engine's Controls)."""

    gamma: int
    schedule: str
    drafter: str
    temperature: float
    drafters: tuple[str, ...] = ()
    server: Capabilities | None = None
    """A server's capabilities (None for the local engine, which measures everything)."""
    replay_speed: float | None = None
    """Set while replaying a saved conversation: the settings shown are the recorded ones."""


@dataclass(frozen=True)
class Inspected:
    """The token under the inspector's cursor, with the round that produced it."""

    token: TokenEvent
    round: RoundEvent | None
    """None while the round is still being verified, or for a saved reply without rounds."""
    reply: int
    """Which reply of the transcript (0 = the first)."""
    index: int
    """The token's index within its reply."""


@dataclass(frozen=True)
class StepView:
    """Step mode: whether decoding waits after every round, and the round it waits after."""

    on: bool = False
    paused: bool = False
    round: RoundEvent | None = None
    """The last round run (None while paused before the first)."""
    closing: TokenEvent | None = None
    """That round's closing token (None when a stop token ended it)."""


@dataclass
class Display:
    """How the chat is shown right now (the legend reads it)."""

    markdown: bool = False
    show_rejected: bool = False
    note: str = ""
    """How a server's colours were obtained; empty for the local engine."""
    keys: Mapping[str, str] = field(default_factory=dict)
    """Binding id -> the key in force (after remapping)."""


class LiveStats:
    """Whole-conversation and current-reply figures, updated event by event, and the screen
    state the panels describe.

    ``version`` grows with every change, so the panels redraw on their timer only when
    something moved.
    """

    def __init__(self) -> None:
        self.controls: ControlsView | None = None
        self.display = Display()
        self.inspected: Inspected | None = None
        self.step = StepView()
        self.by_arrival = False
        """Time replies by when their tokens arrive (a server, which reports no round timings)."""
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
        self._clock: _ArrivalClock | None = None
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
            if self._clock is not None:
                self._clock.tick(self.reply.tokens)
        elif isinstance(event, RoundEvent):
            self.rolling.add(event)
            self.last_round = event
            ms = event.draft_ms + event.verify_ms
            if not known(ms):
                self._rate_by_arrival()
            else:
                self.reply_round_ms += ms
                if ms > 0:
                    self.rates.append(self._round_tokens / (ms / 1000.0))
            self._round_tokens = 0
        if isinstance(event, TokenEvent) and self.by_arrival and self._clock is None:
            self._clock = _ArrivalClock(self.reply.tokens)

    def set_controls(self, controls: ControlsView | None) -> None:
        if controls != self.controls:
            self.controls = controls
            self.version += 1

    def set_display(self, **changes: object) -> None:
        """Change how the chat is shown (markdown, show_rejected, note, keys)."""
        for name, value in changes.items():
            if getattr(self.display, name) != value:
                setattr(self.display, name, value)
                self.version += 1

    def inspect(self, inspected: Inspected | None) -> None:
        if inspected != self.inspected:
            self.inspected = inspected
            self.version += 1

    def set_step(self, step: StepView) -> None:
        if step != self.step:
            self.step = step
            self.version += 1

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

    def _rate_by_arrival(self) -> None:
        """Rounds without timings (a server): the sparkline's rate from the arrival clock."""
        if self._clock is None:
            return
        rate = self._clock.rate(self.reply.tokens)
        if rate is not None:
            self.rates.append(rate)

    @property
    def tokens_per_s(self) -> float | None:
        """The engine's figure once the reply is done; while streaming, tokens over round time
        (or, for a server that times nothing per round, tokens over the time they took to arrive)."""
        if self.reply_summary is not None:
            return self.reply_summary.tokens_per_s
        if self._clock is not None:
            return self._clock.rate(self.reply.tokens)
        if self.reply_round_ms <= 0:
            return None
        return self.reply.tokens / (self.reply_round_ms / 1000.0)


class _ArrivalClock:
    """Tokens per second by arrival time, counted from the first token seen (so prefill and
    network latency before it are excluded)."""

    def __init__(self, tokens: int) -> None:
        self.start = time.monotonic()
        self.start_tokens = tokens
        self.last = self.start
        self.last_tokens = tokens

    def tick(self, tokens: int) -> None:
        self.last, self.last_tokens = time.monotonic(), tokens

    def rate(self, tokens: int) -> float | None:
        elapsed = self.last - self.start
        if elapsed <= 0 or tokens <= self.start_tokens:
            return None
        return (self.last_tokens - self.start_tokens) / elapsed


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
