"""The transcript: user messages and replies whose tokens are coloured by how they were made.

A reply also shows, in place, the drafts each round threw away: after the round's accepted
prefix, the rejected draft tokens struck through and dimmed, then the correction that replaced
them (the palette's ``show_rejected`` hides them). Every token carries its index in the
reply as style metadata, so a mouse click finds the token under it for the inspector.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.visual import visualize
from textual.widget import Widget
from textual.widgets import Markdown, Static

from specchat.engine.events import Event, RoundEvent, SummaryEvent, TokenEvent
from specchat.ui.saved_conversations import reply_figures
from specchat.ui.themes import REJECTED, TokenPalette
from specchat.untrusted import visible

CURSOR = "▌"
RESERVE_LINES = 2
"""Spare lines a streaming block keeps below its text, so it reflows every few lines."""
CURSOR_STYLE = Style(reverse=True, bold=True)
SHOWN_BREAKS = str.maketrans({"\n": "↵", "\t": "→"})
"""A rejected draft never breaks the line it sits in: its line breaks and tabs show as arrows."""


@dataclass
class Piece:
    """A stretch of one token's text (a token split by a block boundary has two pieces)."""

    kind: str
    """A token kind, or REJECTED for a draft the round threw away."""
    text: str
    token: int | None
    """The token's index in the reply; for a rejected draft, the index of the correction
    that replaced it (None when a stop token ended the round instead)."""


