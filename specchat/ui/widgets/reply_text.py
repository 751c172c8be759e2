"""A reply's tokens, coloured by how they were made, in blocks that stop re-rendering once full.

A reply also shows, in place, the drafts each round threw away: after the round's accepted
prefix, the rejected draft tokens struck through and dimmed, then the correction that replaced
them (the palette's ``show_rejected`` hides them). Every token carries its index in the
reply as style metadata, so a mouse click finds the token under it for the inspector.

A thinking model's reasoning (tokens the engine marked ``reasoning``) sits above the answer in a
:class:`ReasoningFold`: folded, one line with its size and its own α; unfolded (the reasoning key,
or a click on that line), its tokens in the same provenance colours as the answer's.
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
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.visual import visualize
from textual.widget import Widget
from textual.widgets import Static

from specchat.engine.display import REJECTED, Shown, ShownKind, display_order
from specchat.engine.events import Event, RoundEvent, TokenEvent, TokenKind
from specchat.engine.metrics import SectionStats
from specchat.engine.reasoning import answer_text
from specchat.store.markdown import fmt
from specchat.ui.settings.themes import TokenPalette
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

    kind: ShownKind
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

    def __init__(
        self, palette: TokenPalette, *, streaming: bool = False, trim_end: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.palette = palette
        self.trim_end = trim_end
        """Draw no line breaks at the end (the reasoning's blank line before the answer)."""
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
    def runs(self) -> list[tuple[ShownKind, str]]:
        """(kind, text) of the reply's own text, consecutive pieces of one kind merged."""
        runs: list[tuple[ShownKind, str]] = []
        for piece in self.pieces:
            if piece.kind == REJECTED:
                continue
            if runs and runs[-1][0] == piece.kind:
                runs[-1] = (piece.kind, runs[-1][1] + piece.text)
            else:
                runs.append((piece.kind, piece.text))
        return runs

    def tokens_shown(self) -> set[int]:
        return {piece.token for piece in self.pieces if piece.token is not None and piece.kind != REJECTED}

    def add(self, kind: ShownKind, text: str, token: int | None = None) -> None:
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
        while self.trim_end and text.plain.endswith("\n"):
            text.right_crop(1)
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


class BlockRun:
    """The blocks of one part of a reply (its answer, or its reasoning), in order: tokens go to the
    last block, which closes at a line break once it holds ``BLOCK_CHARS`` characters."""

    def __init__(self, palette: TokenPalette, *, streaming: bool, trim_end: bool = False) -> None:
        self.palette = palette
        self.streaming = streaming
        self.trim_end = trim_end
        self.blocks: list[TokenText] = [self._block()]

    def _block(self) -> TokenText:
        return TokenText(self.palette, streaming=self.streaming, trim_end=self.trim_end)

    @property
    def last(self) -> TokenText:
        return self.blocks[-1]

    def add(self, kind: ShownKind, text: str, index: int, block_chars: int) -> TokenText:
        """Add one token's text; the block where it starts."""
        first, *rest = text.split("\n")
        start = self.last
        start.add(kind, first, index)
        for piece in rest:
            block = self.last
            if block.chars >= block_chars:
                block.streaming = False
                self.blocks.append(self._block())
            else:
                block.add(kind, "\n", index)
            self.last.add(kind, piece, index)
        return start


class ReasoningFold(Vertical):
    """A reply's reasoning: folded, one line (its tokens and its own α); open, the tokens."""

    DEFAULT_CSS = """
    ReasoningFold { height: auto; }
    ReasoningFold > .fold-line { height: auto; color: $text-muted; text-style: italic; }
    ReasoningFold > .fold-body { height: auto; display: none; padding: 0 0 0 2; }
    ReasoningFold.-open > .fold-body { display: block; margin-bottom: 1; }
    ReasoningFold.-open > .fold-line { margin-bottom: 1; }
    """

    def __init__(self, run: BlockRun, key: str, *, open_: bool) -> None:
        super().__init__()
        self.run = run
        self.key = key
        self.is_open = open_
        self.line = Static("", classes="fold-line", markup=False)
        self.body: Vertical | None = None
        self._mounted_blocks = 0
        self.set_class(open_, "-open")

    def compose(self) -> ComposeResult:
        yield self.line
        self.body = Vertical(*self.run.blocks, classes="fold-body")
        self._mounted_blocks = len(self.run.blocks)
        yield self.body

    def sync(self) -> None:
        """Mount the blocks the run gained since (compose takes all there are), or repaint its last."""
        if self.body is None:
            return
        new = self.run.blocks[self._mounted_blocks :]
        if new:
            self._mounted_blocks = len(self.run.blocks)
            self.body.mount_all(new)
        else:
            self.run.last.refresh_cheaply()

    def set_open(self, open_: bool) -> None:
        self.is_open = open_
        self.set_class(open_, "-open")

    def describe(self, tokens: int, alpha: float | None, thinking: bool) -> None:
        """The folded line: ▸ reasoning · 312 tokens · α 0.71 · Ctrl+D shows it."""
        mark = "▾" if self.is_open else "▸"
        what = "thinking…" if thinking else "reasoning"
        noun = "token" if tokens == 1 else "tokens"
        hint = f" · {self.key} {'folds' if self.is_open else 'shows'} it" if self.key else ""
        self.line.update(Text(f"{mark} {what} · {tokens} {noun} · α {fmt(alpha)}{hint}"))

    def on_click(self, event: events.Click) -> None:
        if self.line in (event.widget, getattr(event.widget, "parent", None)):
            event.stop()
            self.post_message(self.Toggled(self))

    class Toggled(Message):
        """The folded line was clicked."""

        def __init__(self, fold: ReasoningFold) -> None:
            super().__init__()
            self.fold = fold


class ReplyText(Vertical):
    """A reply's tokens, coloured by kind, in blocks that stop re-rendering once full.

    Only the last block changes while a reply streams, so each frame costs the same however
    long the reply grows. A block closes at a line break once it holds ``BLOCK_CHARS``
    characters; that line break is the boundary between blocks. Reasoning tokens go to their
    own run of blocks inside a :class:`ReasoningFold`, mounted above the answer's when the
    first arrives; token indices count both, in stream order.

    It takes the reply's events in stream order (each round's tokens, then its RoundEvent) and
    shows them in display order (:func:`~specchat.engine.display.display_order`: a correction
    waits for its RoundEvent, so that the drafts it replaced can be shown before it).
    """

    BLOCK_CHARS = 400

    DEFAULT_CSS = """
    ReplyText { height: auto; }
    ReplyText.-markdown > TokenText { display: none; }
    """

    def __init__(
        self,
        events: Iterable[Event] = (),
        *,
        streaming: bool = False,
        palette: TokenPalette | None = None,
        reasoning_key: str = "",
        reasoning_open: bool = False,
    ) -> None:
        super().__init__()
        self.palette = palette if palette is not None else TokenPalette()
        self.streaming = streaming
        self.tokens: list[TokenEvent] = []
        self.rounds: dict[int, RoundEvent] = {}
        self.sections = SectionStats()
        """Reasoning and answer counted apart (the fold's line shows the reasoning's)."""
        self._held: TokenEvent | None = None
        self._block_of: list[TokenText] = []
        """For each token, the block where its text starts."""
        self._answer = BlockRun(self.palette, streaming=streaming)
        self._reasoning: BlockRun | None = None
        self.fold: ReasoningFold | None = None
        self._reasoning_key = reasoning_key
        self._reasoning_open = reasoning_open
        self._add(events)
        self._answer.last.empty_note = not self.answer and not streaming
        self._describe_fold()
        self.cursor: int | None = None

    def compose(self) -> ComposeResult:
        if self.fold is not None:
            yield self.fold
        yield from self._answer.blocks

    @property
    def plain(self) -> str:
        """The whole reply's text (reasoning included)."""
        return "".join(t.text for t in self.tokens)

    @property
    def answer(self) -> str:
        return answer_text(self.tokens)

    @property
    def runs(self) -> list[tuple[TokenKind, str]]:
        """(kind, text) runs over the whole reply: consecutive tokens of one kind merged."""
        runs: list[tuple[TokenKind, str]] = []
        for token in self.tokens:
            if not token.text:
                continue
            if runs and runs[-1][0] == token.kind:
                runs[-1] = (token.kind, runs[-1][1] + token.text)
            else:
                runs.append((token.kind, token.text))
        return runs

    @property
    def blocks(self) -> list[TokenText]:
        """Every block: the reasoning's, then the answer's."""
        reasoning = self._reasoning.blocks if self._reasoning is not None else []
        return [*reasoning, *self._answer.blocks]

    @property
    def reasoning_open(self) -> bool:
        return self.fold is not None and self.fold.is_open

    def shows(self, index: int) -> bool:
        """Whether the token at ``index`` is on screen: answer tokens always, reasoning unfolded."""
        return not self.tokens[index].reasoning or self.reasoning_open

    def set_reasoning_open(self, open_: bool) -> None:
        """Unfold or fold the reasoning (the next reasoning to arrive follows it too)."""
        self._reasoning_open = open_
        if self.fold is not None:
            self.fold.set_open(open_)
            self._describe_fold()

    def render_text(self) -> Text:
        """The whole reply as one Text, joined as the blocks are shown (for tests)."""
        return Text("\n", end="").join(block.render() for block in self.blocks)

    def rejected_text(self) -> str:
        """Every rejected draft as shown in place, in order (for tests)."""
        return "".join(p.text for b in self.blocks for p in b.pieces if p.kind == REJECTED)

    def append(self, events: Iterable[Event]) -> None:
        answer_before = len(self._answer.blocks)
        fold_before = self.fold
        last = self._answer.last
        self._add(events)
        if self.fold is not None and fold_before is None:
            self.mount(self.fold, before=self._answer.blocks[0])
        elif self.fold is not None:
            self.fold.sync()
        if len(self._answer.blocks) > answer_before:
            last.set_streaming(False)
            self.mount_all(self._answer.blocks[answer_before:])
        else:
            last.refresh_cheaply()
        self._describe_fold()

    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        if not streaming:
            # A round that never closed (an error): its correction still belongs to the reply.
            shown, self._held = display_order((), self._held, final=True)
            self._show(shown)
        last = self._answer.last
        last.empty_note = not self.answer and not streaming
        last.set_streaming(streaming)
        self._describe_fold()

    def set_cursor(self, index: int | None) -> None:
        """Highlight the token at ``index`` (None: no cursor)."""
        self.cursor = index
        for block in self.blocks:
            block.set_cursor(index if index is not None and index in block.tokens_shown() else None)

    def block_of(self, index: int) -> TokenText:
        return self._block_of[index]

    def round_of(self, index: int) -> RoundEvent | None:
        return self.rounds.get(self.tokens[index].round)

    def _describe_fold(self) -> None:
        if self.fold is None:
            return
        reasoning = self.sections.reasoning
        thinking = self.streaming and bool(self.tokens) and self.tokens[-1].reasoning
        self.fold.describe(reasoning.tokens, reasoning.alpha, thinking)

    def _run_for(self, reasoning: bool) -> BlockRun:
        if not reasoning:
            return self._answer
        if self._reasoning is None:
            # Reasoning blocks never show the streaming cursor: the answer's block keeps it.
            self._reasoning = BlockRun(self.palette, streaming=False, trim_end=True)
            self.fold = ReasoningFold(self._reasoning, self._reasoning_key, open_=self._reasoning_open)
        return self._reasoning

    def _add(self, events: Iterable[Event]) -> None:
        events = list(events)
        for event in events:
            if isinstance(event, TokenEvent | RoundEvent):
                self.sections.add(event)
        shown, self._held = display_order(events, self._held)
        self._show(shown)

    def _show(self, shown: Iterable[Shown]) -> None:
        """Draw the reply's next tokens and closed rounds, in display order (see display_order)."""
        for item in shown:
            if isinstance(item, TokenEvent):
                self._add_token(item)
                continue
            self.rounds[item.round.round] = item.round
            correction = item.correction
            replaced_by = len(self.tokens) if correction is not None else None
            last_reasoning = bool(self.tokens and self.tokens[-1].reasoning)
            run = self._run_for(correction.reasoning if correction is not None else last_reasoning)
            for draft in item.round.rejected:
                run.last.add(REJECTED, draft.text.translate(SHOWN_BREAKS), replaced_by)
            if correction is not None:
                self._add_token(correction)

    def _add_token(self, token: TokenEvent) -> None:
        index = len(self.tokens)
        self.tokens.append(token)
        run = self._run_for(token.reasoning)
        self._block_of.append(run.add(token.kind, token.text, index, self.BLOCK_CHARS))
