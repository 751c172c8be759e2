"""Rebuild speculative rounds from what a server streams (pure Python, no I/O).

A server sends text chunks; some also send counters. Three readers turn chunks into the
engine's events (:mod:`specchat.engine.events`):

- :class:`CounterRounds` (llama-server with ``timings_per_token``): every chunk carries the
  running totals ``predicted_n`` (tokens generated), ``draft_n`` (tokens drafted) and
  ``draft_n_accepted``. llama-server adds a round's drafts to ``draft_n`` before verifying
  them and its accepted count to ``draft_n_accepted`` before it streams the round's tokens, so
  the totals step once per drafted round, at its first token: the step in ``draft_n`` is the
  round's drafted count, the step in ``draft_n_accepted`` its accepted prefix, and the round
  holds that prefix plus one closing token (bonus when every draft passed, correction
  otherwise). Tokens arriving while the totals stand still and no round is open are plain
  target tokens (no draft that step, e.g. the first token, sampled right after prefill).
- :class:`StepRounds` (vLLM): each streamed chunk is one engine step, 1 + accepted drafts
  long; ``usage.completion_tokens`` (continuous usage stats) counts them exactly, γ is the
  server's ``num_speculative_tokens``. The first step is the prefill's, which verifies nothing.
- :class:`PlainTokens` (anything else): one uncoloured token per chunk and no rounds at all.

Token ids and probabilities never reach the client: they stay UNKNOWN (see events.py), and a
chunk that covers several tokens (a token whose text the server held back) gives its text to
the last of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine.events import (
    UNKNOWN,
    UNKNOWN_ID,
    Event,
    RoundEvent,
    TokenEvent,
    TokenKind,
)

MAX_ROUND_DRAFTS = 256
"""The most drafts one rebuilt round holds: a counter that jumps further is the server's error,
and a round's drafts are walked position by position downstream."""


@dataclass(frozen=True)
class Chunk:
    """What one streamed chunk says, normalised across servers."""

    text: str = ""
    tokens: int | None = None
    """Tokens generated so far, this chunk included (None: the server does not count)."""
    drafted: int | None = None
    """Running total of drafted tokens (llama-server ``draft_n``; None: not reported)."""
    accepted: int | None = None
    """Running total of accepted drafts (llama-server ``draft_n_accepted``)."""
    pieces: tuple[str, ...] | None = None
    """Each new token's own text, when the server lists them (logprobs)."""
    finish: str | None = None
    """The finish reason on the last chunk ("stop", "length", …)."""
    reasoning: bool = False
    """The text is the model's reasoning (a server's ``reasoning_content``), not its answer."""


@dataclass
class _OpenRound:
    number: int
    drafted: int
    accepted: int
    gamma: int
    got: int = 0

    @property
    def full(self) -> bool:
        return self.got >= self.accepted + 1


@dataclass
class _Reader:
    """What the three readers share: numbering, counting, and the round's events."""

    drafter: str = "model"
    tokens_seen: int = 0
    rounds: int = 0
    emitted: int = 0
    leftover_text: str = ""

    def _new_tokens(self, chunk: Chunk) -> int:
        """How many tokens this chunk adds (1 per text chunk when the server does not count)."""
        if chunk.tokens is None:
            return 1 if chunk.text else 0
        return max(0, chunk.tokens - self.tokens_seen)

    def _texts(self, chunk: Chunk, count: int) -> list[str]:
        """Each new token's text: the server's own pieces, else all text on the last token.

        Text held over from an earlier chunk goes first, on the first new token."""
        held, self.leftover_text = self.leftover_text, ""
        pieces = chunk.pieces
        if pieces is not None and len(pieces) == count and "".join(pieces) == chunk.text:
            return [held + pieces[0], *pieces[1:]]
        return [""] * (count - 1) + [held + chunk.text]

    def _token(self, kind: TokenKind, text: str, round_no: int, position: int) -> TokenEvent:
        self.emitted += 1
        drafted = kind == "accepted"
        return TokenEvent(
            kind,
            UNKNOWN_ID,
            text,
            round_no,
            position,
            UNKNOWN,
            UNKNOWN if drafted else None,
            "draft" if drafted else "target",
        )

    def close(self) -> list[Event]:
        """Close a round left open (the reply was cut short): its RoundEvent, if any."""
        return []

    def _round(self, number: int, gamma: int, drafted: int, accepted: int) -> RoundEvent:
        return RoundEvent(
            number, gamma, drafted, accepted, UNKNOWN, UNKNOWN, self.drafter if drafted else "none"
        )


def closing_kind(drafted: int, accepted: int) -> TokenKind:
    if drafted == 0:
        return "target"
    return "bonus" if accepted >= drafted else "correction"


