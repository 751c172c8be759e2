"""The token inspector: one token's figures, from the round that produced it.

For any token of a reply it shows its kind, round and position, then the acceptance test as
the paper writes it: p_target (p), p_draft (q), min(1, p/q), the uniform draw u and the
verdict. At T = 0 the test is argmax equality, so there it shows each model's own softmax
probability of the draft (temperature 1) beside that rule instead; at T > 0 it adds the same
own figures under the shaped ones the test used. A lookup draft has no probability: it says
so. For a correction it adds the draft token it replaced and the residual norm(max(p − q, 0))'s
top five as bars; for a bonus or plain target token, the target's top five. Everything comes
from the reply's events (contract v2); replies saved before the trace existed say so instead
of showing invented numbers.

The panel owns the cursor: a (reply, token) position moved by its own keys (←/→ by token, ↑/↓
by round, Home/End to the reply's ends, Esc leaves; it takes the focus while inspecting), by the
inspect key or by a click on a token, shown reversed in the transcript and described here through
``live.inspected``. The cursor walks the tokens on screen: a folded reasoning's are skipped, an
unfolded one's are inspected like the answer's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import Static

from specchat.engine.display import REJECTED
from specchat.engine.events import Candidate, DraftTrace, RoundEvent, TokenEvent, known
from specchat.engine.registry import is_lookup
from specchat.presenters.kind_labels import KIND_LABELS
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.live import Inspected, LiveStats
from specchat.ui.widgets.cursor_walk import Cursor, last_position, moved_cursor, positions
from specchat.untrusted import has_controls, visible

if TYPE_CHECKING:
    from specchat.ui.widgets.reply_text import TokenText
    from specchat.ui.widgets.transcript import AssistantMessage, Transcript

BAR_WIDTH = 24
TOP_SHOWN = 5
DRAWN_FROM = {
    "draft": "drawn by the drafter, kept by the target's test",
    "target": "drawn from the target's distribution p",
    "residual": "drawn from the residual norm(max(p − q, 0))",
}
SHOWN_BREAKS = str.maketrans({"\n": "↵", "\t": "→", "\r": "␍"})


def shown(text: str) -> str:
    """A token's text, quoted, with line breaks, tabs and control characters visible."""
    return f"“{visible(text.translate(SHOWN_BREAKS))}”"


NEAR_ONE_DIGITS = 6
"""Most decimals shown for a probability just below 1."""


def prob(value: float | None) -> str:
    """A probability: three decimals, scientific notation below 0.001, and just below 1 as
    many decimals as it takes not to read 1.000 (a sure model is not a one-hot row)."""
    if value is None or not known(value):
        return "–"
    if 0 < value < 0.001:
        return f"{value:.1e}"
    if 0.9995 <= value < 1.0:
        for digits in range(4, NEAR_ONE_DIGITS + 1):
            if (shown := f"{value:.{digits}f}") != f"{1:.{digits}f}":
                return shown
        return f">{1 - 10**-NEAR_ONE_DIGITS:.{NEAR_ONE_DIGITS}f}"
    return f"{value:.3f}"


def greedy_test(draft: DraftTrace) -> bool:
    """Whether the draft was judged at T = 0 (argmax equality): a tested draft without a draw."""
    return draft.u is None and draft.verdict != "untested"


def own_target(draft: DraftTrace) -> float:
    """The target's own softmax of the draft; at T = 0 a v2 trace's p_target is exactly that."""
    if known(draft.p_target_own) or not greedy_test(draft):
        return draft.p_target_own
    return draft.p_target


def own_draft(draft: DraftTrace, drafter: str) -> float | None:
    """The draft model's own softmax of the draft; None for a lookup, which has none."""
    if is_lookup(drafter):
        return None
    if known(draft.p_draft_own) or not greedy_test(draft):
        return draft.p_draft_own
    return draft.p_draft  # a v2 trace at T = 0: the draft model's plain softmax


def verdict_words(draft: DraftTrace) -> str:
    """Why the test decided as it did, in the paper's terms."""
    if draft.verdict == "untested":
        return "untested: an earlier draft of the round was rejected"
    if draft.u is None:  # T = 0: the test is argmax equality
        # min(1, p/q) of the softmaxes is what a T = 1 test would accept it with: worth a line.
        at_one = f" · at T = 1: min(1, p/q) = {prob(draft.accept_prob)}"
        if draft.verdict == "accepted":
            return f"accepted: it is the target's most likely token (T = 0){at_one}"
        return f"rejected: the target's most likely token differs (T = 0){at_one}"
    if draft.verdict == "accepted":
        return f"accepted: u = {draft.u:.3f} < min(1, p/q) = {draft.accept_prob:.3f}"
    return f"rejected: u = {draft.u:.3f} ≥ min(1, p/q) = {draft.accept_prob:.3f}"


