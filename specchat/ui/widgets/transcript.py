"""The transcript: user messages and replies whose tokens are coloured by how they were made."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Size
from textual.visual import visualize
from textual.widget import Widget
from textual.widgets import Markdown, Static

from specchat.engine.events import SummaryEvent, TokenEvent
from specchat.ui.store import reply_figures

CURSOR = "▌"
RESERVE_LINES = 2
"""Spare lines a streaming block keeps below its text, so it reflows every few lines."""


def styles_of(widget: Widget) -> dict[str, Style]:
    """The app's current token styles (they follow the theme)."""
    return getattr(widget.app, "token_styles", {})


def theme_key(widget: Widget) -> str:
    return str(getattr(widget.app, "theme", ""))


class TokenText(Widget):
    """One block of a reply as provenance-coloured text (see :class:`ReplyText`)."""

    DEFAULT_CSS = """
    TokenText { height: auto; width: 1fr; }
    """

    def __init__(self, *, streaming: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._runs: list[list[str]] = []
        self.chars = 0
        self._line_cells: list[int] = []
        """Cell widths of the finished lines (for a cheap line estimate)."""
        self._last_cells = 0
        self.streaming = streaming
        self.empty_note = False
        self._cache: tuple[tuple[object, ...], Text] | None = None

    @property
    def runs(self) -> list[tuple[str, str]]:
        return [(kind, text) for kind, text in self._runs]

    def add(self, kind: str, text: str) -> None:
        if not text:
            return
        self.chars += len(text)
        first, *rest = text.split("\n")
        self._last_cells += cell_len(first)
        for piece in rest:
            self._line_cells.append(self._last_cells)
            self._last_cells = cell_len(piece)
        if self._runs and self._runs[-1][0] == kind:
            self._runs[-1][1] += text
        else:
            self._runs.append([kind, text])

    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        self.refresh_cheaply()

    def refresh_cheaply(self) -> None:
        """Repaint only this block, unless its text needs more lines than it has (or ended).

        A layout pass reflows the whole screen, so while streaming the block keeps
        ``RESERVE_LINES`` spare lines (see :meth:`get_content_height`): most batches then
        repaint one widget, and the UI thread leaves the GIL to the decoding thread.
        """
        width = self.content_size.width
        if width <= 0 or not self.is_mounted:
            self.refresh(layout=True)
            return
        if self.streaming and self._fewest_lines(width) < self.content_size.height:
            self.refresh()  # certainly fits: skip measuring the wrapped text
            return
        needed = visualize(self, self.render()).get_height(self.styles, width)  # type: ignore[arg-type]
        fits = needed <= self.content_size.height if self.streaming else needed == self.content_size.height
        self.refresh(layout=not fits)

    def _fewest_lines(self, width: int) -> int:
        """Lines the text needs at least (wrapping at characters; word wrap may need more)."""
        lines = sum(max(1, -(-cells // width)) for cells in self._line_cells)
        return lines + max(1, -(-(self._last_cells + 1) // width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        height = super().get_content_height(container, viewport, width)
        if self.streaming and height > 1:
            return height + RESERVE_LINES
        return height

    def render(self) -> Text:
        key = (len(self._runs), self.chars, self.streaming, self.empty_note, theme_key(self))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        styles = styles_of(self)
        text = Text(end="")
        for kind, chunk in self._runs:
            text.append(chunk, styles.get(kind))
        if self.streaming:
            text.append(CURSOR, Style(dim=True))
        elif self.empty_note:
            text.append("(no text)", Style(dim=True, italic=True))
        self._cache = (key, text)
        return text


class ReplyText(Vertical):
    """A reply's tokens, coloured by kind, in blocks that stop re-rendering once full.

    Only the last block changes while a reply streams, so each frame costs the same however
    long the reply grows. A block closes at a line break once it holds ``BLOCK_CHARS``
    characters; that line break is the boundary between blocks.
    """

    BLOCK_CHARS = 400

    DEFAULT_CSS = """
    ReplyText { height: auto; }
    """

    def __init__(self, tokens: Iterable[TokenEvent] = (), *, streaming: bool = False) -> None:
        super().__init__()
        self.streaming = streaming
        self.tokens: list[TokenEvent] = []
        self._blocks: list[TokenText] = [TokenText(streaming=streaming)]
        self._add(tokens)
        self._blocks[-1].empty_note = not self.tokens and not streaming

    def compose(self) -> ComposeResult:
        yield from self._blocks

    @property
    def plain(self) -> str:
        return "".join(t.text for t in self.tokens)

    @property
    def runs(self) -> list[tuple[str, str]]:
        """(kind, text) runs over the whole reply: consecutive tokens of one kind merged."""
        runs: list[list[str]] = []
        for token in self.tokens:
            if not token.text:
                continue
            if runs and runs[-1][0] == token.kind:
                runs[-1][1] += token.text
            else:
                runs.append([token.kind, token.text])
        return [(kind, text) for kind, text in runs]

    @property
    def blocks(self) -> list[TokenText]:
        return list(self._blocks)

    def render_text(self) -> Text:
        """The whole reply as one Text, joined as the blocks are shown (for tests)."""
        return Text("\n", end="").join(block.render() for block in self._blocks)

    def append(self, tokens: Iterable[TokenEvent]) -> None:
        before = len(self._blocks)
        last = self._blocks[-1]
        self._add(tokens)
        if len(self._blocks) > before:
            last.set_streaming(False)
            self.mount_all(self._blocks[before:])
        else:
            last.refresh_cheaply()

    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        last = self._blocks[-1]
        last.empty_note = not self.tokens and not streaming
        last.set_streaming(streaming)

    def _add(self, tokens: Iterable[TokenEvent]) -> None:
        for token in tokens:
            self.tokens.append(token)
            first, *rest = token.text.split("\n")
            self._blocks[-1].add(token.kind, first)
            for piece in rest:
                block = self._blocks[-1]
                if block.chars >= self.BLOCK_CHARS:
                    block.streaming = False
                    self._blocks.append(TokenText(streaming=self.streaming))
                else:
                    block.add(token.kind, "\n")
                self._blocks[-1].add(token.kind, piece)


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { height: auto; }
    """

    def __init__(self, content: str) -> None:
        super().__init__(Text(content), markup=False)
        self.border_title = "you"
        self.text = content


class SystemNote(Static):
    """The system prompt, shown dim at the top of the transcript."""

    def __init__(self, prompt: str) -> None:
        super().__init__(markup=False)
        self.set_prompt(prompt)

    def set_prompt(self, prompt: str) -> None:
        self.prompt = prompt
        shown = " ".join(prompt.split()) or "(none)"
        self.update(Text.assemble(("system  ", "bold"), shown))


class Notice(Static):
    """An error or a note inside the transcript."""

    def __init__(self, message: str, *, error: bool = True) -> None:
        super().__init__(Text(message), markup=False)
        self.set_class(error, "-error")


class AssistantMessage(Vertical):
    """One reply: coloured tokens while streaming; afterwards coloured or Markdown, plus figures."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; }
    AssistantMessage > .figures { height: auto; }
    """

    def __init__(
        self,
        tokens: Iterable[TokenEvent] = (),
        *,
        streaming: bool = False,
        summary: SummaryEvent | None = None,
        settings: dict[str, Any] | None = None,
        error: str | None = None,
        markdown: bool = False,
    ) -> None:
        super().__init__()
        self.border_title = "assistant"
        self.tokens = ReplyText(tokens, streaming=streaming)
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
        return self.tokens.plain

    def append(self, tokens: Iterable[TokenEvent]) -> None:
        self.tokens.append(tokens)

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
            parts.append(f"error: {self._error}")
        self.figures.update(Text("  ".join(parts), style="dim"))
        self.figures.display = bool(parts)

    def set_view(self, markdown: bool) -> None:
        """Markdown for a finished reply, provenance colours otherwise (always while streaming)."""
        self.want_markdown = markdown
        show_markdown = markdown and self.finished
        if show_markdown and self._markdown is None:
            self._markdown = Markdown(self.text)
            self.mount(self._markdown, before=self.figures)
        if self._markdown is not None:
            self._markdown.display = show_markdown
        self.tokens.display = not show_markdown
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
