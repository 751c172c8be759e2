"""The chat screen: transcript, token inspector, step table, legend, message box, live panels.

The screen owns the layout and the panels; the app owns the engine, the conversation and the
actions. Every panel receives the one :class:`~specchat.ui.state.live.LiveStats` on a timer (see
:meth:`MainScreen.refresh_panels`), so adding a panel means writing it and yielding it through
:meth:`MainScreen.panel` in ``compose``: nothing else changes.

The screen binds the chat's keys (:data:`~specchat.ui.settings.keys.APP_KEYS`) and runs each
key's command through one dispatch (:class:`~specchat.ui.state.commands.CommandDispatch`): the
table the app built from its controllers, under the commands this screen owns (the inspect key,
run by the inspector, which owns the cursor; the reasoning key).

Whether reasoning shows unfolded is the screen's (the reasoning key; a click on one fold's line
turns that one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header

from specchat.engine.events import ContextEvent, Event
from specchat.store.conversation import Conversation
from specchat.ui.settings.keys import APP_KEYS, KEYS_BY_ID, KeySpec, bindings, display_key, effective_key
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.commands import CommandDispatch, Commands
from specchat.ui.state.live import LiveStats, replay
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

PANEL_INTERVAL = 0.25
"""Seconds between panel refreshes while figures change."""
NARROW_WIDTH = 96
"""Below this many columns the side panel hides and a one-line summary shows instead."""

P = TypeVar("P", bound=LivePanel)


class MainScreen(CommandDispatch, Screen[None]):
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
        commands: Commands,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.commands = Commands(commands)
        """What the keys run: this screen's own commands over the app's table."""
        self.commands.add("toggle_reasoning", self.fold_reasoning)
        self.live = live
        self.palette = palette
        self.system_prompt = system_prompt
        self.keymap = keymap or {}
        self.panels: list[LivePanel] = []
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
                inspector = InspectorPanel(
                    self.palette,
                    self.live,
                    lambda: self.transcript,
                    changed=self.refresh_panels,
                    left=self.focus_input,
                    id="inspector",
                )
                self.commands.add("inspect", inspector.toggle_inspecting)
                yield self.panel(inspector)
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
            self.inspector.describe_cursor()  # a streaming round may have been verified meanwhile
            for panel in self.panels:
                panel.show_live(self.live, force)
        except NoMatches:  # the app is closing and the panels' parts are already gone
            return

    # ---------------------------------------------------------- the screen's own keys

    def fold_reasoning(self) -> None:
        """The reasoning key: unfold every reply's reasoning, or fold it back to one line."""
        shown = self.toggle_reasoning()
        if shown is None:
            self.notify(
                "No reasoning here yet: a thinking model's reasoning shows folded above its answer; "
                f"the next replies show it {'unfolded' if self.reasoning_open else 'folded'}."
            )
        else:
            self.notify("Reasoning unfolded." if shown else "Reasoning folded to one line.")

    # ---------------------------------------------------------- transcript

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def inspector(self) -> InspectorPanel:
        """The token inspector, which owns the cursor."""
        return self.query_one(InspectorPanel)

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
        self.inspector.hide_if_folded()
        if not any(reply.tokens.fold is not None for reply in replies):
            return None
        return self.reasoning_open

    @on(ReasoningFold.Toggled)
    def _toggle_one_fold(self, message: ReasoningFold.Toggled) -> None:
        for reply in self.transcript.replies():
            if reply.tokens.fold is message.fold:
                reply.tokens.set_reasoning_open(not message.fold.is_open)
        self.inspector.hide_if_folded()

    def show_events(self, reply: AssistantMessage, events: Sequence[Event]) -> None:
        """New events of a streaming reply (tokens and rounds, in stream order)."""
        reply.append(events)
        transcript = self.transcript
        if not transcript.is_anchored:
            transcript.call_after_refresh(transcript.follow)

    async def show_conversation(self, conversation: Conversation, *, markdown: bool) -> None:
        """Replace the transcript with a whole conversation (reopened, or cleared)."""
        self.inspector.stop_inspecting()
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

    def show_busy(self, busy: bool) -> None:
        """The message box while a reply streams: marked, and saying how to stop it."""
        self.prompt.set_class(busy, "-busy")
        self.prompt.border_title = "streaming · Esc stops" if busy else ""

    def focus_input(self) -> None:
        prompts = self.query(PromptInput)
        if prompts:
            prompts.first().focus()

    @on(TokenText.Clicked)
    def _inspect_clicked(self, message: TokenText.Clicked) -> None:
        self.inspector.inspect_clicked(message.block, message.index)
