"""A saved conversation as data: its turns, each reply's tokens, rounds and figures, and the
JSON they are saved as (format ``specchat-conversation``, version 1).

A saved conversation keeps every reply's tokens with their kind (accepted draft, correction,
bonus, target), every round, and the reply's summary (α, τ, tokens/s), so reopening one shows
the same colours and figures. A thinking model's reasoning stays too: its tokens are marked, the
turn keeps its text apart from the answer (``reasoning``). Every turn is kept, also those a long
conversation's later prompts had to leave out (the reply's settings say how many).

Pure Python (no torch, no textual): the CLI reads conversations too.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.reasoning import answer_text, reasoning_text
from specchat.errors import SpecchatError

FORMAT = "specchat-conversation"
VERSION = 1

Role = Literal["user", "assistant"]


class ConversationError(SpecchatError):
    """A saved conversation that cannot be read (not JSON, or not a specchat conversation)."""


class NewerFormatError(ValueError):
    """Saved by a newer specchat: never read (or overwritten) by this one."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"it was saved by a newer specchat (format version {version}; this one reads up to "
            f"{VERSION}): upgrade specchat to open it"
        )


@dataclass
class Turn:
    """One message. Assistant turns carry the events that produced them."""

    role: Role
    content: str
    tokens: list[TokenEvent] = field(default_factory=list)
    rounds: list[RoundEvent] = field(default_factory=list)
    summary: SummaryEvent | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    """γ, schedule, drafter and temperature when the reply started."""
    error: str | None = None
    """Set when the reply ended on an error after some tokens were generated."""
    reasoning: str = ""
    """A thinking model's reasoning before its answer (``content`` is the answer alone)."""

    @classmethod
    def reply(
        cls,
        tokens: list[TokenEvent],
        rounds: list[RoundEvent],
        summary: SummaryEvent | None,
        settings: dict[str, Any],
        error: str | None = None,
    ) -> Turn:
        """An assistant turn from its events: the answer as content, the reasoning apart."""
        return cls(
            "assistant", answer_text(tokens), tokens, rounds, summary, settings, error, reasoning_text(tokens)
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            data["reasoning"] = self.reasoning
        if self.role == "assistant":
            data["tokens"] = [_strip_type(t.to_json()) for t in self.tokens]
            data["rounds"] = [_strip_type(r.to_json()) for r in self.rounds]
            data["stats"] = _strip_type(self.summary.to_json()) if self.summary else None
            data["settings"] = dict(self.settings)
            if self.error:
                data["error"] = self.error
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Turn:
        _expect(data, dict, "a message")
        role = data["role"]
        if role not in ("user", "assistant"):
            raise ValueError(f"unknown role {role!r}")
        stats = data.get("stats")
        error = data.get("error")
        turn = cls(
            role=role,
            content=str(data["content"]),
            tokens=[_token(_expect(t, dict, "a token")) for t in _list(data, "tokens")],
            rounds=[_round(_expect(r, dict, "a round")) for r in _list(data, "rounds")],
            summary=_summary(_expect(stats, dict, "stats")) if stats else None,
            settings=dict(_expect(data.get("settings") or {}, dict, "settings")),
            error=None if error is None else str(error),
            reasoning=str(data.get("reasoning") or ""),
        )
        if turn.summary is not None:
            _check_figures(turn.summary)
        return turn


@dataclass
class Conversation:
    id: str
    system_prompt: str
    target: str
    draft: str | None
    turns: list[Turn] = field(default_factory=list)
    created: str = ""
    updated: str = ""

    @classmethod
    def new(cls, system_prompt: str, target: str, draft: str | None) -> Conversation:
        started = now()
        return cls(new_id(), system_prompt, target, draft, [], started, started)

    @property
    def title(self) -> str:
        first = next((t.content for t in self.turns if t.role == "user"), "")
        line = " ".join(first.split())
        return (line[:57] + "…") if len(line) > 58 else (line or "(empty)")

    def chat_messages(self) -> list[dict[str, str]]:
        """What the engine sees: the system prompt (if any), then every turn."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        messages += [{"role": t.role, "content": t.content} for t in self.turns]
        return messages

    def last_reply(self) -> Turn | None:
        return next((t for t in reversed(self.turns) if t.role == "assistant"), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "models": {"target": self.target, "draft": self.draft},
            "system_prompt": self.system_prompt,
            "messages": [t.to_json() for t in self.turns],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Conversation:
        _expect(data, dict, "a conversation object")
        if data.get("format") != FORMAT:
            raise ValueError("not a specchat conversation")
        version = data.get("version", VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"format version {version!r} is not a number")
        if version > VERSION:
            raise NewerFormatError(version)
        models = _expect(data.get("models") or {}, dict, "models")
        draft = models.get("draft")
        return cls(
            id=str(data["id"]),
            system_prompt=str(data.get("system_prompt", "")),
            target=str(models.get("target", "")),
            draft=None if draft is None else str(draft),
            turns=[Turn.from_json(m) for m in _list(data, "messages")],
            created=str(data.get("created", "")),
            updated=str(data.get("updated", "")),
        )


STOP_WORDS = {"eos": "done", "max_tokens": "token limit", "context": "context full", "cancelled": "stopped"}


def _strip_type(data: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in data.items() if k != "type"}


def _token(data: dict[str, Any]) -> TokenEvent:
    return TokenEvent.from_json(data)


def _round(data: dict[str, Any]) -> RoundEvent:
    return RoundEvent.from_json(data)


def _summary(data: dict[str, Any]) -> SummaryEvent:
    return SummaryEvent.from_json(data)


def _expect(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"{what} should be a JSON {'object' if kind is dict else 'list'}, not {value!r:.40}")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return [] if value is None else list(_expect(value, list, key))


def _check_figures(summary: SummaryEvent) -> None:
    """Figures are drawn with format specs: a string where a number belongs would crash the view."""
    if summary.stop not in STOP_WORDS:
        raise ValueError(f"stats.stop {summary.stop!r} is not a stop reason")
    for name in ("alpha", "tau"):
        value = getattr(summary, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"stats.{name} should be a number, not {value!r}")
    for value in summary.per_position:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"stats.per_position holds {value!r}, not a number")


def new_id() -> str:
    """A conversation id: when it started, and random digits so two copies never pick the same."""
    return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def now() -> str:
    """This moment, as a conversation's ``created`` and ``updated`` stamps record it."""
    return datetime.now(UTC).isoformat(timespec="seconds")