class CounterRounds(_Reader):
    """llama-server: rounds from the steps in the running totals (see the module docstring)."""

    def __init__(self, drafter: str = "model", gamma: int | None = None) -> None:
        super().__init__(drafter=drafter)
        self.gamma = gamma
        """γ asked for (None: the server's own); rounds report max(γ, drafted)."""
        self.total_drafted = 0
        self.total_accepted = 0
        self.open: _OpenRound | None = None
        self.max_drafted = 0
        """The most drafts any round had (tells whether the server honoured γ)."""

    def feed(self, chunk: Chunk, *, hide_last: bool = False) -> list[Event]:
        """The chunk's tokens and any rounds they close (``hide_last``: the last new token is the
        stop token, which fills its round's slot but is not shown)."""
        count = self._new_tokens(chunk)
        if count == 0:
            # Text with no new token: held-back text the server releases late. It rides on the
            # next token (or on the closing flush).
            self.leftover_text += chunk.text
            return []
        drafted = self.total_drafted if chunk.drafted is None else chunk.drafted
        accepted = self.total_accepted if chunk.accepted is None else chunk.accepted
        texts = self._texts(chunk, count)
        out: list[Event] = []
        for j, text in enumerate(texts):
            moved = (drafted, accepted) != (self.total_drafted, self.total_accepted)
            last = j == count - 1
            if moved and (last or self.open is None or self.open.full):
                out.extend(self._close_open())
                self._start(drafted - self.total_drafted, accepted - self.total_accepted)
                self.total_drafted, self.total_accepted = drafted, accepted
            elif self.open is None or self.open.full:
                out.extend(self._close_open())
                self._start(0, 0)
            out.extend(self._add(text, shown=not (hide_last and last)))
        self.tokens_seen += count
        return out

    def finish(self, chunk: Chunk | None = None) -> list[Event]:
        """The last chunk (its finish reason): an unseen stop token still fills its round's slot."""
        out: list[Event] = []
        if chunk is not None:
            count = self._new_tokens(chunk)
            # The stop token: counted by the server, shown by nobody (as in the local engine),
            # unless it has to carry text the server released late.
            stop_token = chunk.finish == "stop" and count > 0 and not (self.leftover_text or chunk.text)
            if count or chunk.text:
                out.extend(self.feed(chunk, hide_last=stop_token))
        if self.leftover_text:
            out.extend(self._flush_leftover())
        out.extend(self._close_open())
        return out

    def _flush_leftover(self) -> list[Event]:
        # Text released after the last counted token: it belongs to tokens already shown, but an
        # event is the only way to add text, so it closes the reply as one more plain token.
        text, self.leftover_text = self.leftover_text, ""
        if self.open is None or self.open.full:
            out = self._close_open()
            self._start(0, 0)
            return out + self._add(text)
        return self._add(text)

    def close(self) -> list[Event]:
        return self._close_open()

    def _start(self, drafted: int, accepted: int) -> None:
        drafted = min(drafted, MAX_ROUND_DRAFTS)
        gamma = max(drafted, self.gamma or 0) if drafted else 0
        self.open = _OpenRound(self.rounds, drafted, min(accepted, drafted), gamma)
        self.rounds += 1
        self.max_drafted = max(self.max_drafted, drafted)

    def _add(self, text: str, shown: bool = True) -> list[Event]:
        r = self.open
        assert r is not None
        position = r.got
        kind: TokenKind = "accepted" if position < r.accepted else closing_kind(r.drafted, r.accepted)
        r.got += 1
        out: list[Event] = [self._token(kind, text, r.number, position)] if shown else []
        if r.full:
            out.extend(self._close_open())
        return out

    def _close_open(self) -> list[Event]:
        r, self.open = self.open, None
        if r is None:
            return []
        return [self._round(r.number, r.gamma, r.drafted, r.accepted)]


class StepRounds(_Reader):
    """vLLM: one chunk = one engine step = its accepted drafts + one closing token."""

    def __init__(self, gamma: int, drafter: str = "model") -> None:
        super().__init__(drafter=drafter)
        self.gamma = gamma

    def feed(self, chunk: Chunk) -> list[Event]:
        count = self._new_tokens(chunk)
        if count == 0:
            self.leftover_text += chunk.text
            return []
        texts = self._texts(chunk, count)
        # The first token comes from the prefill step, which verifies no drafts.
        gamma = min(self.gamma, MAX_ROUND_DRAFTS) if self.rounds else 0
        accepted = min(count - 1, gamma)
        number = self.rounds
        self.rounds += 1
        out: list[Event] = []
        for position, text in enumerate(texts):
            kind: TokenKind = "accepted" if position < accepted else closing_kind(gamma, accepted)
            out.append(self._token(kind, text, number, position))
        out.append(self._round(number, gamma, gamma, accepted))
        self.tokens_seen += count
        return out

    def finish(self, chunk: Chunk | None = None) -> list[Event]:
        out: list[Event] = []
        if chunk is not None and (self._new_tokens(chunk) or chunk.text):
            out.extend(self.feed(chunk))
        if self.leftover_text:
            chunk_text, self.leftover_text = self.leftover_text, ""
            out.extend(self.feed(Chunk(text=chunk_text, tokens=self.tokens_seen + 1)))
        return out


class PlainTokens(_Reader):
    """Any other server: uncoloured tokens, one per text chunk, and no rounds."""

    def feed(self, chunk: Chunk) -> list[Event]:
        if not chunk.text:
            return []
        event = self._token("target", chunk.text, self.emitted, 0)
        return [event]

    def finish(self, chunk: Chunk | None = None) -> list[Event]:
        return self.feed(chunk) if chunk is not None else []
