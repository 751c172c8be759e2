"""The transcript: the system prompt, user messages, notices, and replies whose tokens are
coloured by how they were made (:mod:`specchat.ui.widgets.reply_text`), with their figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from specchat.engine.events import Event, SummaryEvent
from specchat.store.markdown import left_out_words, reply_figures
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.widgets.reply_text import ReplyText
from specchat.untrusted import visible


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { height: auto; }
    """

    def __init__(self, content: str) -> None:
        # Typed here, or read from a saved conversation someone may have shared.
        super().__init__(Text(visible(content)), markup=False)
        self.border_title = "you"
        self.text = content


class SystemNote(Static):
    """The system prompt, shown dim at the top of the transcript; below it, where the user should
    know, how the conversation becomes the prompt (raw mode, or a model without a chat template)."""

    def __init__(self, prompt: str, rendering: str | None = None) -> None:
        super().__init__(markup=False)
        self.rendering = rendering
        self.set_prompt(prompt)

    def set_prompt(self, prompt: str) -> None:
        self.prompt = prompt
        self._show()

    def set_rendering(self, rendering: str | None) -> None:
        self.rendering = rendering
        self._show()

    def _show(self) -> None:
        shown = visible(" ".join(self.prompt.split())) or "(none)"
        text = Text.assemble(("system  ", "bold"), shown)
        if self.rendering:
            text.append_text(Text.assemble("\n", ("prompt  ", "bold"), self.rendering))
        self.update(text)


class Notice(Static):
    """An error or a note inside the transcript."""

    def __init__(self, message: str, *, error: bool = True) -> None:
        super().__init__(Text(visible(message)), markup=False)  # may quote a server
        self.set_class(error, "-error")


def left_out_notice(left_out: int, kept: int, context: int) -> Notice:
    """Above a reply whose prompt left out the conversation's oldest messages."""
    return Notice(
        f"{left_out_words(left_out)}: this reply sees the system prompt and the newest {kept} "
        f"(the context holds {context:,} tokens). The saved conversation keeps every message.",
        error=False,
    )


class AssistantMessage(Vertical):
    """One reply: coloured tokens while streaming; afterwards coloured or Markdown, plus figures."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; }
    AssistantMessage > .figures { height: auto; }
    """

    def __init__(
        self,
        events: Iterable[Event] = (),
        *,
        palette: TokenPalette | None = None,
        streaming: bool = False,
        summary: SummaryEvent | None = None,
        settings: dict[str, Any] | None = None,
        error: str | None = None,
        markdown: bool = False,
        reasoning_key: str = "",
        reasoning_open: bool = False,
    ) -> None:
        super().__init__()
        self.border_title = "assistant"
        self.tokens = ReplyText(
            events,
            streaming=streaming,
            palette=palette,
            reasoning_key=reasoning_key,
            reasoning_open=reasoning_open,
        )
        self.figures = Static("", classes="figures", markup=False)
        self._markdown: Markdown | None = None
        self.want_markdown = markdown
        self.finished = not streaming
        self._summary = summary
        self._settings = settings or {}
        self._error = error

    def compose(self) -> ComposeResult:
        yield self.tokens
        yield self.figures

    def on_mount(self) -> None:
        self._show_figures()
        if self.finished:
            self.set_view(self.want_markdown)

    @property
    def text(self) -> str:
        """The answer (a thinking model's reasoning is apart, in the fold)."""
        return self.tokens.answer

    def append(self, events: Iterable[Event]) -> None:
        self.tokens.append(events)

    def finish(
        self, summary: SummaryEvent | None, settings: dict[str, Any], error: str | None = None
    ) -> None:
        self.finished = True
        self._summary = summary
        self._settings = settings
        self._error = error
        self.tokens.set_streaming(False)
        self._show_figures()
        self.set_view(self.want_markdown)

    def _show_figures(self) -> None:
        parts = []
        if self._summary is not None:
            parts.append(reply_figures(self._summary, self._settings))
        if self._error:
            parts.append(f"error: {visible(self._error)}")
        self.figures.update(Text("  ".join(parts), style="dim"))
        self.figures.display = bool(parts)

    def set_view(self, markdown: bool) -> None:
        """Markdown for a finished reply, provenance colours otherwise (always while streaming)."""
        self.want_markdown = markdown
        show_markdown = markdown and self.finished
        if show_markdown and self._markdown is None:
            self._markdown = Markdown(visible(self.text))
            self.mount(self._markdown, before=self.figures)
        if self._markdown is not None:
            self._markdown.display = show_markdown
        if self.tokens.fold is None:
            self.tokens.display = not show_markdown
        else:  # the reasoning's fold stays above the Markdown answer
            self.tokens.set_class(show_markdown, "-markdown")
        self.set_class(show_markdown, "-markdown")


class Transcript(VerticalScroll):
    """Scrolls with new text while anchored at the bottom; scrolling up releases it."""

    def follow(self) -> None:
        """Stick to the bottom once the text overflows (until the user scrolls up)."""
        if self.max_scroll_y > 0 and not self.is_anchored:
            self.anchor()

    def follow_new_reply(self) -> None:
        """A new reply starts: jump back to the bottom even if the user had scrolled up."""
        if self.is_anchored:
            self.scroll_end(animate=False)
        else:
            self.call_after_refresh(self.follow)

    def restart(self) -> None:
        """After replacing the content: top-aligned again until it overflows."""
        self.anchor(False)
        self.call_after_refresh(self.follow)

    def replies(self) -> list[AssistantMessage]:
        return list(self.query_children(AssistantMessage).results(AssistantMessage))
