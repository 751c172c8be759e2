"""The loading screen: progress while models are assembled, converted and loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Input, Log, ProgressBar, Static

if TYPE_CHECKING:
    from specchat.models import LoadProgress


class LoadingScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "quit_after_error", "Quit", show=False)]

    def __init__(self, target: str, draft: str | None, server: str | None = None) -> None:
        super().__init__()
        self.target = target
        self.draft = draft
        self.server = server
        """Set when attaching to a server: the screen says "Connecting to …" instead."""
        self.failed: tuple[str, int] | None = None
        self._last_line = ""

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static(Text("specchat", style="bold"), id="loading-title")
            what = f"target {self.target}" + (f" · draft {self.draft}" if self.draft else " · no draft model")
            line = f"Connecting to {self.server}…" if self.server else f"Loading {what}"
            yield Static(Text(line), id="loading-what")
            yield ProgressBar(total=None, show_eta=False, id="loading-bar")
            yield Static("starting…", id="loading-status")
            yield Log(id="loading-log", max_lines=200)
            # Typing starts before the models are ready: what is typed here goes to the chat's
            # message box once they are (see SpecchatApp.on_engine_loaded), never lost.
            yield Input(placeholder="Type your first message while this loads…", id="loading-message")
            yield Static("", id="loading-note")

    def on_mount(self) -> None:
        self.query_one("#loading-message", Input).focus()

    @property
    def typed(self) -> str:
        """What the user typed while waiting (kept for the message box)."""
        return self.query_one("#loading-message", Input).value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        note = "Still loading: your message waits in the box; Enter sends it once the chat opens."
        self.query_one("#loading-note", Static).update(Text(note, style="dim"))

    def show_progress(self, progress: LoadProgress) -> None:
        bar = self.query_one(ProgressBar)
        if progress.total:
            bar.update(total=progress.total, progress=progress.done)
        else:
            bar.update(total=None)
        self.query_one("#loading-status", Static).update(Text(progress.message))
        line = f"{progress.model}: {progress.stage}"
        if line != self._last_line:
            self._last_line = line
            self.query_one(Log).write_line(progress.message)

    def show_error(self, error: str, exit_code: int) -> None:
        self.failed = (error, exit_code)
        self.add_class("-failed")
        self.query_one("#loading-title", Static).update(Text("specchat could not start", style="bold"))
        self.query_one("#loading-what", Static).update(Text(error))
        self.query_one(ProgressBar).display = False
        self.query_one("#loading-message", Input).display = False  # q and Esc quit now
        self.query_one("#loading-note", Static).display = False
        self.set_focus(None)
        self.query_one("#loading-status", Static).update(Text("Press q or Esc to quit.", style="dim"))

    def action_quit_after_error(self) -> None:
        if self.failed is not None:
            self.app.exit(return_code=self.failed[1])
