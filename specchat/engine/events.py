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

Contract v2 adds the trace of every round (fields are only added, so v1 readers keep working):
each :class:`RoundEvent` lists every drafted token with both probabilities, its acceptance
probability min(1, p_target/p_draft), the uniform draw and the verdict (rejected drafts
included), and each closing :class:`TokenEvent` carries the top of the distribution it was
drawn from (the residual after a rejection at T > 0, the target otherwise). Later each
:class:`DraftTrace` also gained both models' own softmax probabilities of the drafted token
(temperature 1, unshaped), so a greedy round, whose test is argmax equality, still shows how
sure each model was; files written before read them back as unknown. Later still each
:class:`RoundEvent` gained how many tokens the draft caught up on and the schedule's reason
for its γ; files written before read back as 0 and "".

Backends that cannot know a figure (a remote server reports no token ids, no probabilities and
no per-round timings) say so with the "unknown" values below, never with an invented number:
``UNKNOWN_ID`` for token ids and counts, ``UNKNOWN`` (NaN) for probabilities and milliseconds.
``to_json`` writes both as ``null`` and ``from_json`` reads ``null`` back as them. The local
engine never produces them, so its output is unchanged.

Thinking models write reasoning before their answer (``<think>…</think>``, or a server's
``reasoning_content``): each :class:`TokenEvent` says whether it belongs to it (``reasoning``),
and the :class:`SummaryEvent` counts the reasoning's tokens and gives reasoning and answer their
own α. Both are written only when a reply has reasoning, so other replies' JSON is unchanged.
A reply whose conversation outgrew the context starts with a :class:`ContextEvent` saying how
many of the oldest messages its prompt left out. A :class:`NoticeEvent` tells the user something
about the reply as it streams (a server that stalled, a figure it sent that was dropped, a token
limit it ignored); the summary keeps each notice's text (``notes``), written only when there is one.

This module imports nothing heavy: the UI may import it without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

TokenKind = Literal["accepted", "correction", "bonus", "target"]
TOKEN_KINDS: tuple[TokenKind, ...] = ("accepted", "correction", "bonus", "target")

StopReason = Literal["eos", "max_tokens", "context", "cancelled"]
DrafterName = str
"""Who proposed a round's draft: a name from the drafter registry, or "none" (a hybrid drafter
proposes as one of its parts, "model" or "ngram")."""
Verdict = Literal["accepted", "rejected", "untested"]
"""A drafted token's fate: passed the test, failed it (the round's first failure), or never
tested because an earlier draft of the round was rejected."""
DrawnFrom = Literal["draft", "target", "residual"]
"""The distribution a token was drawn from: the draft's (accepted drafts), the target's (bonus,
plain target tokens, and every closing token at T = 0), or the residual norm(max(p − q, 0))."""
CONTRACT_VERSION = 2
TOP_K_TRACE = 5
"""How many of the most likely tokens a trace lists."""
UNKNOWN_ID = -1
"""A token id (or count) the backend cannot report; real ids are never negative."""
UNKNOWN = math.nan
"""A probability or duration the backend cannot report (test with :func:`known`)."""


def known(value: float | None) -> bool:
    """Whether a figure was reported: not None, not UNKNOWN (NaN)."""
    return value is not None and not math.isnan(value)


def _json_float(value: float | None) -> float | None:
    """UNKNOWN becomes null (JSON has no NaN)."""
    return value if known(value) else None


def _read_float(value: Any) -> float:
    """null (an unknown figure) reads back as UNKNOWN."""
    return UNKNOWN if value is None else float(value)


def _json_id(value: int) -> int | None:
    return None if value == UNKNOWN_ID else value


def _read_id(value: Any) -> int:
    return UNKNOWN_ID if value is None else int(value)


def _read_p_draft(value: Any, kind: str) -> float | None:
    """null is "nobody drafted this token", except on an accepted draft: there it is UNKNOWN."""
    if value is None:
        return UNKNOWN if kind == "accepted" else None
    return float(value)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One entry of a distribution's top list."""

    token_id: int
    text: str
    p: float

    def to_json(self) -> dict[str, object]:
        return {"id": self.token_id, "text": self.text, "p": self.p}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Candidate:
        return cls(int(data["id"]), str(data["text"]), float(data["p"]))


