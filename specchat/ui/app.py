"""The specchat TUI: a chat whose replies show, token by token, how speculation made them.

``run_chat(settings)`` is what the CLI calls: it opens the app, loads the models in a worker
behind a loading screen, then chats. Tests and the screenshot script build the app with an
engine already made: ``SpecchatApp(settings, engine=ChatEngine(...))`` skips loading.
``specchat replay FILE`` opens the same app with no engine, over a :class:`ReplayScreen`.

The app is the wiring: it creates the shared state (:mod:`specchat.ui.state`), hands it to the
screens, panels and controllers through their constructors, and routes the workers' messages.
Where things live under ``ui/``:

- ``screens/``: layout and keys (the chat's :class:`~specchat.ui.screens.main.MainScreen` binds
  the chat's keys and runs each one's command through one dispatch; the app binds only the keys
  of every screen: help, the theme, the screenshot), ``widgets/``: what draws and its own state
  (the token inspector owns its cursor);
- ``controllers/``: what a key does (replies, sending and the conversation's keys, step mode, γ
  and the other control keys, themes, loading, the palette); each adds the commands of the keys
  it owns to the one table the app hands the screens (:mod:`specchat.ui.state.commands`);
- ``talk/``: talk mode, one room (the race, the self-test, the theory panel, replays);
- ``workers/``: the engine's side (:mod:`~specchat.ui.workers.bridge`, model loading, messages);
- ``state/``: shared state (the model lease, live statistics, the command table, preferences,
  autosave);
- ``settings/``: keys, themes and remembered choices; ``terminal/``: the real terminal's driver,
  signals and crashes, plain-text toasts.

Threads: the engine runs only in thread workers (loading, a reply, talk jobs through
:func:`specchat.ui.state.lease.run_job`); results come back only as messages. Live panels redraw
on a timer from :class:`~specchat.ui.state.live.LiveStats`, never per token.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import SystemCommand
from textual.binding import BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import TextArea

from specchat import logs
from specchat.config import Settings, data_dir
from specchat.engine.backend import Capabilities
from specchat.store.conversation import Conversation, ConversationError
from specchat.store.folder import ConversationStore
from specchat.ui.controllers import palette as commands
from specchat.ui.controllers.chat_actions import ChatActions
from specchat.ui.controllers.controls import ControlKeys
from specchat.ui.controllers.loading_flow import LoadingFlow
from specchat.ui.controllers.read_ahead import ReadingAhead
from specchat.ui.controllers.reply import ActiveReply, Replies
from specchat.ui.controllers.stepping import StepKeys
from specchat.ui.controllers.theming import AppThemes
from specchat.ui.screens.help import HelpScreen
from specchat.ui.screens.main import MainScreen
from specchat.ui.settings import keys, themes
from specchat.ui.state.autosave import AutoSave
from specchat.ui.state.commands import Commands
from specchat.ui.state.lease import ModelLease
from specchat.ui.state.live import LiveStats
from specchat.ui.state.preferences import Preferences
from specchat.ui.talk import rules
from specchat.ui.talk.screens import TalkScreens
from specchat.ui.talk.theory_tracker import TheoryTracker
from specchat.ui.terminal.quitting import SignalQuit, run_in_terminal, save_after_crash
from specchat.ui.terminal.toasts import PlainToasts
from specchat.ui.widgets.panels import Figures, figures
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.widgets.transcript import Transcript
from specchat.ui.workers import bridge, messages
from specchat.untrusted import visible

if TYPE_CHECKING:
    from specchat.engine.backend import Controls


class SpecchatApp(PlainToasts[int]):
    CSS_PATH = "app.tcss"
    TITLE = "specchat"
    BINDINGS: ClassVar[list[BindingType]] = keys.bindings(keys.APP_WIDE_KEYS)
    """The keys of every screen; the chat's own are its screen's (:class:`MainScreen`)."""

    def __init__(
        self,
        settings: Settings,
        backend: bridge.Backend | None = None,
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
        self.settings = settings
        self.handle_signals = handle_signals
        """Quit cleanly on SIGTERM/SIGHUP/SIGINT (the real terminal; tests leave them alone)."""
        self.lease = ModelLease(self._hold_prompt, self.call_from_thread)
        """The models and who uses them; screens and panels that run jobs get it, not the app."""
        self._given = (
            None
            if backend is None
            else bridge.LoadedBackend(backend, target_name or settings.target, draft_name, device)
        )
        self.target_name = target_name or settings.target
        self.draft_name = draft_name if backend is not None else settings.draft
        self.store = ConversationStore(data_dir())
        # The app's notify is looked up at each call: whoever wraps it (a recording test) sees
        # the saving notices too.
        self.autosave = AutoSave(self.store, lambda *args, **kwargs: self.notify(*args, **kwargs))
        self.conversation = Conversation.new(settings.system_prompt, self.target_name, self.draft_name)
        self.live = LiveStats()
        self.palette = themes.TokenPalette()
        self.markdown_view = False
        self._exit_status = 0
        self.theory_tracker = TheoryTracker(self.live)
        """What this session measured, for the theory panel (polled from mount on)."""
        self.preferences = Preferences(settings, lambda note: self.notify(note, severity="warning"))
        self.themes = AppThemes(self, self.preferences, self.palette, self._chat_screens)
        # Remaps that collide, or name keys no terminal sends, are dropped with a warning: the
        # action keeps its default key rather than silently losing it.
        self.keymap, warnings = keys.check_keymap(settings.keys)
        self.startup_notes = [*self.themes.notes, *warnings]
        """Warnings about the settings (themes, keys), shown when the app opens."""
        self.set_keymap(self.keymap)
        self.effective_keys = {spec.id: keys.effective_key(spec, self.keymap) for spec in keys.ALL_KEYS}
        self.live.set_display(keys=self.effective_keys)
        self.commands = Commands()
        """What the keys run, by name: filled from the controllers below, read by every screen."""
        self.main_screen = MainScreen(
            self.live, self.palette, self.conversation.system_prompt, self.keymap, commands=self.commands
        )
        self.quitter = SignalQuit(self.request_quit)
        self._make_controllers(replay_speed)

    def _make_controllers(self, replay_speed: float) -> None:
        """The controllers, each given what it drives, and the command table of their keys."""
        self.replies = Replies(self, self.main_screen, self.live, bridge.StepGate(), self.lease)
        self.reading_ahead = ReadingAhead(self, self.lease, self._typed)
        """The models read the next prompt's known part while nobody waits."""
        self.loading = LoadingFlow(self, self.settings, self.lease, self.live)
        self.control_keys = ControlKeys(
            self.lease,
            lambda note, title: self.notify(note, title=title),
            lambda: self.refresh_panels(force=True),
        )
        self.talk_screens = TalkScreens(
            self,
            self.lease,
            self.palette,
            self.theory_tracker,
            self.main_screen,
            lambda: self.conversation,
            self.effective_keys,
            self.commands,
            replay_speed,
        )
        self.chat = ChatActions(
            self,
            self.main_screen,
            self.live,
            self.lease,
            self.autosave,
            self.preferences,
            self.talk_screens.replay,
        )
        self.step_keys = StepKeys(self, self.replies, self.lease, self.effective_keys, self.refresh_panels)
        # One command table: each controller adds the commands of the keys it owns.
        for owner in (self.replies, self.chat, self.step_keys, self.talk_screens, self.themes):
            owner.add_commands(self.commands)
        self.control_keys.add_commands(self.commands, self.theory_tracker)

    # ----------------------------------------------------------------- layout

    def get_default_screen(self) -> Screen[Any]:
        return self.main_screen

    async def on_mount(self) -> None:
        if self.handle_signals:
            self.quitter.install()
        self.themes.start()
        self.theme_changed_signal.subscribe(self, self.themes.changed)
        # The chat's widgets must exist before the app reports ready (tests, autopilots) and
        # before anything below touches them; the screen composes in its own task.
        await self.main_screen.mounted.wait()
        self.set_interval(rules.POLL_S, self.theory_tracker.poll)
        self.refresh_panels(force=True)
        for note in self.startup_notes:
            self.notify(note, severity="warning", timeout=8)
        self.prompt.focus()
        self._hold_prompt()
        if self.replay_only is not None:
            self.sub_title = f"replay · {visible(self.replay_only.title)}"
            self.push_screen(self.talk_screens.replay(self.replay_only), lambda _: self.exit(0))
        elif self._given is not None:
            self.loading.use(self._given)
        else:
            self.loading.start()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return themes.variable_defaults()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from commands.system_commands(self, screen)

    # ------------------------------------------------------------- the models

    def on_load_progressed(self, message: messages.LoadProgressed) -> None:
        self.loading.progressed(message)

    def on_engine_loaded(self, message: messages.EngineLoaded) -> None:
        self.loading.loaded(message.loaded)

    def on_load_failed(self, message: messages.LoadFailed) -> None:
        self.loading.failed(message)

    @property
    def backend(self) -> bridge.Backend | None:
        return self.lease.backend

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
        return self.lease.capabilities or bridge.LOCAL

    # ------------------------------------------------------------- replies

    @on(PromptInput.Submitted)
    def _on_submitted(self, message: PromptInput.Submitted) -> None:
        self.chat.send(message)

    def start_reply(self) -> None:
        assert self.backend is not None and self.controls is not None
        self.reading_ahead.cancel()  # the reply then waits one chunk at most for the models
        self.replies.start(self.backend, self.controls)

    def _hold_prompt(self) -> None:
        """The models' holder changed (loaded, a reply or a talk job took them or let them go)."""
        self.chat.hold_prompt()
        self.reading_ahead.models_changed()

    def _typed(self) -> str | None:
        """What the message box holds; None once it is gone (the app is closing)."""
        try:
            return self.prompt.text
        except NoMatches:
            return None

    @on(TextArea.Changed, "PromptInput")
    def _on_typed(self) -> None:
        """What the message box holds changed: read it ahead once the keys stop."""
        self.reading_ahead.schedule()

    def send_prompt(self) -> None:
        """Send what the message box holds (the palette's "Send")."""
        self.prompt.action_submit()

    def on_reply_events(self, message: messages.ReplyEvents) -> None:
        self.replies.on_events(message)

    def on_reply_paused(self, message: messages.ReplyPaused) -> None:
        self.replies.on_paused(message)

    async def on_reply_closed(self, message: messages.ReplyClosed) -> None:
        await self.replies.on_closed(message)

    def set_busy(self, busy: bool) -> None:
        """The message box while a reply streams: held, marked, and saying how to stop it."""
        self._hold_prompt()
        self.main_screen.show_busy(busy)
        self.refresh_bindings()

    # ------------------------------------------------------------ quitting

    async def action_quit(self) -> None:
        """Ctrl+Q, the palette's Quit, SIGTERM: keep the reply that is streaming, then exit."""
        self.reading_ahead.close()  # exiting waits for the worker threads: never on reading
        await self.replies.keep_before_exit()
        self.exit(return_code=self._exit_status)

    def request_quit(self, exit_status: int) -> None:
        """Quit as Ctrl+Q does, from a signal handler (runs on the app's event loop)."""
        self._exit_status = exit_status
        self.call_later(self.action_quit)

    def _handle_exception(self, error: Exception) -> None:
        """A bug: Textual exits after it and prints the traceback. The conversation (and the reply
        streaming) is saved first, and the traceback goes to the log file (printed with --debug)."""
        line = save_after_crash(error, self.replies, lambda: self.conversation, self.store)
        self.reading_ahead.close()
        super()._handle_exception(error)
        if not logs.debug_enabled():
            self._exit_renderables[:] = [Text(f"specchat: {line}", style="red")]

    # ------------------------------------------------------------ app-wide keys

    def action_help(self) -> None:
        """The help key, on every screen: show the help, or close it."""
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen(self.keymap, self.palette))

    def action_cycle_theme(self) -> None:
        """The theme key, on every screen: the next theme from theme files, round the list."""
        names = self.themes.names
        if names:
            index = names.index(self.theme) if self.theme in names else -1
            self.theme = names[(index + 1) % len(names)]

    def action_save_screenshot(self) -> None:
        """The screenshot key, on every screen: an SVG of the screen as it is, for slides, in
        the user data folder."""
        folder = data_dir() / "screenshots"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = self.save_screenshot(path=str(folder))
        except OSError as err:
            self.notify(f"cannot save the screenshot in {folder}: {err.strerror or err}", severity="error")
            return
        self.notify(f"Screenshot saved: {path}", title="screenshot", timeout=10)

    # ---------------------------------------------- what the rooms and the palette read

    def _chat_screens(self) -> list[MainScreen]:
        screens = (self.main_screen, *self.screen_stack)
        return [s for s in dict.fromkeys(screens) if isinstance(s, MainScreen) and s.is_attached]

    def key_of(self, binding_id: str) -> str:
        return keys.display_key(self.effective_keys.get(binding_id, ""))

    @property
    def specchat_themes(self) -> list[str]:
        """Themes from theme files: the packaged four first, then the user's."""
        return self.themes.names

    def theme_description(self, name: str) -> str:
        return self.themes.description(name)

    def switch_theme(self, name: str) -> None:
        self.theme = name

    @property
    def token_styles(self) -> dict[str, Style]:
        """Rich styles of the token kinds (and rejected drafts) in the current theme."""
        return self.palette.styles

    def refresh_panels(self, force: bool = False) -> None:
        """Tell the live object the controls in force, and redraw the chat's panels."""
        self.live.set_controls(self.control_keys.view())
        self.main_screen.refresh_panels(force)

    @property
    def figures(self) -> Figures:
        """What the panels show right now (tests compare it with the engine's events)."""
        self.live.set_controls(self.control_keys.view())
        return figures(self.live)

    @property
    def transcript(self) -> Transcript:
        return self.main_screen.transcript

    @property
    def prompt(self) -> PromptInput:
        return self.main_screen.prompt

    def save_conversation(self) -> None:
        self.chat.save()

    def show_rendering(self, rendering: str | None) -> None:
        self.main_screen.show_rendering(rendering)


def run_replay(settings: Settings, path: Path, speed: float = 1.0) -> int:
    """Replay a saved conversation round by round, with no model loaded. Returns an exit code."""
    conversation = ConversationStore.load_path(path)
    if not any(turn.role == "assistant" for turn in conversation.turns):
        raise ConversationError(f"{path} holds no reply to replay.")
    app = SpecchatApp(settings, replay=conversation, replay_speed=speed, handle_signals=True)
    run_in_terminal(app, app.quitter)
    return app.return_code or 0


def run_chat(settings: Settings) -> int:
    """Open the chat: load the models behind a loading screen, then chat. Returns an exit code."""
    app = SpecchatApp(settings, handle_signals=True)
    run_in_terminal(app, app.quitter)
    for traceback in logs.debug_tracebacks():
        print(traceback, file=sys.stderr)
    return app.return_code or 0
