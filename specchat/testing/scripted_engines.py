"""Engines for UI tests and screenshots: deterministic timings, and a reply that can pause.

Both wrap a real :class:`~specchat.engine.session.ChatEngine` and pass its events through,
so the UI is driven by the real engine. Importing this module loads nothing heavy;
:func:`tiny_engine` imports torch when called. The application never imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from specchat.engine.backend import Backend, Capabilities, Reply
from specchat.engine.events import Event, RoundEvent, StopReason, SummaryEvent, TokenEvent
from specchat.engine.race import LaneToken, RaceLane, RaceResult
from specchat.ui.workers.bridge import capabilities_of

DRAFT_MS_PER_TOKEN = 1.5
VERIFY_MS = 12.0
PREFILL_MS = 20.0


class FixedTimings:
    """Rewrites the engine's timings with a fixed cost model, so tokens/s is reproducible.

    A round costs ``DRAFT_MS_PER_TOKEN`` per drafted token plus ``VERIFY_MS``; the summary's
    decode time is the sum of its rounds. Everything else passes through unchanged.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def available_drafters(self) -> list[str]:
        return self.backend.available_drafters

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.backend)

    def stream_chat(
        self, messages: Sequence[dict[str, str]], controls: Any, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        clock = _FixedClock()
        for event in self.backend.stream_chat(messages, controls, cancel):
            yield clock.retime(event)

    def start_chat(
        self, messages: Sequence[dict[str, str]], controls: Any, cancel: threading.Event | None = None
    ) -> Reply:
        return _RetimedReply(self.backend.start_chat(messages, controls, cancel))

    def read_ahead(self, messages: Sequence[dict[str, str]], controls: Any, cancel: threading.Event) -> None:
        self.backend.read_ahead(messages, controls, cancel)

    def close(self) -> None:
        self.backend.close()


class _FixedClock:
    """The cost model of :class:`FixedTimings`, applied to one reply's events in order."""

    def __init__(self) -> None:
        self.total_ms = 0.0

    def retime(self, event: Event) -> Event:
        if isinstance(event, RoundEvent):
            event = replace(event, draft_ms=DRAFT_MS_PER_TOKEN * event.drafted, verify_ms=VERIFY_MS)
            self.total_ms += event.draft_ms + event.verify_ms
        elif isinstance(event, SummaryEvent):
            decode_s = self.total_ms / 1000.0
            event = replace(
                event,
                decode_s=decode_s,
                prefill_ms=PREFILL_MS,
                tokens_per_s=event.tokens / decode_s if decode_s > 0 else 0.0,
            )
        return event


class _RetimedReply:
    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.clock = _FixedClock()

    @property
    def done(self) -> bool:
        return self.reply.done

    def step(self) -> list[Event]:
        return [self.clock.retime(event) for event in self.reply.step()]

    def finish(self, stop: StopReason = "cancelled") -> SummaryEvent:
        summary = self.clock.retime(self.reply.finish(stop))
        assert isinstance(summary, SummaryEvent)
        return summary


class PausingEngine:
    """Pauses the stream after a chosen round until released (or until cancelled).

    The pause sits between rounds: the engine has yielded round ``pause_after``'s
    RoundEvent and has not started the next round, so a key press made during the pause
    applies to the very next round.
    """

    def __init__(self, backend: Backend, pause_after: int | None = None) -> None:
        self.backend = backend
        self.pause_after = pause_after
        self.paused = threading.Event()
        self._release = threading.Event()
        self.events: list[Event] = []
        """Every event passed through, in order (what the UI should show)."""

    @property
    def available_drafters(self) -> list[str]:
        return self.backend.available_drafters

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.backend)

    def release(self) -> None:
        self._release.set()

    def wait_paused(self, timeout: float = 30.0) -> bool:
        return self.paused.wait(timeout)

    def stream_chat(
        self, messages: Sequence[dict[str, str]], controls: Any, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        self._begin()
        for event in self.backend.stream_chat(messages, controls, cancel):
            self.events.append(event)
            yield event
            if isinstance(event, RoundEvent):
                self._pause_after(event, cancel)

    def start_chat(
        self, messages: Sequence[dict[str, str]], controls: Any, cancel: threading.Event | None = None
    ) -> Reply:
        self._begin()
        return _PausingReply(self, self.backend.start_chat(messages, controls, cancel), cancel)

    def read_ahead(self, messages: Sequence[dict[str, str]], controls: Any, cancel: threading.Event) -> None:
        self.backend.read_ahead(messages, controls, cancel)

    def close(self) -> None:
        self.backend.close()

    def _begin(self) -> None:
        self.events.clear()
        self.paused.clear()
        self._release.clear()

    def _pause_after(self, event: RoundEvent, cancel: threading.Event | None) -> None:
        if event.round != self.pause_after:
            return
        self.paused.set()
        while not self._release.wait(0.02):
            if cancel is not None and cancel.is_set():
                break

    @property
    def tokens(self) -> list[TokenEvent]:
        return [e for e in self.events if isinstance(e, TokenEvent)]

    @property
    def rounds(self) -> list[RoundEvent]:
        return [e for e in self.events if isinstance(e, RoundEvent)]


class _PausingReply:
    def __init__(self, owner: PausingEngine, reply: Reply, cancel: threading.Event | None) -> None:
        self.owner = owner
        self.reply = reply
        self.cancel = cancel
        self._last_round: RoundEvent | None = None

    @property
    def done(self) -> bool:
        return self.reply.done

    def step(self) -> list[Event]:
        # Pause before the round after pause_after, once the caller has taken that round's
        # events: the UI has them all while the engine waits, as in the streaming path.
        if self._last_round is not None:
            self.owner._pause_after(self._last_round, self.cancel)
        events = self.reply.step()
        self.owner.events.extend(events)
        self._last_round = next((e for e in reversed(events) if isinstance(e, RoundEvent)), None)
        return events

    def finish(self, stop: StopReason = "cancelled") -> SummaryEvent:
        summary = self.reply.finish(stop)
        self.owner.events.append(summary)
        return summary


RACE_PREFILL_S = 0.05
RACE_STEP_S = 0.06
"""A target pass in :func:`race_with_fixed_times`; a drafted token costs a fifth of it."""
CLOSING_KINDS = ("correction", "bonus", "target")


def race_with_fixed_times(result: RaceResult) -> RaceResult:
    """The race with measured arrival times replaced by a cost model, so pictures repeat.

    A plain token arrives one target pass after the last; a speculative round's tokens arrive
    together when the round ends (γ drafted tokens plus one verify pass).
    """
    return replace(
        result,
        plain=_lane_with_fixed_times(result.plain),
        speculative=_lane_with_fixed_times(result.speculative),
    )


def _lane_with_fixed_times(lane: RaceLane) -> RaceLane:
    gamma = max((r.drafted for r in lane.rounds), default=0)
    round_s = RACE_STEP_S + gamma * RACE_STEP_S / 5 if lane.name == "speculative" else RACE_STEP_S
    tokens: list[LaneToken] = []
    pending: list[LaneToken] = []
    t = RACE_PREFILL_S
    for token in lane.tokens:
        pending.append(token)
        if token.kind in CLOSING_KINDS:
            t += round_s
            tokens.extend(replace(p, t=t) for p in pending)
            pending = []
    tokens.extend(replace(p, t=t) for p in pending)
    summary = replace(lane.summary, prefill_ms=RACE_PREFILL_S * 1000)
    return RaceLane(lane.name, tuple(tokens), t, summary, lane.rounds)


def tiny_engine(seed: int = 0, **kwargs: Any) -> Backend:
    """A real ChatEngine over the tiny seeded pair from :mod:`specchat.testing.tiny_models`."""
    from specchat.engine.session import ChatEngine
    from specchat.testing.tiny_models import make_tiny_pair

    pair = make_tiny_pair(seed, **kwargs)
    return ChatEngine(pair.target, pair.tokenizer, pair.draft)