class TokenText(Widget):
    """One block of a reply as provenance-coloured text (see :class:`ReplyText`)."""

    DEFAULT_CSS = """
    TokenText { height: auto; width: 1fr; }
    """

    class Clicked(Message):
        """A token was clicked: its index in the reply."""

        def __init__(self, block: TokenText, index: int) -> None:
            super().__init__()
            self.block = block
            self.index = index

    def __init__(self, palette: TokenPalette, *, streaming: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.palette = palette
        self.pieces: list[Piece] = []
        self.chars = 0
        self._line_cells: list[int] = []
        """Cell widths of the finished lines (for a cheap line estimate)."""
        self._last_cells = 0
        self.streaming = streaming
        self.empty_note = False
        self.cursor: int | None = None
        """The inspected token's index, when it lies in this block."""
        self._cache: tuple[tuple[object, ...], Text] | None = None

    @property
    def runs(self) -> list[tuple[str, str]]:
        """(kind, text) of the reply's own text, consecutive pieces of one kind merged."""
        runs: list[list[str]] = []
        for piece in self.pieces:
            if piece.kind == REJECTED:
                continue
            if runs and runs[-1][0] == piece.kind:
                runs[-1][1] += piece.text
            else:
                runs.append([piece.kind, piece.text])
        return [(kind, text) for kind, text in runs]

    def tokens_shown(self) -> set[int]:
        return {piece.token for piece in self.pieces if piece.token is not None and piece.kind != REJECTED}

    def add(self, kind: str, text: str, token: int | None = None) -> None:
        if not text:
            return
        # A model's or a server's text: its control characters are shown (ESC as ^[), never
        # written to the terminal, where they would clear the screen or set the clipboard.
        text = visible(text)
        self.chars += len(text)
        # Rejected drafts count toward the line estimate even while hidden: an estimate that
        # is too high only makes the block measure itself, never overflow.
        first, *rest = text.split("\n")
        self._last_cells += cell_len(first)
        for piece in rest:
            self._line_cells.append(self._last_cells)
            self._last_cells = cell_len(piece)
        self.pieces.append(Piece(kind, text, token))

    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        self.refresh_cheaply()

    def set_cursor(self, cursor: int | None) -> None:
        if cursor != self.cursor:
            self.cursor = cursor
            self.refresh()

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
        palette = self.palette
        key = (len(self.pieces), self.chars, self.streaming, self.empty_note, palette.version, self.cursor)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        text = Text(end="")
        for piece in self.pieces:
            if piece.kind == REJECTED and not palette.show_rejected:
                continue
            style = palette.get(piece.kind) or Style()
            if piece.token is not None:
                if piece.token == self.cursor and piece.kind != REJECTED:
                    style = style + CURSOR_STYLE
                style = style + Style.from_meta({"token": piece.token})
            text.append(piece.text, style)
        if self.streaming:
            text.append(CURSOR, Style(dim=True))
        elif self.empty_note:
            text.append("(no text)", Style(dim=True, italic=True))
        self._cache = (key, text)
        return text

    def on_click(self, event: events.Click) -> None:
        index = event.style.meta.get("token")
        if isinstance(index, int):
            event.stop()
            self.post_message(self.Clicked(self, index))


class ReplyText(Vertical):
    """A reply's tokens, coloured by kind, in blocks that stop re-rendering once full.

    Only the last block changes while a reply streams, so each frame costs the same however
    long the reply grows. A block closes at a line break once it holds ``BLOCK_CHARS``
    characters; that line break is the boundary between blocks.

    It takes the reply's events in stream order (each round's tokens, then its RoundEvent).
    A correction waits for its RoundEvent, which follows it at once, so that the drafts it
    replaced can be shown before it.
    """

    BLOCK_CHARS = 400

    DEFAULT_CSS = """
    ReplyText { height: auto; }
    """

    def __init__(
        self,
        events: Iterable[Event] = (),
        *,
        streaming: bool = False,
        palette: TokenPalette | None = None,
    ) -> None:
        super().__init__()
        self.palette = palette if palette is not None else TokenPalette()
        self.streaming = streaming
        self.tokens: list[TokenEvent] = []
        self.rounds: dict[int, RoundEvent] = {}
        self._held: TokenEvent | None = None
        self._block_of: list[int] = []
        """For each token, the index of the block where its text starts."""
        self._blocks: list[TokenText] = [TokenText(self.palette, streaming=streaming)]
        self._add(events)
        self._blocks[-1].empty_note = not self.tokens and not streaming
        self.cursor: int | None = None

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

    def rejected_text(self) -> str:
        """Every rejected draft as shown in place, in order (for tests)."""
        return "".join(p.text for b in self._blocks for p in b.pieces if p.kind == REJECTED)

    def append(self, events: Iterable[Event]) -> None:
        before = len(self._blocks)
        last = self._blocks[-1]
        self._add(events)
        if len(self._blocks) > before:
            last.set_streaming(False)
            self.mount_all(self._blocks[before:])
        else:
            last.refresh_cheaply()

    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        if not streaming and self._held is not None:
            # The round never closed (an error): the correction still belongs to the reply.
            self._add_token(self._held)
            self._held = None
        last = self._blocks[-1]
        last.empty_note = not self.tokens and not streaming
        last.set_streaming(streaming)

    def set_cursor(self, index: int | None) -> None:
        """Highlight the token at ``index`` (None: no cursor)."""
        self.cursor = index
        for block in self._blocks:
            block.set_cursor(index if index is not None and index in block.tokens_shown() else None)

    def block_of(self, index: int) -> TokenText:
        return self._blocks[self._block_of[index]]

    def round_of(self, index: int) -> RoundEvent | None:
        return self.rounds.get(self.tokens[index].round)

    def _add(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, TokenEvent):
                if event.kind == "correction":
                    self._flush_held()
                    self._held = event  # its RoundEvent comes next
                else:
                    self._flush_held()
                    self._add_token(event)
            elif isinstance(event, RoundEvent):
                self.rounds[event.round] = event
                held = self._held if self._held is not None and self._held.round == event.round else None
                self._flush_held(unless=held)
                replaced_by = len(self.tokens) if held is not None else None
                for draft in event.rejected:
                    self._blocks[-1].add(REJECTED, draft.text.translate(SHOWN_BREAKS), replaced_by)
                if held is not None:
                    self._held = None
                    self._add_token(held)

    def _flush_held(self, unless: TokenEvent | None = None) -> None:
        """A correction whose round never reported (an old reply, or a stream cut short)."""
        if self._held is not None and self._held is not unless:
            held, self._held = self._held, None
            self._add_token(held)

    def _add_token(self, token: TokenEvent) -> None:
        index = len(self.tokens)
        self.tokens.append(token)
        self._block_of.append(len(self._blocks) - 1)
        first, *rest = token.text.split("\n")
        self._blocks[-1].add(token.kind, first, index)
        for piece in rest:
            block = self._blocks[-1]
            if block.chars >= self.BLOCK_CHARS:
                block.streaming = False
                self._blocks.append(TokenText(self.palette, streaming=self.streaming))
            else:
                block.add(token.kind, "\n", index)
            self._blocks[-1].add(token.kind, piece, index)


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
    """The system prompt, shown dim at the top of the transcript."""

    def __init__(self, prompt: str) -> None:
        super().__init__(markup=False)
        self.set_prompt(prompt)

    def set_prompt(self, prompt: str) -> None:
        self.prompt = prompt
        shown = visible(" ".join(prompt.split())) or "(none)"
        self.update(Text.assemble(("system  ", "bold"), shown))


class Notice(Static):
    """An error or a note inside the transcript."""

    def __init__(self, message: str, *, error: bool = True) -> None:
        super().__init__(Text(visible(message)), markup=False)  # may quote a server
        self.set_class(error, "-error")


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
    ) -> None:
        super().__init__()
        self.border_title = "assistant"
        self.tokens = ReplyText(events, streaming=streaming, palette=palette)
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
