"""A conversation as Markdown, and the one-line figures of a reply (the transcript's footer uses
them too).

Control characters from a model, a server or a shared file are shown, not kept: the export is
read with `cat` and previewed in terminals, where they would be obeyed. Pure Python.
"""

from __future__ import annotations

from typing import Any

from specchat.engine.events import SummaryEvent
from specchat.engine.reasoning import CLOSE_TAG, OPEN_TAG
from specchat.store.conversation import STOP_WORDS, Conversation, Turn
from specchat.untrusted import visible


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
    parts.extend(summary.notes)  # what a server did to this reply (a stall, an overrun, a figure dropped)
    return visible(" · ".join(parts))  # a shared file's settings and notes could hold anything


def left_out_words(count: int) -> str:
    """What a reply's prompt left out of a conversation that outgrew the context."""
    messages = "message" if count == 1 else "messages"
    return f"{count} oldest {messages} left out of the prompt (context full)"


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
