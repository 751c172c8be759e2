"""The one contract between the engine and everything else (CLI, TUI, exports, bench).

Every figure any front end shows is derived from these events, so a headless run, the TUI,
an exported conversation and the benchmark always agree.

A speculative round yields zero or more ``accepted`` tokens, then exactly one closing token:
``correction`` (a draft was rejected and the target resampled from the residual), ``bonus``
(all drafts were accepted and the target's extra position supplied one more token), or
``target`` (nothing was drafted this round, so the token is a plain target token). Then it
yields one :class:`RoundEvent`. The last round of a reply may be cut short by a stop token,
the token budget or the context length; it then has no closing token. The stream ends with
exactly one :class:`SummaryEvent`.

This module imports nothing heavy: the UI may import it without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

TokenKind = Literal["accepted", "correction", "bonus", "target"]
TOKEN_KINDS: tuple[TokenKind, ...] = ("accepted", "correction", "bonus", "target")

StopReason = Literal["eos", "max_tokens", "context", "cancelled"]
DrafterName = Literal["model", "ngram", "none"]
"""Who proposed a round's draft (a hybrid drafter proposes as one or the other)."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token and how it was produced."""

    kind: TokenKind
    token_id: int
    text: str
    """The text this token adds to the reply (may be empty while a multi-byte character is
    incomplete; the missing bytes arrive with a later token)."""
    round: int
    position: int
    """0-based position within its round: accepted drafts are 0..k-1, the closing token is k."""
    p_target: float
    """Probability of this token under the target's (shaped) distribution at its position."""
    p_draft: float | None
    """Probability the drafter gave this token (None for tokens nobody drafted)."""

    def to_json(self) -> dict[str, object]:
        return {
            "type": "token",
            "kind": self.kind,
            "id": self.token_id,
            "text": self.text,
            "round": self.round,
            "position": self.position,
            "p_target": self.p_target,
            "p_draft": self.p_draft,
        }


@dataclass(frozen=True, slots=True)
class RoundEvent:
    """One draft → verify → accept round (or one plain decoding step when nothing is drafted)."""

    round: int
    gamma: int
    """γ asked of the drafter this round."""
    drafted: int
    """Tokens the drafter actually proposed (≤ gamma: the n-gram drafter may find fewer)."""
    accepted: int
    """Leading drafts that passed verification (can exceed the accepted tokens emitted when a
    stop ends the reply inside the accepted run)."""
    draft_ms: float
    verify_ms: float
    drafter: str
    """Name of the drafter that proposed this round: "model", "ngram" or "none"."""

    def to_json(self) -> dict[str, object]:
        return {
            "type": "round",
            "round": self.round,
            "gamma": self.gamma,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_ms": round(self.draft_ms, 3),
            "verify_ms": round(self.verify_ms, 3),
            "drafter": self.drafter,
        }


@dataclass(frozen=True, slots=True)
class SummaryEvent:
    """The last event of every reply. All figures are recomputable from the events before it."""

    tokens: int
    rounds: int
    drafted: int
    accepted: int
    alpha: float | None
    """accepted / drafted over the reply (None when nothing was drafted)."""
    tau: float | None
    """Mean tokens per round (None when no round ran)."""
    tokens_per_s: float
    """Generated tokens over decoding time (prefill excluded; see prefill_ms)."""
    per_position: tuple[float | None, ...]
    """Acceptance rate at each draft position, conditional on the round reaching it."""
    stop: StopReason
    prefill_ms: float
    decode_s: float
    prompt_tokens: int

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["per_position"] = list(self.per_position)
        return {"type": "summary", **data}


Event = TokenEvent | RoundEvent | SummaryEvent
