"""The message box: Enter sends, Ctrl+J inserts a new line (both remappable)."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea

from specchat.ui.keys import PROMPT_KEYS, bindings


class PromptInput(TextArea, inherit_bindings=False):
    # TextArea's own keys, less F6/F7 (select line / select all): those are the app's
    # temperature keys. Ours are priority bindings: TextArea would insert a newline for Enter.
    BINDINGS: ClassVar[list[BindingType]] = [
        *(b for b in TextArea.BINDINGS if not (isinstance(b, Binding) and b.key in ("f6", "f7"))),
        *bindings(PROMPT_KEYS, priority=True),
    ]

    class Submitted(Message):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            soft_wrap=True,
            show_line_numbers=False,
            tab_behavior="focus",
            placeholder="Message · Enter sends · Ctrl+J new line · F1 help",
            **kwargs,
        )

    def on_mount(self) -> None:
        # A blinking cursor would make screenshots and snapshots differ from run to run.
        if self.app.is_headless:
            self.cursor_blink = False

    def action_submit(self) -> None:
        text = self.text.strip()
        if text:
            self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self.insert("\n")
