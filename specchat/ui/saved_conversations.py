"""Saved conversations: JSON files in the platform data folder, written atomically.

A saved conversation keeps every reply's tokens with their kind (accepted draft, correction,
bonus, target), every round, and the reply's summary (α, τ, tokens/s), so reopening one shows
the same colours and figures, and an exported Markdown file quotes the same numbers. A thinking
model's reasoning stays too: its tokens are marked, the turn keeps its text apart from the answer
(``reasoning``), and the Markdown export sets it apart as reasoning. Every turn is kept, also
those a long conversation's later prompts had to leave out (the reply's settings say how many).

Pure Python (no torch, no textual): the CLI may read and export conversations too.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.reasoning import CLOSE_TAG, OPEN_TAG, answer_text, reasoning_text
from specchat.errors import SpecchatError
from specchat.files import CONVERSATION_LIMIT, read_user_text, write_atomic
from specchat.untrusted import visible

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
        now = _now()
        return cls(new_id(), system_prompt, target, draft, [], now, now)

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


@dataclass(frozen=True)
class SavedInfo:
    """One row of the conversation list (a file that cannot be read is listed with why)."""

    id: str
    title: str
    updated: str
    turns: int
    alpha: float | None
    path: Path
    problem: str | None = None


class ConversationStore:
    """``<data dir>/conversations/<id>.json``; exports go to ``<data dir>/exports/<id>.md``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / "conversations"
        self.exports = root / "exports"
        self._seen: dict[str, tuple[int, int, int]] = {}
        """Each file as this store last read or wrote it (inode, size, mtime)."""

    def path_for(self, conversation_id: str) -> Path:
        return self.folder / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        """Write the conversation atomically. If its file changed since this store read or
        wrote it (another specchat has it open too), that version is kept and this one gets
        a new id and file: two copies never overwrite each other's messages."""
        conversation.updated = _now()
        path = self.path_for(conversation.id)
        current = _stamp(path)
        if current is not None and current != self._seen.get(conversation.id):
            conversation.id = new_id()
            path = self.path_for(conversation.id)
        # Compact: json's fast C encoder only runs without indent, and this runs on the UI thread
        # twice per reply, over the whole conversation (every token of every reply).
        write_atomic(path, json.dumps(conversation.to_json(), ensure_ascii=False, separators=(",", ":")))
        self._remember(conversation.id, path)
        return path

    def load(self, conversation_id: str) -> Conversation:
        path = self.path_for(conversation_id)
        conversation = self.load_path(path)
        self._remember(conversation.id, path)
        return conversation

    def _remember(self, conversation_id: str, path: Path) -> None:
        stamp = _stamp(path)
        if stamp is not None:
            self._seen[conversation_id] = stamp

    def delete(self, conversation_id: str) -> None:
        """Remove a conversation's file (one that ended up empty); missing is fine."""
        self.path_for(conversation_id).unlink(missing_ok=True)

    @staticmethod
    def load_path(path: Path) -> Conversation:
        """Read one file. The file is the conversation's identity: its id is the file's name,
        so a file renamed by hand opens and keeps saving to itself."""
        try:
            conversation = Conversation.from_json(json.loads(read_user_text(path, CONVERSATION_LIMIT)))
        except FileNotFoundError as err:
            raise ConversationError(f"no saved conversation at {path} (was it moved or deleted?).") from err
        except UnicodeDecodeError as err:
            raise ConversationError(f"cannot read the conversation {path}: it is not UTF-8 text.") from err
        except json.JSONDecodeError as err:
            raise ConversationError(
                f"cannot read the conversation {path}: it is not complete JSON ({err.msg} at line "
                f"{err.lineno}); the file is left as it is."
            ) from err
        except RecursionError as err:  # json parses nested arrays by recursion
            raise ConversationError(
                f"cannot read the conversation {path}: it nests lists or objects too deeply to be one."
            ) from err
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else _reason(err)
            raise ConversationError(f"cannot read the conversation {path}: {reason}.") from err
        conversation.id = path.stem
        return conversation

    def saved(self) -> list[SavedInfo]:
        """Newest first; files that cannot be read come last, with the reason (never overwritten)."""
        rows: list[SavedInfo] = []
        broken: list[SavedInfo] = []
        for path in self.folder.glob("*.json") if self.folder.is_dir() else []:
            try:
                conversation = self.load_path(path)
            except ConversationError as err:
                reason = str(err).split(": ", 1)[-1]
                broken.append(SavedInfo(path.stem, path.name, "", 0, None, path, reason))
                continue
            replies = [t for t in conversation.turns if t.role == "assistant"]
            drafted = sum(r.drafted for t in replies for r in t.rounds)
            accepted = sum(r.accepted for t in replies for r in t.rounds)
            rows.append(
                SavedInfo(
                    id=conversation.id,
                    title=conversation.title,
                    updated=conversation.updated,
                    turns=len(conversation.turns),
                    alpha=accepted / drafted if drafted else None,
                    path=path,
                )
            )
        rows.sort(key=lambda r: (r.updated, r.id), reverse=True)
        return rows + sorted(broken, key=lambda r: r.id)

    def export_markdown(self, conversation: Conversation, path: Path | None = None) -> Path:
        path = path or self.exports / f"{conversation.id}.md"
        write_atomic(path, to_markdown(conversation))
        return path