def draft_of(inspected: Inspected) -> DraftTrace | None:
    """The drafted token the inspected one stands on: itself (accepted) or the one it replaced."""
    token, round_event = inspected.token, inspected.round
    if round_event is None or token.kind not in ("accepted", "correction"):
        return None
    if token.position < len(round_event.drafts):
        return round_event.drafts[token.position]
    return None


def bars(candidates: tuple[Candidate, ...], drawn: int, style: Style | None) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True, min_width=8)
    table.add_column(no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(no_wrap=True)
    for candidate in candidates[:TOP_SHOWN]:
        eighths = round(max(0.0, min(1.0, candidate.p)) * BAR_WIDTH * 8)
        full, part = divmod(eighths, 8)
        bar = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")
        track = "░" * (BAR_WIDTH - len(bar))
        mark = "◀ drawn" if candidate.token_id == drawn else ""
        table.add_row(
            Text(shown(candidate.text)),
            Text.assemble((bar, style or ""), (track, "dim")),
            prob(candidate.p),
            Text(mark, "bold"),
        )
    return table


class InspectorPanel(Static, can_focus=True):
    """The figures of the token under the cursor (see the module's docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move('token', -1)", "Token ←", show=False),
        Binding("right", "move('token', 1)", "Token →", show=False),
        Binding("up", "move('round', -1)", "Round ↑", show=False),
        Binding("down", "move('round', 1)", "Round ↓", show=False),
        Binding("home", "move('end', -1)", "First token", show=False),
        Binding("end", "move('end', 1)", "Last token", show=False),
        Binding("escape", "leave", "Leave the inspector", show=False),
    ]

    def __init__(
        self,
        palette: TokenPalette,
        live: LiveStats | None = None,
        transcript: Callable[[], Transcript] | None = None,
        *,
        changed: Callable[[], object] = lambda: None,
        left: Callable[[], object] = lambda: None,
        **kwargs: Any,
    ) -> None:
        """``transcript`` gives the replies the cursor walks, ``live`` takes what it is on;
        ``changed`` redraws the panels, ``left`` runs when inspecting stops (the chat's screen
        focuses the message box). A panel made with the palette alone only describes tokens."""
        super().__init__("", **kwargs)
        self.border_title = "token inspector · ←/→ token · ↑/↓ round · Home/End · Esc leaves"
        self.palette = palette
        self.live = live if live is not None else LiveStats()
        self._transcript = transcript
        self.changed = changed
        self.left = left
        self.inspected: Inspected | None = None
        self._drawn: tuple[object, ...] | None = None
        self.cursor: Cursor | None = None
        """The inspected token; None when not inspecting."""

    # ---------------------------------------------------------------- the cursor

    def toggle_inspecting(self) -> None:
        """The inspect key: put the cursor on the reply, or leave the inspector."""
        if self.cursor is not None:
            self.stop_inspecting()
        else:
            self.start_inspecting()

    def start_inspecting(self) -> bool:
        """Put the cursor on the last token (or keep it) and take the focus."""
        if self.cursor is None:
            last = last_position(self._replies())
            if last is None:
                self.notify("No reply to inspect yet.")
                return False
            self.cursor = last
        self._show_cursor()
        self.focus()
        return True

    def inspect_token(self, reply_index: int, token_index: int) -> None:
        """Put the cursor on one token (a reply's index, the token's index in it)."""
        if self.cursor is not None:
            self._reply(self.cursor[0]).tokens.set_cursor(None)
        self.cursor = (reply_index, token_index)
        self._show_cursor()
        self.focus()

    def inspect_clicked(self, block: TokenText, index: int) -> None:
        """A click on a token of ``block``: inspect it."""
        replies = self._replies()
        owner = next((i for i, r in enumerate(replies) if block in r.tokens.blocks), None)
        if owner is not None:
            self.inspect_token(owner, index)

    def stop_inspecting(self) -> None:
        if self.cursor is not None:
            self._reply(self.cursor[0]).tokens.set_cursor(None)
        self.cursor = None
        self.live.inspect(None)
        self.changed()
        self.left()

    def action_move(self, unit: str, step: int) -> None:
        """Move the cursor: by ``step`` tokens, rounds, or to an end of the reply."""
        if self.cursor is None:
            return
        moved = moved_cursor(list(positions(self._replies())), self.cursor, unit, step)
        if moved is not None:
            self._reply(self.cursor[0]).tokens.set_cursor(None)
            self.cursor = moved
            self._show_cursor()

    def action_leave(self) -> None:
        self.stop_inspecting()

    def hide_if_folded(self) -> None:
        """A cursor on reasoning just folded away moves to the reply's first token on screen."""
        if self.cursor is None:
            return
        reply_index, token_index = self.cursor
        text = self._reply(reply_index).tokens
        if text.shows(token_index):
            return
        text.set_cursor(None)
        shown = [i for i, t in enumerate(text.tokens) if t.text and text.shows(i)]
        if not shown:
            self.stop_inspecting()
            return
        self.cursor = (reply_index, shown[0])
        self._show_cursor()

    def describe_cursor(self) -> None:
        """Tell the live object what the cursor is on (a streaming round may have been verified
        since); a cursor whose token is gone (the transcript was replaced) is dropped."""
        if self.cursor is None:
            return
        reply_index, token_index = self.cursor
        replies = self._replies()
        if reply_index >= len(replies) or token_index >= len(replies[reply_index].tokens.tokens):
            self.cursor = None
            self.live.inspect(None)
            return
        text = replies[reply_index].tokens
        token, round_event = shown_token(text.tokens[token_index]), text.round_of(token_index)
        self.live.inspect(
            Inspected(token, shown_round(round_event) if round_event else None, reply_index, token_index)
        )

    def _replies(self) -> list[AssistantMessage]:
        assert self._transcript is not None, "a panel made without a transcript has no cursor"
        return self._transcript().replies()

    def _reply(self, index: int) -> AssistantMessage:
        return self._replies()[index]

    def _show_cursor(self) -> None:
        assert self.cursor is not None and self._transcript is not None
        reply_index, token_index = self.cursor
        reply = self._reply(reply_index)
        reply.tokens.set_cursor(token_index)
        self._transcript().scroll_to_widget(reply.tokens.block_of(token_index), animate=False)
        self.describe_cursor()
        self.changed()

    # ---------------------------------------------------------------- drawing

    def show_live(self, live: LiveStats, force: bool = False) -> None:
        inspected = live.inspected
        self.display = inspected is not None
        drawn = (inspected, self.palette.version)
        if (drawn == self._drawn and not force) or inspected is None:
            self._drawn = drawn
            return
        self._drawn = drawn
        self.inspected = inspected
        self.update(self.describe(inspected))

    def describe(self, inspected: Inspected) -> RenderableType:
        token, round_event = inspected.token, inspected.round
        styles = self.palette.styles
        kind_style = styles.get(token.kind)
        head = Text.assemble(
            (f" {KIND_LABELS[token.kind]} ", kind_style or ""),
            " ",
            (shown(token.text), "bold"),
            (
                f"   round {token.round + 1} · position {token.position + 1} · token {inspected.index + 1}"
                + (" · reasoning" if token.reasoning else ""),
                "dim",
            ),
        )
        parts: list[RenderableType] = [head]
        if round_event is None:
            parts.append(Text("round not verified yet", "dim"))
            return Group(*parts)
        if not round_event.drafts and round_event.drafted and token.kind != "target":
            parts.append(self._no_trace(token))
            return Group(*parts)
        draft = draft_of(inspected)
        if token.kind == "accepted" and draft is not None:
            parts.append(Text(DRAWN_FROM["draft"], "dim"))
            parts.append(self._test_table(draft, round_event.drafter, styles.get("accepted") or ""))
        elif token.kind == "correction":
            parts.append(Text(DRAWN_FROM.get(token.drawn_from, ""), "dim"))
            if draft is not None:
                parts.append(
                    Text.assemble(
                        "it replaced the draft ",
                        (shown(draft.text), styles.get(REJECTED) or "strike"),
                        f" (round {round_event.round + 1}, position {token.position + 1}):",
                    )
                )
                parts.append(self._test_table(draft, round_event.drafter, styles.get(REJECTED) or "strike"))
            parts.extend(
                self._top(
                    token, "the residual's top 5" if token.drawn_from == "residual" else "the target's top 5"
                )
            )
        else:
            why = (
                f"all {round_event.drafted} drafts passed: the target's extra position"
                if token.kind == "bonus"
                else "nothing was drafted this round: a plain target step"
            )
            parts.append(Text(f"{why}; {DRAWN_FROM['target']}", "dim"))
            parts.append(Text.assemble("p_target ", (prob(token.p_target), "bold")))
            parts.extend(self._top(token, "the target's top 5"))
        return Group(*parts)

    def _test_table(self, draft: DraftTrace, drafter: str, style: Style | str) -> Table:
        """The test of one draft, compact enough for a narrow chat column: at T = 0 the rule
        (argmax match) beside each model's own softmax, at T > 0 the paper's min(1, p/q)."""
        grid = Table.grid()
        greedy = greedy_test(draft)
        row = self._greedy_row if greedy else self._sampled_row
        grid.add_row(row(draft, drafter, style))
        grid.add_row(Text(verdict_words(draft), "dim"))
        grid.add_row(Text(own_note(draft, drafter), "dim"))
        return grid

    @staticmethod
    def _greedy_row(draft: DraftTrace, drafter: str, style: Style | str) -> Table:
        table = _table("draft", "p (target, T = 1)", "q (draft, T = 1)", "rule at T = 0", "verdict")
        match = "argmax match" if draft.verdict == "accepted" else "argmax differs"
        q = own_draft(draft, drafter)
        table.add_row(
            Text(shown(draft.text), style),
            prob(own_target(draft)),
            "lookup" if q is None else prob(q),
            match,
            _verdict_text(draft),
        )
        return table

    @staticmethod
    def _sampled_row(draft: DraftTrace, drafter: str, style: Style | str) -> Table:
        table = _table("draft", "p = p_target", "q = p_draft", "min(1, p/q)", "u", "verdict")
        table.add_row(
            Text(shown(draft.text), style),
            prob(draft.p_target),
            prob(draft.p_draft) + (" (lookup)" if is_lookup(drafter) else ""),
            prob(draft.accept_prob),
            "–" if draft.u is None else f"{draft.u:.3f}",
            _verdict_text(draft),
        )
        return table

    def _top(self, token: TokenEvent, title: str) -> list[RenderableType]:
        if not token.top:
            return [Text("no top tokens recorded for this token", "dim")]
        style = self.palette.styles.get(token.kind)
        colour = Style(color=style.color) if style is not None and style.color is not None else None
        return [Text(title, "bold"), bars(token.top, token.token_id, colour)]

    @staticmethod
    def _no_trace(token: TokenEvent) -> Text:
        """A reply saved before the trace existed (or from a server): only what was recorded."""
        text = Text("no trace recorded for this round (saved before contract v2, or a server)", "dim")
        if known(token.p_target):
            text.append(f"\np_target {prob(token.p_target)}")
        if token.p_draft is not None and known(token.p_draft):
            ratio = token.p_target / token.p_draft if token.p_draft > 0 else math.inf
            text.append(f" · p_draft {prob(token.p_draft)} · min(1, p/q) {prob(min(1.0, ratio))}")
        return text


def _table(*columns: str) -> Table:
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True)
    return table


