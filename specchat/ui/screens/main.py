"""The chat screen: transcript, token inspector, step table, legend, message box, live panels.

The screen owns the layout and the panels; the app owns the engine, the conversation and the
actions. Every panel receives the one :class:`~specchat.ui.state.live.LiveStats` on a timer (see
:meth:`MainScreen.refresh_panels`), so adding a panel means writing it and yielding it through
:meth:`MainScreen.panel` in ``compose``: nothing else changes.

The screen binds the chat's keys (:data:`~specchat.ui.settings.keys.APP_KEYS`) and runs their
actions: those that change only the screen (the inspector, reasoning) here, the others through
the controllers it is given (:class:`~specchat.ui.screens.chat_keys.ChatControllers`).

The screen also owns the inspector's cursor: a (reply, token) position moved by the
inspector's keys or a click on a token, shown reversed in the transcript, described in the
inspector panel through ``live.inspected``. The cursor walks the tokens on screen: a folded
reasoning's are skipped, an unfolded one's are inspected like the answer's. Whether reasoning
shows unfolded is the screen's too (the reasoning key; a click on one fold's line turns that one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header

from specchat.engine.events import ContextEvent, Event, RoundEvent, TokenEvent
from specchat.store.conversation import Conversation
from specchat.ui.screens.chat_keys import ChatControllers, ControlKeyActions, SetsControls
from specchat.ui.settings.keys import APP_KEYS, KEYS_BY_ID, KeySpec, bindings, display_key, effective_key
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.live import Inspected, LiveStats, replay
from specchat.ui.widgets.inspector import InspectorPanel
from specchat.ui.widgets.panels import CompactFigures, Legend, LivePanel, SidePanel
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.widgets.reply_text import ReasoningFold, TokenText
from specchat.ui.widgets.steps import StepPanel
from specchat.ui.widgets.transcript import (
    AssistantMessage,
    SystemNote,
    Transcript,
    UserMessage,
    left_out_notice,
)
from specchat.untrusted import has_controls, visible

PANEL_INTERVAL = 0.25
"""Seconds between panel refreshes while figures change."""
NARROW_WIDTH = 96
"""Below this many columns the side panel hides and a one-line summary shows instead."""

P = TypeVar("P", bound=LivePanel)


class MainScreen(ControlKeyActions, Screen[None]):
    """The chat (see the module's docstring)."""

    KEY_TABLE: ClassVar[tuple[KeySpec, ...]] = APP_KEYS
    BINDINGS: ClassVar[list[BindingType]] = bindings(APP_KEYS, on_screen=True)

    def __init__(
        self,
        live: LiveStats,
        palette: TokenPalette,
        system_prompt: str,
        keymap: dict[str, str] | None = None,
        *,
        controllers: ChatControllers,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.controllers = controllers
        """What the keys drive beyond this screen (the app's controllers)."""
        self.live = live
        self.palette = palette
        self.system_prompt = system_prompt
        self.keymap = keymap or {}
        self.panels: list[LivePanel] = []
        self.cursor: tuple[int, int] | None = None
        """The inspected token: (reply index, token index); None when not inspecting."""
        self.reasoning_open = False
        """Whether replies show their reasoning unfolded (new replies follow it)."""
        self.mounted = asyncio.Event()
        """Set once the screen's widgets exist (the app waits for it before starting)."""

    # ----------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        self.panels.clear()
        yield Header(icon="◆")
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(SystemNote(self.system_prompt), id="transcript")
                yield self.panel(InspectorPanel(self.palette, id="inspector"))
                yield self.panel(StepPanel(self.palette, id="steps"))
                yield self.panel(Legend(self.palette, id="legend"))
                yield self.panel(CompactFigures(id="compact-figures"))
                yield from self.compose_input()
            yield self.panel(SidePanel(self.palette, id="side"))
        yield Footer()

    def compose_input(self) -> ComposeResult:
        """What sits below the legend: the message box (the replay screen puts its bar there)."""
        yield PromptInput(self.keymap, id="prompt")

    def panel(self, panel: P) -> P:
        """Register a panel for the live refresh as it is composed."""
        self.panels.append(panel)
        return panel

    def on_mount(self) -> None:
        self.set_interval(PANEL_INTERVAL, self.refresh_panels)
        self.refresh_panels(force=True)
        self.mounted.set()

    def on_resize(self, event: events.Resize) -> None:
        # Narrow terminals give the transcript the whole width; one line of figures remains.
        self.set_class(event.size.width < NARROW_WIDTH, "-narrow")

    def refresh_panels(self, force: bool = False) -> None:
        """Every panel redraws from the live object if what it shows changed."""
        if not self.is_mounted:
            return
        try:
            if self.cursor is not None:
                self._describe_cursor()  # a streaming round may have been verified meanwhile
            for panel in self.panels:
                panel.show_live(self.live, force)
        except NoMatches:  # the app is closing and the panels' parts are already gone
            return

    # ---------------------------------------------------------- the chat's keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":  # shown only while a reply streams
            return True if self.controllers.replies.active is not None else None
        return True

    @property
    def control_rules(self) -> SetsControls:
        return self.controllers.control_keys

    def action_stop(self) -> None:
        self.controllers.replies.stop()

    async def action_regenerate(self) -> None:
        await self.controllers.chat.regenerate()

    async def action_clear(self) -> None:
        await self.controllers.chat.clear()

    def action_copy_reply(self) -> None:
        self.controllers.chat.copy_reply()

    def action_open_conversations(self) -> None:
        self.controllers.chat.open_conversations()

    def action_export_markdown(self) -> None:
        self.controllers.chat.export_markdown()

    def action_edit_system_prompt(self) -> None:
        self.controllers.chat.edit_system_prompt()

    def action_toggle_view(self) -> None:
        self.controllers.chat.toggle_view()

    def action_toggle_rejected(self) -> None:
        self.controllers.themes.toggle_rejected()

    def action_toggle_reasoning(self) -> None:
        """Unfold every reply's reasoning, or fold it back to one line."""
        shown = self.toggle_reasoning()
        if shown is None:
            self.notify(
                "No reasoning here yet: a thinking model's reasoning shows folded above its answer; "
                f"the next replies show it {'unfolded' if self.reasoning_open else 'folded'}."
            )
        else:
            self.notify("Reasoning unfolded." if shown else "Reasoning folded to one line.")

    def action_inspect(self) -> None:
        """Put the inspector's cursor on the reply (or leave the inspector)."""
        self.toggle_inspecting()

    def action_toggle_step_mode(self) -> None:
        self.controllers.step_keys.toggle()

    def action_step(self) -> None:
        self.controllers.step_keys.step()

    def action_best_gamma(self) -> None:
        self.controllers.control_keys.best_gamma(self.controllers.theory_tracker)

    def action_theory(self) -> None:
        self.controllers.talk_screens.toggle_theory()

    def action_race(self) -> None:
        self.controllers.talk_screens.race()

    def action_selftest(self) -> None:
        self.controllers.talk_screens.selftest()

    # ---------------------------------------------------------- transcript

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def reasoning_key(self) -> str:
        """The reasoning key as the user types it (after any remap), for the folded lines."""
        return display_key(effective_key(KEYS_BY_ID["reasoning"], self.keymap))

    def new_reply(self, *, markdown: bool) -> AssistantMessage:
        """Mount a reply that is about to stream, and follow it."""
        widget = AssistantMessage(
            streaming=True,
            markdown=markdown,
            palette=self.palette,
            reasoning_key=self.reasoning_key,
            reasoning_open=self.reasoning_open,
        )
        self.transcript.mount(widget)
        self.transcript.follow_new_reply()
        return widget

    def show_left_out(self, reply: AssistantMessage, event: ContextEvent) -> None:
        """Above a streaming reply: its prompt left out the conversation's oldest messages."""
        self.transcript.mount(left_out_notice(event.left_out, event.kept, event.context), before=reply)

    def show_rendering(self, rendering: str | None) -> None:
        """How the conversation becomes the prompt, under the system prompt (raw mode, or a model
        without a chat template); None: the model's own template, which needs no word."""
        for note in self.query(SystemNote):
            note.set_rendering(rendering)

    def toggle_reasoning(self) -> bool | None:
        """The reasoning key: unfold every reply's reasoning, or fold it. Returns whether it is
        now shown (None: no reply here has reasoning; the next ones follow the change anyway)."""
        self.reasoning_open = not self.reasoning_open
        replies = self.transcript.replies()
        for reply in replies:
            reply.tokens.set_reasoning_open(self.reasoning_open)
        self._hide_cursor_if_folded()
        if not any(reply.tokens.fold is not None for reply in replies):
            return None
        return self.reasoning_open

    @on(ReasoningFold.Toggled)
    def _toggle_one_fold(self, message: ReasoningFold.Toggled) -> None:
        for reply in self.transcript.replies():
            if reply.tokens.fold is message.fold:
                reply.tokens.set_reasoning_open(not message.fold.is_open)
        self._hide_cursor_if_folded()

    def _hide_cursor_if_folded(self) -> None:
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

    def show_events(self, reply: AssistantMessage, events: Sequence[Event]) -> None:
        """New events of a streaming reply (tokens and rounds, in stream order)."""
        reply.append(events)
        transcript = self.transcript
        if not transcript.is_anchored:
            transcript.call_after_refresh(transcript.follow)

    async def show_conversation(self, conversation: Conversation, *, markdown: bool) -> None:
        """Replace the transcript with a whole conversation (reopened, or cleared)."""
        self.stop_inspecting()
        transcript = self.transcript
        rendering = next((note.rendering for note in transcript.query(SystemNote)), None)
        await transcript.remove_children()
        widgets: list[Any] = [SystemNote(conversation.system_prompt, rendering)]
        for turn in conversation.turns:
            if turn.role == "user":
                widgets.append(UserMessage(turn.content))
            else:
                widgets.append(
                    AssistantMessage(
                        replay(turn),
                        palette=self.palette,
                        summary=turn.summary,
                        settings=turn.settings,
                        error=turn.error,
                        markdown=markdown,
                        reasoning_key=self.reasoning_key,
                        reasoning_open=self.reasoning_open,
                    )
                )
        await transcript.mount_all(widgets)
        transcript.restart()

    def redraw_tokens(self) -> None:
        """Repaint every reply (the palette changed: a theme, or rejected drafts shown/hidden)."""
        for block in self.query(TokenText):
            block.refresh(layout=True)
        self.refresh_panels(force=True)

    # ---------------------------------------------------------- inspector

    def start_inspecting(self) -> bool:
        """Put the cursor on the last token (or keep it) and focus the inspector."""
        if self.cursor is None:
            last = self._last_position()
            if last is None:
                self.notify("No reply to inspect yet.")
                return False
            self.cursor = last
        self._show_cursor()
        self.query_one(InspectorPanel).focus()
        return True

    def inspect_token(self, reply_index: int, token_index: int) -> None:
        """Put the inspector's cursor on one token (a reply's index, the token's index in it)."""
        if self.cursor is not None:
            self._reply(self.cursor[0]).tokens.set_cursor(None)
        self.cursor = (reply_index, token_index)
        self._show_cursor()
        self.query_one(InspectorPanel).focus()

    def toggle_inspecting(self) -> None:
        """The inspect key: put the cursor on the reply, or leave the inspector."""
        if self.cursor is not None:
            self.stop_inspecting()
        else:
            self.start_inspecting()

    def show_busy(self, busy: bool) -> None:
        """The message box while a reply streams: marked, and saying how to stop it."""
        self.prompt.set_class(busy, "-busy")
        self.prompt.border_title = "streaming · Esc stops" if busy else ""

    def stop_inspecting(self) -> None:
        if self.cursor is not None:
            self._reply(self.cursor[0]).tokens.set_cursor(None)
        self.cursor = None
        self.live.inspect(None)
        self.refresh_panels()
        self.focus_input()

    def focus_input(self) -> None:
        prompts = self.query(PromptInput)
        if prompts:
            prompts.first().focus()

    @on(InspectorPanel.Leave)
    def _leave_inspector(self) -> None:
        self.stop_inspecting()

    @on(InspectorPanel.Move)
    def _move_cursor(self, message: InspectorPanel.Move) -> None:
        if self.cursor is None:
            return
        moved = self._moved(self.cursor, message.unit, message.step)
        if moved is not None:
            self._reply(self.cursor[0]).tokens.set_cursor(None)
            self.cursor = moved
            self._show_cursor()

    @on(TokenText.Clicked)
    def _inspect_clicked(self, message: TokenText.Clicked) -> None:
        replies = self.transcript.replies()
        owner = next((i for i, r in enumerate(replies) if message.block in r.tokens.blocks), None)
        if owner is not None:
            self.inspect_token(owner, message.index)

    def _reply(self, index: int) -> AssistantMessage:
        return self.transcript.replies()[index]

    def _show_cursor(self) -> None:
        assert self.cursor is not None
        reply_index, token_index = self.cursor
        reply = self._reply(reply_index)
        reply.tokens.set_cursor(token_index)
        self.transcript.scroll_to_widget(reply.tokens.block_of(token_index), animate=False)
        self._describe_cursor()
        self.refresh_panels()

    def _describe_cursor(self) -> None:
        assert self.cursor is not None
        reply_index, token_index = self.cursor
        replies = self.transcript.replies()
        if reply_index >= len(replies) or token_index >= len(replies[reply_index].tokens.tokens):
            self.cursor = None
            self.live.inspect(None)
            return
        text = replies[reply_index].tokens
        token, round_event = shown_token(text.tokens[token_index]), text.round_of(token_index)
        self.live.inspect(
            Inspected(token, shown_round(round_event) if round_event else None, reply_index, token_index)
        )

    def _last_position(self) -> tuple[int, int] | None:
        for reply_index, reply in reversed(list(enumerate(self.transcript.replies()))):
            tokens = reply.tokens.tokens
            for token_index in range(len(tokens) - 1, -1, -1):
                if tokens[token_index].text and reply.tokens.shows(token_index):
                    return reply_index, token_index
        return None

    def _positions(self) -> Iterable[tuple[int, int, int]]:
        """(reply, token, round) of every visible token, in order (folded reasoning is not)."""
        for reply_index, reply in enumerate(self.transcript.replies()):
            for token_index, token in enumerate(reply.tokens.tokens):
                if token.text and reply.tokens.shows(token_index):
                    yield reply_index, token_index, token.round

    def _moved(self, cursor: tuple[int, int], unit: str, step: int) -> tuple[int, int] | None:
        """Where a move takes the cursor (None: nowhere to go)."""
        positions = list(self._positions())
        here = next((i for i, (r, t, _) in enumerate(positions) if (r, t) >= cursor), len(positions) - 1)
        if not positions:
            return None
        if unit == "token":
            target = here + step
        elif unit == "end":
            same = [i for i, (r, _, _) in enumerate(positions) if r == cursor[0]]
            target = same[0] if step < 0 else same[-1]
        else:  # round: the first token of the previous or next round
            reply, _, round_no = positions[here]
            key = (reply, round_no)
            target = here
            if step > 0:
                while target < len(positions) and positions[target][0::2] == key:
                    target += 1
            else:
                while target > 0 and positions[target][0::2] == key:
                    target -= 1
                before = positions[target][0::2]
                while target > 0 and positions[target - 1][0::2] == before:
                    target -= 1
        if not 0 <= target < len(positions):
            return None
        reply, token, _ = positions[target]
        return reply, token


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
