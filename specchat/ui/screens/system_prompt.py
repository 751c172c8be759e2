"""Edit the system prompt of this conversation (and optionally make it the default)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Static, TextArea


class SystemPromptScreen(ModalScreen[tuple[str, bool] | None]):
    """Dismisses with (prompt, save_as_default), or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "save", "Save", priority=True),
    ]

    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        with Vertical(id="system-box"):
            yield Static(
                Text(
                    "Applies to the next reply of this conversation. Ctrl+S saves, Esc cancels.", style="dim"
                )
            )
            yield TextArea(self.prompt, id="system-text", soft_wrap=True, tab_behavior="focus")
            yield Checkbox("Also use for new conversations (saved to the config file)", id="system-default")
            with Horizontal(id="system-buttons"):
                yield Button("Save", variant="primary", id="system-save")
                yield Button("Cancel", id="system-cancel")

    def on_mount(self) -> None:
        self.query_one("#system-box").border_title = "system prompt"
        self.query_one(TextArea).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "system-save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        text = self.query_one(TextArea).text.strip()
        self.dismiss((text, self.query_one(Checkbox).value))

    def action_cancel(self) -> None:
        self.dismiss(None)