def _verdict_text(draft: DraftTrace) -> Text:
    return Text(draft.verdict, "bold" if draft.verdict == "accepted" else "bold red")


def own_note(draft: DraftTrace, drafter: str) -> str:
    """What p and q are: the models' own softmax at T = 0, the shaped rows the test used at T > 0."""
    lookup = "q: a lookup copies earlier text: no probability of its own (a one-hot row)"
    if greedy_test(draft):
        own = "p, q: each model's own softmax (T = 1); at T = 0 only the argmax decides"
        return own + (f"\n{lookup}" if is_lookup(drafter) else "")
    q = own_draft(draft, drafter)
    return (
        f"own softmax (T = 1, before temperature, top-k, top-p): target {prob(own_target(draft))} · "
        f"draft {'lookup' if q is None else prob(q)}"
    )


def shown_token(token: TokenEvent) -> TokenEvent:
    """``token`` with its text and its top candidates' made visible, for panels that quote them
    (the inspector, the step table): a model's or a server's text must not reach the terminal raw.
    The transcript keeps the events as they came; only what is shown changes."""
    if not has_controls(token.text) and not any(has_controls(c.text) for c in token.top):
        return token
    top = tuple(replace(c, text=visible(c.text)) for c in token.top)
    return replace(token, text=visible(token.text), top=top)


def shown_round(round_event: RoundEvent) -> RoundEvent:
    """``round_event`` with its drafts' texts made visible (see :func:`shown_token`)."""
    if not any(has_controls(d.text) for d in round_event.drafts):
        return round_event
    return replace(round_event, drafts=tuple(replace(d, text=visible(d.text)) for d in round_event.drafts))