@dataclass(frozen=True, slots=True)
class DraftTrace:
    """One drafted token and how verification judged it."""

    token_id: int
    text: str
    """The token's text on its own (for display; may hold a replacement character)."""
    p_target: float
    p_draft: float
    accept_prob: float
    """min(1, p_target / p_draft): the chance the acceptance test passes (at T > 0)."""
    u: float | None
    """The uniform draw compared with accept_prob; None at T = 0 (the test is argmax equality)."""
    verdict: Verdict
    p_target_own: float = UNKNOWN
    """The target's own softmax probability of this token: temperature 1, no top-k or top-p.
    At T > 0 the test uses the shaped ``p_target``; this says how sure the model itself was.
    (Added after v2: older files and backends that cannot know it hold UNKNOWN.)"""
    p_draft_own: float = UNKNOWN
    """The draft model's own softmax probability of this token, likewise; UNKNOWN for a lookup
    (n-gram) draft, which copies earlier text and has no probability of its own."""

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.token_id,
            "text": self.text,
            "p_target": self.p_target,
            "p_draft": self.p_draft,
            "accept_prob": self.accept_prob,
            "u": self.u,
            "verdict": self.verdict,
            "p_target_own": _json_float(self.p_target_own),
            "p_draft_own": _json_float(self.p_draft_own),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DraftTrace:
        verdict = str(data["verdict"])
        if verdict not in ("accepted", "rejected", "untested"):
            raise ValueError(f"unknown verdict {verdict!r}")
        u = data.get("u")
        return cls(
            int(data["id"]),
            str(data["text"]),
            float(data["p_target"]),
            float(data["p_draft"]),
            float(data["accept_prob"]),
            None if u is None else float(u),
            verdict,  # type: ignore[arg-type]
            _read_float(data.get("p_target_own")),
            _read_float(data.get("p_draft_own")),
        )


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
    """Probability of this token under the target's (shaped) distribution at its position
    (UNKNOWN when the backend does not report it)."""
    p_draft: float | None
    """Probability the drafter gave this token (None for tokens nobody drafted; UNKNOWN when a
    draft existed but the backend does not report its probability)."""
    drawn_from: DrawnFrom = "target"
    top: tuple[Candidate, ...] = ()
    """Closing tokens (v2): the most likely tokens of the distribution this one was drawn from."""
    reasoning: bool = False
    """Part of the model's reasoning (its ``<think>`` tags included), not of its answer."""

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "type": "token",
            "kind": self.kind,
            "id": _json_id(self.token_id),
            "text": self.text,
            "round": self.round,
            "position": self.position,
            "p_target": _json_float(self.p_target),
            "p_draft": _json_float(self.p_draft),
            "drawn_from": self.drawn_from,
        }
        if self.top:
            data["top"] = [c.to_json() for c in self.top]
        if self.reasoning:
            data["reasoning"] = True
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenEvent:
        """Read a token written by any contract version (v1 lacks the trace fields)."""
        kind = str(data["kind"])
        if kind not in TOKEN_KINDS:
            raise ValueError(f"unknown token kind {kind!r}")
        p_draft = data.get("p_draft")
        drawn_from = str(data.get("drawn_from") or ("draft" if kind == "accepted" else "target"))
        if drawn_from not in ("draft", "target", "residual"):
            raise ValueError(f"unknown distribution {drawn_from!r}")
        return cls(
            kind,  # type: ignore[arg-type]
            _read_id(data["id"]),
            str(data["text"]),
            int(data["round"]),
            int(data["position"]),
            _read_float(data["p_target"]),
            _read_p_draft(p_draft, kind),
            drawn_from,  # type: ignore[arg-type]
            tuple(Candidate.from_json(c) for c in data.get("top") or ()),
            data.get("reasoning") is True,
        )


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
    """Milliseconds drafting and verifying (UNKNOWN when the backend does not time rounds)."""
    drafter: str
    """Name of the drafter that proposed this round, from the registry ("none": nothing was
    drafted); a combined drafter's rounds carry the name of the part that proposed."""
    drafts: tuple[DraftTrace, ...] = ()
    """(v2) Every drafted token in order, accepted, rejected and untested alike."""
    caught_up: int = 0
    """Tokens the draft model read before drafting this round, inside ``draft_ms``: 1 or 2
    after a drafted round, the whole prompt at a reply's first draft, the tokens of any plain
    rounds in between (0: a lookup, a plain round, or not reported)."""
    note: str = ""
    """Why the γ schedule chose this round's γ, in a few words (the adaptive schedule; empty
    for schedules that only follow a setting)."""

    @property
    def rejected(self) -> tuple[DraftTrace, ...]:
        """The drafts this round threw away: the rejected one and any untested after it."""
        return self.drafts[self.accepted :]

    def to_json(self) -> dict[str, object]:
        return {
            "type": "round",
            "round": self.round,
            "gamma": self.gamma,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_ms": _json_float(round(self.draft_ms, 3)),
            "verify_ms": _json_float(round(self.verify_ms, 3)),
            "drafter": self.drafter,
            "drafts": [d.to_json() for d in self.drafts],
            "caught_up": self.caught_up,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundEvent:
        return cls(
            int(data["round"]),
            int(data["gamma"]),
            int(data["drafted"]),
            int(data["accepted"]),
            _read_float(data["draft_ms"]),
            _read_float(data["verify_ms"]),
            str(data["drafter"]),
            tuple(DraftTrace.from_json(d) for d in data.get("drafts") or ()),
            int(data.get("caught_up") or 0),
            str(data.get("note") or ""),
        )


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
    reasoning_tokens: int = 0
    """Tokens of the reply's reasoning (0: none, or not a thinking model)."""
    reasoning_alpha: float | None = None
    """α over the drafts standing for reasoning tokens (None when none was drafted)."""
    answer_alpha: float | None = None
    """α over the drafts standing for answer tokens (None when none was drafted)."""
    notes: tuple[str, ...] = ()
    """The reply's notices, in order (:class:`NoticeEvent`): specchat's words, never a server's."""

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["per_position"] = list(self.per_position)
        if not self.reasoning_tokens:
            for name in REASONING_FIELDS:
                del data[name]
        if self.notes:
            data["notes"] = list(self.notes)
        else:
            del data["notes"]
        return {"type": "summary", **data, "contract": CONTRACT_VERSION}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SummaryEvent:
        stop = str(data["stop"])
        if stop not in ("eos", "max_tokens", "context", "cancelled"):
            raise ValueError(f"unknown stop reason {stop!r}")
        return cls(
            tokens=int(data["tokens"]),
            rounds=int(data["rounds"]),
            drafted=int(data["drafted"]),
            accepted=int(data["accepted"]),
            alpha=_optional_float(data.get("alpha")),
            tau=_optional_float(data.get("tau")),
            tokens_per_s=float(data["tokens_per_s"]),
            per_position=tuple(_optional_float(v) for v in data.get("per_position") or ()),
            stop=stop,  # type: ignore[arg-type]
            prefill_ms=float(data["prefill_ms"]),
            decode_s=float(data["decode_s"]),
            prompt_tokens=int(data["prompt_tokens"]),
            reasoning_tokens=int(data.get("reasoning_tokens") or 0),
            reasoning_alpha=_optional_float(data.get("reasoning_alpha")),
            answer_alpha=_optional_float(data.get("answer_alpha")),
            notes=_notes(data.get("notes")),
        )


def _notes(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(note, str) for note in value):
        raise ValueError("notes must be a list of strings")
    return tuple(value)


REASONING_FIELDS = ("reasoning_tokens", "reasoning_alpha", "answer_alpha")
"""Summary fields written only for a reply that had reasoning."""


@dataclass(frozen=True, slots=True)
class ContextEvent:
    """Before a reply's first round: the conversation outgrew the context, so the prompt left out
    its oldest messages (the system prompt always stays; the saved conversation keeps them all)."""

    left_out: int
    """Messages (user and assistant turns, oldest first) not in this reply's prompt."""
    kept: int
    """Messages in the prompt after the system prompt (the newest)."""
    prompt_tokens: int
    context: int
    """Tokens the context holds."""

    def to_json(self) -> dict[str, object]:
        return {"type": "context", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContextEvent:
        return cls(int(data["left_out"]), int(data["kept"]), int(data["prompt_tokens"]), int(data["context"]))


NoticeKind = Literal["stall", "figures", "overrun"]
"""What a notice is about: no token for a while, a reported figure dropped, a limit ignored."""


@dataclass(frozen=True, slots=True)
class NoticeEvent:
    """Something the user should know about the reply now, in specchat's own words. A front end
    shows it (the chat as a notification, ``generate`` on stderr) and may act on it: ``generate``
    gives up on a stall, the chat lets the user decide (Esc)."""

    kind: NoticeKind
    text: str

    def to_json(self) -> dict[str, object]:
        return {"type": "notice", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoticeEvent:
        kind = str(data["kind"])
        if kind not in ("stall", "figures", "overrun"):
            raise ValueError(f"unknown notice kind {kind!r}")
        return cls(kind, str(data["text"]))  # type: ignore[arg-type]


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


Event = TokenEvent | RoundEvent | SummaryEvent | ContextEvent | NoticeEvent
