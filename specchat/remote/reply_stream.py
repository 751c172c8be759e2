"""One reply from a server, chunk by chunk, within bounds the server cannot move.

:class:`ReplyStream` turns each chunk of a streamed chat completion into the engine's events
(through a reader from :mod:`specchat.remote.rounds`), and holds the reply to what was asked,
whatever the server does:

- **tokens**: at most ``max_new_tokens`` are shown; a server that goes on past its
  ``max_tokens`` is read no further (``stop`` is "max_tokens") and an ``overrun`` notice says so;
  a counter that jumps by a billion makes no more events than the reply has room for;
- **text**: at most :data:`MAX_CHARS_PER_TOKEN` characters a token on average (plus
  :data:`TEXT_SLACK`), text held back by the server included: past that the reply is cut;
- **time**: no new token within ``stall_s`` seconds is a stall, whatever bytes, comments or empty
  chunks arrive meanwhile; a ``stall`` notice says so (the front end decides what to do);
- **figures**: a counter that is not a sane number is dropped with a ``figures`` notice;
- **reasoning tags**: the text is aligned with ``<think>``/``</think>`` before it is marked, so a
  tag split across chunks leaves no fragment (:class:`specchat.engine.reasoning.TagAligner`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from specchat.engine.events import Event, NoticeEvent, NoticeKind, RoundEvent, TokenEvent
from specchat.engine.metrics import StreamStats
from specchat.engine.reasoning import ReasoningMarker, TagAligner
from specchat.remote.chunks import drop_bad_figures
from specchat.remote.rounds import Chunk, CounterRounds, PlainTokens, StepRounds
from specchat.remote.server_errors import ServerError

MAX_CHARS_PER_TOKEN = 256
"""Characters a token may bring on average: the longest tokens of common vocabularies (runs of
spaces or symbols) are under this."""
TEXT_SLACK = 64 * 1024
"""Characters allowed beyond that (a short reply's text held back and released at once)."""
MAX_TOKENS_PER_S = 1e6
"""A decode time the server reports that makes more tokens a second than this is not used."""
HEARTBEAT_S = 0.5
"""How often the clock is looked at while the server sends nothing."""

Reader = CounterRounds | StepRounds | PlainTokens


@dataclass
class Timing:
    """Client-side clocks for one reply: what a server that reports no timings still lets us measure."""

    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    tokens_at_first: int = 0

    def saw_tokens(self, emitted: int) -> None:
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
            self.tokens_at_first = emitted
        self.last_token = now


class ReplyStream:
    """The state of one reply as its chunks arrive (see the module docstring)."""

    def __init__(self, reader: Reader, kind: str, server: str, max_tokens: int, stall_s: float) -> None:
        self.reader = reader
        self.kind = kind
        self.server = server
        self.max_tokens = max_tokens
        self.stall_s = stall_s
        self.max_chars = MAX_CHARS_PER_TOKEN * max_tokens + TEXT_SLACK
        self.stats = StreamStats()
        self.timing = Timing()
        self.last: dict[str, Any] = {}
        """The last ``usage`` and ``timings`` objects the server sent."""
        self.finish: str | None = None
        self.overrun = False
        self.untimed = False
        """llama-server sent its first text without ``timings``: its rounds cannot be rebuilt."""
        self._marker = ReasoningMarker()
        self._tags = TagAligner()
        self._chars = 0
        self._last_token = time.monotonic()
        self._stalled = False
        self._said: set[str] = set()

    @property
    def started(self) -> bool:
        return self.stats.tokens > 0

    def take(self, data: dict[str, Any] | None) -> list[Event]:
        """The events one chunk makes (None: a heartbeat, which may make a stall notice)."""
        if data is None:
            return self._record(self._stall_notice())
        notices = [self._notice("figures", note) for note in drop_bad_figures(data)]
        chunk, usage, timings = chunk_of(data, self.kind)
        if usage:
            self.last["usage"] = usage
        if timings:
            self.last["timings"] = timings
        first_text = bool(chunk.text) and not self.started
        self.untimed = self.untimed or (self.kind == "llama-server" and timings is None and first_text)
        events = self._record([e for e in notices if e is not None] + self._events_of(chunk))
        return events + self._record(self._stall_notice())

    def end(self) -> list[Event]:
        """What the reader still holds once the stream is over without a finish reason (cut or
        cancelled): the aligner's last pieces, then the open round closed."""
        if self.finish is not None:
            return []
        return self._record(self._mark(self._leftover() + list(self.reader.finish(None)), False))

    # ------------------------------------------------------------------ one chunk

    def _events_of(self, chunk: Chunk) -> list[Event]:
        if self.overrun:
            return []
        self._count_text(chunk.text)
        chunk = replace(chunk, text=self._tags.feed(chunk.text))
        room = self.max_tokens - self.stats.tokens
        if chunk.tokens is not None:  # a count can make no more events than there is room for
            chunk = replace(chunk, tokens=min(chunk.tokens, self.reader.tokens_seen + room + 1))
        if chunk.finish is not None:
            self.finish = chunk.finish
            *before, last = [piece for piece in (chunk.text, *self._tags.flush()) if piece] or [""]
            events = self._pieces_as_tokens(before) + list(self.reader.finish(replace(chunk, text=last)))
        elif chunk.text or chunk.tokens is not None:
            events = list(self.reader.feed(chunk))
        else:
            return []
        return self._within_room(self._mark(events, chunk.reasoning), room)

    def _leftover(self) -> list[Event]:
        """Text the aligner still holds, each aligned piece as one more plain token."""
        return self._pieces_as_tokens(self._tags.flush())

    def _pieces_as_tokens(self, pieces: list[str]) -> list[Event]:
        """Aligned text past what the server counted (a reply's last chunk held several tags):
        a token each, so each tag is marked on its own."""
        return [
            event
            for piece in pieces
            for event in self.reader.feed(Chunk(text=piece, tokens=self.reader.tokens_seen + 1))
        ]

    def _within_room(self, events: list[Event], room: int) -> list[Event]:
        """``events`` cut after the reply's last allowed token (an overrun: the server went on)."""
        tokens = sum(isinstance(e, TokenEvent) for e in events)
        if tokens <= room:
            return events
        kept: list[Event] = []
        last_round = None
        for event in events:
            if isinstance(event, TokenEvent):
                if room == 0:
                    break
                room -= 1
                last_round = event.round
            elif isinstance(event, RoundEvent) and event.round != last_round:
                continue
            kept.append(event)
        if not any(isinstance(e, RoundEvent) and e.round == last_round for e in kept):
            kept += self.reader.close()
        self.overrun = True
        self.finish = "length"
        note = (
            f"the server at {self.server} went on past max_tokens ({self.max_tokens}): "
            f"specchat stopped reading at {self.max_tokens} tokens."
        )
        return [*kept, NoticeEvent("overrun", note)]

    def server_decode_s(self) -> tuple[float | None, list[Event]]:
        """The decode time the server reported (seconds), or None where it reported none or
        one that cannot be (a million tokens a second: a notice says it was not used)."""
        predicted_ms = (self.last.get("timings") or {}).get("predicted_ms")
        if not predicted_ms:
            return None, []
        seconds = float(predicted_ms) / 1000.0
        if self.stats.tokens / seconds <= MAX_TOKENS_PER_S:
            return seconds, []
        notice = self._notice("figures", "the server reported an implausible timings.predicted_ms: not used")
        return None, self._record([notice] if notice is not None else [])

    def _mark(self, events: list[Event], reasoning: bool) -> list[Event]:
        """The chunk's tokens marked: all reasoning when it came as ``reasoning_content``;
        otherwise as their text says (a server that leaves ``<think>…</think>`` in the content)."""
        return [
            replace(e, reasoning=reasoning or self._marker.mark(e.text)) if isinstance(e, TokenEvent) else e
            for e in events
        ]

    # ------------------------------------------------------------------ bounds

    def _count_text(self, text: str) -> None:
        self._chars += len(text)
        if self._chars > self.max_chars:
            raise ServerError(
                f"the server at {self.server} sent more text than {self.max_tokens} tokens can hold "
                f"({self._chars:,} characters): specchat stopped reading."
            )

    def _stall_notice(self) -> list[Event]:
        if self._stalled or time.monotonic() - self._last_token < self.stall_s:
            return []
        self._stalled = True
        what = "new token" if self.started else "token"
        return [
            NoticeEvent(
                "stall",
                f"the server at {self.server} has sent no {what} for {self.stall_s:g} s (server_timeout).",
            )
        ]

    def _notice(self, kind: NoticeKind, text: str) -> NoticeEvent | None:
        """A notice, once per reply for the same words."""
        if text in self._said:
            return None
        self._said.add(text)
        return NoticeEvent(kind, text)

    def _record(self, events: list[Event]) -> list[Event]:
        """Count ``events`` into the reply's figures, and restart the stall clock on a token."""
        for event in events:
            self.stats.add(event)
        if any(isinstance(e, TokenEvent) for e in events):
            self.timing.saw_tokens(self.stats.tokens)
            self._last_token = time.monotonic()
            self._stalled = False
        return events


def unattended(stream: Iterator[Event], cancel: threading.Event) -> Iterator[Event]:
    """A reply for a front end nobody watches (``generate``, the bench): nobody can press Esc,
    so a stall ends it with a ServerError (after every token that arrived), and the request
    with it."""
    for event in stream:
        if isinstance(event, NoticeEvent) and event.kind == "stall":
            cancel.set()
            raise ServerError(f"{event.text} Gave up; what arrived is kept.")
        yield event


def chunk_of(data: dict[str, Any], kind: str) -> tuple[Chunk, dict[str, Any] | None, dict[str, Any] | None]:
    """One streamed chat-completion chunk, normalised; plus its usage and timings objects."""
    choices = data.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta") or {}
    # Reasoning a server parsed out of the model's text comes apart: its chunks carry no content
    # (text held back from a reasoning chunk rides with the next token, whichever section).
    reasoning = delta.get("reasoning_content") or ""
    text = reasoning + (delta.get("content") or "")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    timings = data.get("timings") if isinstance(data.get("timings"), dict) else None
    tokens = drafted = accepted = None
    pieces: tuple[str, ...] | None = None
    if kind == "llama-server" and timings is not None:
        tokens = _int(timings.get("predicted_n"))
        drafted = _int(timings.get("draft_n", 0))  # absent until the first drafted round
        accepted = _int(timings.get("draft_n_accepted", 0))
    elif kind == "vllm":
        if usage is not None and choices:
            tokens = _int(usage.get("completion_tokens"))
        logprobs = choice.get("logprobs") or {}
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(content, list) and content:
            pieces = tuple(str(entry.get("token", "")) for entry in content if isinstance(entry, dict))
    finish = choice.get("finish_reason") if choices else None
    chunk = Chunk(
        text=text,
        tokens=tokens,
        drafted=drafted,
        accepted=accepted,
        pieces=pieces,
        finish=finish,
        reasoning=bool(reasoning),
    )
    return chunk, usage, timings


def _int(value: Any) -> int | None:
    """A counter the chunk checks left in place: a whole number by then (see chunks.py)."""
    return int(value) if isinstance(value, int | float) else None