def to_markdown(conversation: Conversation) -> str:
    """The conversation as Markdown: each reply followed by its speculation figures.

    Control characters from a model, a server or a shared file are shown, not kept: the export
    is read with `cat` and previewed in terminals, where they would be obeyed.
    """
    lines = [f"# {conversation.title}", ""]
    models = f"target `{conversation.target}`" + (
        f", draft `{conversation.draft}`" if conversation.draft else ""
    )
    lines += [f"*specchat conversation {conversation.id} · {models}*", ""]
    if conversation.system_prompt.strip():
        lines += ["**System:** " + conversation.system_prompt.strip(), ""]
    for turn in conversation.turns:
        if turn.role == "user":
            lines += ["## You", "", turn.content.strip(), ""]
        else:
            lines += ["## Assistant", ""]
            if turn.reasoning.strip():
                lines += reasoning_block(turn)
            lines += [turn.content.strip(), ""]
            if turn.summary is not None:
                lines += [f"> {reply_figures(turn.summary, turn.settings)}", ""]
    return visible("\n".join(lines).rstrip() + "\n")


def reasoning_block(turn: Turn) -> list[str]:
    """The reply's reasoning, set apart as such: a folded ``<details>`` block that Markdown
    viewers show closed, like the chat, titled with its size and α."""
    title = "Reasoning"
    if turn.summary is not None and turn.summary.reasoning_tokens:
        title += f" · {reasoning_figures(turn.summary)}"
    text = turn.reasoning.replace(OPEN_TAG, "").replace(CLOSE_TAG, "").strip()
    return ["<details>", f"<summary>{title}</summary>", "", text, "", "</details>", ""]


def reasoning_figures(summary: SummaryEvent) -> str:
    """The reasoning's size and α, and the answer's α beside it: "312 tokens · α 0.71 (answer 0.84)"."""
    return (
        f"{summary.reasoning_tokens} tokens · α {fmt(summary.reasoning_alpha)} "
        f"(answer {fmt(summary.answer_alpha)})"
    )


def reply_figures(summary: SummaryEvent, settings: dict[str, Any] | None = None) -> str:
    """One line of figures for a finished reply (transcript footer and Markdown export)."""
    parts = [
        f"α {fmt(summary.alpha)}",
        f"τ {fmt(summary.tau)}",
        f"{summary.tokens_per_s:.1f} tok/s",
        f"{summary.tokens} tokens",
        f"{summary.rounds} rounds",
    ]
    if settings:
        if settings.get("drafter"):
            parts.append(f"drafter {settings['drafter']}")
        if settings.get("gamma") is not None:
            parts.append(f"γ {settings['gamma']} {settings.get('schedule', '')}".rstrip())
    parts.append(STOP_WORDS.get(summary.stop, summary.stop))
    if summary.reasoning_tokens:
        parts.insert(2, f"reasoning {reasoning_figures(summary)}")
    left_out = (settings or {}).get("left_out")
    if isinstance(left_out, int) and not isinstance(left_out, bool) and left_out > 0:
        parts.append(left_out_words(left_out))
    return " · ".join(parts)


def left_out_words(count: int) -> str:
    """What a reply's prompt left out of a conversation that outgrew the context."""
    messages = "message" if count == 1 else "messages"
    return f"{count} oldest {messages} left out of the prompt (context full)"


STOP_WORDS = {"eos": "done", "max_tokens": "token limit", "context": "context full", "cancelled": "stopped"}


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


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


def _reason(err: BaseException) -> str:
    if isinstance(err, KeyError):
        return f"it lacks {err.args[0]!r}"
    return str(err) or type(err).__name__


def new_id() -> str:
    """A conversation id: when it started, and random digits so two copies never pick the same."""
    return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
