"""The specchat TUI: a chat whose replies show, token by token, how speculation made them.

``run_chat(settings)`` is what the CLI calls: it opens the app, loads the models in a worker
behind a loading screen, then chats. Tests and the screenshot script build the app with an
engine already made: ``SpecchatApp(settings, engine=ChatEngine(...))`` skips loading.

The layout, the panels and the inspector's cursor belong to :class:`MainScreen`
(:mod:`specchat.ui.screens.main`). The app is the wiring: it creates the shared state
(:mod:`specchat.ui.state`: the model lease, auto-saving, the theory tracker), hands it to the
screens and panels through their constructors, and maps keys to actions; a reply's life is
:class:`~specchat.ui.reply.Replies`. ``specchat replay FILE`` opens the same app with no
engine, over a :class:`ReplayScreen`.

Threads: the engine runs only in thread workers (loading: :mod:`specchat.ui.model_loading`; a
reply: :mod:`specchat.ui.reply`; talk jobs: :func:`specchat.ui.state.lease.run_job`), through
:mod:`specchat.ui.bridge`; results come back only as messages. Live panels redraw on a timer
from :class:`~specchat.ui.live.LiveStats`, never per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.theme import Theme

from specchat import logs
from specchat.backend import Capabilities
from specchat.config import Settings, data_dir
from specchat.errors import SpecchatError
from specchat.ui import bridge, commands, keys, talk, themes
from specchat.ui.driver import QuitDeadline, tolerant_driver
from specchat.ui.live import ControlsView, LiveStats
from specchat.ui.messages import (
    EngineLoaded,
    LoadFailed,
    LoadProgressed,
    ReplyClosed,
    ReplyEvents,
    ReplyPaused,
)
from specchat.ui.model_loading import load_models
from specchat.ui.prefs import remember
from specchat.ui.reply import ActiveReply, Replies
from specchat.ui.screens.conversations import ConversationsScreen
from specchat.ui.screens.help import HelpScreen
from specchat.ui.screens.loading import LoadingScreen
from specchat.ui.screens.main import MainScreen
from specchat.ui.screens.race import RaceScreen
from specchat.ui.screens.replay import ReplayScreen
from specchat.ui.screens.selftest import SelfTestScreen
from specchat.ui.screens.system_prompt import SystemPromptScreen
from specchat.ui.state.autosave import AutoSave
from specchat.ui.state.controls import (
    TEMPERATURE_STEP,
    Control,
    next_drafter,
    next_schedule,
    server_refusal,
    stepped_gamma,
    stepped_temperature,
)
from specchat.ui.state.lease import ModelLease
from specchat.ui.state.theory_tracker import TheoryTracker
from specchat.ui.store import Conversation, ConversationError, ConversationStore, Turn
from specchat.ui.widgets.panels import Figures, figures
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.widgets.theory import TheoryPanel
from specchat.ui.widgets.transcript import SystemNote, Transcript, UserMessage
from specchat.untrusted import visible

if TYPE_CHECKING:
    from specchat.engine.session import Controls


LEGEND_NOTES = {
    "inferred": "colours inferred from the server's counters",
    "none": "this server reports no provenance: tokens uncoloured",
}


class SpecchatApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "specchat"
    BINDINGS: ClassVar[list[BindingType]] = keys.bindings(keys.APP_KEYS)
    quit_deadline: QuitDeadline | None = None
    """Set where the app runs on the real terminal (run_in_terminal): signals then end it for sure."""

    def __init__(
        self,
        settings: Settings,
        engine: bridge.Engine | None = None,
        *,
        target_name: str | None = None,
        draft_name: str | None = None,
        device: str = "",
        handle_signals: bool = False,
        replay: Conversation | None = None,
        replay_speed: float = 1.0,
    ) -> None:
        super().__init__()
        self.replay_only = replay
        """``specchat replay FILE``: no engine, the saved conversation replayed, then quit."""
        self.replay_speed = replay_speed
        self.settings = settings
        self.handle_signals = handle_signals
        """Quit cleanly on SIGTERM/SIGHUP/SIGINT (the real terminal; tests leave them alone)."""
        self.lease = ModelLease(self._hold_prompt, self.call_from_thread)
        """The models and who uses them; screens and panels that run jobs get it, not the app."""
        self._given = (
            None
            if engine is None
            else bridge.LoadedEngine(engine, target_name or settings.target, draft_name, device)
        )
        self.target_name = target_name or settings.target
        self.draft_name = draft_name if engine is not None else settings.draft
        self.store = ConversationStore(data_dir())
        self.autosave = AutoSave(self.store, self._notify_about_saving)
        self.conversation = Conversation.new(settings.system_prompt, self.target_name, self.draft_name)
        self.live = LiveStats()
        self.palette = themes.TokenPalette()
        self.step_gate = bridge.StepGate()
        self.markdown_view = False
        self.loading_screen: LoadingScreen | None = None
        self._exit_status = 0
        self.startup_notes: list[str] = []
        """Warnings about the settings (themes, keys), shown when the app opens."""
        self.theory_tracker = TheoryTracker(self.live)
        """What this session measured, for the theory panel (polled from mount on)."""

        specs, errors = themes.discover()
        self.startup_notes.extend(errors)
        self.theme_specs = specs
        for spec in specs.values():
            self.register_theme(spec.theme)
        self.theme = self._starting_theme(settings.theme)
        # Remaps that collide, or name keys no terminal sends, are dropped with a warning: the
        # action keeps its default key rather than silently losing it.
        self.keymap, warnings = keys.check_keymap(settings.keys)
        self.startup_notes.extend(warnings)
        self.set_keymap(self.keymap)
        self.live.set_display(keys=self.effective_keys)
        self.main_screen = MainScreen(self.live, self.palette, self.conversation.system_prompt, self.keymap)
        self.replies = Replies(self, self, self.main_screen, self.live, self.step_gate, self.lease)

    def _starting_theme(self, wanted: str) -> str:
        if wanted in self.available_themes:
            return wanted
        self.startup_notes.append(f"unknown theme {wanted!r}: using {themes.DEFAULT_THEME}.")
        return themes.DEFAULT_THEME if themes.DEFAULT_THEME in self.available_themes else "textual-dark"

    # ----------------------------------------------------------------- layout

    def get_default_screen(self) -> Screen[Any]:
        return self.main_screen

    async def on_mount(self) -> None:
        if self.handle_signals:
            self._quit_on_signals()
        self.palette.use(self.token_styles_of(self.theme))
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        # The chat's widgets must exist before the app reports ready (tests, autopilots) and
        # before anything below touches them; the screen composes in its own task.
        await self.main_screen.mounted.wait()
        self.set_interval(talk.POLL_S, self.theory_tracker.poll)
        self.refresh_panels(force=True)
        for note in self.startup_notes:
            self.notify(note, severity="warning", timeout=8)
        self.prompt.focus()
        self._hold_prompt()
        if self.replay_only is not None:
            self.sub_title = f"replay · {visible(self.replay_only.title)}"
            self.push_screen(self._replay_screen(self.replay_only), lambda _: self.exit(0))
        elif self._given is not None:
            self._use_engine(self._given)
        else:
            self.sub_title = "connecting…" if self.settings.server else "loading…"
            settings = self.settings
            self.loading_screen = LoadingScreen(settings.target, settings.draft, settings.server)
            self.push_screen(self.loading_screen)
            self._load_models()

    def _quit_on_signals(self) -> None:
        """SIGTERM, SIGHUP and SIGINT quit as Ctrl+Q does: the reply is kept, the terminal restored.

        Python's default for SIGTERM ends the process at once, leaving the terminal in the
        alternate screen with mouse tracking on and the streaming reply unsaved.
        """
        loop = self._loop_for_signals = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            loop.add_signal_handler(signum, self._quit_on_signal, 128 + signum)

    def _quit_on_signal(self, exit_status: int) -> None:
        # A hangup can leave something blocked on the dead terminal: the deadline ends the
        # process within seconds even then. The quit itself is asked for once: a hangup comes
        # as a signal and as a failed write, and two quits would keep the reply twice.
        deadline = self.quit_deadline
        if deadline is not None:
            if deadline.started:
                return
            deadline.start(exit_status)
        self.request_quit(exit_status)

    def terminal_gone(self) -> None:
        """The terminal hung up (called from the writer thread): quit as on SIGHUP, keeping the reply."""
        with contextlib.suppress(RuntimeError):  # the loop has already closed: nothing left to keep
            self._loop_for_signals.call_soon_threadsafe(self._quit_on_signal, 128 + signal.SIGHUP)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return themes.variable_defaults()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from commands.system_commands(self)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.reply is not None else None
        return True

    # ------------------------------------------------------------ the bridge

    def _load_models(self) -> None:
        self.run_worker(
            partial(load_models, self.settings, self.post_message),
            name="load models",
            group="engine",
            thread=True,
            exclusive=True,
            exit_on_error=False,
        )

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """A toast whose text is shown as text: notices quote servers, models and files, whose
        '[/]' would raise when the toast draws and whose '[@click=…]' would become a button."""
        super().notify(
            visible(message), title=visible(title), severity=severity, timeout=timeout, markup=markup
        )

    def on_load_progressed(self, message: LoadProgressed) -> None:
        if self.loading_screen is not None:
            self.loading_screen.show_progress(message.progress)
        if message.progress.stage == "notice":  # worth reading after the loading screen has closed
            self.notify(message.progress.message, timeout=12)

    def on_engine_loaded(self, message: EngineLoaded) -> None:
        # Close the loading screen and anything opened over it meanwhile (help, say).
        typed = ""
        if self.loading_screen is not None:
            typed = self.loading_screen.typed
            while self.loading_screen in self.screen_stack:
                self.pop_screen()
            self.loading_screen = None
        self._use_engine(message.loaded)
        if typed.strip():
            self.prompt.give_back(typed)
        self.prompt.focus()

    def on_load_failed(self, message: LoadFailed) -> None:
        self.sub_title = "could not attach to the server" if self.settings.server else "models failed to load"
        if self.loading_screen is not None:
            while self.screen is not self.loading_screen and self.loading_screen in self.screen_stack:
                self.pop_screen()
            self.loading_screen.show_error(message.error, message.exit_code)
        else:
            self.notify(message.error, severity="error", timeout=30)

    def _use_engine(self, loaded: bridge.LoadedEngine) -> None:
        self.target_name, self.draft_name = loaded.target_name, loaded.draft_name
        self.conversation.target, self.conversation.draft = loaded.target_name, loaded.draft_name
        chosen, note = bridge.make_controls(self.settings, loaded.engine.available_drafters)
        self.lease.use(loaded.engine, chosen, loaded.target_name, loaded.draft_name)
        if note:
            self.notify(note, severity="warning")
        draft = f"draft {loaded.draft_name}" if loaded.draft_name else "no draft model"
        self.sub_title = " · ".join(p for p in (f"target {loaded.target_name}", draft, loaded.device) if p)
        if self.capabilities.kind != "local":
            self.sub_title = f"server {loaded.target_name}"
            self.live.by_arrival = True  # a server times no rounds: measure tokens as they arrive
            self.live.set_display(note=LEGEND_NOTES.get(self.capabilities.provenance, ""))
        for line in loaded.notes:
            self.notify(line, severity="warning", timeout=12)
        self._hold_prompt()
        self.refresh_panels(force=True)

    @property
    def engine(self) -> bridge.Engine | None:
        return self.lease.engine

    @property
    def controls(self) -> Controls | None:
        return self.lease.controls

    @property
    def talk_task(self) -> str | None:
        """What a talk screen runs on the models (the race, the self-test), so no reply starts."""
        return self.lease.task

    @property
    def reply(self) -> ActiveReply | None:
        """The reply streaming now (None between replies)."""
        return self.replies.active

    @property
    def capabilities(self) -> Capabilities:
        """What the backend reports, measures and lets the user control (the panels label figures by it)."""
        return bridge.capabilities_of(self.engine) if self.engine is not None else bridge.LOCAL

    # ------------------------------------------------------------- replies

    @on(PromptInput.Submitted)
    def _on_submitted(self, message: PromptInput.Submitted) -> None:
        # The box refuses to send while it holds a reason (see _hold_prompt); this catches a
        # message already on its way when a reply started, and gives its text back.
        reason = self._why_not_send()
        if reason is not None:
            message.prompt.give_back(message.text)
            self.notify(reason, severity="warning")
            return
        self.conversation.turns.append(Turn("user", message.text))
        self.transcript.mount(UserMessage(message.text))
        self._start_reply()

    def _start_reply(self) -> None:
        assert self.engine is not None and self.controls is not None
        self.replies.start(self.engine, self.controls)

    def _why_not_send(self) -> str | None:
        if self.replay_only is not None:
            return "This is a replay: no model is loaded, so nothing can be sent."
        if self.engine is None or self.controls is None:
            return "The models are still loading: your message stays in the box."
        if self.reply is not None:
            return "A reply is streaming: Esc stops it. Your message stays in the box."
        if self.talk_task is not None:
            return f"The models are busy with {self.talk_task}: your message stays in the box."
        return None

    def _hold_prompt(self) -> None:
        """The message box refuses to send while the models cannot take a reply."""
        with contextlib.suppress(NoMatches):  # the chat's screen is not composed yet
            self.prompt.hold = self._why_not_send()

    def send_prompt(self) -> None:
        """Send what the message box holds (the palette's "Send")."""
        self.prompt.action_submit()

    def on_reply_events(self, message: ReplyEvents) -> None:
        self.replies.on_events(message)

    def on_reply_paused(self, message: ReplyPaused) -> None:
        self.replies.on_paused(message)

    async def on_reply_closed(self, message: ReplyClosed) -> None:
        await self.replies.on_closed(message)

    def set_busy(self, busy: bool) -> None:
        """The message box while a reply streams: held, marked, and saying how to stop it."""
        prompt = self.prompt
        self._hold_prompt()
        prompt.set_class(busy, "-busy")
        prompt.border_title = "streaming · Esc stops" if busy else ""
        self.refresh_bindings()

    # ------------------------------------------------------------ quitting

    async def action_quit(self) -> None:
        """Ctrl+Q, the palette's Quit, SIGTERM: keep the reply that is streaming, then exit."""
        await self.replies.keep_before_exit()
        self.exit(return_code=self._exit_status)

    def request_quit(self, exit_status: int) -> None:
        """Quit as Ctrl+Q does, from a signal handler (runs on the app's event loop)."""
        self._exit_status = exit_status
        self.call_later(self.action_quit)

    def _handle_exception(self, error: Exception) -> None:
        """A bug: save what can be saved, log the traceback, and leave one line on exit.

        Textual exits the app after any unhandled exception and prints the traceback; the
        conversation (and the reply streaming) is saved first, and the traceback goes to the
        log file instead (printed as well with --debug).
        """
        line = logs.log_unexpected("specchat stopped on an unexpected error", error)
        with contextlib.suppress(Exception):
            self._save_after_crash()
        super()._handle_exception(error)
        if not logs.debug_enabled():
            self._exit_renderables[:] = [Text(f"specchat: {line}", style="red")]

    def _save_after_crash(self) -> None:
        self.replies.keep_after_crash()
        if self.conversation.turns:
            self.store.save(self.conversation)

    # ------------------------------------------------------------ actions

    def action_stop(self) -> None:
        self.replies.stop()

    async def action_regenerate(self) -> None:
        if not self._idle("regenerate"):
            return
        turns = self.conversation.turns
        if turns and turns[-1].role == "assistant":
            turns.pop()
            replies = self.transcript.replies()
            if replies:
                await replies[-1].remove()
            self.live.load(turns)
        if not turns or turns[-1].role != "user":
            self.notify("Nothing to regenerate yet.")
            return
        self._start_reply()

    async def action_clear(self) -> None:
        if not self._idle("clear the conversation"):
            return
        self.save_conversation()
        self.conversation = Conversation.new(
            self.conversation.system_prompt, self.target_name, self.draft_name
        )
        await self._rebuild_transcript()
        self.live.reset()
        self.refresh_panels(force=True)

    def action_copy_reply(self) -> None:
        last = self.conversation.last_reply()
        if last is None:
            self.notify("No reply to copy yet.")
            return
        self.copy_to_clipboard(last.content)
        self.notify(f"Copied the last reply ({len(last.content)} characters).")

    def action_open_conversations(self) -> None:
        if isinstance(self.screen, ConversationsScreen | ReplayScreen) or self.replay_only is not None:
            return
        if not self._idle("open another conversation"):
            return
        self.save_conversation()
        self.push_screen(ConversationsScreen(self.store, self.store.saved()), self._open_conversation)

    async def _open_conversation(self, choice: tuple[str, str] | None) -> None:
        if choice is None:
            return
        what, conversation_id = choice
        try:
            conversation = self.store.load(conversation_id)
        except ConversationError as err:
            self.notify(str(err), severity="error")
            return
        if what == "replay":
            self.push_screen(self._replay_screen(conversation))
            return
        self.conversation = conversation
        await self._rebuild_transcript()
        self.live.load(conversation.turns)
        self.refresh_panels(force=True)
        self.notify(f"Opened “{conversation.title}”.")

    def action_export_markdown(self) -> None:
        if not self.conversation.turns:
            self.notify("Nothing to export yet.")
            return
        try:
            path = self.store.export_markdown(self.conversation)
        except OSError as err:
            self.notify(f"cannot export: {err}", severity="error")
            return
        self.notify(f"Exported to {path}", title="Markdown")

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen(self.keymap, self.palette))

    def action_edit_system_prompt(self) -> None:
        if isinstance(self.screen, SystemPromptScreen):
            return
        self.push_screen(SystemPromptScreen(self.conversation.system_prompt), self._set_system_prompt)

    def _set_system_prompt(self, result: tuple[str, bool] | None) -> None:
        if result is None:
            return
        prompt, make_default = result
        self.conversation.system_prompt = prompt
        self.transcript.query(SystemNote).first().set_prompt(prompt)
        if self.conversation.turns:
            self.save_conversation()
        if make_default:
            self.settings.system_prompt = prompt
            self._remember("system_prompt", prompt)
        self.notify("System prompt updated: it applies from the next reply.")

    def action_toggle_view(self) -> None:
        self.markdown_view = not self.markdown_view
        for reply in self.transcript.replies():
            reply.set_view(self.markdown_view)
        self._update_legend()

    # ------------------------------------------------------------ talk mode

    def action_toggle_rejected(self) -> None:
        """Show or hide the rejected drafts, in every reply on every screen."""
        shown = self.palette.toggle_rejected()
        for screen in self._chat_screens():
            screen.live.set_display(show_rejected=shown)
            screen.redraw_tokens()

    def action_inspect(self) -> None:
        """Put the inspector's cursor on the reply (or leave the inspector)."""
        screen = self.screen
        if not isinstance(screen, MainScreen):
            return
        if screen.cursor is not None:
            screen.stop_inspecting()
        else:
            screen.start_inspecting()

    def action_toggle_step_mode(self) -> None:
        """Pause after every round (on), or stream again (off). A replay pauses or plays."""
        if isinstance(self.screen, ReplayScreen):
            self.screen.toggle_playing()
            return
        if self.engine is not None and not self.capabilities.stepping:
            self.notify(
                "This backend streams whole replies: it cannot pause between rounds.", severity="warning"
            )
            return
        self.notify(self.replies.toggle_step_mode())
        self.refresh_panels(force=True)

    def action_step(self) -> None:
        """Run one more round (step mode), or step a replay."""
        if isinstance(self.screen, ReplayScreen):
            self.screen.step_round()
            return
        if not self.step_gate.on:
            self.notify(f"Step mode is off: {self.key_of('step_mode')} pauses decoding after every round.")
            return
        if self.replies.step():
            self.refresh_panels()

    def action_save_screenshot(self) -> None:
        """An SVG of the screen as it is, for slides, in the user data folder."""
        folder = data_dir() / "screenshots"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = self.save_screenshot(path=str(folder))
        except OSError as err:
            self.notify(f"cannot save the screenshot in {folder}: {err.strerror or err}", severity="error")
            return
        self.notify(f"Screenshot saved: {path}", title="screenshot", timeout=10)

    def _replay_screen(self, conversation: Conversation) -> ReplayScreen:
        return ReplayScreen(
            conversation,
            self.palette,
            self.effective_keys,
            speed=self.replay_speed,
        )

    def _chat_screens(self) -> list[MainScreen]:
        screens = (self.main_screen, *self.screen_stack)
        return [s for s in dict.fromkeys(screens) if isinstance(s, MainScreen) and s.is_attached]

    def key_of(self, binding_id: str) -> str:
        return keys.display_key(self.effective_keys.get(binding_id, ""))

    def action_gamma_up(self) -> None:
        self._set_gamma(+1)

    def action_gamma_down(self) -> None:
        self._set_gamma(-1)

    def _set_gamma(self, step: int) -> None:
        if self.controls is None or not self._server_allows("gamma"):
            return
        # One attribute write: the engine reads γ once at the start of each round.
        self.controls.gamma = stepped_gamma(self.controls.gamma, step)
        self.refresh_panels(force=True)

    def action_cycle_schedule(self) -> None:
        if self.controls is None or not self._server_allows("schedule"):
            return
        self.controls.schedule = next_schedule(self.controls.schedule)
        self.refresh_panels(force=True)

    def action_cycle_drafter(self) -> None:
        if self.controls is None or self.engine is None or not self._server_allows("drafter"):
            return
        self.controls.drafter = next_drafter(self.controls.drafter, self.engine.available_drafters)
        self.refresh_panels(force=True)

    def _server_allows(self, control: Control) -> bool:
        """γ, schedule and drafter belong to a server that fixed them when it started: say so."""
        refusal = server_refusal(self.capabilities, control)
        if refusal is not None:
            self.notify(refusal)
        return refusal is None

    def action_temperature_up(self) -> None:
        self._set_temperature(+TEMPERATURE_STEP)

    def action_temperature_down(self) -> None:
        self._set_temperature(-TEMPERATURE_STEP)

    def _set_temperature(self, step: float) -> None:
        if self.controls is None:
            return
        self.controls.temperature = stepped_temperature(self.controls.temperature, step)
        self.refresh_panels(force=True)

    def action_theory(self) -> None:
        screen = self.main_screen
        try:
            screen.query_one(TheoryPanel).remove()
            return
        except NoMatches:
            pass
        screen.mount(TheoryPanel(self.theory_tracker, self.lease, self.key_of("best_gamma")))

    def action_best_gamma(self) -> None:
        if self.controls is None:
            return
        note, title = talk.apply_best_gamma(self.theory_tracker, self.controls)
        self.notify(note, title=title)
        if title:
            self.refresh_panels(force=True)

    def action_race(self) -> None:
        if isinstance(self.screen, RaceScreen) or not self._can_open("the race"):
            return
        prompt = talk.default_prompt(self.conversation)
        self.push_screen(
            RaceScreen(prompt, lease=self.lease, palette=self.palette, system_prompt=self._system_prompt)
        )

    def action_selftest(self) -> None:
        if isinstance(self.screen, SelfTestScreen) or not self._can_open("the self-test"):
            return
        self.push_screen(SelfTestScreen(lease=self.lease, system_prompt=self._system_prompt))

    def _can_open(self, what: str) -> bool:
        reason = talk.why_not_open(self.lease, what)
        if reason is not None:
            self.notify(reason, severity="warning")
        return reason is None

    def _system_prompt(self) -> str | None:
        return self.conversation.system_prompt

    def action_cycle_theme(self) -> None:
        names = self.specchat_themes
        if not names:
            return
        index = names.index(self.theme) if self.theme in names else -1
        self.switch_theme(names[(index + 1) % len(names)])

    # -------------------------------------------------------------- themes

    @property
    def specchat_themes(self) -> list[str]:
        """Themes from theme files: the packaged four first, then the user's."""
        return themes.ordered_names(self.theme_specs)

    def theme_description(self, name: str) -> str:
        spec = self.theme_specs.get(name)
        return spec.description if spec and spec.description else name

    def switch_theme(self, name: str) -> None:
        self.theme = name

    @property
    def token_styles(self) -> dict[str, Style]:
        """Rich styles of the token kinds (and rejected drafts) in the current theme."""
        return self.palette.styles

    def token_styles_of(self, name: str) -> dict[str, Style]:
        return themes.token_styles(self.get_theme(name) or self.current_theme, self.theme_specs.get(name))

    def _on_theme_changed(self, theme: Theme) -> None:
        self.palette.use(self.token_styles_of(theme.name))
        for screen in self._chat_screens():
            screen.redraw_tokens()
        if theme.name != self.settings.theme:
            self.settings.theme = theme.name
            self._remember("theme", theme.name)

    def _remember(self, name: str, value: object) -> None:
        try:
            remember(name, value)
        except SpecchatError as err:
            self.notify(str(err), severity="warning")

    # --------------------------------------------------------------- panels

    def refresh_panels(self, force: bool = False) -> None:
        """Tell the live object the controls in force, and redraw the chat's panels."""
        self.live.set_controls(self.controls_view())
        self.main_screen.refresh_panels(force)

    @property
    def figures(self) -> Figures:
        """What the panels show right now (tests compare it with the engine's events)."""
        self.live.set_controls(self.controls_view())
        return figures(self.live)

    def controls_view(self) -> ControlsView | None:
        c = self.controls
        if c is None:
            return None
        drafters = tuple(self.engine.available_drafters) if self.engine else ()
        caps = self.capabilities
        if caps.kind == "local":
            return ControlsView(c.gamma, c.schedule, c.drafter, c.temperature, drafters)
        return ControlsView(c.gamma, c.schedule, c.drafter, c.temperature, drafters, caps)

    @property
    def effective_keys(self) -> dict[str, str]:
        return {spec.id: keys.effective_key(spec, self.keymap) for spec in keys.ALL_KEYS}

    def _update_legend(self) -> None:
        self.live.set_display(markdown=self.markdown_view)
        self.refresh_panels()

    # -------------------------------------------------------------- helpers

    @property
    def transcript(self) -> Transcript:
        return self.main_screen.transcript

    @property
    def prompt(self) -> PromptInput:
        return self.main_screen.prompt

    def _idle(self, what: str) -> bool:
        if self.reply is not None:
            self.notify(f"A reply is streaming: press Esc to stop it before you {what}.", severity="warning")
            return False
        if self.talk_task is not None:
            self.notify(
                f"The models are busy with {self.talk_task}: wait before you {what}.", severity="warning"
            )
            return False
        return True

    async def _rebuild_transcript(self) -> None:
        await self.main_screen.show_conversation(self.conversation, markdown=self.markdown_view)

    def save_conversation(self) -> None:
        self.autosave.save(self.conversation)

    def _notify_about_saving(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
    ) -> None:
        # Looked up at each call, not bound when the saver is made: whoever wraps the app's
        # notify (a recording test) sees the saving notices too.
        self.notify(message, title=title, severity=severity, timeout=timeout)


def run_replay(settings: Settings, path: Path, speed: float = 1.0) -> int:
    """Replay a saved conversation round by round, with no model loaded. Returns an exit code."""
    conversation = ConversationStore.load_path(path)
    if not any(turn.role == "assistant" for turn in conversation.turns):
        raise ConversationError(f"{path} holds no reply to replay.")
    app = SpecchatApp(settings, replay=conversation, replay_speed=speed, handle_signals=True)
    run_in_terminal(app)
    return app.return_code or 0


def run_chat(settings: Settings) -> int:
    """Open the chat: load the models behind a loading screen, then chat. Returns an exit code."""
    app = SpecchatApp(settings, handle_signals=True)
    run_in_terminal(app)
    for traceback in logs.debug_tracebacks():
        print(traceback, file=sys.stderr)
    return app.return_code or 0


def run_in_terminal(app: SpecchatApp) -> None:
    """Run ``app`` on the real terminal, surviving the terminal's hangup (see ui/driver.py)."""
    deadline = app.quit_deadline = QuitDeadline()
    app.driver_class = tolerant_driver(app.driver_class, app.terminal_gone)
    try:
        app.run()
    finally:
        deadline.cancel()
